package scaling

import (
	"fmt"
	"slices"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// Keeping spot replicas through a dip in load while the spot market refuses launches.
//
// A scale-down that drains a ready spot replica saves its idle price until the load comes
// back; it then costs a relaunch. When the market gives spot back, that relaunch is a
// spot cold start, which the decider's downscale delay (a cold start or more) has already
// waited out. When the market is refusing spot launches, the relaunch is on-demand: its
// cold start billed at the on-demand price, then the on-demand premium for as long as the
// market keeps refusing. The simulator's spotserve-g4dn day showed it: after hour 11 the
// market refused every spot launch (about two a minute), each dip of the target drained a
// ready spot replica at $1.58/h, and each return of the load bought an on-demand one at
// $11.06/h, 15 of the day's 21 on-demand hours.
//
// Whether the load comes back is not known when the dip begins, so the rule is the ski
// rental's deterministic one (rent until the rent paid equals the price of buying; it never
// pays more than twice the best choice made knowing the future: Karlin, Manasse, McGeoch
// and Owicki, "Competitive randomized algorithms for nonuniform problems", Algorithmica
// 11(1), 1994): a ready spot replica above what is wanted stays until its idle bill since the
// dip began equals what relaunching it would cost.

// spotMarket is what the placer has seen of spot launches: whether the market is refusing
// them now, and the dip under way.
type spotMarket struct {
	// refusingSince is the first spot refusal since a spot replica last became ready (a
	// launch the market granted); zero: not refusing.
	refusingSince time.Time
	// dipSince is when ready spot replicas first exceeded those wanted (zero: no dip);
	// dipRefusing is how long the market had been refusing then.
	dipSince    time.Time
	dipRefusing time.Duration
}

// refused notes a spot launch the market turned down.
func (m *spotMarket) refused(at time.Time) {
	if m.refusingSince.IsZero() {
		m.refusingSince = at
	}
}

// see notes the replicas that became ready since the last plan (fresh; first: there was
// no plan before, so they were not seen become ready): a spot one was granted by the
// market, which ends a refusal streak.
func (m *spotMarket) see(fresh []Placed, first bool) {
	if !first && slices.ContainsFunc(fresh, func(r Placed) bool { return r.Capacity == fleet.Spot }) {
		m.refusingSince = time.Time{}
	}
}

// readiness is the replicas ready at the last plan, so that a plan sees which became
// ready since: the market's grants and the cold starts learned both come from those.
type readiness map[string]bool

// fresh returns the replicas of rs ready now that were not at the last plan (all the ready
// ones, with first, at the first plan), and remembers those ready now.
func (w *readiness) fresh(rs []Placed) (fresh []Placed, first bool) {
	first = *w == nil
	now := make(readiness, len(rs))
	for _, r := range rs {
		if r.Ready {
			now[r.ID] = true
			if !(*w)[r.ID] {
				fresh = append(fresh, r)
			}
		}
	}
	*w = now
	return fresh, first
}

// maxDipKeep bounds keepFor: a dip longer than a day is a new level of load, not a dip.
const maxDipKeep = 24 * time.Hour

// keepFor is how long a ready spot replica at price $/h stays through a dip: until its idle
// bill equals a relaunch's, the relaunch being on-demand at odPrice for its cold start and
// then for as long again as the market had been refusing when the dip began (the time to
// regain spot, estimated as the refusal streak seen so far). Zero while the market is not
// refusing (a spot relaunch's cold start is the decider's downscale delay's to pay). With
// no on-demand offer (or no price) there is no relaunch to buy: the replica stays a cold
// start beyond the streak.
func keepFor(price, odPrice float64, coldStart, refusing time.Duration) time.Duration {
	if refusing <= 0 {
		return 0
	}
	if odPrice <= 0 || price <= 0 {
		return min(coldStart+refusing, maxDipKeep)
	}
	relaunch := odPrice*coldStart.Hours() + max(0, odPrice-price)*refusing.Hours() // $
	hours := relaunch / price
	if hours >= maxDipKeep.Hours() {
		return maxDipKeep
	}
	return time.Duration(hours * float64(time.Hour))
}

// keepThroughDip is how many of the ready spot replicas that would drain (surplus: the
// ready ones above those wanted, in drain order) stay, and the plan reason's clause. It
// starts and ends the market's dip.
func (m *spotMarket) keepThroughDip(now time.Time, surplus []Placed, odPrice float64, coldStart time.Duration) (int, string) {
	if len(surplus) == 0 {
		m.dipSince = time.Time{}
		return 0, ""
	}
	if m.dipSince.IsZero() {
		m.dipSince, m.dipRefusing = now, 0
		if !m.refusingSince.IsZero() {
			m.dipRefusing = now.Sub(m.refusingSince)
		}
	}
	kept, longest := 0, time.Duration(0)
	for _, r := range surplus {
		if t := keepFor(r.PricePerHour, odPrice, coldStart, m.dipRefusing); now.Sub(m.dipSince) < t {
			kept++
			longest = max(longest, t)
		}
	}
	if kept == 0 {
		return 0, ""
	}
	relaunch := "no on-demand offer to relaunch them on"
	if odPrice > 0 {
		relaunch = fmt.Sprintf("a relaunch would be on-demand at $%.2f/h", odPrice)
	}
	return kept, fmt.Sprintf("; %d ready spot replicas kept through the dip: spot launches refused for %s before it, %s (kept until their idle bill equals the relaunch's, at most %s from %s)",
		kept, m.dipRefusing.Round(time.Second), relaunch, longest.Round(time.Minute), m.dipSince.UTC().Format(time.TimeOnly))
}

// coldStart is the policy's ColdStart, or DefaultColdStart.
func (pl *Placer) coldStart() time.Duration {
	if pl.policy.ColdStart > 0 {
		return pl.policy.ColdStart
	}
	return DefaultColdStart
}

// spotOrder is the order the spot replicas leave in: drainOrder's, then by expected cost
// under ZoneExpectedCost, within the shares of wanted spot replicas over zones.
func (pl *Placer) spotOrder(spot []Placed, spotIn map[string]int, wanted, zones int, odPrice float64) []Placed {
	order := pl.drainOrder(fleet.Spot, spot, spotIn)
	if pl.policy.ZoneRule == ZoneExpectedCost {
		order = pl.spotDrainOrder(order, spotIn, pl.zoneShare(wanted, zones), odPrice)
	}
	return order
}

// spotSurplus is the ready spot replicas above the wanted that a scale-down would drain,
// from the spot replicas in drain order; none while spot is neither used nor held (priced
// out, use_spot off: the old kind leaves as a rolling update) or a rebalancing move is under
// way (its replica leaves once its replacement is ready).
func (pl *Placer) spotSurplus(order []Placed, wanted int, spotWanted bool) []Placed {
	if !spotWanted || pl.moving != nil {
		return nil
	}
	var ready []Placed // a copy: order is the drains' too
	for _, r := range order {
		if r.Ready {
			ready = append(ready, r)
		}
	}
	return ready[:max(0, len(ready)-wanted)]
}

// swapWait is how long after a zone's last refusal or preemption an on-demand stand-in at
// the max_replicas bound is swapped out for a spot launch there: the ZoneCooldown at most,
// less the more the stand-ins' premium over spot costs. A swap into a market that still
// refuses costs one stand-in's relaunch (its cold start at the on-demand price); waiting
// costs every stand-in's premium. The ski rental again: swap once the premium paid since
// the refusal equals one failed swap. On spotserve-g4dn's first hour, 12 stand-ins at $11.06/h
// against spot at $1.58/h waited the 10-minute cooldown where 29 s pays for a failed swap.
func swapWait(standIns int, spotPrice, odPrice float64, coldStart, cooldown time.Duration) time.Duration {
	premium := float64(standIns) * (odPrice - spotPrice) // $/h
	if standIns <= 0 || spotPrice <= 0 || premium <= 0 {
		return cooldown
	}
	return min(time.Duration(odPrice*float64(coldStart)/premium), cooldown)
}
