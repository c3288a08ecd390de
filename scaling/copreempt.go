package scaling

import (
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// coPreemptions is how a zone's preemptions have fallen on the service: whether one took
// every spot replica the service had there at once (two or more), or some of them. Spot
// markets take capacity back in parts: SpotServe's g4dn trace removes one node of up to 24
// at a time in 31 of its 48 removal instants, and a SkyPilot trace's drop from 16 to 6 leaves
// 6. A second spot replica in the lone one's zone then hedges it, unless the zone's reclaims
// have nearly all taken the service's replicas there together (allowsPair).
type coPreemptions struct {
	// holding is the service's spot replicas per place at the last plan.
	holding map[string]int
	// burst is the preemptions of one place that came together (within coPreemptWindow of
	// the first), the one under way per place.
	burst map[string]preemptBurst
	// seen counts each place's preemptions that found two or more of the service's spot
	// replicas there: those that took them all and those that left some, decayed with the
	// zones' records at every plan (decay).
	seen map[string]*jointRecord
}

type preemptBurst struct {
	at         time.Time
	n, holding int
}

type jointRecord struct{ whole, partial float64 }

// decay fades every place's record by factor, as Placer.observe fades the zones' records.
func (c *coPreemptions) decay(factor float64) {
	for _, r := range c.seen {
		r.whole *= factor
		r.partial *= factor
	}
}

// coPreemptWindow: notices of one reclaim reach a provider's VMs within seconds of each
// other, not at one instant.
const coPreemptWindow = time.Minute

// held records the spot replicas the service has in each place now (those leaving not
// counted: they are going anyway). It is as of the last plan: a replica that plan drained, or
// one launched since, is counted until the next, so a burst between two plans may be judged
// against a count one off; the next plan's record corrects the count, not the verdict.
func (c *coPreemptions) held(spot []Placed) {
	if c.holding == nil {
		c.holding = map[string]int{}
	}
	clear(c.holding)
	for _, r := range spot {
		if r.Capacity == fleet.Spot {
			c.holding[r.place()]++
		}
	}
}

// preempted counts one preemption in place at at. The first of a burst that finds two or
// more replicas there counts as partial until the burst has taken them all.
func (c *coPreemptions) preempted(place string, at time.Time) {
	if c.burst == nil {
		c.burst, c.seen = map[string]preemptBurst{}, map[string]*jointRecord{}
	}
	b := c.burst[place]
	if d := at.Sub(b.at); b.n == 0 || d > coPreemptWindow || d < -coPreemptWindow {
		b = preemptBurst{at: at, holding: c.holding[place]}
	} else if at.Before(b.at) {
		b.at = at // reported out of order: the burst starts at its earliest notice
	}
	b.n++
	c.burst[place] = b
	if b.holding < 2 {
		return // one replica there: says nothing of how the zone takes several
	}
	r := c.seen[place]
	if r == nil {
		r = &jointRecord{}
		c.seen[place] = r
	}
	switch {
	case b.n == 1:
		r.partial++
	case b.n == b.holding:
		r.partial, r.whole = max(r.partial-1, 0), r.whole+1
	}
}

// allowsPair says whether place's reclaims leave a pair of spot replicas there worth its
// second one: a pair in one zone loses both only in a whole reclaim, where the lone replica
// is lost in every reclaim that reaches it, so the pair is worth its second replica until
// nearly every reclaim takes all. It is refused once the chance that a reclaim takes all,
// estimated from the record with a uniform prior ((whole+1) ÷ (whole+partial+2)), passes
// wholeReclaimBar: three whole reclaims and no partial one do it (4/5), two do not (3/4);
// one whole among partial ones does not.
func (c *coPreemptions) allowsPair(place string) bool {
	r := c.seen[place]
	if r == nil {
		return true
	}
	return (r.whole+1)/(r.whole+r.partial+2) <= wholeReclaimBar
}

// onlyZone says whether place is the only one of all the offers (every offer, refused or
// cooling ones too, since those are other zones a hedge may wait for) that sells spot.
func onlyZone(all []Offer, place string) bool {
	for _, o := range all {
		if o.Capacity == fleet.Spot && o.place() != place {
			return false
		}
	}
	return true
}

// onePlace says whether every spot replica a plan keeps or launches is in one place, and
// which (false for none).
func onePlace(have []Placed, launches []Launch) (string, bool) {
	at := ""
	for _, r := range have {
		if at != "" && r.place() != at {
			return "", false
		}
		at = r.place()
	}
	for _, l := range launches {
		if at != "" && l.Offer.place() != at {
			return "", false
		}
		at = l.Offer.place()
	}
	return at, at != ""
}

// sameZoneHedge says whether a lone spot replica in place, the only zone that sells spot
// (onlyZone, the caller's to check), may be hedged by a second one there: only once the zone
// has taken one of the service's replicas back lately (its record holds at least half a
// preemption, decayed with zoneMemory's half life: one within the last day), and where its
// reclaims allow a pair (allowsPair). A zone that takes nothing back needs no insurance:
// under the count reading of SpotServe's trace, which never reaches the service, a pair cost
// 1.9× SkyServe's lone replica.
func (pl *Placer) sameZoneHedge(place string) bool {
	r := pl.zones[place]
	return r != nil && r.preemptions >= 0.5 && pl.together.allowsPair(place)
}

// wholeReclaimBar is the chance of a whole reclaim past which a same-zone hedge stops paying.
const wholeReclaimBar = 0.75
