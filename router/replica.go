package router

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
)

// Replica is the router's live view of one replica. It survives replica-set refreshes
// (keyed by ID), so health, load and what the predictor learned are kept.
type Replica struct {
	info     atomic.Pointer[fleet.Replica]
	idHash   uint64 // for rendezvous hashing
	inflight atomic.Int64
	// peerInflight counts peers' requests open on the replica (the shared view, peers.go);
	// out tells the peers about this router's. Both stay zero without peers.
	peerInflight atomic.Int64
	out          atomic.Pointer[peerView]
	// judged and missed: answers judged against the SLO since the last load report, and
	// those that missed it (judge, takeJudged).
	judged, missed atomic.Int64
	conns          *connPool
	series         atomic.Pointer[replicaSeries]
	// rejectLoggedAt (unix nanoseconds) is when a refused report of the replica was last
	// logged, rejectsUnlogged how many were refused since (replicareports.go).
	rejectLoggedAt, rejectsUnlogged atomic.Int64

	// Availability is read on every pick without the mutex (a pick over thousands of
	// candidates cannot take thousands of locks); it is written under mu.
	//
	// ready is the active probe's verdict; a new replica starts ready because whoever
	// listed it (the control plane) saw it ready.
	ready        atomic.Bool
	removed      atomic.Bool  // no longer in the set: drain, then drop
	ejectedUntil atomic.Int64 // unix nanoseconds; passive health's ejection ends then
	// progressAt is when a scrape last saw the engine's token counters grow (unix
	// nanoseconds; 0: never): a wait for a whole response is extended while it moves.
	progressAt atomic.Int64
	// refused holds the APIs (apiBit) the replica answered with vLLM's "does not support":
	// its model does not serve them, so it gets no more of their requests (endpoints.go).
	refused    atomic.Uint32
	tokensSeen float64 // the counters' last sum; only the replica's scrape loop touches it

	mu         sync.Mutex // guards everything below
	probeFails int
	probeOKs   int  // consecutive passed probes
	probedOut  bool // failed probes took it out of routing: it needs failThreshold passes to return
	fails      int  // consecutive request failures (passive health)
	ejections  int  // consecutive ejections, for backoff
	scrape     scrapeState
	rtt        ewma // seconds, from readiness probes
	twin       twin // the replica's engine as this router's requests load it
	// prefixes is what this router sent the replica that its prefix cache likely holds.
	prefixes prefixMemory
	spread   spread
	// tpotSpread is spread for the time per output token: a stream's TPOT grows with the
	// requests sent to the replica after it, which no prediction at its pick can see.
	tpotSpread spread
	// lastSent is when this router last sent the replica a request (or claimed one to
	// re-sample it).
	lastSent time.Time

	// lora is the replica's LoRA adapters as this router knows them (lora.go), made on
	// first use: a fleet without adapters never makes one.
	lora     *loraState
	loraOnce sync.Once
	// loadingNanos is the load time of the adapters this router is having it load now.
	loadingNanos atomic.Int64
}

type scrapeState struct {
	at               time.Time
	running, waiting float64
	inflightAtScrape int64
	queuedAtScrape   int // our prompts not yet seen prefilled
}

func newReplica(info fleet.Replica, pc *connPool, prof *engine.Profile) *Replica {
	r := &Replica{idHash: xxhash.Sum64String(info.ID), conns: pc, rtt: ewma{v: 0.001, alpha: 0.2}, twin: newTwin(prof)}
	r.info.Store(&info)
	r.ready.Store(true)
	return r
}

// Info returns the replica's description.
func (r *Replica) Info() *fleet.Replica { return r.info.Load() }

// InFlight is the number of requests this router has open on the replica.
func (r *Replica) InFlight() int64 { return r.inflight.Load() }

// inflightSeen is the requests open on the replica as far as this router knows: its own and
// its peers'.
func (r *Replica) inflightSeen() int64 { return r.inflight.Load() + r.peerInflight.Load() }

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
	in := float64(r.inflightSeen())
	s := r.scrape
	if s.at.IsZero() || now.Sub(s.at) > staleAfter {
		return in
	}
	projected := s.running + s.waiting + in - float64(s.inflightAtScrape)
	return math.Max(projected, in)
}

// observeScrape records a /metrics scrape.
func (r *Replica) observeScrape(now time.Time, running, waiting, kv float64) {
	in := r.inflightSeen()
	r.mu.Lock()
	r.scrape = scrapeState{at: now, running: running, waiting: waiting, inflightAtScrape: in, queuedAtScrape: len(r.twin.queue)}
	r.twin.scrapedKV, r.twin.scrapedAt = kv, now
	r.mu.Unlock()
}

// observeTokens records a scrape of the engine's token counters (their sum): any change
// is progress, a restart's reset included.
func (r *Replica) observeTokens(now time.Time, total float64) {
	if total != r.tokensSeen {
		r.tokensSeen = total
		r.progressAt.Store(now.UnixNano())
	}
}

// judge counts one answer judged against the SLO (met or not) for the next load report.
// The count of judged moves first, so that a report, which takes the misses first, never
// says more misses than answers judged.
func (r *Replica) judge(met bool) {
	r.judged.Add(1)
	if !met {
		r.missed.Add(1)
	}
}

// takeJudged returns and resets the answers judged and missed since the last call.
func (r *Replica) takeJudged() (judged, missed int64) {
	missed = r.missed.Swap(0)
	judged = r.judged.Swap(0)
	return judged, min(missed, judged)
}

// progressedSince reports whether a scrape saw the engine's token counters move after t.
func (r *Replica) progressedSince(t time.Time) bool {
	return r.progressAt.Load() > t.UnixNano()
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
		r.probeOKs++
		r.rtt.observe(rtt.Seconds())
		if r.probedOut && r.probeOKs < failThreshold {
			// Taken out by failed probes, it comes back after as many passes in a row as
			// failures took it out: a /health that flaps (fail, fail, pass, ...) would
			// otherwise move it in and out of routing every few probes.
			return false
		}
		r.probedOut = false
		r.ready.Store(true)
		return true
	}
	r.probeOKs = 0
	r.probeFails++
	if r.probeFails >= failThreshold {
		r.probedOut = true
		r.ready.Store(false)
	}
	return r.ready.Load()
}

// rttKnown reports whether a probe has measured the replica's round trip yet.
func (r *Replica) rttKnown() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rtt.n > 0
}

// Prediction is what the router expects a request to see on a replica.
type Prediction struct {
	TTFT, TPOT, E2E float64 // seconds
	// Wait is the seconds of TTFT before the request's own prefill starts: the step running
	// and the prompts queued ahead.
	Wait float64
	// Ahead is the prompts queued ahead of it (this router's and, from the replica's
	// metrics, others').
	Ahead    int
	Load     float64 // requests in the engine besides this one
	Uncached int     // prompt tokens the replica must compute (not in its prefix cache)
	// Spread is what this replica's TTFTs have been, at the SLO's percentile, as a multiple
	// of their predictions (0: not known yet): a replica whose answers scatter around the
	// prediction must be predicted under the SLO by that much to meet it at its percentile.
	Spread float64
	// TPOTSpread is the same for the time per output token: how a stream's TPOT turned out
	// against its prediction at the pick, at the SLO's percentile. The replica's later
	// picks add sequences to its batch, so a policy that fills a replica up to the TPOT
	// target would otherwise see its earlier streams slow past it.
	TPOTSpread float64
	// TooLong: the prompt and its output are more than the replica's profile holds (its
	// max_model_len, which vLLM bounds by the KV cache): the replica would refuse it.
	TooLong bool

	seq *twinSeq // the request in the model, once Begin sent it
	// shared is the request's ID among this router's peers (0: none); shape, what Begin put
	// in the replica's model, which is what peers are told.
	shared uint64
	shape  shape
	// adapter is the request's LoRA adapter ("": the base model), and adapterLoad the load
	// predicted before the replica has the request, which the replica's TTFT does not show.
	adapter     string
	adapterLoad float64
}

// Predict runs the replica's model (twin) forward with one more prompt of prompt tokens,
// uncached of them to compute: TTFT is the round trip plus the time until its last prompt
// chunk is computed, TPOT the decode step it would then share, stretched by the share of
// time the replica spends on prefill. The pick and the request's own accounting (Begin)
// both come here, with the same inputs, so the prediction that chose a replica is the one
// its error is measured against.
func (r *Replica) Predict(now time.Time, prompt, uncached, outTokens int, staleAfter time.Duration) Prediction {
	return r.predict(now, shape{prompt: max(prompt, uncached, 1), cached: max(prompt-uncached, 0), out: outTokens}, outTokens, staleAfter)
}

func (r *Replica) predict(now time.Time, p shape, outTokens int, staleAfter time.Duration) Prediction {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.predictLocked(now, p, outTokens, staleAfter)
}

func (r *Replica) predictLocked(now time.Time, p shape, outTokens int, staleAfter time.Duration) Prediction {
	p = r.withKnownPrefix(p)
	prompt := p.prompt
	w := &r.twin
	w.advance(now)
	o := r.othersLocked(now, staleAfter)
	res := w.dryRun(now, -1, p, o)
	uncached := prompt - res.cached
	ttft := r.rtt.v + max(res.end.Sub(now).Seconds(), 0)
	tpot := w.tpot(now, res.decoding, res.ctx+float64(prompt))
	ahead := o.waiting
	for _, s := range w.queue[:res.at] {
		if s.left > 0 {
			ahead++
		}
	}
	wait := max(res.start.Sub(now).Seconds(), 0)
	if n := r.loadingNanos.Load(); n > 0 {
		// Adapters this router asked the replica to load: its engine loads them between
		// steps, and serves nothing meanwhile.
		ttft += float64(n) / 1e9
		wait += float64(n) / 1e9
	}
	return Prediction{TTFT: ttft, TPOT: tpot, E2E: ttft + float64(max(outTokens-1, 0))*tpot, Wait: wait,
		Ahead: ahead, Load: r.loadLocked(now, staleAfter), Uncached: uncached, Spread: r.spread.factor(), TPOTSpread: r.tpotSpread.factor(),
		TooLong: w.prof != nil && w.prof.MaxModelLen > 0 && prompt+max(outTokens, 1) > w.prof.MaxModelLen}
}

// withKnownPrefix counts as cached what the replica's prefix cache likely holds of the
// prompt (its prefix memory), beyond what the caller knew (a peer's word, or Predict's
// argument). Caller holds r.mu.
func (r *Replica) withKnownPrefix(p shape) shape {
	if c := r.prefixes.match(p.prefix, p.blockTokens); c > p.cached {
		p.cached = min(c, p.prompt-1)
	}
	return p
}

// othersLocked is the load other routers (or clients) put on the replica: what its last
// fresh scrape counted beyond this router's own requests then.
func (r *Replica) othersLocked(now time.Time, staleAfter time.Duration) others {
	s := r.scrape
	if s.at.IsZero() || now.Sub(s.at) > staleAfter {
		return others{}
	}
	extra := int(math.Round(s.running+s.waiting)) - int(s.inflightAtScrape)
	if extra <= 0 {
		return others{}
	}
	waiting := min(max(int(math.Round(s.waiting))-s.queuedAtScrape, 0), extra)
	return others{decoding: extra - waiting, waiting: waiting}
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

// StepScales is the profile the replica's model runs with and what it multiplies the
// profile's prefill and decode step times by, as calibrated by the replica's answers.
func (r *Replica) StepScales(now time.Time) (profile string, prefill, decode float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.twin.prof.Name, r.twin.prefill.factor(now), r.twin.decop.factor(now)
}

// setInfo replaces the replica's description, and the profile its model runs with.
func (r *Replica) setInfo(info fleet.Replica, prof *engine.Profile) {
	r.info.Store(&info)
	r.mu.Lock()
	r.twin.setProfile(prof)
	r.mu.Unlock()
}

// kvCapacity is the replica's KV cache in tokens, by its profile (0: unknown).
func (r *Replica) kvCapacity() float64 {
	if r.twin.prof == nil {
		return 0
	}
	return float64(r.twin.prof.KVTokens)
}
