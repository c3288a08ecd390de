package scaling

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// Placement decides where a service's replicas run and how they are bought: reserved
// capacity first (already paid for), then spot when its price is at most MaxSpotPriceRatio
// × the on-demand price, else on-demand; with SkyServe's SpotHedge semantics for users who
// come from it (base on-demand replicas, dynamic on-demand fallback while spot replicas are
// not ready, spot spread over zones, recently preempted zones avoided). Like the decider it
// is pure: the caller passes the clock, the replicas and the price offers.

// Offer is one price for one replica in one place.
type Offer struct {
	Provider, Region, Zone, InstanceType string
	Capacity                             fleet.Capacity // spot or on_demand
	PricePerHour                         float64
	// Accelerator × AcceleratorCount is the GPU the offer runs on, passed through to the
	// launch.
	Accelerator      string
	AcceleratorCount int
	// Sustains is what one replica on this offer serves within the service's SLO for its
	// request mix (Sustained); its zero value is not known, and the offer is then compared
	// by its price per hour.
	Sustains Sustains
	// Preference is the offer's rank in the order the user wrote (spec's `ordered`, or a
	// list of accelerators; spec.Resources.Preference): 0 first. Placement takes, for each
	// capacity kind, only the offers of the earliest rank it can have now, as SkyPilot
	// tries ordered candidates: the next only when the earlier cannot be had (no offer, or
	// refused, or every zone cooling down). Resources that state no order leave every offer
	// at 0, and placement chooses by price.
	Preference int
	// PriceSource says where the price came from (a catalog file, a provider's price API),
	// for the launch's log line.
	PriceSource string
}

func (o Offer) place() string { return place(o.Provider, o.Region, o.Zone) }

// Sustains is the throughput one replica keeps within a latency SLO for a request mix.
type Sustains struct {
	// Known: the throughput was computed (from the GPU's performance profile); a known 0
	// is a GPU that cannot meet the SLO even with one request (or cannot hold the model).
	Known bool
	// TokensPerSecond is prompt plus output tokens a second at the SLO.
	TokensPerSecond float64
	// Why says what it was computed from (profile, mix, SLO), for reasons and `serve up`.
	Why string
}

// PerMTokens is the offer's $ per million tokens at the SLO: its hourly price over what it
// sustains; +Inf where it sustains nothing, 0 where that is not known.
func (o Offer) PerMTokens() float64 {
	if !o.Sustains.Known {
		return 0
	}
	if o.Sustains.TokensPerSecond <= 0 {
		return math.Inf(1)
	}
	return o.PricePerHour / 3600 / o.Sustains.TokensPerSecond * 1e6
}

// unitPrice is what offers are ranked by: $ per million tokens at the SLO where both are
// known (the cheapest token, not the cheapest hour: an H100 at five times an L4's price
// may serve ten times its tokens), else the price per hour.
func unitPrice(o, than Offer) (a, b float64) {
	if o.Sustains.Known && than.Sustains.Known {
		return o.PerMTokens(), than.PerMTokens()
	}
	return o.PricePerHour, than.PricePerHour
}

// priced describes an offer's price for a reason: $/h, and $/M tokens where known.
func (o Offer) priced() string {
	s := fmt.Sprintf("$%.2f/h", o.PricePerHour)
	if o.Accelerator != "" {
		s = o.Accelerator + " at " + s
	}
	switch m := o.PerMTokens(); {
	case math.IsInf(m, 1):
		s += " (cannot meet the SLO)"
	case m > 0:
		s += fmt.Sprintf(" ($%.3f/M tokens at the SLO)", m)
	}
	return s
}

// place names provider/region/zone for keys and reasons, leaving out what is not known (a
// Kubernetes node without zone labels): "kubernetes:x", never "kubernetes:x//".
func place(provider, region, zone string) string {
	s := provider
	for _, part := range []string{region, zone} {
		if part != "" {
			s += "/" + part
		}
	}
	return s
}

// Slot is reserved capacity: Count replicas' worth, already paid for.
type Slot struct {
	Provider, Region, Zone string
	Count                  int
	PricePerHour           float64
}

// Placed is an existing replica as placement sees it, in launch order (oldest first).
type Placed struct {
	ID                     string
	Capacity               fleet.Capacity
	Provider, Region, Zone string
	PricePerHour           float64
	Ready                  bool
	// Leaving: draining, or reclaimed after a notice; it runs (and counts against
	// MaxReplicas) but is neither wanted nor drained again.
	Leaving bool
	// LaunchedAt and ReadyAt, where known, are its launch and its readiness: the placer
	// learns each place's cold start from them.
	LaunchedAt, ReadyAt time.Time
}

func (p Placed) place() string { return place(p.Provider, p.Region, p.Zone) }

// PlacementPolicy is a service's purchasing policy.
type PlacementPolicy struct {
	// UseSpot allows spot at all (the spec's use_spot: the user accepts preemptions).
	UseSpot bool
	// MaxSpotPriceRatio: spot is used when its price ≤ ratio × the on-demand price.
	MaxSpotPriceRatio float64
	// BaseOnDemand replicas are always on-demand (base_ondemand_fallback_replicas).
	BaseOnDemand int
	// DynamicFallback starts on-demand stand-ins for spot replicas that are wanted but not
	// ready and removes them when spot recovers (dynamic_ondemand_fallback). A spot replica
	// that is starting (or launched in the same plan) gets no stand-in unless
	// StandInForStarting: an on-demand replica launched beside it starts no sooner, so it
	// would never serve before the spot one and only buy a cold start; stand-ins cover the
	// spot that could not be launched (every zone refused, cooling down or priced out).
	DynamicFallback bool
	// StandInForStarting also stands in for starting spot replicas, as SkyServe's
	// SpotHedge fallback does (the simulator's SkyServe baseline).
	StandInForStarting bool
	// SpotMinZones 2 hedges a lone spot replica: when spot alone serves a target of one,
	// a second spot replica runs in another zone, so that a preemption (30 s of notice on
	// GCP, a cold start of minutes to replace) never leaves the service with none ready,
	// as long as the pair still costs at most MaxSpotPriceRatio × on-demand (the saving the
	// user asked spot for). The hedge is insurance, like num_overprovision: no stand-in
	// covers it, and none goes in the lone replica's own zone.
	SpotMinZones int
	// Overprovision is the part of the target that is num_overprovision: stand-ins never
	// cover it (an extra spot replica is insurance, not demand).
	Overprovision int
	Reserved      []Slot
	// ZoneCooldown keeps spot out of a zone this long after it preempted a replica (or
	// refused one), unless fewer than two zones would be left.
	ZoneCooldown time.Duration
	// RebalanceMinSaving moves a ready spot replica to another zone whose spot price is
	// at least this fraction below its own, one at a time, the replacement first and the
	// old replica drained once it is ready, never to a zone that would then hold more of
	// the service's spot replicas than the one it leaves. 0: never.
	RebalanceMinSaving float64
	// RebalanceWhenItPays moves a ready spot replica, in the same way and under the same
	// bounds, where the move pays for its cold start: the expected saving an hour (price,
	// and each zone's preemptions priced in), over the replacement's expected life in its
	// zone (one over the zone's preemption rate, at most a day), is more than the
	// replacement's bill while it starts; to the zone where that gain is largest
	// (movePaying; Arbiter's default, spot_policy.rebalance_min_saving: auto). It needs no
	// RebalanceMinSaving; with one set, both must hold.
	RebalanceWhenItPays bool
	// RefusalBackoff keeps a place's offer of one capacity kind out of the plan this long
	// after the place refused a launch for want of capacity, even when the cooldown has
	// run out of zones: an empty market is not asked again at every decision. 0: a refusal
	// only cools the zone.
	RefusalBackoff time.Duration
	// ZoneRule chooses a new spot replica's zone among the active ones.
	ZoneRule ZoneRule
	// ColdStart is a replica's launch to ready, what ZoneExpectedCost charges per
	// preemption (0: DefaultColdStart).
	ColdStart time.Duration
	// RelaunchCosts weighs drains and swaps against what relaunching would cost in the
	// market seen (Arbiter's; dip.go): while spot launches are refused, ready spot
	// replicas stay through a dip until their idle bill equals an on-demand relaunch's, and
	// at max_replicas an on-demand stand-in makes room for spot once its premium has paid
	// for a failed swap (swapWait), not only after ZoneCooldown. Off (SkyServe's
	// baselines): a dip drains at once and a swap waits for the cooldown.
	RelaunchCosts bool
	// Availability is the share of time a replica is ready that spot purchasing must keep
	// (arbiter.availability; 0: none): for the spot part of a target, the cheapest of spot as
	// planned, a second spot zone for a lone replica, or one replica on-demand that the
	// availability model predicts meets it (availability.go); the spot_policy.min_zones
	// hedge and its price bound give way to it.
	Availability float64
	// MaxReplicas bounds the replicas alive at once (max_replicas): those leaving, the
	// on-demand stand-ins and a rebalance's replacement included. A plan that would pass it
	// launches what fits, the wanted kinds first (reserved, spot, then on-demand), and says
	// so in its reason. 0: no bound.
	MaxReplicas int
}

// ZoneRule is how a new spot replica's zone is chosen among the active zones.
type ZoneRule int

const (
	// ZoneExpectedCost (Arbiter's): the lowest expected cost of an hour of spot capacity in
	// the zone — its price, plus each preemption the zone is expected to deal (its rate as
	// this placer has seen it) costing a cold start twice over: the replacement billed
	// while it starts, and the capacity missing meanwhile at the on-demand price that
	// would have held it — among the zones holding less than their share of the spot
	// fleet (⌈spot replicas ÷ SpotMinZones⌉, so one zone's loss never takes more than that
	// share). Scale-down drains the dearest zones' replicas first, within the same shares.
	ZoneExpectedCost ZoneRule = iota
	// ZoneFewestThenCheapest: the zones holding the fewest of the service's spot replicas,
	// then the cheapest (Arbiter's rule before ZoneExpectedCost).
	ZoneFewestThenCheapest
	// ZoneUnusedThenCheapest is SkyServe's SpotHedge placer: the active zones holding none
	// of the service's spot replicas, else every active zone; then the cheapest
	// (skypilot-org/skypilot sky/serve/spot_placer.py, DynamicFallbackSpotPlacer
	// .select_next_location). Once every zone holds one, each new replica goes to the
	// cheapest.
	ZoneUnusedThenCheapest
)

// DefaultColdStart is the ColdStart assumed when the policy gives none: vLLM's published
// cold start with nothing cached (sim.DefaultColdStart is the same figure).
const DefaultColdStart = 294 * time.Second

// DefaultRefusalBackoff is the control plane's RefusalBackoff.
const DefaultRefusalBackoff = 30 * time.Second

// Validate names the field that is wrong.
func (p PlacementPolicy) Validate() error {
	var errs []error
	if p.MaxSpotPriceRatio <= 0 || p.MaxSpotPriceRatio > 1 {
		errs = append(errs, fmt.Errorf("max spot price ratio %v: want a fraction in (0, 1], e.g. 0.6", p.MaxSpotPriceRatio))
	}
	if !(p.RebalanceMinSaving >= 0 && p.RebalanceMinSaving < 1) {
		errs = append(errs, fmt.Errorf("rebalance minimum saving %v: want a fraction in [0, 1), e.g. 0.2 (0: never move)", p.RebalanceMinSaving))
	}
	if !(p.Availability >= 0 && p.Availability < 1) {
		errs = append(errs, fmt.Errorf("availability %v: want a fraction in [0, 1), e.g. 0.999 (0: no target)", p.Availability))
	}
	if p.BaseOnDemand < 0 || p.Overprovision < 0 || p.ZoneCooldown < 0 || p.RefusalBackoff < 0 || p.MaxReplicas < 0 {
		errs = append(errs, errors.New("base on-demand replicas, overprovision, zone cooldown, refusal backoff and max replicas must be ≥ 0"))
	}
	for i, s := range p.Reserved {
		if s.Count < 0 || s.PricePerHour < 0 {
			errs = append(errs, fmt.Errorf("reserved[%d]: count and price must be ≥ 0", i))
		}
	}
	return errors.Join(errs...)
}

// Launch is one replica to start, with the quote and the rule that chose it.
type Launch struct {
	Offer  Offer
	Reason string
}

// Drain is one replica to remove, and why.
type Drain struct {
	ID, Reason string
}

// Plan is what to do now to reach the wanted mix.
type Plan struct {
	Launch []Launch
	Drain  []Drain
	// Want is the wanted number of replicas per capacity kind.
	Want map[fleet.Capacity]int
	// Reason says how the mix was chosen (which quote, which rule).
	Reason string
}

// Placer remembers which zones preempted or refused recently and the spot replica it is
// moving; everything else comes in per call.
type Placer struct {
	policy    PlacementPolicy
	preempted map[string]time.Time  // provider/region/zone → last preemption or refusal
	refused   map[refusal]time.Time // last refusal
	moving    *move                 // the rebalancing move under way, if any
	market    spotMarket            // spot refusals and the dip under way
	starts    coldStarts            // each place's cold start, from its launches
	ready     readiness             // the replicas ready at the last plan
	// zones is each zone's preemption record; observed is when it last counted hours.
	zones    map[string]*zoneRecord
	observed time.Time
	// outages is the market's record: onsets of plans that wanted spot and found no zone
	// offering it, and the hours watched, decayed as zones' records are; noSpot says the
	// last plan found none.
	outages zoneRecord
	noSpot  bool
	// availOD is the availability target's last choice: one replica on-demand.
	availOD bool
	// together is how the zones' preemptions fell on the service (sameZoneHedge).
	together coPreemptions
}

// zoneRecord is what the placer has seen of one zone: the service's spot replicas it took
// back and the replica-hours the service ran there, both decayed with zoneMemory's half
// life, so that what a zone did lately counts most.
type zoneRecord struct{ preemptions, hours float64 }

// zoneMemory is the half life of a zone's record: long enough to see a zone's daily
// pattern (the spot traces' zones go quiet and busy over hours), short enough that a zone
// that changed is judged by what it does now.
const zoneMemory = 24 * time.Hour

// priorHours weighs the rate pooled over every zone into each zone's own: a zone seen for
// less than this is judged mostly by the others.
const priorHours = 2.0

// move is one spot replica being moved to a cheaper zone: its replacement was launched
// there at since; the replica drains once the replacement is ready.
type move struct {
	from  Placed
	to    Offer
	since time.Time
}

// describe is the plan reason's clause for a move under way.
func (m *move) describe() string {
	return fmt.Sprintf("; moving spot replica %s from %s ($%.2f/h) to %s ($%.2f/h)", m.from.ID, m.from.place(), m.from.PricePerHour, m.to.place(), m.to.PricePerHour)
}

// moveQuiet: a replica moves only to a zone that has neither preempted nor refused a
// replica (nor failed a move) for this long. A cheap zone is often cheap because its
// capacity comes and goes, and a move that ends in a preemption costs a cold start of lost
// capacity. The placer's memory is the control plane's process's: after a restart, quiet
// periods and cooldowns start again from nothing known.
const moveQuiet = time.Hour

// moveTimeout gives up a move whose replacement is not ready by then (a cold start is ~5
// minutes); the replacement, if still starting, is drained as any extra replica.
const moveTimeout = 15 * time.Minute

// refusal is what a refusal keeps out: one place's offers of one capacity kind and GPU
// (a zone out of L4s may have H100s).
type refusal struct {
	place       string
	capacity    fleet.Capacity
	accelerator string
}

func refusalOf(o Offer) refusal {
	return refusal{o.place(), o.Capacity, strings.ToLower(o.Accelerator)}
}

// NewPlacer returns a placer for a policy.
func NewPlacer(p PlacementPolicy) (*Placer, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &Placer{policy: p, preempted: map[string]time.Time{}, refused: map[refusal]time.Time{}, zones: map[string]*zoneRecord{}}, nil
}

// Reconfigure applies a new policy (a service update) and keeps what the placer has seen:
// zones still cooling after a preemption or refusal stay avoided.
func (pl *Placer) Reconfigure(p PlacementPolicy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	pl.policy = p
	return nil
}

// Preempted records that a zone took a spot replica back: it cools down, and counts
// against the zone's expected cost.
func (pl *Placer) Preempted(provider, region, zone string, at time.Time) {
	place := place(provider, region, zone)
	pl.preempted[place] = at
	pl.record(place).preemptions++
	pl.together.preempted(place, at)
}

func (pl *Placer) record(place string) *zoneRecord {
	r := pl.zones[place]
	if r == nil {
		r = &zoneRecord{}
		pl.zones[place] = r
	}
	return r
}

// observe counts the replica-hours the spot replicas ran since the last plan, and decays
// every zone's record by the time passed.
func (pl *Placer) observe(now time.Time, spot []Placed) {
	if pl.observed.IsZero() || now.Before(pl.observed) {
		pl.observed = now
		return
	}
	dt := now.Sub(pl.observed)
	pl.observed = now
	decay := math.Exp2(-dt.Hours() / zoneMemory.Hours())
	for _, r := range pl.zones {
		r.preemptions *= decay
		r.hours *= decay
	}
	pl.outages.preemptions *= decay
	pl.outages.hours = pl.outages.hours*decay + dt.Hours()
	pl.together.decay(decay)
	for _, r := range spot {
		pl.record(r.place()).hours += dt.Hours()
	}
}

// preemptionRate is a zone's preemptions per replica-hour: its own record, with priorHours
// of the rate pooled over every zone.
func (pl *Placer) preemptionRate(place string) float64 {
	n, h := pl.pooledRecord()
	pooled := 0.0
	if h > 0 {
		pooled = n / h
	}
	own := pl.zones[place]
	if own == nil {
		return pooled
	}
	return (own.preemptions + priorHours*pooled) / (own.hours + priorHours)
}

// marketRate is a zone's preemptions per replica-hour as the availability model reads it:
// its own record with pooled, the rate over every zone with DefaultSpotPreemptionRate
// under it (PooledPreemptionRate of pooledRecord), weighed in.
func (pl *Placer) marketRate(place string, pooled float64) float64 {
	var rec zoneRecord
	if r := pl.zones[place]; r != nil {
		rec = *r
	}
	return ZonePreemptionRate(rec.preemptions, rec.hours, pooled)
}

// pooledRecord is every zone's record summed: preemptions and replica-hours.
func (pl *Placer) pooledRecord() (preemptions, hours float64) {
	for _, r := range pl.zones {
		preemptions, hours = preemptions+r.preemptions, hours+r.hours
	}
	return preemptions, hours
}

// expectedCost is ZoneExpectedCost's price of an hour of spot capacity from offer o, with
// odPrice the on-demand price (0: none offered, the spot price stands in).
func (pl *Placer) expectedCost(o Offer, odPrice float64) float64 {
	return pl.spotHour(o, pl.preemptionRate(o.place()), odPrice)
}

// spotHour is the expected cost of an hour of spot capacity from offer o in a zone that
// preempts at rate: its price, plus each preemption costing a cold start twice over (the
// replacement billed while it starts, and the capacity missing meanwhile at odPrice, the
// on-demand price; 0: none offered, the spot price stands in).
func (pl *Placer) spotHour(o Offer, rate, odPrice float64) float64 {
	cold := pl.coldStartAt(Offer{Provider: o.Provider, Region: o.Region, Zone: o.Zone, Capacity: fleet.Spot})
	if odPrice <= 0 {
		odPrice = o.PricePerHour
	}
	return o.PricePerHour + rate*cold.Hours()*(o.PricePerHour+odPrice)
}

// zoneShare is the most spot replicas one zone may hold under ZoneExpectedCost when n are
// wanted over the active zones.
func (pl *Placer) zoneShare(n, zones int) int {
	k := min(max(pl.policy.SpotMinZones, 1), max(zones, 1))
	return max(1, (n+k-1)/k)
}

// Refused records that a place turned down a launch of o's capacity kind and GPU for want of
// capacity: that offer leaves the plan for RefusalBackoff, and a spot zone cools down as
// after a preemption.
func (pl *Placer) Refused(o Offer, at time.Time) {
	pl.refused[refusalOf(o)] = at
	if o.Capacity == fleet.Spot {
		pl.preempted[o.place()] = at // cools the zone; a refusal took nothing back
		pl.market.refused(at)
		if m := pl.moving; m != nil && m.to.place() == o.place() {
			pl.moving = nil // the move's replacement was refused
		}
	}
}

// Offered is offers less those refused within RefusalBackoff: what a plan at now would
// choose from.
func (pl *Placer) Offered(now time.Time, offers []Offer) []Offer { return pl.offered(now, offers) }

// offered is offers less those refused within RefusalBackoff; older refusals are forgotten.
func (pl *Placer) offered(now time.Time, offers []Offer) []Offer {
	if len(pl.refused) == 0 {
		return offers
	}
	for k, at := range pl.refused {
		if now.Sub(at) >= pl.policy.RefusalBackoff {
			delete(pl.refused, k)
		}
	}
	out := make([]Offer, 0, len(offers))
	for _, o := range offers {
		if _, ok := pl.refused[refusalOf(o)]; !ok {
			out = append(out, o)
		}
	}
	return out
}

func cheapest(offers []Offer, capacity fleet.Capacity, ok func(Offer) bool) (Offer, bool) {
	var best Offer
	found := false
	for _, o := range offers {
		if o.Capacity != capacity || (ok != nil && !ok(o)) {
			continue
		}
		if !found || cheaper(o, best) {
			best, found = o, true
		}
	}
	return best, found
}

// Plan returns the launches and drains that move existing toward target replicas.
func (pl *Placer) Plan(now time.Time, target int, existing []Placed, offers []Offer) Plan {
	p := pl.policy
	all := offers
	offers = pl.offered(now, offers)
	alive := len(existing)
	existing = slices.DeleteFunc(slices.Clone(existing), func(r Placed) bool { return r.Leaving })
	have := map[fleet.Capacity][]Placed{}
	readySpot, ready := 0, 0
	for _, r := range existing {
		have[r.Capacity] = append(have[r.Capacity], r)
		if r.Ready {
			ready++
			if r.Capacity == fleet.Spot {
				readySpot++
			}
		}
	}
	startingSpot := len(have[fleet.Spot]) - readySpot
	pl.observe(now, have[fleet.Spot])
	pl.together.held(have[fleet.Spot])
	fresh, first := pl.ready.fresh(existing)
	pl.market.see(fresh, first)
	pl.starts.learn(fresh)
	reservedCap := 0
	for _, s := range p.Reserved {
		reservedCap += s.Count
	}
	want := map[fleet.Capacity]int{fleet.Reserved: min(max(target, 0), reservedCap)}
	rest := max(target, 0) - want[fleet.Reserved]

	// base on-demand replicas are always wanted; on-demand never covers the overprovisioned
	// part beyond them (odCap).
	base := min(p.BaseOnDemand, rest)
	odCap := max(base, rest-p.Overprovision)

	active := pl.activeZones(now, offers)
	offers = preferred(offers, active)
	spotOffer, haveSpot := cheapest(offers, fleet.Spot, func(o Offer) bool { return active[o.place()] })
	odOffer, haveOD := cheapest(offers, fleet.OnDemand, nil)
	useSpot, holdSpot, why := false, false, ""
	// Spot and on-demand compare per token where both are known: the cheapest of each may
	// be different GPUs.
	spotUnit, odUnit := unitPrice(spotOffer, odOffer)
	switch {
	case !p.UseSpot:
		why = "use_spot is off: on-demand"
	case !haveSpot && len(have[fleet.Spot]) > 0:
		// Nothing to buy now (every zone refused lately or has no capacity): that says
		// nothing against the spot replicas already running, which keep serving; only
		// what they do not cover goes on-demand.
		holdSpot = true
		why = fmt.Sprintf("no spot offer now: keeping %d spot replicas, on-demand for the rest", min(len(have[fleet.Spot]), rest-base))
	case !haveSpot:
		why = "no spot offer: on-demand"
	case haveOD && spotUnit > p.MaxSpotPriceRatio*odUnit:
		why = fmt.Sprintf("spot %s > %.2f × on-demand %s: on-demand", spotOffer.priced(), p.MaxSpotPriceRatio, odOffer.priced())
	case haveOD:
		useSpot = true
		why = fmt.Sprintf("spot %s ≤ %.2f × on-demand %s: spot", spotOffer.priced(), p.MaxSpotPriceRatio, odOffer.priced())
	default:
		useSpot = true
		why = "spot offered, no on-demand price to compare: spot"
	}
	// Spot launches: spread over active zones (SpotHedge), then cheapest. Decided before
	// the on-demand side, whose stand-ins cover what spot could not launch.
	var spotLaunches []Launch
	spotIn := map[string]int{}
	for _, r := range have[fleet.Spot] {
		spotIn[r.place()]++
	}
	if p.UseSpot && rest > 0 {
		pl.noteSpotOffered(haveSpot)
	}
	hedge, availOD := 0, 0
	switch {
	case useSpot && p.Availability > 0 && rest-base >= 1 && base == 0 && want[fleet.Reserved] == 0:
		// The availability target decides the hedge, in place of min_zones' price-bounded one
		// (a base on-demand or a reserved replica, never preempted, meets it already).
		pairOK := rest == 1 && p.Overprovision == 0 && (p.MaxReplicas == 0 || p.MaxReplicas >= 2) && len(active) >= 2
		c := pl.availabilityHedge(rest, offers, active, spotOffer, odOffer, haveOD, pairOK)
		switch {
		case c.kind == hedgeSpot:
			hedge = 1
		case c.kind == hedgeOnDemand && p.MaxReplicas > 0 && alive >= p.MaxReplicas && len(have[fleet.OnDemand]) == 0 && len(have[fleet.Spot]) > 0:
			// No room at max_replicas for the on-demand replica beside the spot one it would
			// replace, and draining that one first is an outage of a cold start: spot stays.
			c.reason += fmt.Sprintf("; but max_replicas %d leaves no room to bring it up beside the spot replica: spot stays", p.MaxReplicas)
		case c.kind == hedgeOnDemand:
			base, availOD = base+1, 1
			odCap = max(odCap, base)
		}
		why += "; " + c.reason
	case useSpot && p.SpotMinZones >= 2 && rest-base == 1 && base == 0 && want[fleet.Reserved] == 0 && p.Overprovision == 0 &&
		(p.MaxReplicas == 0 || p.MaxReplicas >= 2) &&
		(!haveOD || 2*spotUnit <= p.MaxSpotPriceRatio*odUnit):
		hedge = 1
	}
	if useSpot || holdSpot {
		want[fleet.Spot] = rest - base + hedge
		od := base
		if holdSpot {
			want[fleet.Spot] = min(want[fleet.Spot], len(have[fleet.Spot]))
			od = max(base, rest-p.Overprovision-want[fleet.Spot])
		}
		share := pl.zoneShare(want[fleet.Spot], len(active))
		if hedge == 1 {
			share = 1 // the lone replica and its hedge, each in a zone of its own
		}
		var there []int // spot replicas in each launch's place before it
		for n := want[fleet.Spot] - len(have[fleet.Spot]); n > 0; n-- {
			o, ok := pl.spotZone(offers, active, spotIn, share, odOffer.PricePerHour)
			if !ok {
				break
			}
			if hedge == 1 && len(have[fleet.Spot])+len(spotLaunches) >= want[fleet.Spot]-1 && spotIn[o.place()] > 0 {
				if p.Availability > 0 || !onlyZone(all, o.place()) || !pl.sameZoneHedge(o.place()) {
					// A hedge in the lone replica's own zone would go with it: none. (The
					// availability target's pair needs two active zones, pairOK, so it comes
					// here only if spotZone put both in one: its model counts zones.)
					want[fleet.Spot], hedge = want[fleet.Spot]-1, 0
					break
				}
			}
			there = append(there, spotIn[o.place()])
			spotIn[o.place()]++
			spotLaunches = append(spotLaunches, Launch{Offer: o})
		}
		if hedge == 1 && len(have[fleet.Spot])+len(spotLaunches) < want[fleet.Spot] {
			want[fleet.Spot], hedge = want[fleet.Spot]-1, 0 // no zone took it
			if p.Availability > 0 {
				why += " (no other zone offers spot now: the hedge waits)"
			}
		}
		sameZone, only := false, false
		if hedge == 1 && p.Availability == 0 {
			// A pair in one place is held to the same-zone rule at every plan, not only when
			// its second replica launches: in the only zone that sells spot, once the zone's
			// record has faded (or its reclaims proved whole), one of the pair drains. Where
			// other zones sell spot, a pair left in one zone (a target that fell from two)
			// stays, as it always has: moving one costs a cold start unhedged.
			if at, one := onePlace(have[fleet.Spot], spotLaunches); one {
				sameZone, only = true, onlyZone(all, at)
				if only && !pl.sameZoneHedge(at) {
					want[fleet.Spot], hedge, sameZone = want[fleet.Spot]-1, 0, false
				}
			}
		}
		// The reasons are written once the plan is known: a hedge is claimed only where one
		// runs or launches, and compared with on-demand only where an on-demand price is.
		if hedge == 1 && p.Availability == 0 {
			switch {
			case only:
				why += "; a second spot replica in the same zone hedges the lone one (spot_policy.min_zones 2; no other zone sells spot; this one has taken a replica back lately, and its reclaims have not nearly all taken the service's replicas there together"
			case sameZone:
				why += "; a second spot replica in the same zone hedges the lone one (spot_policy.min_zones 2; left there when the target fell"
			default:
				why += "; a second spot replica in another zone hedges the lone one (spot_policy.min_zones 2"
			}
			if haveOD {
				why += fmt.Sprintf("; two at the cheapest spot price, $%.2f/h, ≤ %.2f × on-demand $%.2f/h)",
					2*spotOffer.PricePerHour, p.MaxSpotPriceRatio, odOffer.PricePerHour)
			} else {
				why += "; no on-demand price to compare it with)"
			}
		}
		for i := range spotLaunches {
			o := spotLaunches[i].Offer
			spotLaunches[i].Reason = fmt.Sprintf("spot in %s, %s: %s; %d spot replicas there now", o.place(), o.priced(), why, there[i]) + pl.passedOver(now, all, o)
		}
		if p.DynamicFallback {
			// One on-demand stand-in per spot replica that is wanted but not ready (never for
			// the overprovisioned part, which odCap keeps out), the starting ones only as
			// SkyServe does it.
			covered := readySpot
			if !p.StandInForStarting {
				covered += startingSpot + len(spotLaunches)
			}
			od += max(0, want[fleet.Spot]-hedge-covered)
		}
		want[fleet.OnDemand] = min(od, odCap)
	} else {
		want[fleet.OnDemand] = rest
	}
	notReadySpot := max(0, want[fleet.Spot]-hedge-readySpot)
	plan := Plan{Want: want, Reason: fmt.Sprintf("target %d: reserved %d (of %d slots), %s; want spot %d, on-demand %d",
		target, want[fleet.Reserved], reservedCap, why, want[fleet.Spot], want[fleet.OnDemand])}

	// Reserved: fill free slots.
	used := map[string]int{}
	for _, r := range have[fleet.Reserved] {
		used[r.place()]++
	}
	for n := want[fleet.Reserved] - len(have[fleet.Reserved]); n > 0; n-- {
		for _, s := range p.Reserved {
			key := place(s.Provider, s.Region, s.Zone)
			if used[key] < s.Count {
				used[key]++
				plan.Launch = append(plan.Launch, Launch{Offer: Offer{Provider: s.Provider, Region: s.Region, Zone: s.Zone, Capacity: fleet.Reserved, PricePerHour: s.PricePerHour},
					Reason: fmt.Sprintf("reserved slot %s: already paid for", key)})
				break
			}
		}
	}
	plan.Launch = append(plan.Launch, spotLaunches...)
	// On-demand: cheapest.
	for n := want[fleet.OnDemand] - len(have[fleet.OnDemand]); n > 0 && haveOD; n-- {
		reason := fmt.Sprintf("on-demand in %s, %s%s: ", odOffer.place(), odOffer.priced(), pl.passedOver(now, all, odOffer))
		if useSpot {
			reason += fmt.Sprintf("base %d + stand-ins for %d spot replicas not ready", base-availOD, want[fleet.OnDemand]-base)
			if availOD > 0 {
				reason += fmt.Sprintf(" + %d for the availability target", availOD)
			}
		} else {
			reason += why
		}
		plan.Launch = append(plan.Launch, Launch{Offer: odOffer, Reason: reason})
	}
	if n := want[fleet.OnDemand] - len(have[fleet.OnDemand]); n > 0 && !haveOD {
		plan.Reason += fmt.Sprintf("; %d on-demand replicas wanted but no on-demand offer", n)
	}
	heldSpot := 0
	if room := max(0, p.MaxReplicas-alive); p.MaxReplicas > 0 && len(plan.Launch) > room {
		plan.Reason += fmt.Sprintf("; max_replicas %d binding: %d alive (%d leaving), %d of %d launches held",
			p.MaxReplicas, alive, alive-len(existing), len(plan.Launch)-room, len(plan.Launch))
		standIns := len(have[fleet.OnDemand]) - base
		wait := func(o Offer) time.Duration {
			if !p.RelaunchCosts || ready-1 < 1 {
				// A swap that leaves no replica ready is an outage for the spot replica's
				// cold start whether or not the launch succeeds: no premium pays for that
				// sooner than the cooldown (issue 47's Karpenter run at max_replicas 1).
				return p.ZoneCooldown
			}
			return swapWait(standIns, o.PricePerHour, odOffer.PricePerHour, pl.coldStartAt(odOffer), p.ZoneCooldown)
		}
		for _, l := range plan.Launch[room:] {
			// Only a zone quiet since its last preemption or refusal for swapWait is worth a
			// swap: one that just refused would likely send the room back to on-demand.
			if at, took := pl.preempted[l.Offer.place()]; l.Offer.Capacity == fleet.Spot &&
				(!took || now.Sub(at) >= wait(l.Offer)) {
				heldSpot++
			}
		}
		plan.Launch = plan.Launch[:room]
	}
	pl.followMove(now, &plan, have[fleet.Spot])
	// On-demand replicas already there that cover spot replicas not ready yet stay until
	// those are (whether or not they are stand-ins by policy): the shortfall bought while
	// no spot was offered must not be drained, still starting, the moment an offer comes
	// back, only to be bought again at the next refusal.
	keep := want
	if useSpot {
		keep = maps.Clone(want)
		cover := min(len(have[fleet.OnDemand]), base+notReadySpot, odCap)
		keep[fleet.OnDemand] = max(want[fleet.OnDemand], cover)
	}
	spotOrder := pl.spotOrder(have[fleet.Spot], spotIn, want[fleet.Spot], len(active), odOffer.PricePerHour)
	if n, clause := pl.market.keepThroughDip(now, pl.spotSurplus(spotOrder, want[fleet.Spot], p.RelaunchCosts && (useSpot || holdSpot)),
		odOffer.PricePerHour, pl.coldStartAt(odOffer)); n > 0 {
		keep = maps.Clone(keep)
		keep[fleet.Spot] += n
		plan.Reason += clause
	}
	// Drains: extra replicas of each kind, not-ready ones first, then the newest; spot from
	// the most crowded zone so the spread survives; the dearest kind first. A ready replica
	// leaves only while the ready ones left still cover the target: when the mix changes
	// (spot priced out, or back in), the old kind serves until its replacements are ready,
	// as in a rolling update, instead of leaving the service short for a cold start.
	readyBudget, kept := max(0, ready-max(target, 0)), 0
	for _, kind := range []fleet.Capacity{fleet.OnDemand, fleet.Spot, fleet.Reserved} {
		extra := len(have[kind]) - keep[kind]
		if extra <= 0 {
			continue
		}
		order := spotOrder
		if kind != fleet.Spot {
			order = pl.drainOrder(kind, have[kind], spotIn)
		}
		for _, r := range order[:extra] {
			if r.Ready {
				if readyBudget == 0 {
					kept++
					continue
				}
				readyBudget--
			}
			if kind == fleet.Spot {
				spotIn[r.place()]--
			}
			reason := fmt.Sprintf("%d %s replicas for %d wanted (%s)", len(have[kind]), kind, want[kind], why)
			if m := pl.moving; m != nil && r.ID == m.from.ID {
				reason = fmt.Sprintf("rebalance: its replacement in %s at $%.2f/h is ready (it ran at $%.2f/h)", m.to.place(), m.to.PricePerHour, r.PricePerHour)
			}
			plan.Drain = append(plan.Drain, Drain{ID: r.ID, Reason: reason})
		}
	}
	if kept > 0 {
		plan.Reason += fmt.Sprintf("; %d ready replicas of the old mix serve until their replacements are ready", kept)
	}
	// Swaps as a rolling update makes them: a stand-in makes room only while the replicas
	// not ready stay within maxUnavailable of the target (a quarter, at least one, as a
	// Kubernetes Deployment's default), never short of as many as there are stand-ins (the
	// simulator's spotserve-g4dn day drained 16 ready stand-ins in 3.5 minutes, one a plan,
	// and had none ready for the spot replicas' cold start).
	if heldSpot > 0 && alive == len(existing) && len(plan.Drain) == 0 && len(have[fleet.OnDemand]) > base && ready-1 >= max(target, 0)-maxUnavailable(target) {
		if r, ok := roomMaker(pl.drainOrder(fleet.OnDemand, have[fleet.OnDemand], spotIn)); ok {
			plan.Drain = append(plan.Drain, Drain{ID: r.ID, Reason: fmt.Sprintf("max_replicas %d binding: an on-demand stand-in makes room for a spot replica (%s)", p.MaxReplicas, why)})
		}
	}
	if useSpot && len(plan.Launch) == 0 && len(plan.Drain) == 0 && readySpot == want[fleet.Spot] && len(have[fleet.Spot]) == want[fleet.Spot] &&
		(p.MaxReplicas == 0 || alive < p.MaxReplicas) {
		pl.startMove(now, &plan, have[fleet.Spot], offers, active, spotIn, odOffer.PricePerHour)
	}
	return plan
}

// maxUnavailable is how many of target replicas may be not ready while stand-ins make room
// for spot: a quarter, rounded down, at least one (a Kubernetes Deployment's rolling update
// default, maxUnavailable 25 %).
func maxUnavailable(target int) int { return max(1, target/4) }

// roomMaker is the on-demand stand-in that leaves to make room for a held spot launch at
// the max_replicas bound, from the stand-ins in drain order: at the bound they would hold
// the room of the spot replicas they stand in for forever, so one a plan makes room, within
// maxUnavailable (the service is that many replicas short for a cold start, which is what
// max_replicas asks for).
// Only a ready one: a stand-in still starting has its cold start paid, and the spot launch
// it would make room for may be refused again.
func roomMaker(order []Placed) (Placed, bool) {
	i := slices.IndexFunc(order, func(r Placed) bool { return r.Ready })
	if i < 0 {
		return Placed{}, false
	}
	return order[i], true
}

// drainOrder sorts replicas of one kind in the order they leave: a move's replica first
// (spot), then the not-ready, then the newest; spot from the most crowded zone (spotIn).
func (pl *Placer) drainOrder(kind fleet.Capacity, rs []Placed, spotIn map[string]int) []Placed {
	order := slices.Clone(rs)
	slices.Reverse(order) // newest first
	slices.SortStableFunc(order, func(a, b Placed) int {
		if m := pl.moving; m != nil && kind == fleet.Spot && (a.ID == m.from.ID) != (b.ID == m.from.ID) {
			// A move under way: the replica it replaces goes first, and only once the
			// ready budget says its replacement serves.
			if a.ID == m.from.ID {
				return -1
			}
			return 1
		}
		if a.Ready != b.Ready {
			if !a.Ready {
				return -1
			}
			return 1
		}
		if kind == fleet.Spot {
			return cmp.Compare(spotIn[b.place()], spotIn[a.place()])
		}
		return 0
	})
	return order
}

// spotDrainOrder reorders drainOrder's spot replicas for ZoneExpectedCost: after a move's
// replica and the not-ready ones, those in a zone holding more than its share of the
// fleet that stays, then those in the zone dearest by expected cost, so a scale-down keeps
// the cheap zones' replicas and the spread.
func (pl *Placer) spotDrainOrder(order []Placed, spotIn map[string]int, share int, odPrice float64) []Placed {
	held := maps.Clone(spotIn)
	cost := map[string]float64{}
	for _, r := range order {
		cost[r.place()] = pl.expectedCost(Offer{Provider: r.Provider, Region: r.Region, Zone: r.Zone, PricePerHour: r.PricePerHour}, odPrice)
	}
	// first keeps drainOrder's precedence: a move's replica, then the not ready.
	first := func(r Placed) int {
		switch {
		case pl.moving != nil && r.ID == pl.moving.from.ID:
			return 2
		case !r.Ready:
			return 1
		}
		return 0
	}
	out := make([]Placed, 0, len(order))
	left := slices.Clone(order)
	for len(left) > 0 {
		best := 0
		for i, r := range left[1:] {
			b := left[best]
			if f, fb := first(r), first(b); f != fb {
				if f > fb {
					best = i + 1
				}
				continue
			}
			over, overB := held[r.place()] > share, held[b.place()] > share
			if over != overB {
				if over {
					best = i + 1
				}
				continue
			}
			if cost[r.place()] > cost[b.place()] {
				best = i + 1
			}
		}
		held[left[best].place()]--
		out = append(out, left[best])
		left = slices.Delete(left, best, best+1)
	}
	return out
}

// followMove follows the move under way: it is over when the replica it replaces has
// gone (drained, or preempted meanwhile), and given up when its replacement was refused
// (Refused clears it) or is not ready within moveTimeout (or was never launched: a crash
// loop's backoff, a failed state write); a zone that failed a move must be quiet again for
// moveQuiet before the next one goes there.
func (pl *Placer) followMove(now time.Time, plan *Plan, spot []Placed) {
	m := pl.moving
	if m == nil {
		return
	}
	switch {
	case !slices.ContainsFunc(spot, func(r Placed) bool { return r.ID == m.from.ID }):
		pl.moving = nil
	case now.Sub(m.since) >= moveTimeout:
		pl.moving = nil
		pl.preempted[m.to.place()] = now
		plan.Reason += fmt.Sprintf("; gave up moving spot replica %s to %s: no ready replacement after %v", m.from.ID, m.to.place(), moveTimeout)
	default:
		plan.Reason += m.describe()
	}
}

// startMove starts a move, the caller having found the spot fleet as wanted, all of it
// ready, and nothing else to do: the dearest ready spot replica (at its zone's price now,
// else the price it was launched at) goes to the cheapest active zone at least
// RebalanceMinSaving cheaper (under RebalanceWhenItPays, the one movePaying finds the move
// pays most for), quiet for moveQuiet, where the service would then have no more spot
// replicas than in the zone it leaves. odPrice is the on-demand price (0: none offered).
func (pl *Placer) startMove(now time.Time, plan *Plan, spot []Placed, offers []Offer, active map[string]bool, spotIn map[string]int, odPrice float64) {
	if pl.policy.RebalanceMinSaving <= 0 && !pl.policy.RebalanceWhenItPays || pl.moving != nil {
		return
	}
	priceNow := func(r Placed) float64 {
		if o, ok := cheapest(offers, fleet.Spot, func(o Offer) bool { return o.place() == r.place() }); ok {
			return o.PricePerHour
		}
		return r.PricePerHour
	}
	for _, r := range slices.SortedStableFunc(slices.Values(spot), func(a, b Placed) int { return cmp.Compare(priceNow(b), priceNow(a)) }) {
		price := priceNow(r)
		if !r.Ready || price <= 0 {
			continue
		}
		from := Offer{Provider: r.Provider, Region: r.Region, Zone: r.Zone, Capacity: fleet.Spot, PricePerHour: price}
		eligible := func(o Offer) bool {
			at, took := pl.preempted[o.place()]
			return active[o.place()] && (!took || now.Sub(at) >= moveQuiet) && o.place() != r.place() &&
				spotIn[o.place()]+1 <= spotIn[r.place()] && o.PricePerHour <= (1-pl.policy.RebalanceMinSaving)*price
		}
		var o Offer
		var ok bool
		why := fmt.Sprintf("≥ %.0f %% cheaper", 100*pl.policy.RebalanceMinSaving)
		if pl.policy.RebalanceWhenItPays {
			o, why, ok = pl.movePaying(from, offers, eligible, odPrice)
		} else {
			o, ok = cheapest(offers, fleet.Spot, eligible)
		}
		if !ok {
			continue
		}
		r.PricePerHour = price
		pl.moving = &move{from: r, to: o, since: now}
		plan.Launch = append(plan.Launch, Launch{Offer: o, Reason: fmt.Sprintf("rebalance: spot in %s at $%.2f/h replaces %s in %s at $%.2f/h (%s); %s drains once it is ready",
			o.place(), o.PricePerHour, r.ID, r.place(), price, why, r.ID)})
		plan.Reason += pl.moving.describe()
		return
	}
}

// movePaying is the eligible spot offer a replica running as from would most gain by moving
// to, if the move pays for its cold start (PlacementPolicy.RebalanceWhenItPays), and why
// it pays. The saving is the fall in the expected cost of an hour of spot capacity, the
// preemptions each zone is expected to deal priced in at marketRate, so a cheap zone that
// preempts often, or one not yet seen against a zone the replica has run in for hours
// without a preemption, saves less than its price says. It is earned for the replacement's
// expected life in its zone, one over marketRate (a zone not yet seen lives 2.66 h, the
// median of SkyPilot's GPU traces; at most maxDipKeep, a day), and the move costs the
// replacement's bill while it starts (the old replica serves meanwhile, as it would have).
func (pl *Placer) movePaying(from Offer, offers []Offer, eligible func(Offer) bool, odPrice float64) (Offer, string, bool) {
	if odPrice <= 0 {
		odPrice = from.PricePerHour
	}
	pooled := PooledPreemptionRate(pl.pooledRecord())
	stay := pl.spotHour(from, pl.marketRate(from.place(), pooled), odPrice)
	var best Offer
	var bestGain float64
	var why string
	for _, o := range offers {
		if o.Capacity != fleet.Spot || !eligible(o) {
			continue
		}
		rate := pl.marketRate(o.place(), pooled)
		saving := stay - pl.spotHour(o, rate, odPrice)
		life := min(maxDipKeep.Hours(), 1/rate)
		start := o.PricePerHour * pl.coldStartAt(o).Hours()
		if gain := saving*life - start; gain > bestGain {
			best, bestGain = o, gain
			why = fmt.Sprintf("expected $%.2f/h less over its expected %.1f h there, against $%.2f for its cold start", saving, life, start)
		}
	}
	return best, why, bestGain > 0
}

// activeZones is every offered place not cooling down after a preemption; when fewer than
// two zones remain, all are active again (SkyServe resets rather than run out of zones).
func (pl *Placer) activeZones(now time.Time, offers []Offer) map[string]bool {
	all, active := map[string]bool{}, map[string]bool{}
	for _, o := range offers {
		if o.Capacity != fleet.Spot {
			continue
		}
		all[o.place()] = true
		if at, ok := pl.preempted[o.place()]; !ok || now.Sub(at) >= pl.policy.ZoneCooldown {
			active[o.place()] = true
		}
	}
	if len(active) < 2 {
		return all
	}
	return active
}

// spotZone picks the spot offer for the next replica among the active zones, by the
// policy's ZoneRule; share is zoneShare of the spot fleet once placed (ZoneExpectedCost)
// and odPrice the on-demand price (0: none).
func (pl *Placer) spotZone(offers []Offer, active map[string]bool, spotIn map[string]int, share int, odPrice float64) (Offer, bool) {
	rule := pl.policy.ZoneRule
	unused := false
	if rule == ZoneUnusedThenCheapest {
		for _, o := range offers {
			unused = unused || o.Capacity == fleet.Spot && active[o.place()] && spotIn[o.place()] == 0
		}
	}
	var best Offer
	bestCost, bestOver := 0.0, false
	found := false
	for _, o := range offers {
		if o.Capacity != fleet.Spot || !active[o.place()] || unused && spotIn[o.place()] > 0 {
			continue
		}
		var better bool
		switch rule {
		case ZoneExpectedCost:
			// Under its share first; then the lowest expected cost.
			c, over := pl.expectedCost(o, odPrice), spotIn[o.place()] >= share
			if o.Sustains.Known {
				// Several GPU types: an hour of each buys different tokens.
				c /= max(o.Sustains.TokensPerSecond, 1e-9)
			}
			better = !found || !over && bestOver || over == bestOver && (c < bestCost || c == bestCost && o.place() < best.place())
			if better {
				bestCost, bestOver = c, over
			}
		case ZoneFewestThenCheapest:
			better = !found || spotIn[o.place()] < spotIn[best.place()] ||
				spotIn[o.place()] == spotIn[best.place()] && cheaper(o, best)
		default:
			better = !found || cheaper(o, best)
		}
		if better {
			best, found = o, true
		}
	}
	return best, found
}

// passedOver says, for a launch on chosen, which offer of the same capacity kind would be
// cheaper per token but was refused within RefusalBackoff (a type that cannot be had falls
// to the next cheapest, and the reason says so); "" when none was.
func (pl *Placer) passedOver(now time.Time, all []Offer, chosen Offer) string {
	best, found := Offer{}, false
	for _, o := range all {
		_, refused := pl.refused[refusalOf(o)]
		if o.Capacity != chosen.Capacity || !refused || !before(o, chosen) || (found && !before(o, best)) {
			continue
		}
		best, found = o, true
	}
	if !found {
		return ""
	}
	at := pl.refused[refusalOf(best)]
	what := "cheaper"
	if best.Preference < chosen.Preference {
		what = "preferred (earlier in resources.ordered)"
	}
	return fmt.Sprintf(" (the %s %s in %s refused a launch %v ago: no capacity)", what, best.priced(), best.place(), now.Sub(at).Round(time.Second))
}

// preferred keeps, of each capacity kind, the offers of the earliest Preference that can be
// had now (for spot, in an active zone); a kind none of whose offers can be had keeps all
// of its offers, for the reasons that say why.
func preferred(offers []Offer, active map[string]bool) []Offer {
	first := map[fleet.Capacity]int{}
	ordered := false
	for _, o := range offers {
		ordered = ordered || o.Preference != 0
		if o.Capacity == fleet.Spot && !active[o.place()] {
			continue
		}
		if r, ok := first[o.Capacity]; !ok || o.Preference < r {
			first[o.Capacity] = o.Preference
		}
	}
	if !ordered {
		return offers
	}
	return slices.DeleteFunc(slices.Clone(offers), func(o Offer) bool {
		r, ok := first[o.Capacity]
		return ok && o.Preference != r
	})
}

// before orders offers as placement prefers them: the user's order first, then cheaper.
func before(a, b Offer) bool {
	if a.Preference != b.Preference {
		return a.Preference < b.Preference
	}
	return cheaper(a, b)
}

// cheaper orders offers by unit price ($ per token at the SLO where known, else per
// hour), then hourly price, then place and accelerator.
func cheaper(a, b Offer) bool {
	ua, ub := unitPrice(a, b)
	if ua != ub {
		return ua < ub
	}
	if a.PricePerHour != b.PricePerHour {
		return a.PricePerHour < b.PricePerHour
	}
	return a.place() < b.place() || a.place() == b.place() && a.Accelerator < b.Accelerator
}
