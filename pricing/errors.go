package pricing

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/internal/text/textdist"
)

// UnknownAcceleratorError is an accelerator name no loaded catalog mentions.
type UnknownAcceleratorError struct {
	Name    string
	Closest []string // known names nearest by edit distance, nearest first
}

func (e *UnknownAcceleratorError) Error() string {
	msg := fmt.Sprintf("unknown accelerator %q", e.Name)
	if len(e.Closest) > 0 {
		msg += "; closest known: " + strings.Join(e.Closest, ", ")
	}
	return msg
}

// NoOffersError is a request whose accelerators are known but which no offer satisfies.
type NoOffersError struct {
	// Reasons has one sentence per candidate: the constraint that left nothing and what
	// the catalogs have instead.
	Reasons []string
}

func (e *NoOffersError) Error() string {
	if len(e.Reasons) == 1 {
		return e.Reasons[0]
	}
	return "no candidate has an offer: " + strings.Join(e.Reasons, "; ")
}

// explain finds the first constraint of o that leaves no line, relaxing nothing before
// it, and says what exists at that point instead.
func (c *Catalog) explain(o option, at time.Time) string {
	r := o.r
	what := o.accelerator.Name + ":" + strconv.Itoa(o.accelerator.Count)
	if o.accelerator.Name == "" {
		what = "instance_type " + r.InstanceType
	}
	lower := lowerName(o.accelerator.Name)
	ls := c.lineRefs(c.candidates(o))
	if len(ls) == 0 {
		return fmt.Sprintf("no %s offers: %s", what, strings.Join(c.notesFor(lower, ""), "; "))
	}
	// where describes the place the steps so far narrowed to.
	where := ""
	type step struct {
		skip bool
		keep func(*line) bool
		fail func(before []*line) string
		// where is the place once this step applies, for later messages ("" keeps it).
		where string
	}
	steps := []step{{
		skip: o.accelerator.Name == "",
		keep: func(l *line) bool { return l.count == o.accelerator.Count },
		fail: func(before []*line) string {
			return fmt.Sprintf("no %s offers; %s comes in counts %s", what, o.accelerator.Name,
				list(before, func(l *line) string { return strconv.Itoa(l.count) }, byNumber))
		},
	}, {
		skip:  r.Cloud == "",
		keep:  func(l *line) bool { return strings.EqualFold(l.provider, r.Cloud) },
		where: describePlace(r.Cloud, "", ""),
		fail: func(before []*line) string {
			msg := fmt.Sprintf("no %s offers on %s; clouds with %s: %s", what, r.Cloud, what,
				list(before, func(l *line) string { return l.provider }, byText))
			return withNotes(msg, c.notesFor(lower, strings.ToLower(r.Cloud)))
		},
	}, {
		skip:  r.Region == "",
		keep:  func(l *line) bool { return strings.EqualFold(l.region, r.Region) },
		where: describePlace(r.Cloud, r.Region, ""),
		fail: func(before []*line) string {
			return fmt.Sprintf("no %s offers%s; regions with %s%s: %s", what, describePlace(r.Cloud, r.Region, ""), what, where,
				list(before, func(l *line) string { return l.region }, byText))
		},
	}, {
		skip:  r.Zone == "",
		keep:  func(l *line) bool { return strings.EqualFold(l.zone, r.Zone) },
		where: describePlace(r.Cloud, r.Region, r.Zone),
		fail: func(before []*line) string {
			msg := fmt.Sprintf("no %s offers%s", what, describePlace(r.Cloud, r.Region, r.Zone))
			zoned := slices.DeleteFunc(slices.Clone(before), func(l *line) bool { return l.zone == "" })
			if len(zoned) == 0 {
				return msg + fmt.Sprintf("; the catalogs price %s%s per region, without zones (leave zone out)", what, where)
			}
			hint := ""
			if slices.ContainsFunc(zoned, func(l *line) bool { return l.provider == "aws" }) {
				hint = " (AWS zones are AZ ids such as use1-az1)"
			}
			return fmt.Sprintf("%s; zones with %s%s: %s%s", msg, what, where,
				list(zoned, func(l *line) string { return l.zone }, byText), hint)
		},
	}, {
		skip: r.InstanceType == "",
		keep: func(l *line) bool { return strings.EqualFold(l.instanceType, r.InstanceType) },
		fail: func(before []*line) string {
			if o.accelerator.Name == "" {
				return fmt.Sprintf("no offers for instance_type %s%s; closest instance types there: %s", r.InstanceType, where,
					strings.Join(closest(r.InstanceType, distinct(before, func(l *line) string { return l.instanceType }), 3), ", "))
			}
			return fmt.Sprintf("no %s offers as instance_type %s%s; instance types with %s%s: %s", what, r.InstanceType, where, what, where,
				list(before, func(l *line) string { return l.instanceType }, byText))
		},
	}, {
		skip: !o.cpus.set,
		keep: func(l *line) bool { return o.cpus.ok(l.vcpus) },
		fail: func(before []*line) string {
			return fmt.Sprintf("no %s offers with cpus %s%s; vCPUs there: %s", what, r.CPUs, where,
				list(before, func(l *line) string { return strconv.FormatFloat(l.vcpus, 'g', -1, 64) }, byNumber))
		},
	}, {
		skip: !o.mem.set,
		keep: func(l *line) bool { return o.mem.ok(l.memGiB) },
		fail: func(before []*line) string {
			return fmt.Sprintf("no %s offers with memory %s%s; memory there (GiB): %s", what, r.Memory, where,
				list(before, func(l *line) string { return strconv.FormatFloat(l.memGiB, 'g', -1, 64) }, byNumber))
		},
	}, {
		keep: func(l *line) bool { return o.capacityOK(l.capacity) },
		fail: func([]*line) string {
			return fmt.Sprintf("no on-demand price for %s%s, only spot; set use_spot: true to consider spot", what, where)
		},
	}}
	for _, s := range steps {
		if s.skip {
			continue
		}
		kept := slices.DeleteFunc(slices.Clone(ls), func(l *line) bool { return !s.keep(l) })
		if len(kept) == 0 {
			return s.fail(ls)
		}
		ls = kept
		if s.where != "" {
			where = s.where
		}
	}
	// Every constraint is met by some line, but none has a price at this time: the
	// machines appeared later, or left, or the source lists them without this price.
	when := "at " + at.UTC().Format(time.RFC3339)
	if at.IsZero() {
		when = "in the latest prices"
	}
	return fmt.Sprintf("no %s offers%s have a price in force %s; the catalogs list them only at other times", what, where, when)
}

// describePlace writes a location constraint for messages: " on aws",
// " in region us-east-1 of aws", " in zone use1-az1 (region us-east-1) of aws".
func describePlace(cloud, region, zone string) string {
	var s string
	switch {
	case zone != "":
		s = " in zone " + zone
		if region != "" {
			s += " (region " + region + ")"
		}
	case region != "":
		s = " in region " + region
	case cloud != "":
		return " on " + cloud
	default:
		return ""
	}
	if cloud != "" {
		s += " of " + cloud
	}
	return s
}

func (c *Catalog) lineRefs(idx []int) []*line {
	out := make([]*line, len(idx))
	for i, j := range idx {
		out[i] = &c.lines[j]
	}
	return out
}

// notesFor lists why the accelerator has no price from provider (all providers when "").
func (c *Catalog) notesFor(lower, provider string) []string {
	var out []string
	for p, why := range c.notes[lower] {
		if provider == "" || p == provider {
			out = append(out, why)
		}
	}
	slices.Sort(out)
	return out
}

func withNotes(msg string, notes []string) string {
	if len(notes) == 0 {
		return msg
	}
	return msg + " (" + strings.Join(notes, "; ") + ")"
}

const (
	byText = iota
	byNumber
)

// maxListed keeps error messages readable: Azure alone prices some GPUs in 40 regions.
const maxListed = 12

// distinct gives the distinct values of f over ls, in first-seen order.
func distinct(ls []*line, f func(*line) string) []string {
	seen := map[string]bool{}
	var vals []string
	for _, l := range ls {
		if v := f(l); !seen[v] {
			seen[v] = true
			vals = append(vals, v)
		}
	}
	return vals
}

// list gives the distinct values of f over ls, sorted, the first maxListed of them.
func list(ls []*line, f func(*line) string, order int) string {
	vals := distinct(ls, f)
	slices.SortFunc(vals, func(a, b string) int {
		if order == byNumber {
			x, _ := strconv.ParseFloat(a, 64)
			y, _ := strconv.ParseFloat(b, 64)
			return cmp.Compare(x, y)
		}
		return cmp.Compare(a, b)
	})
	if len(vals) > maxListed {
		return strings.Join(vals[:maxListed], ", ") + fmt.Sprintf(", … (%d more)", len(vals)-maxListed)
	}
	return strings.Join(vals, ", ")
}

// closest returns up to n names nearest to name by case-insensitive edit distance; ties
// go to names of about the same length, then alphabetical order, so "A10O" suggests
// A100, A10G, A10.
func closest(name string, names []string, n int) []string {
	type scored struct {
		name       string
		dist, dlen int
	}
	q := strings.ToLower(name)
	s := make([]scored, 0, len(names))
	for _, k := range names {
		s = append(s, scored{k, textdist.Distance(q, strings.ToLower(k)), abs(len(k) - len(name))})
	}
	slices.SortFunc(s, func(a, b scored) int {
		return cmp.Or(cmp.Compare(a.dist, b.dist), cmp.Compare(a.dlen, b.dlen), cmp.Compare(a.name, b.name))
	})
	out := make([]string, 0, n)
	for i := 0; i < len(s) && i < n; i++ {
		out = append(out, s[i].name)
	}
	return out
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
