package spec

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Pos is where a value was written in a service.yaml.
type Pos struct {
	File         string
	Line, Column int // 1-based
}

// notePos records where an accelerator name was written, so that a later step that prices
// the names (one the spec package cannot take: catalogs and providers live above it) can
// place what it says about them.
func (d *decoder) notePos(name string, at *yaml.Node) {
	if at == nil {
		return
	}
	k := strings.ToLower(name)
	p := Pos{File: d.file, Line: at.Line, Column: at.Column}
	if !slices.Contains(d.accPos[k], p) {
		d.accPos[k] = append(d.accPos[k], p)
	}
}

// AcceleratorPositions lists where name (matched case-insensitively) is written in the
// file the service was parsed from, in file order; nil for a service not parsed from a
// file, or a name it does not give.
func (s *Service) AcceleratorPositions(name string) []Pos {
	return slices.Clone(s.accPos[strings.ToLower(name)])
}

// AcceleratorNames lists every accelerator name the resources give (base and candidates),
// each once, in the order first written.
func (s *Service) AcceleratorNames() []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range s.Resources.all() {
		for _, a := range r.Accelerators {
			if k := strings.ToLower(a.Name); !seen[k] {
				seen[k] = true
				out = append(out, a.Name)
			}
		}
	}
	return out
}

// all is the base resources followed by its candidates.
func (r *Resources) all() []*Resources {
	out := []*Resources{r}
	for i := range r.AnyOf {
		out = append(out, &r.AnyOf[i])
	}
	for i := range r.Ordered {
		out = append(out, &r.Ordered[i])
	}
	return out
}

// RenameAccelerators spells each accelerator name as canonical returns it (SkyPilot
// canonicalises names it knows: "a100" is A100), in the base, the candidates and the
// per-accelerator QPS targets. A name canonical maps to "" is kept as written.
func (s *Service) RenameAccelerators(canonical func(name string) string) {
	for _, r := range s.Resources.all() {
		for i, a := range r.Accelerators {
			if c := canonical(a.Name); c != "" {
				r.Accelerators[i].Name = c
			}
		}
	}
	if m := s.Service.ReplicaPolicy.TargetQPSByAccelerator; m != nil {
		out := make(map[string]float64, len(m))
		for k, v := range m {
			name, count, hasCount := strings.Cut(k, ":")
			if c := canonical(strings.TrimSpace(name)); c != "" {
				name = c
			}
			if hasCount {
				name += ":" + count
			}
			out[name] = v
		}
		s.Service.ReplicaPolicy.TargetQPSByAccelerator = out
	}
}

// DropAccelerators removes every accelerator for which why gives a reason, from the base
// resources and from each any_of/ordered candidate; a candidate left with no accelerator
// is removed with it (one that named none, only an instance type, stays). Each name
// dropped is a warning at every place it is written, saying why. When nothing runnable is
// left the service cannot run: the error (an *ErrorList) names each name and its place,
// and the service is left as it was.
func (s *Service) DropAccelerators(why func(name string) string) (warnings ErrorList, err error) {
	reasons := map[string]string{}
	var order []string
	for _, name := range s.AcceleratorNames() {
		if w := why(name); w != "" {
			reasons[strings.ToLower(name)] = w
			order = append(order, name)
		}
	}
	if len(order) == 0 {
		return nil, nil
	}
	dropped := func(a Accelerator) bool { return reasons[strings.ToLower(a.Name)] != "" }
	r := &s.Resources
	kept := slices.DeleteFunc(slices.Clone(r.Accelerators), dropped)
	candidates := func(cs []Resources) []Resources {
		var out []Resources
		for _, c := range cs {
			had := len(c.Accelerators) > 0
			c.Accelerators = slices.DeleteFunc(slices.Clone(c.Accelerators), dropped)
			if had && len(c.Accelerators) == 0 {
				continue
			}
			out = append(out, c)
		}
		return out
	}
	anyOf, ordered := candidates(r.AnyOf), candidates(r.Ordered)
	runnable := len(kept) > 0
	if r.AnyOf != nil || r.Ordered != nil {
		runnable = len(anyOf)+len(ordered) > 0
	}
	msgs := ErrorList{}
	for _, name := range order {
		at := s.AcceleratorPositions(name)
		if len(at) == 0 {
			at = []Pos{{}}
		}
		for _, p := range at {
			msgs = append(msgs, &Error{File: p.File, Line: p.Line, Column: p.Column, Msg: "resources.accelerators: " + strconv.Quote(name) + ": " + reasons[strings.ToLower(name)]})
		}
	}
	slices.SortStableFunc(msgs, func(a, b *Error) int {
		if a.Line != b.Line {
			return a.Line - b.Line
		}
		return a.Column - b.Column
	})
	if !runnable {
		for _, m := range msgs {
			m.Msg += "; and no other accelerator is left to run the service on"
		}
		return nil, &msgs
	}
	for _, m := range msgs {
		m.Msg += "; left out, the others remain"
	}
	r.Accelerators = kept
	if r.AnyOf != nil {
		r.AnyOf = anyOf
	}
	if r.Ordered != nil {
		r.Ordered = ordered
	}
	return msgs, nil
}

// acceleratorKey is how the map form writes an accelerator when one name comes at several
// counts, which a mapping of name to count cannot hold: "A100:4" with no value, as
// SkyPilot's examples write {A100:4, A100:8}.
func acceleratorKey(a Accelerator) string { return fmt.Sprintf("%s:%d", a.Name, a.Count) }

// Preference ranks an offer by the order the user wrote, as SkyPilot tries `ordered`
// candidates and a list of accelerators: 0 for the first candidate that matches the offer
// (its provider, region, zone, instance type and accelerator × count, each where the
// candidate names it), 1 for the second, and so on; within a candidate, a list of
// accelerators orders them too. Resources that state no order (one accelerator, a set,
// any_of) rank every offer 0: placement then chooses by price. Where no candidate matches
// the offer's place (a provider that names places its own way, such as sim), the first
// whose accelerator matches ranks it; an offer none matches ranks after all of them.
func (r *Resources) Preference(provider, region, zone, instanceType, accelerator string, count int) int {
	cands := r.Ordered
	if len(cands) == 0 {
		if !r.AcceleratorsOrdered {
			return 0
		}
		cands = []Resources{*r}
	}
	if rank, ok := preference(cands, accelerator, count, func(c *Resources) bool { return c.placeMatches(provider, region, zone, instanceType) }); ok {
		return rank
	}
	if rank, ok := preference(cands, accelerator, count, func(c *Resources) bool { return len(c.Accelerators) > 0 }); ok {
		return rank
	}
	return len(cands) * perCandidate
}

// perCandidate leaves room in a rank for the accelerators of one candidate's list.
const perCandidate = 1 << 10

// preference is the rank of the first of cands that match accepts and whose accelerators
// (if it names any) include accelerator × count.
func preference(cands []Resources, accelerator string, count int, match func(*Resources) bool) (int, bool) {
	for i := range cands {
		c := &cands[i]
		if !match(c) {
			continue
		}
		if len(c.Accelerators) == 0 {
			return i * perCandidate, true
		}
		for j, a := range c.Accelerators {
			if strings.EqualFold(a.Name, accelerator) && max(a.Count, 1) == max(count, 1) {
				if !c.AcceleratorsOrdered {
					j = 0
				}
				return i*perCandidate + min(j, perCandidate-1), true
			}
		}
	}
	return 0, false
}

// placeMatches reports whether an offer in provider/region/zone on instanceType is one r
// allows (each where r names it).
func (r *Resources) placeMatches(provider, region, zone, instanceType string) bool {
	cloudOK := r.Cloud == "" || strings.EqualFold(r.Cloud, provider) || IsKubernetes(r.Cloud) && IsKubernetes(provider)
	return cloudOK && (r.Region == "" || strings.EqualFold(r.Region, region)) && (r.Zone == "" || strings.EqualFold(r.Zone, zone)) &&
		(r.InstanceType == "" || strings.EqualFold(r.InstanceType, instanceType))
}
