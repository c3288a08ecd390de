package scaling

import (
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// `ordered` is strict, as SkyPilot's: the user's first candidate is taken while it can be
// had, even where a later one is cheaper per token, and the next only when the earlier
// cannot be had (refused, here); the reason names the refused preferred one.
func TestOrderedKeepsTheUsersOrder(t *testing.T) {
	offers := gpuOffers(t) // per token: H100, A100-80GB, L4, A10G
	order := map[string]int{"L4": 0, "A10G": 1, "H100": 2, "A100-80GB": 3}
	for i := range offers {
		offers[i].Preference = order[offers[i].Accelerator]
	}
	pl := policy(func(p *PlacementPolicy) { p.UseSpot = false; p.RefusalBackoff = time.Minute })
	eq(t, "ordered: the first candidate", accelerators(pl.Plan(p0, 2, nil, offers).Launch), "L4", "L4")
	pl.Refused(offers[0], p0) // the L4
	plan := pl.Plan(p0.Add(10*time.Second), 1, nil, offers)
	eq(t, "ordered, the L4 refused: the second", accelerators(plan.Launch), "A10G")
	if r := plan.Launch[0].Reason; !strings.Contains(r, "the preferred (earlier in resources.ordered) L4 at $0.70/h") {
		t.Fatalf("reason %q: want the refused preferred L4 named", r)
	}
	// Once the refusal is forgotten, the first candidate is taken again.
	eq(t, "ordered, the refusal past", accelerators(pl.Plan(p0.Add(2*time.Minute), 1, nil, offers).Launch), "L4")
	// Without an order (any_of, a set) the cheapest per token wins.
	for i := range offers {
		offers[i].Preference = 0
	}
	eq(t, "any_of", accelerators(policy(func(p *PlacementPolicy) { p.UseSpot = false }).Plan(p0, 1, nil, offers).Launch), "H100")
}

// Spot follows the order too, and a candidate whose spot zones are all cooling down (a
// preemption) counts as one that cannot be had.
func TestOrderedSpot(t *testing.T) {
	mk := func(acc, zone string, pref int, price float64) Offer {
		return Offer{Provider: "cloud", Region: "r", Zone: zone, Capacity: fleet.Spot, PricePerHour: price, Accelerator: acc, AcceleratorCount: 1, Preference: pref}
	}
	offers := []Offer{mk("A100", "a", 0, 2.0), mk("A100", "b", 0, 2.1), mk("L4", "c", 1, 0.2), mk("L4", "d", 1, 0.2)}
	pl := policy(func(p *PlacementPolicy) { p.UseSpot = true; p.SpotMinZones = 1 })
	eq(t, "ordered spot", accelerators(pl.Plan(p0, 2, nil, offers).Launch), "A100", "A100")
	pl.Preempted("cloud", "r", "a", p0)
	pl.Preempted("cloud", "r", "b", p0)
	eq(t, "ordered spot, the A100 zones cooling", accelerators(pl.Plan(p0.Add(time.Second), 1, nil, offers).Launch), "L4")
}
