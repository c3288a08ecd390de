package scaling

import (
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

var p0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Offers shaped like a real catalog: one on-demand price, spot in three zones.
func offers() []Offer {
	return []Offer{
		{Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Capacity: fleet.OnDemand, PricePerHour: 10},
		{Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Capacity: fleet.Spot, PricePerHour: 4},
		{Provider: "aws", Region: "us-east-1", Zone: "us-east-1b", Capacity: fleet.Spot, PricePerHour: 3},
		{Provider: "aws", Region: "us-east-1", Zone: "us-east-1c", Capacity: fleet.Spot, PricePerHour: 5},
	}
}

func policy(mod func(*PlacementPolicy)) *Placer {
	p := PlacementPolicy{UseSpot: true, MaxSpotPriceRatio: 0.6, ZoneCooldown: 10 * time.Minute}
	if mod != nil {
		mod(&p)
	}
	pl, err := NewPlacer(p)
	if err != nil {
		panic(err)
	}
	return pl
}

func zones(ls []Launch) []string {
	var out []string
	for _, l := range ls {
		out = append(out, string(l.Offer.Capacity)+"@"+l.Offer.Zone)
	}
	return out
}

func eq(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("%s = %v; want %v", what, got, want)
	}
}

func TestReservedFirstThenSpotSpreadCheapestFirst(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) {
		p.Reserved = []Slot{{Provider: "lambda", Region: "us-tx", Zone: "us-tx-1", Count: 1, PricePerHour: 2}}
	})
	plan := pl.Plan(p0, 4, nil, offers())
	eq(t, "launches", zones(plan.Launch), "reserved@us-tx-1", "spot@us-east-1b", "spot@us-east-1a", "spot@us-east-1c")
	if plan.Want[fleet.Reserved] != 1 || plan.Want[fleet.Spot] != 3 || plan.Want[fleet.OnDemand] != 0 {
		t.Fatalf("want %v", plan.Want)
	}
	if !strings.Contains(plan.Launch[1].Reason, "spot $3.00/h ≤ 0.60 × on-demand $10.00/h") {
		t.Fatalf("reason %q does not name the quote and the rule", plan.Launch[1].Reason)
	}
	// A fourth spot replica goes back to the cheapest zone once every zone has one.
	existing := []Placed{{ID: "r", Capacity: fleet.Reserved, Provider: "lambda", Region: "us-tx", Zone: "us-tx-1", Ready: true}}
	for _, l := range plan.Launch[1:] {
		existing = append(existing, Placed{ID: l.Offer.Zone, Capacity: fleet.Spot, Provider: "aws", Region: "us-east-1", Zone: l.Offer.Zone, Ready: true})
	}
	eq(t, "fifth replica", zones(pl.Plan(p0, 5, existing, offers()).Launch), "spot@us-east-1b")
}

func TestOnDemandWhenSpotIsNotCheapEnough(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) { p.MaxSpotPriceRatio = 0.25 })
	plan := pl.Plan(p0, 2, nil, offers())
	eq(t, "launches", zones(plan.Launch), "on_demand@us-east-1a", "on_demand@us-east-1a")
	if !strings.Contains(plan.Reason, "spot $3.00/h > 0.25 × on-demand $10.00/h") {
		t.Fatalf("reason %q", plan.Reason)
	}
	eq(t, "without use_spot", zones(policy(func(p *PlacementPolicy) { p.UseSpot = false }).Plan(p0, 1, nil, offers()).Launch), "on_demand@us-east-1a")
}

// SpotHedge: base on-demand replicas always; stand-ins while spot replicas are not ready,
// drained when spot recovers.
func TestDynamicOnDemandFallback(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) { p.BaseOnDemand = 1; p.DynamicFallback = true })
	plan := pl.Plan(p0, 3, nil, offers())
	eq(t, "from nothing", zones(plan.Launch), "spot@us-east-1b", "spot@us-east-1a", "on_demand@us-east-1a", "on_demand@us-east-1a", "on_demand@us-east-1a")
	existing := []Placed{
		{ID: "od1", Capacity: fleet.OnDemand, Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Ready: true},
		{ID: "s1", Capacity: fleet.Spot, Provider: "aws", Region: "us-east-1", Zone: "us-east-1b", Ready: false},
		{ID: "s2", Capacity: fleet.Spot, Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Ready: false},
		{ID: "od2", Capacity: fleet.OnDemand, Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Ready: true},
		{ID: "od3", Capacity: fleet.OnDemand, Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Ready: false},
	}
	if plan := pl.Plan(p0, 3, existing, offers()); len(plan.Launch) != 0 || len(plan.Drain) != 0 {
		t.Fatalf("steady while spot starts: %+v", plan)
	}
	existing[1].Ready, existing[2].Ready = true, true
	plan = pl.Plan(p0, 3, existing, offers())
	if len(plan.Launch) != 0 || len(plan.Drain) != 2 || plan.Drain[0].ID != "od3" || plan.Drain[1].ID != "od2" {
		t.Fatalf("spot recovered: want od3 (not ready) then od2 (newest) drained, got %+v", plan.Drain)
	}
}

func TestOverprovisionIsNotCoveredByStandIns(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) { p.DynamicFallback = true; p.Overprovision = 1 })
	plan := pl.Plan(p0, 3, nil, offers())
	if plan.Want[fleet.Spot] != 3 || plan.Want[fleet.OnDemand] != 2 {
		t.Fatalf("want %v; 3 spot (1 overprovisioned) and 2 stand-ins", plan.Want)
	}
}

func TestPreemptedZoneAvoidedThenForgiven(t *testing.T) {
	pl := policy(nil)
	pl.Preempted("aws", "us-east-1", "us-east-1b", p0)
	eq(t, "cooling", zones(pl.Plan(p0.Add(time.Minute), 1, nil, offers()).Launch), "spot@us-east-1a")
	eq(t, "after cooldown", zones(pl.Plan(p0.Add(11*time.Minute), 1, nil, offers()).Launch), "spot@us-east-1b")
	// With fewer than two zones left active, all are active again.
	pl.Preempted("aws", "us-east-1", "us-east-1a", p0)
	pl.Preempted("aws", "us-east-1", "us-east-1c", p0)
	eq(t, "all preempted", zones(pl.Plan(p0.Add(time.Minute), 1, nil, offers()).Launch), "spot@us-east-1b")
}

func TestScaleDownKeepsSpotSpread(t *testing.T) {
	pl := policy(nil)
	existing := []Placed{
		{ID: "a1", Capacity: fleet.Spot, Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Ready: true},
		{ID: "b1", Capacity: fleet.Spot, Provider: "aws", Region: "us-east-1", Zone: "us-east-1b", Ready: true},
		{ID: "b2", Capacity: fleet.Spot, Provider: "aws", Region: "us-east-1", Zone: "us-east-1b", Ready: true},
		{ID: "c1", Capacity: fleet.Spot, Provider: "aws", Region: "us-east-1", Zone: "us-east-1c", Ready: true},
	}
	plan := pl.Plan(p0, 3, existing, offers())
	if len(plan.Drain) != 1 || plan.Drain[0].ID != "b2" {
		t.Fatalf("drain %+v; want b2 (the crowded zone's newest)", plan.Drain)
	}
}

func TestPlacementPolicyValidate(t *testing.T) {
	if _, err := NewPlacer(PlacementPolicy{MaxSpotPriceRatio: 1.5}); err == nil || !strings.Contains(err.Error(), "ratio") {
		t.Fatalf("err = %v", err)
	}
}

func spotAt(id, zone string, ready bool) Placed {
	return Placed{ID: id, Capacity: fleet.Spot, Provider: "aws", Region: "us-east-1", Zone: zone, Ready: ready}
}

func drained(pl Plan) []string {
	var out []string
	for _, d := range pl.Drain {
		out = append(out, d.ID)
	}
	return out
}

// When spot is priced out, the spot replicas serve until their on-demand replacements are
// ready: draining them at once would leave the service short for a whole cold start.
func TestMixChangeKeepsReadyReplicasUntilReplaced(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) { p.MaxSpotPriceRatio = 0.25 }) // spot $3 > 0.25 × $10
	existing := []Placed{spotAt("a", "us-east-1a", true), spotAt("b", "us-east-1b", true), spotAt("c", "us-east-1c", false)}
	plan := pl.Plan(p0, 3, existing, offers())
	eq(t, "launches", zones(plan.Launch), "on_demand@us-east-1a", "on_demand@us-east-1a", "on_demand@us-east-1a")
	eq(t, "drains while on-demand starts", drained(plan), "c") // not ready: serves nothing
	if !strings.Contains(plan.Reason, "2 ready replicas of the old mix serve until their replacements are ready") {
		t.Fatalf("reason %q does not say why spot stays", plan.Reason)
	}
	od := func(id string, ready bool) Placed {
		return Placed{ID: id, Capacity: fleet.OnDemand, Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Ready: ready}
	}
	existing = []Placed{existing[0], existing[1], od("x", true), od("y", false), od("z", false)}
	plan = pl.Plan(p0, 3, existing, offers())
	if len(plan.Launch) != 0 || len(plan.Drain) != 0 {
		t.Fatalf("one replacement ready, 3 ready for a target of 3: want no change, got %+v", plan)
	}
	existing[3].Ready = true
	eq(t, "two replacements ready", drained(pl.Plan(p0, 3, existing, offers())), "b")
	existing = []Placed{existing[0], existing[1], od("x", true), od("y", true), od("z", true)}
	eq(t, "all replacements ready", drained(pl.Plan(p0, 3, existing, offers())), "b", "a")
	// A scale-down at the same time drains what the smaller target leaves over at once.
	existing = []Placed{spotAt("a", "us-east-1a", true), spotAt("b", "us-east-1b", true), spotAt("c", "us-east-1c", true)}
	if got := drained(pl.Plan(p0, 1, existing, offers())); len(got) != 2 {
		t.Fatalf("target 3 → 1 while priced out: %v drained, want 2 (the third serves until its replacement is ready)", got)
	}
}

// Every zone refusing at once (no spot offer) is no reason to drain healthy spot replicas:
// they keep serving and only the shortfall is bought on-demand.
func TestNoSpotOfferKeepsRunningSpot(t *testing.T) {
	onlyOD := offers()[:1]
	pl := policy(nil)
	existing := []Placed{spotAt("a", "us-east-1a", true), spotAt("b", "us-east-1b", true)}
	plan := pl.Plan(p0, 2, existing, onlyOD)
	if len(plan.Launch) != 0 || len(plan.Drain) != 0 {
		t.Fatalf("steady spot fleet with no spot offer: want no change, got %+v", plan)
	}
	plan = pl.Plan(p0, 3, existing, onlyOD)
	eq(t, "scale up without spot offers", zones(plan.Launch), "on_demand@us-east-1a")
	if len(plan.Drain) != 0 || !strings.Contains(plan.Reason, "no spot offer now: keeping 2 spot replicas") {
		t.Fatalf("plan %+v", plan)
	}
	// With SpotHedge's fallback, a spot replica that is not ready gets its stand-in.
	pl = policy(func(p *PlacementPolicy) { p.DynamicFallback = true })
	existing[1].Ready = false
	plan = pl.Plan(p0, 2, existing, onlyOD)
	eq(t, "stand-in for the starting spot replica", zones(plan.Launch), "on_demand@us-east-1a")
	// Spot offered again: the on-demand replica that covered the shortfall leaves once the
	// spot replicas are ready.
	existing = []Placed{spotAt("a", "us-east-1a", true), spotAt("b", "us-east-1b", true),
		{ID: "od", Capacity: fleet.OnDemand, Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Ready: true}}
	eq(t, "spot back", drained(policy(nil).Plan(p0, 2, existing, offers())), "od")
}
