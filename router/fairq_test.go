package router

import (
	"math"
	"testing"
	"time"
)

func newWaiter(tenant string, band Band, weight, cost float64) *waiter {
	return &waiter{tenant: tenant, band: band, weight: weight, cost: cost}
}

// serve pops n heads, charging each its cost, and returns the service each tenant got.
func serveHeads(q *fairQueue, n int, refill func(w *waiter)) map[string]float64 {
	got := map[string]float64{}
	for range n {
		h := q.head()
		if h == nil {
			break
		}
		q.remove(h)
		q.charge(h.band, h.tenant, h.weight, h.cost)
		got[h.tenant] += h.cost
		if refill != nil {
			refill(h)
		}
	}
	return got
}

// Every waiting critical request goes before any standard one, and standard before
// sheddable, whatever their tenants' counters.
func TestFairQueueBandsAreStrict(t *testing.T) {
	q := &fairQueue{}
	q.charge(Critical, "a", 1, 1e6) // a's critical counter is far ahead
	order := []*waiter{newWaiter("s", Sheddable, 1, 1), newWaiter("b", Standard, 1, 1), newWaiter("a", Critical, 1, 1)}
	for _, w := range order {
		if _, ok := q.push(w, false); !ok {
			t.Fatal("refused")
		}
	}
	for _, want := range []Band{Critical, Standard, Sheddable} {
		h := q.head()
		if h == nil || h.band != want {
			t.Fatalf("head %+v; want band %v", h, want)
		}
		q.remove(h)
	}
	if q.head() != nil || q.n != 0 {
		t.Fatalf("queue not empty: %d", q.n)
	}
}

// Two backlogged tenants of one band, one asking 10× larger requests: each gets about
// the same service in tokens (not in requests), the gap bounded as VTC's is (within twice
// the largest request's cost); with weight 2, a tenant gets twice the other's.
func TestFairQueueSharesTokensNotRequests(t *testing.T) {
	for _, tc := range []struct {
		name   string
		wBig   float64
		wantBy float64 // big's service ÷ small's
	}{{"equal weights", 1, 1}, {"big tenant weight 2", 2, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			q := &fairQueue{}
			const bigCost, smallCost = vtcInput*2000 + vtcOutput*200, vtcInput*200 + vtcOutput*20
			for range 50 {
				q.push(newWaiter("big", Standard, tc.wBig, bigCost), false)
				q.push(newWaiter("small", Standard, 1, smallCost), false)
			}
			// Both stay backlogged: each served request is replaced by another.
			got := serveHeads(q, 2000, func(w *waiter) { q.push(newWaiter(w.tenant, w.band, w.weight, w.cost), false) })
			ratio := got["big"] / got["small"]
			if math.Abs(ratio-tc.wantBy)/tc.wantBy > 0.05 {
				t.Fatalf("big got %.0f, small %.0f (ratio %.3f); want about %.0f×", got["big"], got["small"], ratio, tc.wantBy)
			}
			gap := q.bands[Standard].counters["big"] - q.bands[Standard].counters["small"]
			if math.Abs(gap) > 2*bigCost {
				t.Fatalf("counters %v differ by %.0f; want within twice the largest request (%.0f)", q.bands[Standard].counters, gap, 2*bigCost)
			}
		})
	}
}

// A tenant that was idle while another was served does not cash in that idle time: it
// joins at the least counter of those waiting, and from there the two alternate.
func TestFairQueueLiftsAReturningTenant(t *testing.T) {
	q := &fairQueue{}
	for range 100 {
		q.push(newWaiter("busy", Standard, 1, 10), false)
	}
	serveHeads(q, 50, nil) // busy alone: its counter is 500
	for range 10 {
		q.push(newWaiter("back", Standard, 1, 10), false)
	}
	if c := q.bands[Standard].counters["back"]; c != 500 {
		t.Fatalf("the returning tenant's counter is %v; want lifted to 500, the least of those waiting", c)
	}
	got := serveHeads(q, 10, nil)
	if got["back"] != 50 || got["busy"] != 50 {
		t.Fatalf("after the return: %v; want the two served alike (50 each), not the returning one alone", got)
	}
}

// A full queue makes room for a more urgent request by taking out the newest of the
// lowest band below it, and refuses a request when nothing below it waits.
func TestFairQueueBoundedShedsTheLowestNewestFirst(t *testing.T) {
	q := &fairQueue{}
	const room = 3
	push := func(w *waiter) (*waiter, bool) { return q.push(w, q.n >= room) }
	old := newWaiter("batch", Sheddable, 1, 1)
	newest := newWaiter("batch", Sheddable, 1, 1)
	std := newWaiter("app", Standard, 1, 1)
	for _, w := range []*waiter{old, newest, std} {
		if ev, ok := push(w); !ok || ev != nil {
			t.Fatalf("push into room: evicted %v ok %v", ev, ok)
		}
	}
	if _, ok := push(newWaiter("batch", Sheddable, 1, 1)); ok {
		t.Fatal("a sheddable request was queued into a full queue with nothing below it")
	}
	crit := newWaiter("app", Critical, 1, 1)
	ev, ok := push(crit)
	if !ok || ev != newest || newest.queued {
		t.Fatalf("a critical request into a full queue: evicted %+v ok %v; want the newest sheddable out", ev, ok)
	}
	ev, ok = push(newWaiter("app", Standard, 1, 1))
	if !ok || ev != old {
		t.Fatalf("a standard request: evicted %+v; want the remaining sheddable", ev)
	}
	if _, ok := push(newWaiter("app", Standard, 1, 1)); ok {
		t.Fatal("a standard request queued with only standard and critical waiting")
	}
	if q.n != 3 || q.waitingAtOrAbove(Critical) != 1 || q.waitingAtOrAbove(Standard) != 3 {
		t.Fatalf("n %d, critical %d, standard and above %d", q.n, q.waitingAtOrAbove(Critical), q.waitingAtOrAbove(Standard))
	}
}

// A request no replica has room for goes anyway while lower bands hold the room, one for
// each lower-band request in flight: a top band's flood still waits for its own room.
func TestOverLowerStandsForLowerBandsInFlight(t *testing.T) {
	var sq serviceQueue
	if sq.overLower(Critical) || sq.overLower(Sheddable) {
		t.Fatal("nothing in flight: nothing to go over")
	}
	sq.sent[Sheddable] = 2
	if !sq.overLower(Critical) || !sq.overLower(Standard) {
		t.Fatal("two sheddable in flight: a critical or standard request goes over them")
	}
	if sq.overLower(Sheddable) {
		t.Fatal("a sheddable request never goes over its own band")
	}
	sq.over[Critical], sq.sent[Critical] = 1, 1
	if !sq.overLower(Critical) {
		t.Fatal("one critical over two sheddable: another may go")
	}
	sq.over[Standard], sq.sent[Standard] = 1, 1
	if sq.overLower(Critical) {
		t.Fatal("two over two sheddable: the next waits for room")
	}
	// A standard request through its gate holds room a critical one may go over.
	sq.over[Standard] = 0
	if !sq.overLower(Critical) {
		t.Fatal("one over three lower (a standard and two sheddable): a critical request may go")
	}
	if !sq.overLower(Standard) {
		t.Fatal("one over two sheddable: a standard request may go")
	}
	sq.over[Standard], sq.sent[Standard] = 1, 2
	if sq.overLower(Standard) {
		t.Fatal("two over two sheddable: a standard request waits")
	}
	if !sq.overLower(Critical) {
		t.Fatal("two over three held (a standard through its gate, two sheddable): a critical request may go")
	}
}

// A request goes over the gate only when waiting on for room would leave too little of its
// TTFT target: the next look for room (holdPoll away) plus its predicted TTFT.
func TestOverGateWaitsWhileRoomMayStillCome(t *testing.T) {
	for _, c := range []struct {
		waited       time.Duration
		ttft, target float64
		want         bool
	}{
		{0, 0.3, 1, false},                      // 0.25 + 0.3 < 1: wait for room
		{400 * time.Millisecond, 0.3, 1, false}, // 0.65 + 0.3 < 1
		{500 * time.Millisecond, 0.3, 1, true},  // 0.75 + 0.3 ≥ 1: go, to meet it
		{0, 0.8, 1, true},                       // a long prefill: at once
		{0, 0.1, 0, true},                       // no TTFT target: nothing to wait for
	} {
		if got := overGateNow(c.waited, c.ttft, c.target); got != c.want {
			t.Errorf("waited %v, predicted TTFT %v s, target %v s: over the gate %v, want %v", c.waited, c.ttft, c.target, got, c.want)
		}
	}
}

// A request sent over the gate gives its place back at its first token, not at its end: the
// place bounds prefills bypassing the gate at once; settle does not give it back twice.
func TestOverGatePlaceReturnsAtTheFirstToken(t *testing.T) {
	sq := &serviceQueue{}
	sq.sent[Sheddable] = 1
	c := &call{band: Critical, queue: sq, overGate: true}
	sq.sent[Critical], sq.over[Critical] = 1, 1
	if sq.overLower(Critical) {
		t.Fatal("one over one sheddable: no place left")
	}
	c.prefilled()
	if !sq.overLower(Critical) || sq.over[Critical] != 0 {
		t.Fatalf("after its first token: over %v; want the place back", sq.over)
	}
	c.settle(0, 0)
	if sq.over[Critical] != 0 || sq.sent[Critical] != 0 {
		t.Fatalf("after its end: over %v sent %v; want 0 and 0 (no double give-back)", sq.over, sq.sent)
	}
}
