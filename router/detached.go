package router

import (
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
)

// Detached replicas serve callers that move requests themselves: the trace-driven simulator
// advances virtual time and hands requests to a performance model instead of a socket, but
// must route with exactly this package's view of a replica (load projection, predictor,
// marginal cost) and its policies. Everything below is what the proxy does around a
// request, minus the network.

// NewDetachedReplica returns a replica without a connection pool whose model runs with prof.
func NewDetachedReplica(info fleet.Replica, prof *engine.Profile) *Replica {
	return newReplica(info, nil, prof)
}

// SetInfo replaces the replica's description (e.g. it started draining).
func (r *Replica) SetInfo(info fleet.Replica) { r.info.Store(&info) }

// Begin counts a request as in flight on the replica (sent at req.Now), adds it to the
// replica's model, and returns what the replica is expected to do with it: the prediction
// the pick made (or, for a policy that predicts nothing, the same made now), before the
// request counts itself.
func (r *Replica) Begin(req *Request, staleAfter time.Duration) Prediction {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.withKnownPrefix(req.shape())
	var pred Prediction
	if req.picked == r {
		pred = req.pickedPred
	} else {
		pred = r.predictLocked(req.Now, p, req.OutTokens, staleAfter)
	}
	req.picked = nil // a retry's pick is its own
	pred.seq, pred.shape = r.twin.add(req.Now, p, req.Streamed), p
	r.prefixes.add(p.prefix, float64(pred.Uncached+p.out), r.kvCapacity())
	r.lastSent = req.Now
	r.inflight.Add(1)
	if v := r.out.Load(); v != nil {
		pred.shared = v.begin(r, p, req.Streamed, req.Now)
	}
	if pred.adapter = req.Adapter; pred.adapter != "" {
		r.adapterBegan(pred.adapter)
	}
	return pred
}

// peerBegin adds a peer's request, sent at now, to the replica's model as Begin does our own.
// The replica counts as sent to: without it each of N routers re-sampled a replica it had
// not sent to itself, N times as often as one router (8 routers in virtual time: 85.9 %
// against 87.2 % SLO attainment without and with this).
func (r *Replica) peerBegin(now time.Time, p shape, streamed bool) *twinSeq {
	r.mu.Lock()
	defer r.mu.Unlock()
	p = r.withKnownPrefix(p)
	seq := r.twin.add(now, p, streamed)
	r.prefixes.add(p.prefix, float64(p.prompt-p.cached+p.out), r.kvCapacity())
	r.peerInflight.Add(1)
	if now.After(r.lastSent) {
		r.lastSent = now
	}
	return seq
}

// peerFirst says a peer's request got its first token at now, in the peer's clock. It does
// not calibrate this router's model of the replica: in virtual time, where the peer's word
// is exact, calibrating from it cost 3 and 8 routers 0.4–0.6 points of SLO attainment
// (`simulate routers`, bench/docs/picker.md).
func (r *Replica) peerFirst(seq *twinSeq, now time.Time) {
	r.mu.Lock()
	r.twin.prefilled(seq, r.replicaTime(now), false)
	r.mu.Unlock()
}

// peerEnd releases a peer's request.
func (r *Replica) peerEnd(seq *twinSeq, now time.Time) {
	r.peerInflight.Add(-1)
	r.mu.Lock()
	r.twin.remove(seq, r.replicaTime(now))
	r.mu.Unlock()
}

// PeerRequest is a peer router's request as another router's view of the replica holds it:
// the simulator's routers sharing their view (Inputs.SharedView) without a network.
type PeerRequest struct{ seq *twinSeq }

// PeerBegan applies to r, this router's view of the replica a peer sent a request to, what
// the peer's begin event says (peers.go): the request as the peer's Begin returned pred for
// it. aff, this router's affinity table (nil: none), learns its prefix.
func (r *Replica) PeerBegan(req *Request, pred Prediction, aff *Affinity) PeerRequest {
	seq := r.peerBegin(req.Now, pred.shape, req.Streamed)
	aff.record(pred.shape.prefix, r)
	return PeerRequest{seq}
}

// PeerFirstToken applies a peer's first-token event.
func (r *Replica) PeerFirstToken(p PeerRequest, now time.Time) { r.peerFirst(p.seq, now) }

// PeerEnded applies a peer's end event.
func (r *Replica) PeerEnded(p PeerRequest, now time.Time) { r.peerEnd(p.seq, now) }

// replicaTime is when something the router saw at now happened on the replica, in its
// model's time (see twin).
func (r *Replica) replicaTime(now time.Time) time.Time {
	return now.Add(-time.Duration(r.rtt.v * float64(time.Second)))
}

// FirstToken says the request's first token came at now: its prefill, and that of every
// prompt ahead of it, is done.
func (r *Replica) FirstToken(pred Prediction, now time.Time) {
	r.mu.Lock()
	r.twin.prefilled(pred.seq, r.replicaTime(now), true)
	r.mu.Unlock()
	if v := r.out.Load(); v != nil {
		v.first(pred.shared, now)
	}
}

// End releases what Begin took at now: the request is answered, failed or cancelled.
func (r *Replica) End(pred Prediction, now time.Time) {
	r.inflight.Add(-1)
	r.mu.Lock()
	r.twin.remove(pred.seq, r.replicaTime(now))
	r.mu.Unlock()
	if v := r.out.Load(); v != nil {
		v.end(pred.shared, now)
	}
	if pred.adapter != "" {
		r.adapterEnded(pred.adapter)
	}
}

// ObserveEngine records the engine's queue as a /metrics scrape would report it.
func (r *Replica) ObserveEngine(now time.Time, running, waiting int, kvUsage float64) {
	r.observeScrape(now, float64(running), float64(waiting), kvUsage)
}

// ObserveRTT records a successful readiness probe's round trip.
func (r *Replica) ObserveRTT(rtt time.Duration) { r.probed(true, rtt, 1) }

// Completed says a request succeeded: ttft and e2e are seconds from sending, outTokens its
// completion length, streamed whether ttft is a real first token (else it is the whole
// answer). A stream's time per token calibrates the model's decode steps; a whole answer
// says its prefill is over. pred is what Begin returned.
func (r *Replica) Completed(req *Request, pred Prediction, ttft, e2e float64, outTokens int, streamed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	end := r.replicaTime(req.Now.Add(time.Duration(e2e * float64(time.Second))))
	if !streamed {
		r.twin.prefilled(pred.seq, end, false)
		return
	}
	if base := pred.TTFT - pred.adapterLoad; base > 0 && ttft > 0 {
		// The adapter's load or slot wait came before the replica had the request.
		r.spread.observe(ttft/base, req.SLO.Percentile)
	}
	if outTokens > 1 {
		tpot := (e2e - ttft) / float64(outTokens-1)
		r.twin.decoded(pred.seq, tpot, end)
		if pred.TPOT > 0 {
			r.tpotSpread.observe(tpot/pred.TPOT, req.SLO.Percentile)
		}
	}
}

// Forget drops every prefix entry pointing at r, once r has left the set.
func (a *Affinity) Forget(r *Replica) { a.forget(r) }
