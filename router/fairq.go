package router

import (
	"math"
	"time"
)

// fairQueue orders the requests that wait for capacity when the fleet is saturated
// (issue 52): the bands strictly (every waiting critical request before any standard
// one), and within a band the tenants by the virtual token counter of Sheng et al.,
// "Fairness in Serving Large Language Models" (OSDI '24, arXiv:2401.00588): each tenant's
// counter is the service it was given, input tokens weighing 1 and output tokens 2 (the
// paper's weights, as its artifact's defaults), divided by the tenant's weight; the
// tenant with the least goes next, its own requests first come first served. A tenant
// whose queue was empty joins at no less than the least counter of those waiting, so
// credit built while it was idle (or while the fleet had room for all) is not cashed in
// against the tenants that kept asking: the paper's "lift". The queue is
// work-conserving by construction: it orders only what waits, and nothing waits while a
// replica can take it (the proxy's gate).
//
// Not safe for concurrent use; the proxy's serviceQueue holds its lock around every call.
type fairQueue struct {
	bands [numBands]fairBand
	n     int // waiters, all bands together
	seq   uint64
}

type fairBand struct {
	flows map[string]*fairFlow // tenants with waiters
	// counters are the tenants' virtual token counters in this band, kept while they are
	// idle (bounded by the keys file's tenants).
	counters map[string]float64
}

type fairFlow struct {
	tenant  string
	waiters []*waiter // FIFO
}

// waiter is one request waiting in a fairQueue.
type waiter struct {
	tenant string
	band   Band
	weight float64
	// cost is what dispatching it charges its tenant's counter before its answer is
	// known: its prompt and the output expected (charge corrects it at the end).
	cost     float64
	arrived  time.Time
	deadline time.Time
	seq      uint64
	// turn is signalled (never closed) when the waiter is the queue's head and may try a
	// replica.
	turn   chan struct{}
	queued bool
	// evicted: a more urgent request took its place; it answers 429 when it wakes.
	evicted bool
}

// VTC's weights: an output token costs twice an input token.
const (
	vtcInput  = 1.0
	vtcOutput = 2.0
)

// vtcCost is the service of a request of prompt input tokens and output output tokens.
func vtcCost(prompt, output int) float64 {
	return vtcInput*float64(max(prompt, 0)) + vtcOutput*float64(max(output, 0))
}

// push queues w. When there is no room for it (full) it makes room by taking out the newest
// waiter of the lowest band below w's (returned, to be answered 429), or refuses w (ok
// false) when no band below w's has a waiter.
func (q *fairQueue) push(w *waiter, full bool) (evicted *waiter, ok bool) {
	if full {
		evicted = q.newestBelow(w.band)
		if evicted == nil {
			return nil, false
		}
		q.remove(evicted)
	}
	b := &q.bands[w.band]
	if b.flows == nil {
		b.flows, b.counters = map[string]*fairFlow{}, map[string]float64{}
	}
	f := b.flows[w.tenant]
	if f == nil {
		// The lift: a tenant that starts waiting joins at no less than the least counter
		// of those already waiting.
		if lo, any := b.leastWaiting(); any && b.counters[w.tenant] < lo {
			b.counters[w.tenant] = lo
		}
		f = &fairFlow{tenant: w.tenant}
		b.flows[w.tenant] = f
	}
	q.seq++
	w.seq, w.queued = q.seq, true
	f.waiters = append(f.waiters, w)
	q.n++
	return evicted, true
}

// leastWaiting is the least counter among the band's tenants with waiters.
func (b *fairBand) leastWaiting() (float64, bool) {
	lo, any := math.Inf(1), false
	for t := range b.flows {
		lo, any = math.Min(lo, b.counters[t]), true
	}
	return lo, any
}

// newestBelow is the last waiter to arrive in the lowest band below band that has one.
func (q *fairQueue) newestBelow(band Band) *waiter {
	for b := numBands - 1; b > band; b-- {
		var newest *waiter
		for _, f := range q.bands[b].flows {
			if w := f.waiters[len(f.waiters)-1]; newest == nil || w.seq > newest.seq {
				newest = w
			}
		}
		if newest != nil {
			return newest
		}
	}
	return nil
}

// head is the waiter to serve next: in the first band with waiters, the first waiter of
// the tenant with the least counter (ties: the earlier arrival).
func (q *fairQueue) head() *waiter {
	for i := range q.bands {
		b := &q.bands[i]
		var best *waiter
		bestC := 0.0
		for t, f := range b.flows {
			w, c := f.waiters[0], b.counters[t]
			if best == nil || c < bestC || (c == bestC && w.seq < best.seq) {
				best, bestC = w, c
			}
		}
		if best != nil {
			return best
		}
	}
	return nil
}

// remove takes w out of the queue (dispatched, expired or gone); a waiter not queued is
// left alone.
func (q *fairQueue) remove(w *waiter) {
	if !w.queued {
		return
	}
	b := &q.bands[w.band]
	f := b.flows[w.tenant]
	for i, x := range f.waiters {
		if x == w {
			f.waiters = append(f.waiters[:i], f.waiters[i+1:]...)
			break
		}
	}
	if len(f.waiters) == 0 {
		delete(b.flows, w.tenant)
	}
	w.queued = false
	q.n--
}

// charge adds service to a tenant's counter in a band: a request's expected cost when it
// is dispatched, the difference once its answer is counted (negative when it was shorter
// than expected). Weight divides it: a tenant of weight 2 is charged half as much, so gets
// twice the share.
func (q *fairQueue) charge(band Band, tenant string, weight, service float64) {
	b := &q.bands[band]
	if b.counters == nil {
		b.flows, b.counters = map[string]*fairFlow{}, map[string]float64{}
	}
	if weight <= 0 {
		weight = 1
	}
	b.counters[tenant] += service / weight
	// Keep the numbers small: a long-running router's counters would otherwise lose the
	// precision that tells two tenants apart (GIE's VTC plugin rebases likewise).
	if b.counters[tenant] > 1e12 {
		lo := math.Inf(1)
		for _, c := range b.counters {
			lo = math.Min(lo, c)
		}
		for t := range b.counters {
			b.counters[t] -= lo
		}
	}
}

// waitingAtOrAbove is how many wait in band and in the bands above it (more urgent).
func (q *fairQueue) waitingAtOrAbove(band Band) int {
	n := 0
	for b := Critical; b <= band; b++ {
		for _, f := range q.bands[b].flows {
			n += len(f.waiters)
		}
	}
	return n
}
