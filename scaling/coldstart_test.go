package scaling

import (
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

func launchedFor(id, zone string, capacity fleet.Capacity, cold time.Duration) Placed {
	return Placed{ID: id, Capacity: capacity, Provider: "aws", Region: "us-east-1", Zone: zone, Ready: true,
		LaunchedAt: p0, ReadyAt: p0.Add(cold)}
}

func TestColdStartsLearnedPerPlace(t *testing.T) {
	var c coldStarts
	var w readiness
	learn := func(rs ...Placed) {
		fresh, _ := w.fresh(rs)
		c.learn(fresh)
	}
	prior := DefaultColdStart
	if got := c.at("aws/us-east-1/us-east-1a", fleet.Spot, prior); got != prior {
		t.Fatalf("nothing seen: %s; want the prior %s", got, prior)
	}
	a := launchedFor("a", "us-east-1a", fleet.Spot, 78*time.Second)
	learn(a, Placed{ID: "starting", Capacity: fleet.Spot, Zone: "us-east-1a", LaunchedAt: p0}, Placed{ID: "no-times", Ready: true})
	if got := c.at("aws/us-east-1/us-east-1a", fleet.Spot, prior); got != 78*time.Second {
		t.Fatalf("after one launch of 78 s: %s", got)
	}
	// Another place not seen yet: every place's estimate, not the prior.
	if got := c.at("aws/us-east-1/us-east-1b", fleet.OnDemand, prior); got != 78*time.Second {
		t.Fatalf("an unseen place: %s; want the pooled 78 s", got)
	}
	// The same replica seen again is not counted again; a new one moves the estimate by a
	// quarter of the difference.
	learn(a, launchedFor("b", "us-east-1a", fleet.Spot, 178*time.Second))
	if got := c.at("aws/us-east-1/us-east-1a", fleet.Spot, prior); got != 103*time.Second {
		t.Fatalf("after 78 s then 178 s: %s; want 103 s (78 + (178 - 78) / 4)", got)
	}
	// On-demand in the same zone is its own record.
	learn(launchedFor("c", "us-east-1a", fleet.OnDemand, 300*time.Second))
	if got := c.at("aws/us-east-1/us-east-1a", fleet.OnDemand, prior); got != 300*time.Second {
		t.Fatalf("on-demand: %s", got)
	}
}

// The dip's keep is priced with the on-demand relaunch's learned cold start: a market whose
// on-demand replicas start in 78 s keeps an idle spot replica a shorter time than one
// assuming the default 294 s.
func TestKeepThroughADipUsesTheLearnedColdStart(t *testing.T) {
	fleetOf := []Placed{spotPriced("a", "us-east-1a", 4, true), spotPriced("b", "us-east-1b", 3, true), spotPriced("c", "us-east-1c", 5, true)}
	pl := policy(func(p *PlacementPolicy) { p.RefusalBackoff = 30 * time.Second })
	od := launchedFor("od", "us-east-1a", fleet.OnDemand, 78*time.Second)
	pl.Plan(p0, 4, append(fleetOf[:3:3], od), offers())
	for _, o := range offers()[1:] {
		pl.Refused(o, p0.Add(time.Minute))
	}
	// Refusing for a moment only: the keep is the on-demand relaunch's cold start at its
	// price over the $5 replica's: 10 × 78 s / 5 = 156 s (with the default: 588 s).
	dip := p0.Add(time.Minute + time.Second)
	if got := drained(pl.Plan(dip, 2, fleetOf, offers())); len(got) != 0 {
		t.Fatalf("dip: drained %v", got)
	}
	if got := drained(pl.Plan(dip.Add(150*time.Second), 2, fleetOf, offers())); len(got) != 0 {
		t.Fatalf("150 s into the dip: drained %v", got)
	}
	if got := drained(pl.Plan(dip.Add(160*time.Second), 2, fleetOf, offers())); len(got) != 1 || got[0] != "c" {
		t.Fatalf("160 s into the dip: drained %v; want c (kept 156 s with a 78 s on-demand cold start)", got)
	}
}
