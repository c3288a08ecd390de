package pricing

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/spec"
)

// option is one thing a resources: block accepts: an accelerator (or none, when only an
// instance type is named) under one candidate's constraints, with its preference rank.
type option struct {
	label       string // where it came from, for errors: "ordered[1]"
	accelerator spec.Accelerator
	r           spec.Resources
	rank        [2]int32 // (candidate, accelerator) preference; lower is preferred
	cpus, mem   amount
}

// amount is a cpus or memory constraint: exactly v, or at least v.
type amount struct {
	set, atLeast bool
	v            float64
}

func (a amount) ok(have float64) bool {
	switch {
	case !a.set:
		return true
	case have == 0: // the catalog does not say
		return false
	case a.atLeast:
		return have >= a.v
	}
	return have == a.v
}

// Quote lists the offers that can run one replica of r at time at (zero: latest prices),
// cheapest per instance-hour first. Candidates come from any_of (all equally acceptable),
// ordered (earlier preferred: offers sort by Preference, then price) or, without either,
// r itself; a list of accelerators is ordered, a map of them is any-of. Each candidate
// constrains accelerator name (case-insensitive) and exact count, cloud, region, zone,
// instance_type, cpus and memory. Keys that do not change a catalog price (disk, ports,
// image, labels) are not checked.
//
// Without use_spot only on-demand offers come back. With use_spot, spot and on-demand
// offers both come back, told apart by Capacity, so that the spot policy can compare their
// ratio and fall back; filter by Capacity to get one kind. Reserved capacity is in the
// spec, not in catalogs: see ReservedOffers.
//
// An accelerator no catalog knows is left out, as SkyPilot's optimizer skips a candidate
// no enabled cloud offers (Resolve warns about it, with its place in the file, before a
// service is accepted); when every accelerator named is unknown the error is one
// *UnknownAcceleratorError per name, naming the closest known ones. When no candidate has
// an offer the error is a *NoOffersError saying, for each, which constraint emptied the
// list and what the catalogs have instead.
func (c *Catalog) Quote(r spec.Resources, at time.Time) ([]Offer, error) {
	opts, err := options(r)
	if err != nil {
		return nil, err
	}
	var unknownErrs []error
	names := map[string]bool{}
	overlap := false
	known := opts[:0:0]
	for _, o := range opts {
		n := lowerName(o.accelerator.Name)
		if n != "" && c.byAcc[n] == nil && c.notes[n] == nil {
			if !names[n] {
				unknownErrs = append(unknownErrs, &UnknownAcceleratorError{Name: o.accelerator.Name, Closest: closest(o.accelerator.Name, c.names, 3)})
			}
			names[n] = true
			continue
		}
		// A line can match two candidates only if they name the same accelerator, or one
		// names none (instance type alone).
		overlap = overlap || (len(known) > 0 && (names[n] || n == ""))
		names[n] = true
		known = append(known, o)
	}
	if len(known) == 0 {
		return nil, errors.Join(unknownErrs...)
	}
	opts = known
	t := resolve(at)
	var seen map[int32]int // line → position in hits, to list a line once at its best rank
	if overlap {
		seen = map[int32]int{}
	}
	// hit is a matching line, kept small because Quote sorts thousands of them.
	type hit struct {
		line int32
		rank [2]int32
		s    sample
	}
	var hits []hit
	for _, o := range opts {
		rank := o.rank
		for _, i := range c.candidates(o) {
			l := &c.lines[i]
			if !o.matches(l) {
				continue
			}
			s, st := l.price.at(t)
			if st != priced {
				continue
			}
			if seen != nil {
				if j, dup := seen[int32(i)]; dup {
					if rankLess(rank, hits[j].rank) {
						hits[j].rank = rank
					}
					continue
				}
				seen[int32(i)] = len(hits)
			}
			hits = append(hits, hit{int32(i), rank, s})
		}
	}
	if len(hits) == 0 {
		nf := &NoOffersError{}
		for _, o := range opts {
			reason := c.explain(o, at)
			if len(opts) > 1 {
				reason = o.label + ": " + reason
			}
			nf.Reasons = append(nf.Reasons, reason)
		}
		return nil, nf
	}
	// Lines are stored sorted by provider, region, zone and instance type, so the line
	// index breaks price ties the same way every time.
	slices.SortFunc(hits, func(a, b hit) int {
		switch {
		case rankLess(a.rank, b.rank):
			return -1
		case rankLess(b.rank, a.rank):
			return 1
		}
		return cmp.Or(cmp.Compare(a.s.usd, b.s.usd), cmp.Compare(a.line, b.line))
	})
	out := make([]Offer, len(hits))
	pref := 0
	for i, h := range hits {
		if i > 0 && h.rank != hits[i-1].rank {
			pref++
		}
		out[i] = c.lines[h.line].offer(h.s)
		out[i].Preference = pref
	}
	return out, nil
}

// rankLess orders preference ranks: candidate first, then accelerator within it.
func rankLess(a, b [2]int32) bool { return a[0] < b[0] || (a[0] == b[0] && a[1] < b[1]) }

// candidates are the lines worth checking for o: those of its accelerator, or all of them
// when only an instance type is named.
func (c *Catalog) candidates(o option) []int {
	if o.accelerator.Name != "" {
		return c.byAcc[lowerName(o.accelerator.Name)]
	}
	all := make([]int, len(c.lines))
	for i := range all {
		all[i] = i
	}
	return all
}

func (o option) matches(l *line) bool {
	r := o.r
	return o.capacityOK(l.capacity) &&
		(o.accelerator.Name == "" || (strings.EqualFold(l.accelerator, o.accelerator.Name) && l.count == o.accelerator.Count)) &&
		(r.Cloud == "" || strings.EqualFold(l.provider, r.Cloud)) &&
		(r.Region == "" || strings.EqualFold(l.region, r.Region)) &&
		(r.Zone == "" || strings.EqualFold(l.zone, r.Zone)) &&
		(r.InstanceType == "" || strings.EqualFold(l.instanceType, r.InstanceType)) &&
		o.cpus.ok(l.vcpus) && o.mem.ok(l.memGiB)
}

func (o option) capacityOK(c fleet.Capacity) bool {
	return c == fleet.OnDemand || (o.r.UseSpot && c == fleet.Spot)
}

// options expands r into what it accepts, in preference order.
func options(r spec.Resources) ([]option, error) {
	cands, kind := []spec.Resources{r}, ""
	switch {
	case len(r.AnyOf) > 0:
		cands, kind = r.AnyOf, "any_of"
	case len(r.Ordered) > 0:
		cands, kind = r.Ordered, "ordered"
	}
	var out []option
	for i, cand := range cands {
		label := "resources"
		if kind != "" {
			label = fmt.Sprintf("%s[%d]", kind, i)
		}
		cpus, err := parseAmount(cand.CPUs, false)
		if err != nil {
			return nil, fmt.Errorf("%s.cpus: %w", label, err)
		}
		mem, err := parseAmount(cand.Memory, true)
		if err != nil {
			return nil, fmt.Errorf("%s.memory: %w", label, err)
		}
		var candRank int32
		if kind == "ordered" {
			candRank = int32(i)
		}
		if len(cand.Accelerators) == 0 {
			if cand.InstanceType == "" {
				return nil, fmt.Errorf("%s: names no accelerators and no instance_type; the price catalogs list GPU machines only", label)
			}
			out = append(out, option{label: label, r: cand, rank: [2]int32{candRank, 0}, cpus: cpus, mem: mem})
			continue
		}
		for j, a := range cand.Accelerators {
			var accRank int32
			if cand.AcceleratorsOrdered {
				accRank = int32(j)
			}
			if a.Count < 1 {
				a.Count = 1 // spec's default; a zero value here means "not given"
			}
			out = append(out, option{label: label, accelerator: a, r: cand, rank: [2]int32{candRank, accRank}, cpus: cpus, mem: mem})
		}
	}
	return out, nil
}

// amountForm is spec's cpus/memory form: a number, an optional unit (memory), an
// optional + for "at least".
var amountForm = regexp.MustCompile(`(?i)^((?:\d+(?:\.\d*)?|\.\d+))\s*([kmgtp]i?b?|b)?(\+)?$`)

// parseAmount reads cpus ("4", "4+") or memory ("32", "32GB+", "512MiB") as spec keeps
// them. Memory is in GiB, as the catalogs' MemoryGiB; like SkyPilot, GB and GiB are one.
func parseAmount(s string, memory bool) (amount, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return amount{}, nil
	}
	m := amountForm.FindStringSubmatch(s)
	if m == nil || (!memory && m[2] != "") {
		return amount{}, fmt.Errorf("want a number with an optional + such as 4 or 4+, got %q", s)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return amount{}, fmt.Errorf("want a number, got %q", s)
	}
	if unit := strings.ToLower(m[2]); unit != "" {
		v *= math.Pow(1024, float64(strings.IndexByte("bkmgtp", unit[0])-3))
	}
	return amount{set: true, atLeast: m[3] != "", v: v}, nil
}
