package scaling

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

func TestKeepFor(t *testing.T) {
	cold := DefaultColdStart // 294 s
	for _, c := range []struct {
		name            string
		price, odPrice  float64
		refusing        time.Duration
		want            time.Duration
		within          time.Duration
		wantCapped      bool
		wantAtLeastCold bool
	}{
		{name: "market not refusing: the downscale delay paid the spot relaunch", price: 1.58, odPrice: 11.06, refusing: 0, want: 0},
		// spotserve-g4dn's prices: (11.06 × 294 s + 9.48 × 1 h) / 1.58 = 6.57 h.
		{name: "refusing for an hour", price: 1.58, odPrice: 11.06, refusing: time.Hour, want: 6*time.Hour + 34*time.Minute + 7*time.Second, within: time.Minute},
		// Only the on-demand cold start: 11.06 × 294 s / 1.58 = 34.3 min.
		{name: "refusing for an instant", price: 1.58, odPrice: 11.06, refusing: time.Nanosecond, want: 34*time.Minute + 18*time.Second, within: time.Minute},
		{name: "no on-demand to relaunch on: a cold start past the streak", price: 1.58, odPrice: 0, refusing: time.Hour, want: time.Hour + cold},
		{name: "spot dearer than on-demand: the on-demand cold start only", price: 12, odPrice: 10, refusing: time.Hour, want: time.Duration(10 * float64(cold) / 12), within: time.Second},
		{name: "a day at most", price: 1, odPrice: 100, refusing: 10 * time.Hour, want: maxDipKeep},
	} {
		got := keepFor(c.price, c.odPrice, cold, c.refusing)
		if d := got - c.want; d > c.within || d < -c.within {
			t.Errorf("%s: keepFor = %s; want %s ± %s", c.name, got, c.want, c.within)
		}
	}
}

func TestSpotMarketRefusalStreak(t *testing.T) {
	var m spotMarket
	var w readiness
	see := func(m *spotMarket, w *readiness, rs ...Placed) { m.see(w.fresh(rs)) }
	see(&m, &w, spotAt("a", "us-east-1a", true), spotAt("b", "us-east-1b", false))
	m.refused(p0)
	m.refused(p0.Add(time.Minute))
	if !m.refusingSince.Equal(p0) {
		t.Fatalf("streak since %v; want the first refusal %v", m.refusingSince, p0)
	}
	see(&m, &w, spotAt("a", "us-east-1a", true), spotAt("b", "us-east-1b", false))
	if m.refusingSince.IsZero() {
		t.Fatal("no replica became ready: the streak must go on")
	}
	// An on-demand replica becoming ready says nothing of the spot market.
	see(&m, &w, spotAt("a", "us-east-1a", true), spotAt("b", "us-east-1b", false), Placed{ID: "od", Capacity: fleet.OnDemand, Ready: true})
	if m.refusingSince.IsZero() {
		t.Fatal("an on-demand replica became ready: the streak must go on")
	}
	see(&m, &w, spotAt("a", "us-east-1a", true), spotAt("b", "us-east-1b", true))
	if !m.refusingSince.IsZero() {
		t.Fatal("b became ready, a launch the market granted: the streak must end")
	}
	// A placer's first plan knows nothing before it: replicas ready then were not granted
	// since a refusal.
	var fresh spotMarket
	var fw readiness
	fresh.refused(p0)
	see(&fresh, &fw, spotAt("a", "us-east-1a", true))
	if fresh.refusingSince.IsZero() {
		t.Fatal("the first plan's ready replicas ended the streak")
	}
}

// While the market refuses spot launches, a dip in the target keeps the ready spot
// replicas: relaunching one when the load comes back would be on-demand. The dearest
// leaves first, once its idle bill since the dip began equals the relaunch's; while the
// market gives spot back, a dip drains at once as before.
func TestSpotKeptThroughADipWhileTheMarketRefuses(t *testing.T) {
	fleetOf := func() []Placed {
		return []Placed{spotPriced("a", "us-east-1a", 4, true), spotPriced("b", "us-east-1b", 3, true), spotPriced("c", "us-east-1c", 5, true)}
	}
	spotOnly := offers()[1:]
	onlyOD := offers()[:1]

	pl := policy(func(p *PlacementPolicy) { p.RefusalBackoff = 30 * time.Second })
	pl.Plan(p0, 3, fleetOf(), offers())
	for _, o := range spotOnly { // every zone refuses a launch
		pl.Refused(o, p0.Add(time.Minute))
	}
	dip := p0.Add(61 * time.Minute) // refusing for an hour when the target drops
	plan := pl.Plan(dip, 2, fleetOf(), offers())
	if len(plan.Drain) != 0 {
		t.Fatalf("dip while the market refuses: drained %v; want none", drained(plan))
	}
	if !strings.Contains(plan.Reason, "1 ready spot replicas kept through the dip: spot launches refused for 1h0m0s before it, a relaunch would be on-demand at $10.00/h") {
		t.Fatalf("reason %q does not say why the spot replica stays", plan.Reason)
	}
	// The load comes back with no spot offer: the kept replica serves, no on-demand bought.
	if plan := pl.Plan(dip.Add(20*time.Minute), 3, fleetOf(), onlyOD); len(plan.Launch) != 0 || len(plan.Drain) != 0 {
		t.Fatalf("load back, no spot offer: want no change, got launches %v, drains %v", zones(plan.Launch), drained(plan))
	}
	// A new dip, judged by the streak's age then (1 h 21 m): the $5 replica in 1c stays
	// (10 × 294 s + 5 × 1.35 h) / 5 = 1 h 30.8 m, then leaves.
	dip2 := dip.Add(21 * time.Minute)
	if got := drained(pl.Plan(dip2, 2, fleetOf(), offers())); len(got) != 0 {
		t.Fatalf("second dip: drained %v", got)
	}
	if got := drained(pl.Plan(dip2.Add(90*time.Minute), 2, fleetOf(), offers())); len(got) != 0 {
		t.Fatalf("90 minutes into the dip: drained %v; want none before 1 h 30.8 m", got)
	}
	eq(t, "past its keep", drained(pl.Plan(dip2.Add(91*time.Minute), 2, fleetOf(), offers())), "c")

	// A replica granted since the refusals ends the streak: the next dip drains at once.
	pl = policy(func(p *PlacementPolicy) { p.RefusalBackoff = 30 * time.Second })
	starting := fleetOf()
	starting[2].Ready = false
	pl.Plan(p0, 3, starting, offers())
	for _, o := range spotOnly {
		pl.Refused(o, p0.Add(time.Minute))
	}
	pl.Plan(p0.Add(5*time.Minute), 3, fleetOf(), offers()) // c became ready
	eq(t, "dip after spot was granted", drained(pl.Plan(p0.Add(61*time.Minute), 2, fleetOf(), offers())), "c")

	// Never refused: the dip drains at once, as it always did.
	pl = policy(nil)
	pl.Plan(p0, 3, fleetOf(), offers())
	eq(t, "dip in a market that gives spot", drained(pl.Plan(p0.Add(time.Hour), 2, fleetOf(), offers())), "c")

	// SkyServe's baselines (RelaunchCosts off) drain at once, refusals or not.
	pl = policy(func(p *PlacementPolicy) { p.RelaunchCosts = false; p.RefusalBackoff = 30 * time.Second })
	pl.Plan(p0, 3, fleetOf(), offers())
	for _, o := range spotOnly {
		pl.Refused(o, p0.Add(time.Minute))
	}
	eq(t, "RelaunchCosts off", drained(pl.Plan(p0.Add(61*time.Minute), 2, fleetOf(), offers())), "c")
}

func TestSwapWait(t *testing.T) {
	cold, cool := DefaultColdStart, 10*time.Minute
	for _, c := range []struct {
		name         string
		standIns     int
		spot, od     float64
		want, within time.Duration
	}{
		// 11.06 × 294 s / (12 × 9.48) = 28.6 s.
		{"spotserve-g4dn's first hour: 12 stand-ins", 12, 1.58, 11.06, 28600 * time.Millisecond, 100 * time.Millisecond},
		// 11.06 × 294 s / 9.48 = 5 m 43 s.
		{"one stand-in", 1, 1.58, 11.06, 5*time.Minute + 43*time.Second, time.Second},
		{"a small premium waits the cooldown", 1, 9, 10, cool, 0},
		{"spot dearer than on-demand: the cooldown", 4, 12, 10, cool, 0},
		{"no spot price: the cooldown", 4, 0, 10, cool, 0},
		{"no stand-ins: the cooldown", 0, 1, 10, cool, 0},
	} {
		got := swapWait(c.standIns, c.spot, c.od, cold, cool)
		if d := got - c.want; d > c.within || d < -c.within {
			t.Errorf("%s: swapWait = %s; want %s ± %s", c.name, got, c.want, c.within)
		}
	}
}

// At max_replicas, a fleet of on-demand stand-ins is swapped for spot as soon as waiting
// has cost one failed swap, not after the whole zone cooldown: 16 stand-ins at $10/h
// against spot at $4/h pay a failed swap's $0.82 (294 s at $10/h) in 31 s.
func TestStandInsSwapOnceWaitingCostsAFailedSwap(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) {
		p.DynamicFallback = true
		p.MaxReplicas = 16
	})
	oneZone := offers()[:2] // on-demand and spot in us-east-1a
	var existing []Placed
	for i := range 16 {
		existing = append(existing, Placed{ID: fmt.Sprintf("od%d", i), Capacity: fleet.OnDemand, Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Ready: true})
	}
	pl.Refused(oneZone[1], p0)
	if plan := pl.Plan(p0.Add(30*time.Second), 16, existing, oneZone); len(plan.Drain) != 0 {
		t.Fatalf("30 s after the refusal: drained %v; want none before 30.6 s", drained(plan))
	}
	plan := pl.Plan(p0.Add(31*time.Second), 16, existing, oneZone)
	if len(plan.Drain) != 1 || !strings.Contains(plan.Drain[0].Reason, "makes room for a spot replica") {
		t.Fatalf("31 s after the refusal: drains %+v; want one stand-in making room", plan.Drain)
	}
	// At max_replicas 1 the swap leaves no replica ready, an outage for a cold start however
	// it ends: it waits for the zone cooldown (the e2e Karpenter run drained the only,
	// ready on-demand replacement 161 s after a refusal).
	pl = policy(func(p *PlacementPolicy) { p.DynamicFallback, p.MaxReplicas = true, 1 })
	lone := existing[:1]
	pl.Refused(oneZone[1], p0)
	if plan := pl.Plan(p0.Add(9*time.Minute), 1, lone, oneZone); len(plan.Drain) != 0 {
		t.Fatalf("max_replicas 1, 9 minutes after the refusal: drained %v; want the cooldown", drained(plan))
	}
	if plan := pl.Plan(p0.Add(10*time.Minute), 1, lone, oneZone); len(plan.Drain) != 1 {
		t.Fatalf("max_replicas 1, after the cooldown: drains %+v; want the swap", plan.Drain)
	}
	// RelaunchCosts off: the swap waits for the zone cooldown (10 minutes).
	pl = policy(func(p *PlacementPolicy) { p.DynamicFallback, p.MaxReplicas, p.RelaunchCosts = true, 16, false })
	pl.Refused(oneZone[1], p0)
	if plan := pl.Plan(p0.Add(9*time.Minute), 16, existing, oneZone); len(plan.Drain) != 0 {
		t.Fatalf("RelaunchCosts off, 9 minutes after the refusal: drained %v", drained(plan))
	}
	if plan := pl.Plan(p0.Add(10*time.Minute), 16, existing, oneZone); len(plan.Drain) != 1 {
		t.Fatalf("RelaunchCosts off, after the cooldown: drains %+v; want one", plan.Drain)
	}
}
