package scaling

import (
	"fmt"
	"slices"
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
	p := PlacementPolicy{UseSpot: true, MaxSpotPriceRatio: 0.6, ZoneCooldown: 10 * time.Minute, RelaunchCosts: true}
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
		p.ZoneRule = ZoneFewestThenCheapest
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
	pl := policy(func(p *PlacementPolicy) {
		p.BaseOnDemand = 1
		p.DynamicFallback = true
		p.StandInForStarting = true
		p.ZoneRule = ZoneFewestThenCheapest
	})
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

// Arbiter's fallback stands in only for the spot it could not launch: an on-demand replica
// launched beside a starting spot one starts no sooner, so it would never serve first.
func TestStandInsOnlyForSpotThatCannotLaunch(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) {
		p.BaseOnDemand = 1
		p.DynamicFallback = true
		p.RefusalBackoff = time.Minute
		p.ZoneRule = ZoneFewestThenCheapest
	})
	plan := pl.Plan(p0, 3, nil, offers())
	eq(t, "from nothing", zones(plan.Launch), "spot@us-east-1b", "spot@us-east-1a", "on_demand@us-east-1a")
	starting := []Placed{
		{ID: "od1", Capacity: fleet.OnDemand, Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Ready: true},
		{ID: "s1", Capacity: fleet.Spot, Provider: "aws", Region: "us-east-1", Zone: "us-east-1b", Ready: false},
		{ID: "s2", Capacity: fleet.Spot, Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Ready: false},
	}
	if plan := pl.Plan(p0, 3, starting, offers()); len(plan.Launch) != 0 || len(plan.Drain) != 0 {
		t.Fatalf("spot starting: want no stand-in, got %+v", plan)
	}
	// Every zone refuses the two spot launches: on-demand covers them; a zone that comes
	// back gets spot again, and the on-demand replicas serve until it is ready.
	for _, z := range []string{"us-east-1a", "us-east-1b", "us-east-1c"} {
		pl.Refused(Offer{Provider: "aws", Region: "us-east-1", Zone: z, Capacity: fleet.Spot}, p0)
	}
	plan = pl.Plan(p0, 3, []Placed{starting[0]}, offers())
	eq(t, "spot refused everywhere", zones(plan.Launch), "on_demand@us-east-1a", "on_demand@us-east-1a")
}

// A lone spot replica is hedged by a second in another zone (spot_policy.min_zones 2), which
// no on-demand stand-in covers; a target of two is its own hedge; min_zones 1 turns it off.
func TestLoneSpotReplicaIsHedged(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) { p.SpotMinZones = 2; p.DynamicFallback = true })
	plan := pl.Plan(p0, 1, nil, offers())
	eq(t, "target 1", zones(plan.Launch), "spot@us-east-1b", "spot@us-east-1a")
	// The pair must still cost ≤ 0.6 × on-demand ($10): at $3.50 each it does not.
	dear := offers()
	dear[2].PricePerHour = 3.5
	eq(t, "target 1, a dear pair", zones(policy(func(p *PlacementPolicy) { p.SpotMinZones = 2 }).Plan(p0, 1, nil, dear).Launch), "spot@us-east-1b")
	if !strings.Contains(plan.Reason, "hedges the lone one") || plan.Want[fleet.OnDemand] != 0 {
		t.Fatalf("plan %+v", plan)
	}
	// One zone left (the others refused lately): the hedge is not stood in for on-demand.
	pl = policy(func(p *PlacementPolicy) { p.SpotMinZones = 2; p.DynamicFallback = true; p.RefusalBackoff = time.Minute })
	pl.Refused(Offer{Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Capacity: fleet.Spot}, p0)
	pl.Refused(Offer{Provider: "aws", Region: "us-east-1", Zone: "us-east-1c", Capacity: fleet.Spot}, p0)
	plan = pl.Plan(p0, 1, nil, offers())
	eq(t, "target 1, one zone offered: no hedge in the same zone", zones(plan.Launch), "spot@us-east-1b")
	if plan.Want[fleet.OnDemand] != 0 || plan.Want[fleet.Spot] != 1 {
		t.Fatalf("want %v: one spot replica, no stand-in for the hedge", plan.Want)
	}
	eq(t, "target 2", zones(policy(func(p *PlacementPolicy) { p.SpotMinZones = 2 }).Plan(p0, 2, nil, offers()).Launch), "spot@us-east-1b", "spot@us-east-1a")
	eq(t, "min_zones 1", zones(policy(func(p *PlacementPolicy) { p.SpotMinZones = 1 }).Plan(p0, 1, nil, offers()).Launch), "spot@us-east-1b")
}

func TestOverprovisionIsNotCoveredByStandIns(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) { p.DynamicFallback = true; p.StandInForStarting = true; p.Overprovision = 1 })
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
	pl = policy(func(p *PlacementPolicy) { p.DynamicFallback = true; p.StandInForStarting = true })
	existing[1].Ready = false
	plan = pl.Plan(p0, 2, existing, onlyOD)
	eq(t, "stand-in for the starting spot replica", zones(plan.Launch), "on_demand@us-east-1a")
	// Spot offered again: the on-demand replica that covered the shortfall leaves once the
	// spot replicas are ready.
	existing = []Placed{spotAt("a", "us-east-1a", true), spotAt("b", "us-east-1b", true),
		{ID: "od", Capacity: fleet.OnDemand, Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Ready: true}}
	eq(t, "spot back", drained(policy(nil).Plan(p0, 2, existing, offers())), "od")
}

// A refusal keeps that offer out of the plan for RefusalBackoff even when the cooldown has
// run out of zones (with fewer than two zones left every zone is active again); the
// place's other capacity kind is still offered. Refusals in every spot zone leave no spot
// offer: the shortfall goes on-demand.
func TestRefusedOfferLeavesThePlanForTheBackoff(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) { p.RefusalBackoff = 30 * time.Second })
	two := []Offer{offers()[0], offers()[1], offers()[2]} // on-demand and spot in 1a, spot in 1b
	pl.Refused(two[2], p0)                                // 1b: cooling, and out of the plan
	eq(t, "1b refused", zones(pl.Plan(p0.Add(time.Second), 2, nil, two).Launch), "spot@us-east-1a", "spot@us-east-1a")
	pl.Refused(two[1], p0.Add(time.Second)) // 1a's spot too: no spot offer; 1a's on-demand stays
	plan := pl.Plan(p0.Add(2*time.Second), 2, nil, two)
	eq(t, "every spot zone refused", zones(plan.Launch), "on_demand@us-east-1a", "on_demand@us-east-1a")
	if !strings.Contains(plan.Reason, "no spot offer") {
		t.Fatalf("reason %q", plan.Reason)
	}
	// After the backoff both zones are offered again; both are still cooling, which with
	// fewer than two active zones means all are active: the cheapest first.
	eq(t, "after the backoff", zones(pl.Plan(p0.Add(31*time.Second), 1, nil, two).Launch), "spot@us-east-1b")
	if len(pl.refused) != 0 {
		t.Fatalf("%d refusals remembered past the backoff", len(pl.refused))
	}
}

func spotPriced(id, zone string, price float64, ready bool) Placed {
	p := spotAt(id, zone, ready)
	p.PricePerHour = price
	return p
}

// Rebalancing: a ready spot replica moves to a zone at least RebalanceMinSaving cheaper,
// its replacement first; it drains once the replacement is ready; one move at a time, and
// never into a zone that would then hold more of the service's spot replicas than the one
// it leaves.
func TestSpotRebalancesToACheaperZone(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) { p.RebalanceMinSaving = 0.2; p.RefusalBackoff = 30 * time.Second })
	x := spotPriced("x", "us-east-1c", 5, true)
	plan := pl.Plan(p0, 1, []Placed{x}, offers())
	eq(t, "move from 1c ($5)", zones(plan.Launch), "spot@us-east-1b")
	if len(plan.Drain) != 0 || !strings.Contains(plan.Launch[0].Reason, "rebalance: spot in aws/us-east-1/us-east-1b at $3.00/h replaces x") {
		t.Fatalf("plan %+v", plan)
	}
	y := spotPriced("y", "us-east-1b", 3, false)
	plan = pl.Plan(p0.Add(time.Minute), 1, []Placed{x, y}, offers())
	if len(plan.Launch) != 0 || len(plan.Drain) != 0 || !strings.Contains(plan.Reason, "moving spot replica x") {
		t.Fatalf("while the replacement starts: want no change, got %+v", plan)
	}
	y.Ready = true
	plan = pl.Plan(p0.Add(5*time.Minute), 1, []Placed{x, y}, offers())
	if len(plan.Launch) != 0 || len(plan.Drain) != 1 || plan.Drain[0].ID != "x" || !strings.Contains(plan.Drain[0].Reason, "rebalance: its replacement") {
		t.Fatalf("replacement ready: want x drained, got %+v", plan)
	}
	if plan := pl.Plan(p0.Add(6*time.Minute), 1, []Placed{y}, offers()); len(plan.Launch)+len(plan.Drain) != 0 || pl.moving != nil {
		t.Fatalf("at $3, nothing 20 %% cheaper: want no move, got %+v", plan)
	}

	// Spread first: from 1c ($5) the move goes to 1a ($4), not to 1b ($3), which already
	// has one of the two.
	pl = policy(func(p *PlacementPolicy) { p.RebalanceMinSaving = 0.2 })
	eq(t, "spread kept", zones(pl.Plan(p0, 2, []Placed{spotPriced("b", "us-east-1b", 3, true), spotPriced("c", "us-east-1c", 5, true)}, offers()).Launch), "spot@us-east-1a")
	// Not enough saving: $3 vs $4 is 25 %, under a 30 % bar.
	pl = policy(func(p *PlacementPolicy) { p.RebalanceMinSaving = 0.3 })
	if plan := pl.Plan(p0, 1, []Placed{spotPriced("a", "us-east-1a", 4, true)}, offers()); len(plan.Launch) != 0 {
		t.Fatalf("25 %% saving with a 30 %% bar: %+v", plan.Launch)
	}
	// Only a steady, ready fleet moves.
	pl = policy(func(p *PlacementPolicy) { p.RebalanceMinSaving = 0.2 })
	if plan := pl.Plan(p0, 1, []Placed{spotPriced("c", "us-east-1c", 5, false)}, offers()); len(plan.Launch) != 0 {
		t.Fatalf("a replica still starting was moved: %+v", plan.Launch)
	}
	// 0 never moves.
	pl = policy(nil)
	if plan := pl.Plan(p0, 1, []Placed{x}, offers()); len(plan.Launch) != 0 {
		t.Fatalf("rebalancing off: %+v", plan.Launch)
	}
}

// RebalanceWhenItPays (Arbiter's default): a ready spot replica moves when the expected
// saving over the replacement's expected life pays for the replacement's cold start, the
// zones' preemptions priced in; no fixed fraction is needed.
func TestSpotMovesWhenItPaysForItsColdStart(t *testing.T) {
	paying := func() *Placer {
		return policy(func(p *PlacementPolicy) { p.RebalanceWhenItPays = true; p.ColdStart = 294 * time.Second })
	}
	at := func(zone string, price float64) []Offer {
		o := offers()
		for i := range o {
			if o[i].Zone == zone && o[i].Capacity == fleet.Spot {
				o[i].PricePerHour = price
			}
		}
		return o
	}
	// $5 against $3: $2.06 an hour (the preemptions priced in) over a zone's prior life of
	// 2.66 h, against $0.24 of cold start at $3.
	plan := paying().Plan(p0, 1, []Placed{spotPriced("x", "us-east-1c", 5, true)}, offers())
	eq(t, "$5 → $3", zones(plan.Launch), "spot@us-east-1b")
	if !strings.Contains(plan.Launch[0].Reason, "expected $2.06/h less over its expected 2.7 h there, against $0.24 for its cold start") {
		t.Fatalf("reason %q", plan.Launch[0].Reason)
	}
	// $3.05 against $3: about $0.14 over 2.66 h does not pay for $0.24 of cold start.
	if plan := paying().Plan(p0, 1, []Placed{spotPriced("x", "us-east-1c", 3.05, true)}, at("us-east-1c", 3.05)); len(plan.Launch) != 0 {
		t.Fatalf("a move saving about $0.14 for a $0.24 cold start: %+v", plan.Launch)
	}
	// $3.60 against $3 pays where the cheaper zone is not known to preempt; two hours after it
	// took a replica back (past moveQuiet), its preemptions eat the saving and its expected
	// life is an hour: no move. A fixed 10 % bar moves regardless.
	x := spotPriced("x", "us-east-1c", 3.6, true)
	eq(t, "$3.60 → $3, nothing known", zones(paying().Plan(p0, 1, []Placed{x}, at("us-east-1c", 3.6)).Launch), "spot@us-east-1b")
	pl := paying()
	pl.Preempted("aws", "us-east-1", "us-east-1b", p0.Add(-2*time.Hour))
	if plan := pl.Plan(p0, 1, []Placed{x}, at("us-east-1c", 3.6)); len(plan.Launch) != 0 {
		t.Fatalf("moved into a zone whose preemptions eat the saving: %+v", plan.Launch)
	}
	fixed := policy(func(p *PlacementPolicy) { p.RebalanceMinSaving = 0.1; p.ColdStart = 294 * time.Second })
	fixed.Preempted("aws", "us-east-1", "us-east-1b", p0.Add(-2*time.Hour))
	eq(t, "a fixed 10 % bar", zones(fixed.Plan(p0, 1, []Placed{x}, at("us-east-1c", 3.6)).Launch), "spot@us-east-1b")
}

// A move whose replacement is refused, or not ready within moveTimeout, is given up: the
// old replica stays, and a replacement still starting is drained as an extra.
func TestSpotMoveGivenUp(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) { p.RebalanceMinSaving = 0.2; p.RefusalBackoff = 30 * time.Second })
	x := spotPriced("x", "us-east-1c", 5, true)
	eq(t, "move", zones(pl.Plan(p0, 1, []Placed{x}, offers()).Launch), "spot@us-east-1b")
	pl.Refused(Offer{Provider: "aws", Region: "us-east-1", Zone: "us-east-1b", Capacity: fleet.Spot}, p0.Add(time.Second))
	plan := pl.Plan(p0.Add(2*time.Second), 1, []Placed{x}, offers())
	eq(t, "refused: the next cheaper zone", zones(plan.Launch), "spot@us-east-1a")
	if len(plan.Drain) != 0 || pl.moving == nil || pl.moving.to.Zone != "us-east-1a" {
		t.Fatalf("plan %+v, moving %+v", plan, pl.moving)
	}
	slow := spotPriced("s", "us-east-1a", 4, false)
	if plan := pl.Plan(p0.Add(10*time.Minute), 1, []Placed{x, slow}, offers()); len(plan.Drain) != 0 {
		t.Fatalf("within the timeout: %+v", plan.Drain)
	}
	plan = pl.Plan(p0.Add(2*time.Second+moveTimeout), 1, []Placed{x, slow}, offers())
	if pl.moving != nil || len(plan.Launch) != 0 || len(plan.Drain) != 1 || plan.Drain[0].ID != "s" {
		t.Fatalf("timed out: want s drained and the move given up, got %+v (moving %v)", plan, pl.moving)
	}
}

// The review's cases: a fleet not yet steady does not move; a move judges the replica by
// its zone's price now; a move whose replacement never comes is given up and its zone left
// alone for moveQuiet; the on-demand shortfall bought while no spot was offered is not
// drained, still starting, when an offer comes back.
func TestSpotMoveEdges(t *testing.T) {
	rebalancing := func() *Placer {
		return policy(func(p *PlacementPolicy) { p.RebalanceMinSaving = 0.2; p.ZoneRule = ZoneFewestThenCheapest })
	}
	// Two wanted, one still starting: not steady, so the $5 replica does not move yet.
	if plan := rebalancing().Plan(p0, 2, []Placed{spotPriced("c", "us-east-1c", 5, true), spotPriced("a", "us-east-1a", 4, false)}, offers()); len(plan.Launch) != 0 {
		t.Fatalf("moved while the fleet was still starting: %+v", plan.Launch)
	}
	// Launched at $5, but its zone quotes $3.50 now: $3 is not 20 % below that.
	cheaper := offers()
	cheaper[3].PricePerHour = 3.5
	if plan := rebalancing().Plan(p0, 1, []Placed{spotPriced("c", "us-east-1c", 5, true)}, cheaper); len(plan.Launch) != 0 {
		t.Fatalf("moved on the launch price, not the price now: %+v", plan.Launch)
	}
	// A replacement never launched (say a crash loop's backoff held it): given up after
	// moveTimeout, and its zone is not tried again within moveQuiet.
	pl := rebalancing()
	x := spotPriced("x", "us-east-1c", 5, true)
	eq(t, "move", zones(pl.Plan(p0, 1, []Placed{x}, offers()).Launch), "spot@us-east-1b")
	if plan := pl.Plan(p0.Add(moveTimeout-time.Second), 1, []Placed{x}, offers()); len(plan.Launch) != 0 {
		t.Fatalf("a second move while one is under way: %+v", plan.Launch)
	}
	plan := pl.Plan(p0.Add(moveTimeout), 1, []Placed{x}, offers())
	if !strings.Contains(plan.Reason, "gave up moving spot replica x to aws/us-east-1/us-east-1b") {
		t.Fatalf("reason %q", plan.Reason)
	}
	eq(t, "after giving up: the next zone, not 1b again", zones(plan.Launch), "spot@us-east-1a")

	// No spot offer: the shortfall (1) goes on-demand; when spot is offered again that
	// on-demand replica, still starting, stays until a third spot replica is ready.
	pl = policy(func(p *PlacementPolicy) { p.ZoneRule = ZoneFewestThenCheapest })
	spot := []Placed{spotAt("a", "us-east-1a", true), spotAt("b", "us-east-1b", true)}
	eq(t, "shortfall", zones(pl.Plan(p0, 3, spot, offers()[:1]).Launch), "on_demand@us-east-1a")
	od := Placed{ID: "od", Capacity: fleet.OnDemand, Provider: "aws", Region: "us-east-1", Zone: "us-east-1a"}
	plan = pl.Plan(p0.Add(time.Second), 3, append(spot, od), offers())
	eq(t, "spot back", zones(plan.Launch), "spot@us-east-1c")
	if len(plan.Drain) != 0 {
		t.Fatalf("the starting on-demand shortfall was drained when spot came back: %+v", plan.Drain)
	}
	od.Ready = true
	third := spotAt("c", "us-east-1c", true)
	eq(t, "third spot ready", drained(pl.Plan(p0.Add(10*time.Minute), 3, append(spot, od, third), offers())), "od")
}

// max_replicas bounds everything alive: stand-ins and replacements wait for room, the
// reason says the bound binds, a replica leaving still counts, and at the bound an
// on-demand stand-in makes room for the spot replica it stands in for, one at a time.
func TestMaxReplicasBoundsTheWholeFleet(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) {
		p.DynamicFallback = true
		p.StandInForStarting = true
		p.MaxReplicas = 3
		p.ZoneRule = ZoneFewestThenCheapest
	})
	plan := pl.Plan(p0, 3, nil, offers())
	eq(t, "from nothing", zones(plan.Launch), "spot@us-east-1b", "spot@us-east-1a", "spot@us-east-1c")
	if !strings.Contains(plan.Reason, "max_replicas 3 binding: 0 alive (0 leaving), 3 of 6 launches held") {
		t.Fatalf("reason %q does not say the bound binds", plan.Reason)
	}
	// A spot replica reclaimed after a notice: its replacement waits until it is gone.
	s := func(id, zone string, ready, leaving bool) Placed {
		return Placed{ID: id, Capacity: fleet.Spot, Provider: "aws", Region: "us-east-1", Zone: zone, Ready: ready, Leaving: leaving}
	}
	existing := []Placed{s("s1", "us-east-1b", true, false), s("s2", "us-east-1a", true, false), s("s3", "us-east-1c", true, true)}
	if plan := pl.Plan(p0, 3, existing, offers()); len(plan.Launch) != 0 {
		t.Fatalf("launched %v beside a leaving replica at the bound", zones(plan.Launch))
	}
	// Spot refused for a while: two on-demand stand-ins fill the room; when spot is back,
	// one stand-in at a time makes room.
	od := func(id string) Placed {
		return Placed{ID: id, Capacity: fleet.OnDemand, Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Ready: true}
	}
	existing = []Placed{s("s1", "us-east-1b", true, false), od("od1"), od("od2")}
	plan = pl.Plan(p0, 3, existing, offers())
	if len(plan.Launch) != 0 || len(plan.Drain) != 1 || plan.Drain[0].ID != "od2" || !strings.Contains(plan.Drain[0].Reason, "makes room for a spot replica") {
		t.Fatalf("at the bound with stand-ins: launches %v, drains %+v", zones(plan.Launch), plan.Drain)
	}
	existing[2].Leaving = true // od2 drains
	if plan := pl.Plan(p0, 3, existing, offers()); len(plan.Drain) != 0 || len(plan.Launch) != 0 {
		t.Fatalf("a second swap while the first is under way: %+v", plan)
	}
	existing = existing[:2] // od2 gone: room for one spot replica
	eq(t, "after the swap", zones(pl.Plan(p0, 3, existing, offers()).Launch), "spot@us-east-1a")
	// The next swap waits for that spot replica to be ready: one replica short at a time.
	existing = append(existing, s("s4", "us-east-1a", false, false))
	if plan := pl.Plan(p0, 3, existing, offers()); len(plan.Drain) != 0 {
		t.Fatalf("a second stand-in swapped out while the first swap's spot replica starts: %+v", plan.Drain)
	}
	existing[2].Ready = true
	if plan := pl.Plan(p0, 3, existing, offers()); len(plan.Drain) != 1 || plan.Drain[0].ID != "od1" {
		t.Fatalf("the next swap once the spot replica is ready: drains %+v, want od1", plan.Drain)
	}
	// No swap toward a zone that preempted lately: the room would likely go back to
	// on-demand soon, a launch and a cold start for nothing. Lately is swapWait: here the
	// two stand-ins' premium over spot ($6–7/h) pays a failed swap's on-demand cold start
	// ($0.82) in 4.1–4.9 minutes, within the 10-minute cooldown.
	pl.Preempted("aws", "us-east-1", "us-east-1a", p0)
	pl.Preempted("aws", "us-east-1", "us-east-1c", p0)
	existing = []Placed{s("s1", "us-east-1b", true, false), od("od1"), od("od2")}
	if plan := pl.Plan(p0.Add(4*time.Minute), 3, existing, offers()); len(plan.Drain) != 0 {
		t.Fatalf("a stand-in swapped out for a zone that preempted 4 minutes ago: %+v", plan.Drain)
	}
	if plan := pl.Plan(p0.Add(5*time.Minute), 3, existing, offers()); len(plan.Drain) != 1 {
		t.Fatalf("no swap once waiting has cost a failed swap: %+v", plan)
	}
	// A stand-in still starting is never the one swapped out: its cold start is paid, and
	// the spot replica it would make room for may be refused again (issue 47's Karpenter
	// run: the only replica's on-demand replacement drained 31 s into its cold start).
	// (roomMaker picks the ready one: TestRoomMakerIsAReadyStandIn.) And while a stand-in
	// starts the service is a replica short already: no swap makes it two.
	existing[2].Ready = false
	if plan := pl.Plan(p0.Add(12*time.Minute), 3, existing, offers()); len(plan.Drain) != 0 {
		t.Fatalf("at the bound with a ready and a starting stand-in: drains %+v; want none until it is ready", plan.Drain)
	}
	existing[1].Ready = false
	if plan := pl.Plan(p0.Add(13*time.Minute), 3, existing, offers()); len(plan.Drain) != 0 {
		t.Fatalf("a stand-in swapped out while still starting: %+v", plan.Drain)
	}
}

// Arbiter's zone rule: the cheapest by expected cost within each zone's share of the spot
// fleet; a zone that keeps preempting loses its price advantage; a scale-down keeps the
// spread first and the cheap zones' replicas next.
func TestSpotZoneByExpectedCost(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) { p.SpotMinZones = 2 })
	eq(t, "from nothing, half per zone at most", zones(pl.Plan(p0, 4, nil, offers()).Launch),
		"spot@us-east-1b", "spot@us-east-1b", "spot@us-east-1a", "spot@us-east-1a")

	// Five hours with a replica in each of 1a and 1b; 1b takes back ten of them.
	running := []Placed{spotPriced("a", "us-east-1a", 4, true), spotPriced("b", "us-east-1b", 3, true)}
	at := p0
	for range 10 {
		pl.Plan(at, 2, running, offers())
		at = at.Add(30 * time.Minute)
		pl.Preempted("aws", "us-east-1", "us-east-1b", at.Add(-20*time.Minute))
	}
	pl.Plan(at, 2, running, offers())
	if rb, ra := pl.preemptionRate("aws/us-east-1/us-east-1b"), pl.preemptionRate("aws/us-east-1/us-east-1a"); !(rb > 1 && ra < 0.5) {
		t.Fatalf("preemption rates: 1b %.2f/h, 1a %.2f/h; want 1b's above 1 and 1a's below 0.5", rb, ra)
	}
	// Three replicas now go to 1a ($4) first, two of them (its share), and only the third to
	// 1b ($3), though 1b's cooldown is over.
	eq(t, "after 1b's preemptions", zones(pl.Plan(at, 3, nil, offers()).Launch), "spot@us-east-1a", "spot@us-east-1a", "spot@us-east-1b")
	// A placer without the record takes the price.
	eq(t, "without the record", zones(policy(func(p *PlacementPolicy) { p.SpotMinZones = 2 }).Plan(at, 3, nil, offers()).Launch),
		"spot@us-east-1b", "spot@us-east-1b", "spot@us-east-1a")

	// Scale-down from 4 to 2, two each in 1a and 1c: both zones hold more than their new
	// share (1), the dearer one's newest goes first, then 1a's newest: one stays in each.
	fleet4 := []Placed{spotPriced("a1", "us-east-1a", 4, true), spotPriced("a2", "us-east-1a", 4, true),
		spotPriced("c1", "us-east-1c", 5, true), spotPriced("c2", "us-east-1c", 5, true)}
	got := drained(policy(func(p *PlacementPolicy) { p.SpotMinZones = 2 }).Plan(p0, 2, fleet4, offers()))
	eq(t, "scale-down", got, "c2", "a2")
	// From 4 to 3 with 1a holding three: 1a's newest, though 1c is dearer.
	fleet4[2].ID, fleet4[2].Zone = "a3", "us-east-1a"
	fleet4[2].PricePerHour = 4
	got = drained(policy(func(p *PlacementPolicy) { p.SpotMinZones = 2 }).Plan(p0, 3, fleet4, offers()))
	eq(t, "over its share", got, "a3")
}

// SkyServe's placer: zones holding none of the service's spot replicas first, then the
// cheapest by price, however many replicas the cheapest already holds.
func TestSpotZoneUnusedThenCheapest(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) { p.ZoneRule = ZoneUnusedThenCheapest })
	eq(t, "from nothing", zones(pl.Plan(p0, 3, nil, offers()).Launch), "spot@us-east-1b", "spot@us-east-1a", "spot@us-east-1c")
	existing := []Placed{spotAt("b1", "us-east-1b", true), spotAt("b2", "us-east-1b", true), spotAt("a1", "us-east-1a", true), spotAt("c1", "us-east-1c", true)}
	eq(t, "every zone used", zones(pl.Plan(p0, 5, existing, offers()).Launch), "spot@us-east-1b")
	eq(t, "1c unused", zones(pl.Plan(p0, 4, existing[:3], offers()).Launch), "spot@us-east-1c")
}

// The hedge's reason says only what the plan does: no hedge is claimed where no second zone
// can hold one, and no comparison with an on-demand price that no offer gives.
func TestHedgeReasonIsTrue(t *testing.T) {
	hedged := func(p *PlacementPolicy) { p.SpotMinZones = 2 }
	spotOnly := func(zones ...string) []Offer {
		var out []Offer
		for _, z := range zones {
			out = append(out, Offer{Provider: "kubernetes:c", Region: "r", Zone: z, Capacity: fleet.Spot, PricePerHour: 0.5})
		}
		return out
	}
	// One spot zone, no on-demand price, nothing taken back yet: one replica and no hedge,
	// said as such.
	plan := policy(hedged).Plan(p0, 1, nil, spotOnly("z1"))
	eq(t, "one zone", zones(plan.Launch), "spot@z1")
	for _, s := range append([]string{plan.Reason}, plan.Launch[0].Reason) {
		if strings.Contains(s, "hedge") || strings.Contains(s, "× on-demand") {
			t.Errorf("one spot zone, no on-demand price: reason %q claims a hedge or an on-demand comparison", s)
		}
	}
	// Once the zone has taken a replica back, the hedge goes in that zone, said as such
	// (TestSameZoneHedgeOnlyWhereNoOtherZoneSellsSpot), with no on-demand comparison.
	reclaimed := policy(hedged)
	reclaimed.Plan(p0, 1, []Placed{{ID: "r0", Capacity: fleet.Spot, Provider: "kubernetes:c", Region: "r", Zone: "z1", Ready: true}}, spotOnly("z1"))
	reclaimed.Preempted("kubernetes:c", "r", "z1", p0)
	plan = reclaimed.Plan(p0.Add(time.Minute), 1, nil, spotOnly("z1"))
	eq(t, "one zone that took a replica back", zones(plan.Launch), "spot@z1", "spot@z1")
	for _, s := range append([]string{plan.Reason}, plan.Launch[0].Reason) {
		if !strings.Contains(s, "in the same zone hedges") || strings.Contains(s, "× on-demand") {
			t.Errorf("one spot zone, no on-demand price: reason %q; want the same-zone hedge and no on-demand comparison", s)
		}
	}
	// The lone replica runs in a zone that took two at once three times: nothing launches,
	// and nothing claims a hedge.
	lone := []Placed{{ID: "r1", Capacity: fleet.Spot, Provider: "kubernetes:c", Region: "r", Zone: "z1", Ready: true}}
	pl := policy(hedged)
	for i := range 3 {
		t0 := p0.Add(time.Duration(i) * time.Hour)
		pl.Plan(t0, 2, append(slices.Clone(lone), Placed{ID: "r2", Capacity: fleet.Spot, Provider: "kubernetes:c", Region: "r", Zone: "z1", Ready: true}), spotOnly("z1"))
		pl.Preempted("kubernetes:c", "r", "z1", t0)
		pl.Preempted("kubernetes:c", "r", "z1", t0.Add(time.Second))
	}
	plan = pl.Plan(p0.Add(3*time.Hour), 1, lone, spotOnly("z1"))
	if len(plan.Launch) != 0 || strings.Contains(plan.Reason, "hedge") || plan.Want[fleet.Spot] != 1 {
		t.Errorf("lone replica, one zone that took two at once: plan %+v; want nothing launched and no hedge claimed", plan)
	}
	// Two zones, no on-demand price: a hedge, without an on-demand comparison.
	plan = policy(hedged).Plan(p0, 1, nil, spotOnly("z1", "z2"))
	eq(t, "two zones", zones(plan.Launch), "spot@z1", "spot@z2")
	if !strings.Contains(plan.Reason, "hedges the lone one") || strings.Contains(plan.Reason, "× on-demand") {
		t.Errorf("two zones, no on-demand price: reason %q; want a hedge with no on-demand comparison", plan.Reason)
	}
	// With an on-demand price, the comparison stays.
	plan = policy(hedged).Plan(p0, 1, nil, offers())
	if !strings.Contains(plan.Reason, "two at the cheapest spot price, $6.00/h, ≤ 0.60 × on-demand $10.00/h") {
		t.Errorf("reason %q; want the pair compared with on-demand", plan.Reason)
	}
}

// An offer from nodes that name no region or zone (an on-prem Kubernetes pool) is placed
// by its provider alone: no reason prints an empty place.
func TestPlaceWithoutRegionOrZone(t *testing.T) {
	offers := []Offer{{Provider: "kubernetes:x", Capacity: fleet.OnDemand, PricePerHour: 10}, {Provider: "kubernetes:x", Capacity: fleet.Spot, PricePerHour: 3}}
	plan := policy(nil).Plan(p0, 2, nil, offers)
	if len(plan.Launch) == 0 {
		t.Fatalf("no launch: %s", plan.Reason)
	}
	for _, l := range append(plan.Launch, Launch{Reason: plan.Reason}) {
		if strings.Contains(l.Reason, "//") || strings.Contains(l.Reason, "/ ") || strings.Contains(l.Reason, "  ") {
			t.Errorf("a reason with an empty place: %q", l.Reason)
		}
	}
	t.Logf("%s", plan.Launch[0].Reason)
}

// At the max_replicas bound, the first ready stand-in in drain order makes room; none while
// every one is still starting.
func TestRoomMakerIsAReadyStandIn(t *testing.T) {
	od := func(id string, ready bool) Placed { return Placed{ID: id, Capacity: fleet.OnDemand, Ready: ready} }
	for _, tc := range []struct {
		name  string
		order []Placed
		want  string
	}{
		{"the first, ready", []Placed{od("a", true), od("b", true)}, "a"},
		{"the first ready after a starting one", []Placed{od("a", false), od("b", true)}, "b"},
		{"all starting", []Placed{od("a", false), od("b", false)}, ""},
		{"none", nil, ""},
	} {
		r, ok := roomMaker(tc.order)
		if got := map[bool]string{true: r.ID}[ok]; got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// At max_replicas, on-demand stand-ins make room for spot as a rolling update does: at most
// a quarter of the target not ready at once (at least one). Before, every plan swapped one
// more ready stand-in out while the spot replicas that replaced the others still started: the
// simulator's spotserve-g4dn day drained all 16 in 3.5 minutes and had no replica ready.
func TestStandInsMakeRoomAsARollingUpdate(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) {
		p.DynamicFallback = true
		p.MaxReplicas = 16
		p.ZoneRule = ZoneFewestThenCheapest
	})
	var existing []Placed
	for i := range 16 {
		existing = append(existing, Placed{ID: fmt.Sprintf("od%d", i), Capacity: fleet.OnDemand, Provider: "aws", Region: "us-east-1", Zone: "us-east-1a", Ready: true})
	}
	swaps := 0
	for step := range 20 {
		plan := pl.Plan(p0.Add(time.Duration(step)*time.Second), 16, existing, offers())
		if len(plan.Drain) == 0 {
			break
		}
		// The stand-in leaves; its room goes to a spot replica, which starts.
		gone := plan.Drain[0].ID
		existing = slices.DeleteFunc(existing, func(r Placed) bool { return r.ID == gone })
		existing = append(existing, Placed{ID: fmt.Sprintf("s%d", step), Capacity: fleet.Spot, Provider: "aws", Region: "us-east-1", Zone: "us-east-1b"})
		swaps++
	}
	if swaps != 4 {
		t.Fatalf("%d stand-ins swapped out while their spot replacements start; want 4 (a quarter of 16)", swaps)
	}
	existing[len(existing)-1].Ready = true
	if plan := pl.Plan(p0.Add(time.Minute), 16, existing, offers()); len(plan.Drain) != 1 {
		t.Fatalf("one spot replacement ready: drains %+v, want the next swap", plan.Drain)
	}
}

// The availability target (arbiter.availability) buys the cheapest hedge its model
// predicts meets it: a second spot zone while the market seen is calm enough, the replica
// on-demand once the market's outages make any spot fleet miss it, nothing for a loose one.
func TestAvailabilityTargetBuysTheCheapestHedge(t *testing.T) {
	avail := func(target float64) *Placer {
		return policy(func(p *PlacementPolicy) { p.SpotMinZones = 2; p.DynamicFallback = true; p.Availability = target })
	}
	// A pair at $3 and $3.50 costs more than 0.6 × on-demand: min_zones alone would not
	// hedge, but 99.5 % needs it (one replica: 97.0 % at the prior's one preemption per
	// 2.66 h and a 294 s cold start; two zones 99.91 %, within DayMargin), and it is cheaper
	// than on-demand. 99.9 % is not within DayMargin of the pair: on-demand.
	dear := offers()
	dear[2].PricePerHour = 3.5
	plan := avail(0.995).Plan(p0, 1, nil, dear)
	eq(t, "99.5 %, a calm market", zones(plan.Launch), "spot@us-east-1b", "spot@us-east-1a")
	if !strings.Contains(plan.Reason, "availability target 99.50 %: spot as planned predicted at 97.0") || !strings.Contains(plan.Reason, ": a spot replica in one more zone") {
		t.Fatalf("reason %q", plan.Reason)
	}
	eq(t, "99.9 %, a calm market", zones(avail(0.999).Plan(p0, 1, nil, dear).Launch), "on_demand@us-east-1a")
	eq(t, "90 %", zones(avail(0.9).Plan(p0, 1, nil, dear).Launch), "spot@us-east-1b")

	// A market that lost spot everywhere four times in eight hours: 99.5 % takes on-demand.
	pl := avail(0.995)
	odOnly := []Offer{offers()[0]}
	at := p0
	for i := range 8 {
		o := offers()
		if i%2 == 1 {
			o = odOnly
		}
		pl.Plan(at, 1, nil, o)
		at = at.Add(time.Hour)
	}
	plan = pl.Plan(at, 1, nil, offers())
	eq(t, "99.5 %, outages seen", zones(plan.Launch), "on_demand@us-east-1a")
	if plan.Want[fleet.Spot] != 0 || plan.Want[fleet.OnDemand] != 1 || !strings.Contains(plan.Reason, ": one replica on-demand") ||
		!strings.Contains(plan.Launch[0].Reason, "1 for the availability target") {
		t.Fatalf("plan %+v", plan)
	}
	// Three replicas: one of them on-demand, the others spot over two zones.
	plan = pl.Plan(at, 3, nil, offers())
	if plan.Want[fleet.Spot] != 2 || plan.Want[fleet.OnDemand] != 1 {
		t.Fatalf("target 3 after outages: want %v, 2 spot and 1 on-demand", plan.Want)
	}
	if _, err := NewPlacer(PlacementPolicy{MaxSpotPriceRatio: 0.6, Availability: 1}); err == nil || !strings.Contains(err.Error(), "availability 1") {
		t.Fatalf("availability 1 accepted: %v", err)
	}
}

// The review's cases (each failed before its fix): a base on-demand replica meets the
// target already; the pair goes to two zones whatever min_zones says and is priced at the
// second zone's spot; at max_replicas 1 a ready spot replica is not left for an on-demand
// one there is no room for.
func TestAvailabilityTargetEdges(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) { p.SpotMinZones = 2; p.Availability = 0.999; p.BaseOnDemand = 1 })
	plan := pl.Plan(p0, 2, nil, offers())
	if plan.Want[fleet.OnDemand] != 1 || plan.Want[fleet.Spot] != 1 {
		t.Errorf("base on-demand 1, target 2, 99.9 %%: want %v; want 1 on-demand (the base) and 1 spot", plan.Want)
	}
	pl = policy(func(p *PlacementPolicy) { p.SpotMinZones = 1; p.Availability = 0.995 })
	plan = pl.Plan(p0, 1, nil, offers())
	eq(t, "min_zones 1, 99.5 %", zones(plan.Launch), "spot@us-east-1b", "spot@us-east-1a")
	if !strings.Contains(plan.Reason, "one more zone 99.91 % ($4.00/h more)") {
		t.Errorf("the pair's hedge priced at the second zone's $4: %q", plan.Reason)
	}
	pl = policy(func(p *PlacementPolicy) { p.SpotMinZones = 2; p.Availability = 0.999; p.MaxReplicas = 1 })
	running := []Placed{{ID: "s1", Capacity: fleet.Spot, Provider: "aws", Region: "us-east-1", Zone: "us-east-1b", Ready: true}}
	plan = pl.Plan(p0, 1, running, offers())
	if len(plan.Launch) != 0 || len(plan.Drain) != 0 || plan.Want[fleet.Spot] != 1 || !strings.Contains(plan.Reason, "max_replicas 1 leaves no room") {
		t.Errorf("max_replicas 1, a ready spot replica, 99.9 %%: %+v; want it kept, and why", plan)
	}
}

// Where no other zone sells spot at all, a lone spot replica's hedge runs in its own zone
// once that zone has taken a replica back (within about a day), unless that zone's reclaims have nearly all taken the service's replicas there at once
// (within a minute), counted with zoneMemory's half life. Zones that exist but are
// refused or cooling keep the old rule (TestLoneSpotReplicaIsHedged), and so does the
// availability target, whose model counts zones.
func TestSameZoneHedgeOnlyWhereNoOtherZoneSellsSpot(t *testing.T) {
	one := []Offer{
		{Provider: "gcp", Region: "africa-south1", Zone: "africa-south1-a", Capacity: fleet.OnDemand, PricePerHour: 10},
		{Provider: "gcp", Region: "africa-south1", Zone: "africa-south1-a", Capacity: fleet.Spot, PricePerHour: 2},
	}
	hedged := func(p *PlacementPolicy) { p.SpotMinZones = 2; p.DynamicFallback = true }
	at := func(id string, ready bool) Placed {
		return Placed{ID: id, Capacity: fleet.Spot, Provider: "gcp", Region: "africa-south1", Zone: "africa-south1-a", Ready: ready, PricePerHour: 2}
	}
	pl := policy(hedged)
	plan := pl.Plan(p0, 1, nil, one)
	eq(t, "one zone, nothing taken back yet", zones(plan.Launch), "spot@africa-south1-a")
	pl.Plan(p0, 1, []Placed{at("r0", true)}, one)
	pl.Preempted("gcp", "africa-south1", "africa-south1-a", p0)
	plan = pl.Plan(p0.Add(time.Second), 1, nil, one)
	eq(t, "one zone", zones(plan.Launch), "spot@africa-south1-a", "spot@africa-south1-a")
	if plan.Want[fleet.OnDemand] != 0 || !strings.Contains(plan.Reason, "in the same zone hedges the lone one") {
		t.Fatalf("plan %+v: want two spot replicas, no stand-in, and the reason", plan)
	}
	// The pair runs: nothing launches or drains.
	pair := []Placed{at("r1", true), at("r2", true)}
	if plan = pl.Plan(p0.Add(time.Minute), 1, pair, one); len(plan.Launch)+len(plan.Drain) != 0 {
		t.Fatalf("the pair running: plan %+v; want nothing to do", plan)
	}
	// One preempted alone: the survivor is hedged again.
	pl.Preempted("gcp", "africa-south1", "africa-south1-a", p0.Add(2*time.Minute))
	plan = pl.Plan(p0.Add(3*time.Minute), 1, pair[:1], one)
	eq(t, "one taken of two", zones(plan.Launch), "spot@africa-south1-a")
	// Both taken within a minute, once among partial reclaims: the hedge stays.
	pl.Plan(p0.Add(10*time.Minute), 1, pair, one)
	pl.Preempted("gcp", "africa-south1", "africa-south1-a", p0.Add(11*time.Minute))
	pl.Preempted("gcp", "africa-south1", "africa-south1-a", p0.Add(11*time.Minute+20*time.Second))
	eq(t, "one whole, one partial", zones(pl.Plan(p0.Add(20*time.Minute), 1, nil, one).Launch), "spot@africa-south1-a", "spot@africa-south1-a")
	// Only whole reclaims, three of them: no hedge, until the record has faded.
	pl = policy(hedged)
	for i := range 3 {
		t0 := p0.Add(time.Duration(i) * time.Hour)
		pl.Plan(t0, 1, pair, one)
		pl.Preempted("gcp", "africa-south1", "africa-south1-a", t0.Add(time.Minute))
		pl.Preempted("gcp", "africa-south1", "africa-south1-a", t0.Add(time.Minute))
		if l := pl.Plan(t0.Add(30*time.Minute), 1, pair[:1], one).Launch; (len(l) == 0) != (i == 2) {
			t.Fatalf("after %d whole reclaims: launches %v; want a hedge after one or two, none after three", i+1, zones(l))
		}
	}
	eq(t, "two days later", zones(pl.Plan(p0.Add(2*time.Hour+2*zoneMemory), 1, pair[:1], one).Launch), "spot@africa-south1-a")
	// Two preempted an hour apart are two partial reclaims, not one whole one.
	pl = policy(hedged)
	pl.Plan(p0, 1, pair, one)
	pl.Preempted("gcp", "africa-south1", "africa-south1-a", p0)
	pl.Plan(p0.Add(30*time.Minute), 1, pair, one)
	pl.Preempted("gcp", "africa-south1", "africa-south1-a", p0.Add(time.Hour))
	eq(t, "apart", zones(pl.Plan(p0.Add(2*time.Hour), 1, pair[:1], one).Launch), "spot@africa-south1-a")
	// The availability target's model hedges across zones only.
	pl = policy(func(p *PlacementPolicy) { hedged(p); p.Availability = 0.99 })
	for _, l := range pl.Plan(p0, 1, nil, one).Launch {
		if l.Offer.Capacity == fleet.Spot && strings.Contains(l.Reason, "same zone") {
			t.Fatalf("availability target: %q", l.Reason)
		}
	}
}

// Offers with no zone (a region's price, as a catalog gives for a continent it has no zone
// of, or a provider without zones) are the same place in every record: a preemption there
// cools that place (the placer keyed it "gcp/r1/" and the offer "gcp/r1", so it never
// cooled, nor counted in the place's preemption rate), and a reserved slot with no zone
// counts the replicas it holds.
func TestPreemptionCoolsAZonelessPlace(t *testing.T) {
	regions := []Offer{
		{Provider: "gcp", Region: "r1", Capacity: fleet.Spot, PricePerHour: 1},
		{Provider: "gcp", Region: "r2", Capacity: fleet.Spot, PricePerHour: 2},
		{Provider: "gcp", Region: "r3", Capacity: fleet.Spot, PricePerHour: 2.5},
		{Provider: "gcp", Region: "r1", Capacity: fleet.OnDemand, PricePerHour: 10},
	}
	pl := policy(nil)
	if l := pl.Plan(p0, 1, nil, regions).Launch[0]; l.Offer.Region != "r1" {
		t.Fatalf("first launch in %s; want r1, the cheaper", l.Offer.Region)
	}
	pl.Preempted("gcp", "r1", "", p0)
	if l := pl.Plan(p0.Add(time.Minute), 1, nil, regions).Launch; len(l) != 1 || l[0].Offer.Region != "r2" {
		t.Fatalf("after r1 preempted: %+v; want r2 while r1 cools down", l)
	}
}

func TestZonelessReservedSlotsCountTheirReplicas(t *testing.T) {
	pl := policy(func(p *PlacementPolicy) {
		p.Reserved = []Slot{{Provider: "lambda", Region: "us-tx", Count: 1, PricePerHour: 2}, {Provider: "lambda", Region: "us-ut", Count: 1, PricePerHour: 2}}
	})
	held := []Placed{{ID: "r1", Capacity: fleet.Reserved, Provider: "lambda", Region: "us-tx", Ready: true}}
	l := pl.Plan(p0, 2, held, offers()).Launch
	if len(l) != 1 || l[0].Offer.Region != "us-ut" {
		t.Fatalf("one of two zone-less slots held: launches %+v; want the other slot (us-ut)", l)
	}
}

// The same-zone rule holds at every plan, not only at the second replica's launch, and each
// of its conditions is its own: another zone selling spot (even one refused lately), a faded
// record, the availability target, partial reclaims outweighing whole ones, and notices of
// one reclaim reported out of order. A pair left in one zone where others sell spot stays,
// as before the rule.
func TestSameZoneHedgeIsCheckedEveryPlan(t *testing.T) {
	one := []Offer{
		{Provider: "gcp", Region: "r", Zone: "a", Capacity: fleet.OnDemand, PricePerHour: 10},
		{Provider: "gcp", Region: "r", Zone: "a", Capacity: fleet.Spot, PricePerHour: 2},
	}
	two := append(slices.Clone(one), Offer{Provider: "gcp", Region: "r", Zone: "b", Capacity: fleet.Spot, PricePerHour: 2.5})
	hedged := func(p *PlacementPolicy) { p.SpotMinZones = 2; p.RefusalBackoff = time.Hour }
	at := func(id, zone string) Placed {
		return Placed{ID: id, Capacity: fleet.Spot, Provider: "gcp", Region: "r", Zone: zone, Ready: true, PricePerHour: 2}
	}
	pair := []Placed{at("r1", "a"), at("r2", "a")}
	reclaimed := func(mod func(*PlacementPolicy)) *Placer {
		pl := policy(mod)
		pl.Plan(p0, 1, pair[:1], one)
		pl.Preempted("gcp", "r", "a", p0)
		return pl
	}
	wantSpot := func(what string, plan Plan, n int, claim bool) {
		t.Helper()
		if plan.Want[fleet.Spot] != n || strings.Contains(plan.Reason, "same zone") != claim {
			t.Fatalf("%s: want spot %d, reason %q; want spot %d, same-zone claim %v", what, plan.Want[fleet.Spot], plan.Reason, n, claim)
		}
	}
	pl := reclaimed(hedged)
	wantSpot("the pair runs", pl.Plan(p0.Add(time.Minute), 1, pair, one), 2, true)
	// Another zone sells spot now: the pair stays (moving one costs a cold start unhedged),
	// said as a pair in one zone, not as the only zone's hedge.
	plan := pl.Plan(p0.Add(2*time.Minute), 1, pair, two)
	wantSpot("another zone appears", plan, 2, true)
	if len(plan.Drain)+len(plan.Launch) != 0 || strings.Contains(plan.Reason, "no other zone sells spot") {
		t.Fatalf("another zone appears: plan %+v; want the pair kept, its reason true", plan)
	}
	// The record fades (no reclaim for days): one of the pair drains.
	wantSpot("ten quiet days", pl.Plan(p0.Add(10*zoneMemory), 1, pair, one), 1, false)
	// Three in the only zone, never reclaimed: no pair is kept as a hedge, and no reason
	// claims one in another zone.
	plan = policy(hedged).Plan(p0, 1, []Placed{at("r1", "a"), at("r2", "a"), at("r3", "a")}, one)
	wantSpot("three, never reclaimed", plan, 1, false)
	if strings.Contains(plan.Reason, "hedge") {
		t.Fatalf("three in one zone, never reclaimed: reason %q claims a hedge", plan.Reason)
	}
	// Another zone exists but refused lately: the old rule (no hedge in the same zone).
	pl = reclaimed(hedged)
	pl.Refused(two[2], p0)
	wantSpot("the other zone refused", pl.Plan(p0.Add(time.Minute), 1, pair[:1], two), 1, false)
	// The availability target: no same-zone hedge, reclaimed or not.
	pl = reclaimed(func(p *PlacementPolicy) { hedged(p); p.Availability = 0.99 })
	for _, l := range pl.Plan(p0.Add(time.Minute), 1, pair[:1], one).Launch {
		if l.Offer.Capacity == fleet.Spot {
			t.Fatalf("availability target: a same-zone spot launch %q", l.Reason)
		}
	}
	// Three whole reclaims stop the hedge; two partial ones after them bring it back.
	pl = reclaimed(hedged)
	for i := range 3 {
		t0 := p0.Add(time.Duration(i+1) * time.Minute * 10)
		pl.Plan(t0, 1, pair, one)
		pl.Preempted("gcp", "r", "a", t0)
		pl.Preempted("gcp", "r", "a", t0)
	}
	wantSpot("three whole", pl.Plan(p0.Add(time.Hour), 1, pair[:1], one), 1, false)
	for i := range 2 {
		t0 := p0.Add(time.Hour + time.Duration(i+1)*time.Minute*10)
		pl.Plan(t0, 1, pair, one)
		pl.Preempted("gcp", "r", "a", t0)
	}
	wantSpot("then two partial", pl.Plan(p0.Add(2*time.Hour), 1, pair[:1], one), 2, true)
	// One reclaim's notices out of order are one whole reclaim: three of them stop the hedge.
	pl = reclaimed(hedged)
	for i := range 3 {
		t0 := p0.Add(time.Duration(i+1) * time.Hour)
		pl.Plan(t0, 1, pair, one)
		pl.Preempted("gcp", "r", "a", t0.Add(10*time.Second))
		pl.Preempted("gcp", "r", "a", t0)
	}
	wantSpot("out of order", pl.Plan(p0.Add(5*time.Hour), 1, pair[:1], one), 1, false)
}
