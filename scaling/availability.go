package scaling

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// Availability as a target (issue 49; the spec's arbiter.availability).
//
// What is predicted: the share of time the service has no ready replica. A spot replica in
// a zone is preempted at a rate λ (preemptions per replica-hour, as this service has seen
// the zone: zoneRecord, with a market prior) and each preemption leaves it down for the
// time its replacement takes to be ready, R (the learned cold start less the provider's
// notice, at which the replacement launches). Alone it is down a share λR ÷ (1 + λR) of the
// time (an alternating renewal process); spot replicas spread over k zones, preempted
// independently, are all down the product of their zones' shares. Zones are not
// independent: the market loses spot everywhere at once at a rate μ (outages: moments when
// no zone offers spot, as the placer sees them), each taking every spot replica for R, a
// share μR ÷ (1 + μR) more. An on-demand replica is not preempted.
//
// Its error, each day of the spot traces predicted from the days before it against a
// replay of that day (TestAvailabilityModelHeldOut in market/), is in
// bench/docs/simulator.md.
//
// What is decided, for the spot part of a target: the cheapest of (a) spot as planned,
// (b) for a lone replica, a second spot replica in another zone, (c) one replica on-demand
// instead of spot, whose predicted downtime meets the target with DayMargin to spare (the
// target holds day by day); where none does, the most available. The plan's reasons say
// what each option predicts and costs.

// DefaultSpotPreemptionRate is the prior of a place's preemption rate before the service has
// seen any: one per 2.66 hours, the median over the zones of SkyPilot's GPU preemption traces
// (p3.2xlarge, 2023; shared/data/spot_traces_skypilot/summary.csv, mean_gt0_run_hours:
// 1.36, 1.75, 2.24, 2.66, 3.13, 4.60 and 21.36 hours).
const DefaultSpotPreemptionRate = 1 / 2.655

// marketPriorHours weighs DefaultSpotPreemptionRate into the rate pooled over the zones the
// service has seen: after a day of spot replica-hours, what the market did dominates.
const marketPriorHours = 8.0

// PooledPreemptionRate is the preemptions per replica-hour over every zone the service has
// seen (n preemptions in h replica-hours), DefaultSpotPreemptionRate weighed in for
// marketPriorHours.
func PooledPreemptionRate(n, h float64) float64 {
	return (n + marketPriorHours*DefaultSpotPreemptionRate) / (h + marketPriorHours)
}

// ZonePreemptionRate is one zone's preemptions per replica-hour (n in h), the pooled rate
// weighed in for priorHours, as the placer's zone records are read.
func ZonePreemptionRate(n, h, pooled float64) float64 {
	return (n + priorHours*pooled) / (h + priorHours)
}

// downShare is the share of time a lone spot replica is down: preempted at rate per hour,
// each time down for restore.
func downShare(rate float64, restore time.Duration) float64 {
	x := rate * restore.Hours()
	if x <= 0 {
		return 0
	}
	return x / (1 + x)
}

// PredictUnavailable is the model's share of time with none of a set of spot replicas
// ready: one replica (or one zone's worth) in each of len(rates) zones, preempted at rates
// (per replica-hour), each down for restore after each preemption, independently; and
// outages, market-wide losses of spot (no zone with capacity) at outageRate an hour, each
// taking every spot replica for restore (the on-demand stand-in launched at the notice, or
// spot elsewhere, is ready a cold start later).
func PredictUnavailable(rates []float64, outageRate float64, restore time.Duration) float64 {
	if len(rates) == 0 {
		return 1
	}
	all := 1.0
	for _, r := range rates {
		all *= downShare(r, restore)
	}
	return math.Min(1, all+downShare(outageRate, restore))
}

// DayMargin is what the placer multiplies a predicted downtime by before comparing it with a
// target's allowance: the target is met day by day, and a day's downtime is that day's luck
// (one outage is 0.2–0.5 % of a day). On the spot traces, 90 % of days held out came in at
// most this many times their prediction (TestAvailabilityModelHeldOut, market/).
const DayMargin = 3.0

// hedgeKind is how an availability target is met.
type hedgeKind int

const (
	hedgeNone     hedgeKind = iota // spot as planned meets it
	hedgeSpot                      // one more spot replica, in another zone
	hedgeOnDemand                  // one replica on-demand instead of spot
)

// hedgeOption is one way to serve the spot part of a target: its predicted share of time
// with no replica ready, and what it costs an hour beyond spot as planned.
type hedgeOption struct {
	kind hedgeKind
	down float64
	usd  float64
}

// hedgeChoice is an availability decision: the hedge, the availability it predicts, and
// why.
type hedgeChoice struct {
	kind      hedgeKind
	predicted float64
	reason    string
}

// chooseHedge picks, for a target availability (a fraction: 0.999), the cheapest option
// predicted to meet it on most days (DayMargin × down ≤ 1 − target); where none does, the
// most available. The first option is spot as planned (kind hedgeNone, usd 0). After an
// on-demand choice (wasOD), a spot option must meet it with twice that margin to replace
// it: each change of mind is a cold start bought, and the prediction drifts with the
// market's record, so near the boundary it would flip back and forth.
func chooseHedge(target float64, opts []hedgeOption, wasOD bool) hedgeChoice {
	allowed := (1 - target + 1e-12) / DayMargin
	meetsOf := func(o hedgeOption) bool {
		if wasOD && o.kind != hedgeOnDemand {
			return o.down <= allowed/2
		}
		return o.down <= allowed
	}
	best, found := opts[0], meetsOf(opts[0])
	for _, o := range opts[1:] {
		meets := meetsOf(o)
		switch {
		case meets && (!found || o.usd < best.usd):
			best, found = o, true
		case !found && o.down < best.down:
			best = o
		}
	}
	pct := func(down float64) string { return fmt.Sprintf("%.2f %%", 100*(1-down)) }
	why := fmt.Sprintf("availability target %s: spot as planned predicted at %s", pct(1-target), pct(opts[0].down))
	for _, o := range opts[1:] {
		switch o.kind {
		case hedgeSpot:
			why += fmt.Sprintf(", with a spot replica in one more zone %s ($%.2f/h more)", pct(o.down), o.usd)
		case hedgeOnDemand:
			why += fmt.Sprintf(", with one replica on-demand %s ($%.2f/h more)", pct(o.down), o.usd)
		}
	}
	switch best.kind {
	case hedgeNone:
		why += ": no hedge"
	case hedgeSpot:
		why += ": a spot replica in one more zone"
	case hedgeOnDemand:
		why += ": one replica on-demand"
	}
	if !found {
		why += " (nothing offered meets the target: the most available)"
	} else if wasOD && best.kind == hedgeOnDemand && slices.ContainsFunc(opts, func(o hedgeOption) bool { return o.kind != hedgeOnDemand && o.down <= allowed }) {
		why += " (kept: spot must meet the target twice over to replace it)"
	}
	return hedgeChoice{kind: best.kind, predicted: 1 - best.down, reason: why}
}

// noteSpotOffered records whether a plan that wanted spot found a zone offering it: the
// first plan to find none starts a market outage (outageRate).
func (pl *Placer) noteSpotOffered(offered bool) {
	if !offered && !pl.noSpot {
		pl.outages.preemptions++
	}
	pl.noSpot = !offered
}

// outageRate is the market's outages an hour, as the placer has watched it.
func (pl *Placer) outageRate() float64 {
	if pl.outages.hours <= 0 {
		return 0
	}
	return pl.outages.preemptions / pl.outages.hours
}

// availabilityHedge decides how the policy's availability target is met by n spot replicas
// (n ≥ 1) over the active zones: each zone's preemption rate from the service's record with
// the market prior, the restore time the learned cold start of spotOffer's place (the
// provider's notice is not known here, so none is taken off: the prediction errs long),
// the spot fleet spread over min_zones zones (a lone replica: one), and the options priced
// at spotOffer and odOffer (haveOD false: no on-demand option); a second spot zone only
// where pairOK (the plan can run a hedge replica: max_replicas leaves room for it).
func (pl *Placer) availabilityHedge(n int, offers []Offer, active map[string]bool, spotOffer, odOffer Offer, haveOD, pairOK bool) hedgeChoice {
	pooled := PooledPreemptionRate(pl.pooledRecord())
	price := map[string]float64{} // each active place's cheapest spot offer
	for _, o := range offers {
		if o.Capacity != fleet.Spot || !active[o.place()] {
			continue
		}
		if p, ok := price[o.place()]; !ok || o.PricePerHour < p {
			price[o.place()] = o.PricePerHour
		}
	}
	var rates, prices []float64
	for place, p := range price {
		rates = append(rates, pl.marketRate(place, pooled))
		prices = append(prices, p)
	}
	slices.Sort(rates)
	slices.Sort(prices)
	restore := pl.coldStartAt(spotOffer)
	mu := pl.outageRate()
	spread := 1
	if n > 1 {
		spread = min(max(pl.policy.SpotMinZones, 1), len(rates))
	}
	opts := []hedgeOption{{hedgeNone, PredictUnavailable(rates[:min(spread, len(rates))], mu, restore), 0}}
	if n == 1 && pairOK && len(rates) > 1 {
		// The hedge goes to another zone than the lone replica's: the second-cheapest.
		opts = append(opts, hedgeOption{hedgeSpot, PredictUnavailable(rates[:2], mu, restore), prices[1]})
	}
	if haveOD {
		opts = append(opts, hedgeOption{hedgeOnDemand, 0, math.Max(odOffer.PricePerHour-spotOffer.PricePerHour, 0)})
	}
	c := chooseHedge(pl.policy.Availability, opts, pl.availOD)
	pl.availOD = c.kind == hedgeOnDemand
	return c
}
