package router

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/arbiter-serve/arbiter/fleet"
)

// Replica is the router's live view of one replica. It survives replica-set refreshes
// (keyed by ID), so health, load and what the predictor learned are kept.
type Replica struct {
	info     atomic.Pointer[fleet.Replica]
	idHash   uint64 // for rendezvous hashing
	inflight atomic.Int64
	conns    *connPool
	series   atomic.Pointer[replicaSeries]

	// Availability is read on every pick without the mutex (a pick over thousands of
	// candidates cannot take thousands of locks); it is written under mu.
	//
	// ready is the active probe's verdict; a new replica starts ready because whoever
	// listed it (the control plane) saw it ready.
	ready        atomic.Bool
	removed      atomic.Bool  // no longer in the set: drain, then drop
	ejectedUntil atomic.Int64 // unix nanoseconds; passive health's ejection ends then

	mu         sync.Mutex // guards everything below
	probeFails int
	fails      int // consecutive request failures (passive health)
	ejections  int // consecutive ejections, for backoff
	scrape     scrapeState
	pred       predictor
	// prefillUntil is when the prefill work this router has queued on the replica should
	// be done: the wait ahead of a new prompt, which the request count alone does not show
	// (one 8k-token prompt delays the next TTFT as much as many short ones). It drains with
	// time, so a request whose first token the router never sees (not streamed) stops
	// counting once its prefill should be over, not when its whole answer is.
	prefillUntil time.Time
	// lastSent is when this router last sent the replica a request (or claimed one to
	// re-sample it).
	lastSent time.Time
}

type scrapeState struct {
	at               time.Time
	running, waiting float64
	kvUsage          float64
	inflightAtScrape int64
}

func newReplica(info fleet.Replica, pc *connPool) *Replica {
	r := &Replica{idHash: xxhash.Sum64String(info.ID), conns: pc, pred: newPredictor()}
	r.info.Store(&info)
	r.ready.Store(true)
	return r
}

// Info returns the replica's description.
func (r *Replica) Info() *fleet.Replica { return r.info.Load() }

// InFlight is the number of requests this router has open on the replica.
func (r *Replica) InFlight() int64 { return r.inflight.Load() }

// Available reports whether the replica may take a new request: ready, not ejected, not
// draining and still in the set.
func (r *Replica) Available(now time.Time) bool {
	return r.listed() && !r.ejected(now)
}

// listed reports whether the replica belongs among a pool's candidates: ready, in the set
// and not draining. The pool indexes only these; ejection is the one transient state a pick
// checks itself.
func (r *Replica) listed() bool {
	return r.ready.Load() && !r.removed.Load() && !r.Info().Draining
}

// ejected reports whether passive health keeps the replica out at now.
func (r *Replica) ejected(now time.Time) bool { return now.UnixNano() < r.ejectedUntil.Load() }

// Load is the replica's predicted number of requests in its engine (running + waiting):
// the last scrape, moved by what this router started or finished since. Between scrapes
// other routers' changes are unknown, so a stale scrape falls back to our own count.
func (r *Replica) Load(now time.Time, staleAfter time.Duration) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.loadLocked(now, staleAfter)
}

func (r *Replica) loadLocked(now time.Time, staleAfter time.Duration) float64 {
	in := float64(r.inflight.Load())
	s := r.scrape
	if s.at.IsZero() || now.Sub(s.at) > staleAfter {
		return in
	}
	projected := s.running + s.waiting + in - float64(s.inflightAtScrape)
	return math.Max(projected, in)
}

// observeScrape records a /metrics scrape.
func (r *Replica) observeScrape(now time.Time, running, waiting, kv float64) {
	in := r.inflight.Load()
	r.mu.Lock()
	r.scrape = scrapeState{at: now, running: running, waiting: waiting, kvUsage: kv, inflightAtScrape: in}
	if waiting > 0 && running > 0 {
		// A queue means the engine is full: its running count is its batch capacity.
		r.pred.slots.observe(running)
	}
	r.mu.Unlock()
}

// requestSucceeded resets passive-health failure counts.
func (r *Replica) requestSucceeded() {
	r.mu.Lock()
	r.fails, r.ejections = 0, 0
	r.mu.Unlock()
}

// requestFailed counts a failure and ejects the replica after maxFails in a row, for a
// backoff that doubles with each consecutive ejection. It reports whether it ejected.
func (r *Replica) requestFailed(now time.Time, maxFails int, base, maxBackoff time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fails++
	if r.fails < maxFails {
		return false
	}
	backoff := base << min(r.ejections, 16)
	if backoff > maxBackoff || backoff <= 0 {
		backoff = maxBackoff
	}
	r.ejections++
	r.fails = 0
	r.ejectedUntil.Store(now.Add(backoff).UnixNano())
	return true
}

// probed records an active readiness probe's result; it returns the readiness after it.
func (r *Replica) probed(ok bool, rtt time.Duration, failThreshold int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ok {
		r.probeFails = 0
		r.ready.Store(true)
		r.pred.rtt.observe(rtt.Seconds())
		return true
	}
	r.probeFails++
	if r.probeFails >= failThreshold {
		r.ready.Store(false)
	}
	return r.ready.Load()
}

// rttKnown reports whether a probe has measured the replica's round trip yet.
func (r *Replica) rttKnown() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pred.rtt.n > 0
}

// Prediction is what the router expects a request to see on a replica.
type Prediction struct {
	TTFT, TPOT, E2E float64 // seconds
	QueueWait       float64 // seconds of TTFT spent queued
	PrefillWait     float64 // seconds of TTFT spent on prompts sent ahead of it
	Load            float64 // requests in the engine besides this one
	Uncached        int     // prompt tokens the replica must compute (not in its prefix cache)

	prefillWork float64   // seconds of prefill this request adds to the replica's queue
	prefillEnd  time.Time // when Begin expects its prefill to be done
}

// Predict estimates TTFT = RTT + queue wait + prefill of the prompts queued ahead and of the
// request's own uncached tokens, and time per output token from the batch the request would
// join. The pick and the request's own accounting (Begin) both come here, with the same
// inputs, so the prediction that chose a replica is the one its error is measured against.
func (r *Replica) Predict(now time.Time, uncached, outTokens int, staleAfter time.Duration) Prediction {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.predictLocked(now, uncached, outTokens, staleAfter)
}

func (r *Replica) predictLocked(now time.Time, uncached, outTokens int, staleAfter time.Duration) Prediction {
	ahead := max(r.prefillUntil.Sub(now).Seconds(), 0)
	return r.pred.predict(r.loadLocked(now, staleAfter), uncached, ahead, outTokens)
}

// claimResample reserves the replica for one re-sampling request if the router has sent it
// nothing for every; it reports whether the claim was taken.
func (r *Replica) claimResample(now time.Time, every time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Sub(r.lastSent) < every {
		return false
	}
	r.lastSent = now
	return true
}

// defaultTokensPerSecond stands in for a replica whose description gives no throughput: the
// same for all, so replicas are then ranked by price alone.
const defaultTokensPerSecond = 2000

// MarginalCost is the cost in USD of one more token on this replica: zero on reserved
// capacity (already paid for), else the hourly price spread over its token throughput.
func (r *Replica) MarginalCost() float64 {
	info := r.Info()
	if info.Capacity == fleet.Reserved || info.PricePerHour <= 0 {
		return 0
	}
	// Throughput comes from the replica's description, never from what this router saw:
	// a learned figure grows with the traffic a replica gets, so the busiest replica would
	// look cheapest and draw still more (a feedback loop the simulator showed).
	tps := info.TokensPerSecond
	if tps <= 0 {
		tps = defaultTokensPerSecond
	}
	return info.PricePerHour / 3600 / tps
}

// learn feeds a finished request's measurements to the predictor.
func (r *Replica) learn(now time.Time, m measurement) {
	r.mu.Lock()
	r.pred.learn(now, m)
	r.mu.Unlock()
}

// prefillDone says a request's prefill is over (its first token came, or it ended): the
// work queued before it is done too, and what was queued after it starts now.
func (r *Replica) prefillDone(pred Prediction, now time.Time) {
	if pred.prefillEnd.IsZero() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	after := max(r.prefillUntil.Sub(pred.prefillEnd), 0)
	r.prefillUntil = now.Add(after)
}
