package pricing

import (
	"fmt"
	"slices"
	"strings"

	"github.com/arbiter-serve/arbiter/spec"
)

// Canonical is the catalogs' spelling of an accelerator name, matched case-insensitively
// as SkyPilot canonicalises the names it knows ("a100" is A100, "l4" is L4); ok is false
// for a name no loaded catalog mentions.
func (c *Catalog) Canonical(name string) (string, bool) {
	n := lowerName(strings.TrimSpace(name))
	if c.byAcc[n] != nil {
		return c.lines[c.byAcc[n][0]].accelerator, true
	}
	if c.notes[n] != nil {
		return name, true // mentioned with no price anywhere; its spelling is not recorded
	}
	return "", false
}

// RunsUnpriced reports whether a provider can offer an accelerator no catalog prices:
// Kubernetes matches the name against its nodes' labels, RunPod maps it through its
// gpu_types. The others choose among catalog offers (aws, sim) or offer no GPU by name
// (local, whose replicas run on this machine whatever the file asks for), so a name no
// catalog knows is, for them, most likely a typo.
func RunsUnpriced(provider string) bool {
	return provider == "runpod" || spec.IsKubernetes(provider)
}

// Resolve does for a service what SkyPilot does before it optimises: it spells each
// accelerator as the catalogs do, and leaves out the accelerators nothing can price or
// run, as its optimizer skips candidates no enabled cloud offers. A name no catalog
// prices is kept when one of the service's providers runs it without a price
// (RunsUnpriced), and left out otherwise. Each name left out, and each kept without a
// price, is a warning at every place the file writes it. Only a service left with nothing
// to run on is an error (an *spec.ErrorList, with places); the service is changed only
// when there is none.
func Resolve(sp *spec.Service, c *Catalog) (spec.ErrorList, error) {
	sp.RenameAccelerators(func(name string) string {
		n, _ := c.Canonical(name)
		return n
	})
	runners := slices.DeleteFunc(slices.Clone(sp.Arbiter.Providers), func(p string) bool { return !RunsUnpriced(p) })
	var kept spec.ErrorList
	warnings, err := sp.DropAccelerators(func(name string) string {
		if _, ok := c.Canonical(name); ok {
			return ""
		}
		why := "no price catalog lists it"
		if cl := closest(name, c.names, 3); len(cl) > 0 {
			why += fmt.Sprintf(" (closest known: %s)", strings.Join(cl, ", "))
		}
		if len(runners) > 0 {
			for _, p := range sp.AcceleratorPositions(name) {
				kept = append(kept, &spec.Error{File: p.File, Line: p.Line, Column: p.Column,
					Msg: fmt.Sprintf("resources.accelerators: %q: %s; kept, as %s can run it without one, while a provider that places by price leaves it out", name, why, strings.Join(runners, ", "))})
			}
			return ""
		}
		return fmt.Sprintf("%s, and none of this service's providers (%s) offers a GPU no catalog lists (kubernetes and runpod match names against their own nodes and GPU types)", why, strings.Join(sp.Arbiter.Providers, ", "))
	})
	if err != nil {
		return nil, err
	}
	out := append(kept, warnings...)
	slices.SortStableFunc(out, func(a, b *spec.Error) int {
		if a.Line != b.Line {
			return a.Line - b.Line
		}
		return a.Column - b.Column
	})
	return out, nil
}
