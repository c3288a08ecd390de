package router

import (
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// Detached replicas serve callers that move requests themselves: the trace-driven simulator
// advances virtual time and hands requests to a performance model instead of a socket, but
// must route with exactly this package's view of a replica (load projection, predictor,
// marginal cost) and its policies. Everything below is what the proxy does around a
// request, minus the network.

// NewDetachedReplica returns a replica without a connection pool.
func NewDetachedReplica(info fleet.Replica) *Replica { return newReplica(info, nil) }

// SetInfo replaces the replica's description (e.g. it started draining).
func (r *Replica) SetInfo(info fleet.Replica) { r.info.Store(&info) }

// Begin counts a request as in flight on the replica (sent at req.Now) and returns what the
// replica is expected to do with it: the same prediction the pick saw, made before the
// request counts itself.
func (r *Replica) Begin(req *Request, staleAfter time.Duration) Prediction {
	r.mu.Lock()
	defer r.mu.Unlock()
	pred := r.predictLocked(req.Now, req.uncachedOn(r), req.OutTokens, staleAfter)
	start := req.Now
	if r.prefillUntil.After(start) {
		start = r.prefillUntil
	}
	pred.prefillEnd = start.Add(time.Duration(pred.prefillWork * float64(time.Second)))
	r.prefillUntil = pred.prefillEnd
	r.lastSent = req.Now
	r.inflight.Add(1)
	return pred
}

// FirstToken says the request's prefill is done at now: it no longer delays later prompts.
func (r *Replica) FirstToken(pred Prediction, now time.Time) { r.prefillDone(pred, now) }

// End releases what Begin took at now; firstToken says whether FirstToken was called.
func (r *Replica) End(pred Prediction, firstToken bool, now time.Time) {
	r.inflight.Add(-1)
	if !firstToken {
		r.prefillDone(pred, now)
	}
}

// ObserveEngine records the engine's queue as a /metrics scrape would report it.
func (r *Replica) ObserveEngine(now time.Time, running, waiting int, kvUsage float64) {
	r.observeScrape(now, float64(running), float64(waiting), kvUsage)
}

// ObserveRTT records a successful readiness probe's round trip.
func (r *Replica) ObserveRTT(rtt time.Duration) { r.probed(true, rtt, 1) }

// Completed feeds a successful request's latencies (seconds) to the predictor; pred is what
// Begin returned. outTokens is the completion length; streamed says ttft is a real first token.
func (r *Replica) Completed(req *Request, pred Prediction, ttft, e2e float64, outTokens int, streamed bool) {
	r.learn(req.Now.Add(time.Duration(e2e*float64(time.Second))), measurement{uncached: pred.Uncached, outTokens: outTokens, ttft: ttft, e2e: e2e, loadAtStart: pred.Load,
		predictedTTFT: pred.TTFT, queueWait: pred.QueueWait, prefillWait: pred.PrefillWait, streamed: streamed})
}

// Forget drops every prefix entry pointing at r, once r has left the set.
func (a *Affinity) Forget(r *Replica) { a.forget(r) }
