package router

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/internal/conn/connwatch"
	"github.com/arbiter-serve/arbiter/oai"
)

// The router's queue for a saturated fleet (issue 52, queue.enabled). Without it, a
// request that no replica is predicted to serve within its SLO goes to the least loaded
// replica anyway and waits in that engine's queue, first come first served: a tenant that
// floods the endpoint takes the capacity, and an interactive request waits behind a batch
// job's. With it, such a request waits in the router instead, in its priority band and
// its tenant's flow (fairQueue), and is sent when a replica has room for it: the head of
// the queue (the most urgent band, the tenant served least within it) goes first, one at
// a time, each dispatch re-judged from the replicas' predictions after the one before has
// begun. A critical or standard request never waits past its SLO's TTFT target (it would
// miss it anyway), a sheddable one (batch work, which would rather wait for room than be
// refused) nor one whose SLO has no TTFT target past queue.max_wait, and none past its own
// deadline: it is answered 429 with Retry-After, as is a sheddable request pushed out of a
// full queue by a more urgent one.
//
// Nothing waits while a replica has room: a request goes straight to a replica when none
// of its band or a more urgent one waits and one has room; an idle replica always has
// room. So idle capacity is never held back for a tenant that is not asking, and the
// queue orders only what the fleet cannot take now. Queued requests count as held in the
// load reports, so the autoscaler sees the demand that waits.

// serviceQueue is one service's queue (its replicas are shared by its requests only).
type serviceQueue struct {
	mu sync.Mutex
	q  fairQueue
	// trying is the head that was told to try a replica and has not said how it went:
	// one at a time, so that each dispatch is judged after the one before has begun.
	trying *waiter
	// kickPending: a kick came while trying picked (room may have opened after its pick
	// looked), so if it finds none it looks again rather than wait for the next event.
	kickPending bool
	// ratePerSec is the pace of the queue's dispatches over its last window (for
	// Retry-After); windowCount counts those since rateSince, the window's start.
	rateSince   time.Time
	ratePerSec  float64
	windowCount int
	// sent counts, per band, the requests this queue sent (gated or not) whose answers
	// have not settled; over counts, per band, those among them sent past the gate
	// because lower bands held the room they missed (overLower).
	sent, over [numBands]int
}

// overGateNow reports whether a request that has waited waited for room, predicted to
// take ttft seconds to its first token on the best replica, should go there now rather than
// wait on for room: when its SLO has no TTFT target, or when the next look for room (at
// most holdPoll away) would come too late to meet the target (seconds). Until then room
// may come (a request ending frees it for the most urgent waiter), and a request sent over
// the gate waits in the engine behind what the lower bands already queued there.
func overGateNow(waited time.Duration, ttft, target float64) bool {
	if target <= 0 {
		return true
	}
	return (waited+holdPoll).Seconds()+ttft >= target
}

// overLower reports whether a request of band b that no replica has room for may go
// anyway, ungated (once overGateNow says so): a request is never refused for room that
// requests of lower bands hold. The engine cannot preempt them, so it goes to the replica
// predicted to serve it best, beside them, rather than wait to a 429 behind work that
// yields to it. Each request sent over the gate (of any band), until its first token
// (prefilled), stands for one lower-band request in flight that went through its gate, so
// that a flood of the top band cannot bypass the gate wholesale: it still waits for its
// own band's room. Caller holds sq.mu.
func (sq *serviceQueue) overLower(b Band) bool {
	held, over := 0, 0
	for x := b + 1; x < numBands; x++ {
		held += sq.sent[x] - sq.over[x]
	}
	for x := range numBands {
		over += sq.over[x]
	}
	return held > over
}

// queues holds the services' queues and the bound on them all.
type queues struct {
	mu      sync.Mutex
	byName  map[string]*serviceQueue
	waiting int // all services together, bounded by QueueConfig.MaxWaiting
}

func (qs *queues) of(service string) *serviceQueue {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if qs.byName == nil {
		qs.byName = map[string]*serviceQueue{}
	}
	sq := qs.byName[service]
	if sq == nil {
		sq = &serviceQueue{}
		qs.byName[service] = sq
	}
	return sq
}

// kick tells the head, if none is trying, that it may try a replica.
func (sq *serviceQueue) kick() {
	sq.mu.Lock()
	defer sq.mu.Unlock()
	sq.kickLocked()
}

func (sq *serviceQueue) kickLocked() {
	if sq.trying != nil && sq.trying.queued {
		sq.kickPending = true
		return
	}
	// A turn held by a waiter no longer queued is no one's: whatever path took it out
	// without passing the turn on, the queue does not stall on it.
	sq.trying, sq.kickPending = nil, false
	if h := sq.q.head(); h != nil {
		sq.trying = h
		select {
		case h.turn <- struct{}{}:
		default:
		}
	}
}

// retryAfter is the seconds a request answered 429 by this queue should wait: the
// requests ahead of one of its band at the pace the queue has been sending them, within
// [1, 60] (the OpenAI SDKs honour up to 60 s).
func (sq *serviceQueue) retryAfter(band Band) int {
	sq.mu.Lock()
	defer sq.mu.Unlock()
	ahead := float64(sq.q.waitingAtOrAbove(band))
	if sq.ratePerSec <= 0 {
		return int(math.Min(60, math.Max(1, ahead)))
	}
	return int(math.Min(60, math.Max(1, math.Ceil(ahead/sq.ratePerSec))))
}

// countDispatch updates the queue's recent dispatch rate. Caller holds sq.mu.
func (sq *serviceQueue) countDispatch(now time.Time) {
	if sq.rateSince.IsZero() {
		sq.rateSince = now
		return
	}
	sq.windowCount++
	if el := now.Sub(sq.rateSince); el >= 5*time.Second {
		sq.ratePerSec = float64(sq.windowCount) / el.Seconds()
		sq.rateSince, sq.windowCount = now, 0
	}
}

// queueing reports whether c goes through the queue: it is on, the policy predicts, and
// the request may go to any replica (not a continuation pinned to one).
func (px *Proxy) queueing(c *call, policy Policy) bool {
	if !px.queueOf(c).Enabled || c.pinned != nil {
		return false
	}
	_, ok := policy.(gating)
	return ok
}

// gating is a policy that judges a replica's room for a request (Request.gate): picks
// nothing when none has room. slo_cheapest does, from its predictions.
type gating interface {
	Policy
	gates()
}

func (*SLOCheapest) gates() {}

// queueOf is c's queue settings: its service's, else the router's.
func (px *Proxy) queueOf(c *call) *QueueConfig {
	if c.queueCfg != nil {
		return c.queueCfg
	}
	return &px.cfg.Queue
}

// gateFor is the share of the SLO c fills replicas up to.
func (px *Proxy) gateFor(c *call) float64 {
	if c.band == Sheddable {
		return px.queueOf(c).SheddableFill
	}
	return 1
}

// admitQueued picks a replica with room for c, waiting in its service's queue while none
// has. It returns nil when it has answered the client (429, or the client left).
func (px *Proxy) admitQueued(ctx *fasthttp.RequestCtx, c *call, policy Policy, rng *rand.Rand) *Replica {
	sq := px.queues.of(c.service)
	// overPick sends c over the gate when lower bands hold the room it misses and waiting on
	// would leave too little of its TTFT target (overGateNow): nil otherwise. The place
	// over the gate is taken under the lock, so that arrivals at once cannot all see one
	// free (settle gives it back).
	overPick := func(waited time.Duration, cands []*Replica) *Replica {
		if c.band == Sheddable {
			return nil
		}
		sq.mu.Lock()
		over := sq.overLower(c.band)
		if over {
			sq.over[c.band]++
		}
		sq.mu.Unlock()
		if !over {
			return nil
		}
		r := policy.Pick(&c.route, cands, rng)
		if r != nil && !overGateNow(waited, c.route.pickedPred.TTFT, c.route.SLO.TTFT) {
			r = nil // room may yet come: a request sent now waits behind theirs in the engine
		}
		if c.overGate = r != nil; !c.overGate {
			sq.mu.Lock()
			sq.over[c.band]--
			sq.mu.Unlock()
		}
		return r
	}
	candidates := func() []*Replica {
		c.route.Now = px.Now()
		return servingCandidates(px.callCandidates(c), c.api, &c.servingBuf)
	}
	// pick finds a replica with room for c, which has waited waited; else overPick's.
	pick := func(waited time.Duration) *Replica {
		cands := candidates()
		c.route.gate, c.route.patient = px.gateFor(c), c.band == Sheddable
		r := policy.Pick(&c.route, cands, rng)
		c.route.gate, c.route.patient = 0, false
		if r == nil {
			r = overPick(waited, cands)
		}
		return r
	}
	sq.mu.Lock()
	ahead := sq.q.waitingAtOrAbove(c.band)
	sq.mu.Unlock()
	if ahead == 0 {
		if r := pick(0); r != nil {
			px.charged(sq, c)
			px.met.queueWait.WithLabelValues(c.service, c.tenant, c.band.String()).Observe(0)
			return r
		}
	}
	// Saturated for it, or others of its band or above wait: it waits its turn.
	now := px.Now()
	wait := px.queueOf(c).MaxWait
	if t := c.route.SLO.TTFT; t > 0 && c.band != Sheddable {
		wait = time.Duration(t * float64(time.Second))
	}
	w := &waiter{tenant: c.tenant, band: c.band, weight: c.weight, arrived: now,
		deadline: minTime(c.deadline, now.Add(wait)), turn: make(chan struct{}, 1)}
	w.cost = vtcCost(c.route.PromptTokens, c.route.OutTokens)
	if !px.enqueue(ctx, c, sq, w) {
		return nil
	}
	c.load.held.Add(1)
	px.met.queueWaiting.WithLabelValues(c.service, c.band.String()).Inc()
	defer func() {
		c.load.held.Add(-1)
		px.met.queueWaiting.WithLabelValues(c.service, c.band.String()).Dec()
		// Every return has taken w out; a panic (in a policy's pick, say) must too, or its
		// slot and, were it the head, the queue's turn would be held for ever.
		sq.mu.Lock()
		if w.queued {
			px.leave(sq, w)
		}
		sq.mu.Unlock()
	}()
	for {
		t := time.NewTimer(max(0, min(cmp.Or(px.queuePoll, holdPoll), w.deadline.Sub(px.Now()))))
		select {
		case <-w.turn:
		case <-t.C:
		}
		t.Stop()
		now := px.Now()
		sq.mu.Lock()
		myTurn := sq.trying == w
		switch {
		case w.evicted:
			sq.mu.Unlock()
			px.refuseQueued(ctx, c, sq, w, "shed", fmt.Sprintf("The fleet serving model %q is saturated and this %s request gave its place in the queue to a more urgent one after %s.",
				c.model, c.band, now.Sub(w.arrived).Round(time.Millisecond)))
			return nil
		case !now.Before(w.deadline):
			px.leave(sq, w)
			sq.mu.Unlock()
			why := "its SLO's TTFT target"
			if c.route.SLO.TTFT <= 0 || c.band == Sheddable {
				why = "queue.max_wait"
			}
			if !w.deadline.Before(c.deadline) {
				why = "its deadline"
			}
			px.refuseQueued(ctx, c, sq, w, "timeout", fmt.Sprintf("The fleet serving model %q is saturated: this %s request waited %s (%s) for a replica with room.",
				c.model, c.band, now.Sub(w.arrived).Round(time.Millisecond), why))
			return nil
		case connwatch.PeerClosed(ctx.Conn()):
			px.leave(sq, w)
			sq.mu.Unlock()
			px.met.queueRejected.WithLabelValues(c.service, c.tenant, c.band.String(), "client_gone").Inc()
			px.met.fail("client_gone", c.service)
			ctx.SetConnectionClose()
			return nil
		}
		sq.mu.Unlock()
		var r *Replica
		if !myTurn {
			// Not the head: it waits its turn for room, but going over the gate takes no
			// room, so it need not wait behind others for that (else it would reach its
			// target still queued behind them while lower bands hold the room).
			if r = overPick(now.Sub(w.arrived), candidates()); r == nil {
				sq.kick() // a turn lost in a race, or a change no event told of: the head tries
				continue
			}
			sq.mu.Lock()
		} else {
			r = pick(now.Sub(w.arrived))
			sq.mu.Lock()
			if r == nil {
				sq.endTurnLocked(w)
				sq.mu.Unlock()
				continue // no room yet: the next request to end or start streaming kicks the head
			}
		}
		if sq.trying == w {
			// Its turn ends as it goes. (On the way over the gate the turn may have passed
			// to it while it picked, the head having left: it goes on, else no later
			// waiter gets one.)
			sq.trying = nil
		}
		if w.queued {
			sq.q.remove(w)
			px.releaseSlot()
		} // else it was shed while it picked, its slot taken by the request that shed it; it found room: it goes
		sq.countDispatch(now)
		sq.mu.Unlock()
		px.charged(sq, c)
		c.queued = now.Sub(w.arrived)
		px.met.queueWait.WithLabelValues(c.service, c.tenant, c.band.String()).Observe(c.queued.Seconds())
		// The next head tries once this request has begun on its replica (attempt's
		// Begin), so that its prediction counts this one.
		c.onBegin = sq.kick
		return r
	}
}

// endTurnLocked ends w's turn after its pick found no room: if a kick came meanwhile
// (a request ended or began streaming after the pick looked), the head looks again at
// once. The turn may already be another's (w was shed while it picked, and the turn went
// on): that one is left alone. Caller holds sq.mu.
func (sq *serviceQueue) endTurnLocked(w *waiter) {
	if sq.trying != w {
		return
	}
	sq.trying = nil
	if sq.kickPending {
		sq.kickLocked()
	}
}

// enqueue puts w in sq's queue, within the bound on all queues: a full queue sheds the
// newest waiter of a lower band for it, or refuses it (answered 429).
func (px *Proxy) enqueue(ctx *fasthttp.RequestCtx, c *call, sq *serviceQueue, w *waiter) bool {
	sq.mu.Lock()
	// The bound is on all services together; each service's fairQueue sheds within
	// itself only, so a full router with room in no lower band of this service refuses.
	full := !px.takeSlot()
	if full {
		// Full: push must make room in this service's queue, or refuse.
		if sq.q.n == 0 {
			sq.mu.Unlock()
			px.refuseQueued(ctx, c, sq, w, "full", fmt.Sprintf("The fleet serving model %q is saturated and %d requests already wait (queue.max_waiting) for other models.",
				c.model, px.cfg.Queue.MaxWaiting))
			return false
		}
	}
	evicted, ok := sq.q.push(w, full)
	if !ok {
		sq.mu.Unlock()
		px.refuseQueued(ctx, c, sq, w, "full", fmt.Sprintf("The fleet serving model %q is saturated and %d requests already wait (queue.max_waiting) none of them less urgent than this %s one.",
			c.model, px.cfg.Queue.MaxWaiting, c.band))
		return false
	}
	if evicted != nil {
		// It took the evicted waiter's slot; that one answers 429 when it wakes.
		evicted.evicted = true
		if sq.trying == evicted {
			sq.trying = nil
		}
		select {
		case evicted.turn <- struct{}{}:
		default:
		}
	}
	sq.kickLocked()
	sq.mu.Unlock()
	return true
}

// takeSlot counts one more waiter against queue.max_waiting; false: the queues are full.
func (px *Proxy) takeSlot() bool {
	px.queues.mu.Lock()
	defer px.queues.mu.Unlock()
	if px.queues.waiting >= px.cfg.Queue.MaxWaiting {
		return false
	}
	px.queues.waiting++
	return true
}

func (px *Proxy) releaseSlot() {
	px.queues.mu.Lock()
	px.queues.waiting--
	px.queues.mu.Unlock()
}

// leave takes w out of sq's queue (it expired or its client left). Caller holds sq.mu.
func (px *Proxy) leave(sq *serviceQueue, w *waiter) {
	if w.queued {
		sq.q.remove(w)
		px.releaseSlot()
	}
	if sq.trying == w {
		sq.trying = nil
	}
	sq.kickLocked()
}

// refuseQueued answers a request the queue could not serve: 429 with Retry-After.
func (px *Proxy) refuseQueued(ctx *fasthttp.RequestCtx, c *call, sq *serviceQueue, w *waiter, reason, msg string) {
	retry := sq.retryAfter(c.band)
	if c.load != nil {
		// Demand the fleet had no room for: the autoscaler counts it (fleet.ModelLoad.Shed).
		c.load.shed.Add(1)
		c.load.shedTokens.Add(int64(c.route.PromptTokens + c.route.OutTokens))
	}
	px.met.queueRejected.WithLabelValues(c.service, c.tenant, c.band.String(), reason).Inc()
	px.met.fail("queue_"+reason, c.service)
	oai.WriteError(ctx, fasthttp.StatusTooManyRequests, oai.RateLimit, fmt.Sprintf("%s Retry after %d s.", msg, retry))
	ctx.Response.Header.Set("Retry-After", strconv.Itoa(retry))
}

// charged counts c's expected cost against its tenant in its band once it is sent; the
// answer's usage corrects it (settle).
func (px *Proxy) charged(sq *serviceQueue, c *call) {
	c.charge = vtcCost(c.route.PromptTokens, c.route.OutTokens)
	c.queue = sq
	sq.mu.Lock()
	sq.q.charge(c.band, c.tenant, c.weight, c.charge)
	sq.sent[c.band]++ // over[c.band] was counted when pick took the place
	sq.mu.Unlock()
}

// settle replaces c's expected cost by what its answer used, and gives the head a turn:
// the request's end freed room.
func (c *call) settle(prompt, completion int) {
	sq := c.queue
	if sq == nil {
		return
	}
	c.queue = nil
	sq.mu.Lock()
	if prompt > 0 || completion > 0 {
		sq.q.charge(c.band, c.tenant, c.weight, vtcCost(prompt, completion)-c.charge)
	}
	sq.sent[c.band]--
	sq.giveBackOver(c)
	sq.kickLocked()
	sq.mu.Unlock()
	// The replica's model still counts c until its End, which comes after: the head then
	// looks again (endKick), else it would wait for the next event or poll to see the room.
	c.endKick = sq
}

// kickAfterEnd tells c's queue, once c has left its replica's model (Replica.End), that
// its room is free: settle's kick came before.
func (c *call) kickAfterEnd() {
	if sq := c.endKick; sq != nil {
		c.endKick = nil
		sq.kick()
	}
}

// giveBackOver gives back c's place over the gate, if it holds one. Caller holds sq.mu.
func (sq *serviceQueue) giveBackOver(c *call) {
	if c.overGate {
		c.overGate = false
		sq.over[c.band]--
	}
}

// prefilled is a streamed request's first token: its prefill is done, so room may have
// opened for the queue's head; and a request sent over the gate gives its place back, for
// the place bounds prefills bypassing the gate at once, not requests decoding beside the
// lower bands (a trickle of long interactive answers would hold every place for minutes,
// and the next critical request would wait to a 429 while sheddable work holds the room).
func (c *call) prefilled() {
	sq := c.queue
	if sq == nil {
		return
	}
	sq.mu.Lock()
	sq.giveBackOver(c)
	sq.kickLocked()
	sq.mu.Unlock()
}
