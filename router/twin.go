package router

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
)

// DefaultProfile is the profile a replica that names none is predicted with: an 8B model on
// an H100, the most common serving shape; calibration corrects it for others.
const DefaultProfile = "h100-llama-3.1-8b"

// LoadProfile returns a built-in engine profile by name; unlike engine.LoadProfile it reads
// no file, since a replica's description comes over the network.
func LoadProfile(name string) (*engine.Profile, error) {
	if strings.HasSuffix(name, ".json") {
		return nil, fmt.Errorf("profile %q: a router takes built-in profiles only: %s", name, strings.Join(engine.ProfileNames(), ", "))
	}
	return engine.LoadProfile(name)
}

// twin is the router's model of one replica's engine, run forward in time with the replica's
// GPU profile (engine.Profile: step times measured on real GPUs) the way vLLM's scheduler
// runs it: each step decodes one token for every generating sequence and prefills chunks of
// the waiting prompts, first come first served, within the step's token budget
// (vllm/v1/core/sched/scheduler.py), a prompt starting only when the KV cache has room for
// it. It holds what this router sent the replica: the prompts not yet prefilled, in the order
// the engine gets them, and the sequences generating.
//
// A prediction runs the model forward from now with one more prompt in its place in the
// queue, without changing it, until that prompt's last chunk is computed. What the router
// observes keeps the model on time:
//   - a streamed request's first token says its prefill, and every prompt's ahead of it,
//     ended then. Until it comes, the model does not run past the end of that prefill (a
//     model that runs ahead would start the next prompts early), and when it comes early,
//     the model catches up at once;
//   - the time from the last such moment to a quiet prompt's first token, against the steps
//     the model ran in between, and each stream's time per token, against the steps it
//     decoded in, calibrate two scales (prefill, decode) on the profile's step times, so a
//     replica whose GPU, model or engine differs from its profile is predicted right after
//     a few requests.
//
// Time in the model is the replica's clock shifted back by half a round trip: a request
// joins the queue when it is sent, and an event the router sees at t happened at t − RTT.
// Not safe for concurrent use: the replica's mutex guards it.
type twin struct {
	prof           *engine.Profile
	prefill, decop calib

	clock  time.Time // steps that ended before it are applied
	inStep bool      // a step is running from clock to stepAt
	step   stepCost  // its cost (unscaled, applied when it ends)
	stepAt time.Time // its end

	queue []*twinSeq // prompts still prefilling, in arrival order
	nDec  int        // sequences generating
	decs  []*twinSeq // the same, for when they end: the KV space they free
	// ends and joins are dryRun's scratch: the generating sequences' ends, and those of
	// the prompts that start generating in the step it runs.
	ends, joins []seqEnd
	// Σ context of the generating sequences = ctx0 + nDec·steps, each sequence's context
	// growing by one token a decode step.
	ctx0  float64
	steps float64 // decode steps run
	// cum is the unscaled step time run, by part; the calibrations compare its growth with
	// the real time that passed.
	cum stepCost

	// syncAt is the last moment the model and the replica were known to agree (a first token,
	// or the start of a busy period); cumAtSync is cum then.
	syncAt    time.Time
	cumAtSync stepCost

	// prefillShare is the share of recent decoding time spent on other prompts' prefill
	// chunks, which the generating sequences' steps carry: a new stream's tokens will wait
	// behind the prompts that arrive while it generates.
	prefillShare float64
	// scrapedKV is the replica's KV cache usage (0..1) its metrics reported at scrapedAt.
	scrapedKV float64
	scrapedAt time.Time
	// promptTokens is the typical prompt computed, to price prompts other routers queued.
	promptTokens ewma
}

// stepCost is a step's time by part, in the profile's milliseconds.
type stepCost struct{ prefill, decode float64 }

// twinSeq is one request in the model.
type twinSeq struct {
	// arrive is when the engine gets it: sent, then tokenized by the replica's server
	// (PrepPerToken), so a short prompt sent just after a long one is scheduled first.
	arrive time.Time
	prompt int // prompt tokens
	out    int // the most tokens it may generate (its max_tokens, or the router's guess)
	done   int // prompt tokens in the KV cache (cached on arrival, then computed)
	// admitted: the engine gave it KV blocks (its first chunk was scheduled).
	admitted bool
	left     int // prompt tokens still to compute
	chunk    int // tokens computed in the step running now
	// prefix is the prompt's chained block hashes (Request.Prefix), blockTokens the tokens
	// one block stands for: a later prompt sharing them finds them cached only once this
	// one has computed them.
	prefix      []uint64
	blockTokens float64
	// gated: the router will see this request's first token (a stream), so the model
	// waits for it rather than run past its prefill.
	gated    bool
	decoding bool
	gone     bool
	// At the start of its decoding: the decode steps run and cum then.
	steps0 float64
	cum0   stepCost
}

const (
	// calibForget is how fast a calibration decays to the profile while the replica gets
	// no traffic: a replica once measured slow is predicted from its profile again within
	// minutes, and gets traffic again that measures it anew.
	calibForget = 2 * time.Minute
	// shareWindow is the time constant of prefillShare.
	shareWindow = 20 * time.Second
	// PrepPerToken is the replica server's work per prompt token before its engine sees
	// the prompt (parsing, the chat template, tokenization): about what a fast BPE
	// tokenizer takes (replicasim's: BenchmarkBPE; Hugging Face's tokenizers are alike).
	PrepPerToken = 2 * time.Microsecond
	// maxDryRunSteps bounds one prediction's work; a queue longer than this many full steps
	// is priced from its tokens.
	maxDryRunSteps = 4096
)

// calib is a multiplicative correction to the profile, kept as a logarithm so errors either
// way weigh the same: the median of the last calibWindow observations, each fading to the
// profile (0) with calibForget. A median, not a mean: about one answer in ten is off by a
// factor of 1.5–3 for reasons the model does not see (which prompts share an engine step, a
// preemption), and a mean moved by each of them made the correction wander (in the
// simulator, where the engine runs the profile exactly, it spent a fifth of the time below
// 0.8 or above 1.5, and TTFT MAPE was 38 % on Mooncake's trace against 29 % without
// calibration). A replica that really differs shows it in most answers: it moves the median
// within calibWindow/2+1 of them, the first one alone deciding until there are more.
type calib struct {
	log float64 // the median, as of at
	at  time.Time
	n   int
	obs [calibWindow]calibObs // a ring; the last min(n, calibWindow) are in use
	// factor's last answer: a prediction asks for it at one instant once per simulated step,
	// and two exponentials each time were a tenth of a simulated day's time.
	memoAt  time.Time
	memoVal float64
}

type calibObs struct {
	log float64
	at  time.Time
}

// calibWindow is how many observations the median is over.
const calibWindow = 9

func (c *calib) factor(now time.Time) float64 {
	if c.n == 0 {
		return 1
	}
	if !now.Equal(c.memoAt) {
		c.memoAt, c.memoVal = now, math.Exp(c.log*forgetting(now.Sub(c.at)))
	}
	return c.memoVal
}

func forgetting(d time.Duration) float64 {
	if d <= 0 {
		return 1
	}
	return math.Exp(-float64(d) / float64(calibForget))
}

// observe adds ratio (what happened ÷ what the profile says) and takes the median anew.
func (c *calib) observe(now time.Time, ratio float64) {
	if math.IsNaN(ratio) || math.IsInf(ratio, 0) || ratio <= 0 {
		return
	}
	c.obs[c.n%calibWindow] = calibObs{log: math.Log(min(max(ratio, 1/maxCalib), maxCalib)), at: now}
	c.n++
	var vals [calibWindow]float64
	k := min(c.n, calibWindow)
	for i := range k {
		vals[i] = c.obs[i].log * forgetting(now.Sub(c.obs[i].at))
	}
	v := vals[:k]
	slices.Sort(v)
	if k%2 == 1 {
		c.log = v[k/2]
	} else {
		c.log = (v[k/2-1] + v[k/2]) / 2
	}
	c.at = now
	c.memoAt = time.Time{} // the median moved
}

// deadband takes a prefill ratio within 25 % of the profile for the profile itself. Where a
// prompt's last step starts decides which prompts queued behind it share that step, and the
// model and the engine start it a few milliseconds apart; what that moves is noise, not a
// replica unlike its profile (those differ by more: another model size, another GPU
// generation), and learning it would make the model run early and miss more such prompts.
func deadband(ratio float64) float64 {
	if ratio > 0.8 && ratio < 1.25 {
		return 1
	}
	return ratio
}

// spread tracks a quantile of a replica's TTFT ÷ its prediction, in logarithms, by
// stochastic approximation (each answer moves it a step up or down, in proportion to the
// percentile), so the SLO filter can ask for its percentile rather than the mean.
type spread struct {
	log float64
	n   int
}

const (
	spreadStep = 0.05 // in log units: about 5 % an answer
	spreadMin  = 20   // answers before the spread is used
)

func (s *spread) observe(ratio, percentile float64) {
	if math.IsNaN(ratio) || math.IsInf(ratio, 0) || ratio <= 0 {
		return
	}
	if percentile <= 0 || percentile >= 1 {
		percentile = 0.9
	}
	x := math.Log(ratio)
	if x > s.log {
		s.log += spreadStep * percentile
	} else {
		s.log -= spreadStep * (1 - percentile)
	}
	s.log = min(max(s.log, math.Log(0.5)), math.Log(4))
	s.n++
}

// factor is the spread as a multiple (0 until enough answers were seen).
func (s *spread) factor() float64 {
	if s.n < spreadMin {
		return 0
	}
	return math.Exp(s.log)
}

// maxCalib bounds a calibration either way: a 70B model on a small GPU runs some 30 times
// slower than the default profile, and a replica further off is better judged broken.
const maxCalib = 64

func newTwin(p *engine.Profile) twin {
	return twin{prof: p, promptTokens: ewma{v: 1000, alpha: 0.05}}
}

// setProfile changes the profile a model runs with (the replica's description changed).
func (w *twin) setProfile(p *engine.Profile) {
	if p != w.prof {
		w.prof = p
		w.prefill, w.decop = calib{}, calib{}
	}
}

func (w *twin) scaled(c stepCost, now time.Time) time.Duration {
	ms := c.prefill*w.prefill.factor(now) + c.decode*w.decop.factor(now)
	return time.Duration(ms * float64(time.Millisecond))
}

// ctx is the context the generating sequences read in a decode step.
func (w *twin) ctx() float64 { return w.ctx0 + float64(w.nDec)*w.steps }

// kvUsed is the KV cache this router's sequences hold, in tokens: the generating ones'
// context and what the admitted prompts have computed.
func (w *twin) kvUsed() float64 {
	kv := w.ctx()
	for _, s := range w.queue {
		if s.admitted {
			kv += float64(s.done)
		}
	}
	return kv
}

// kvInUse is the KV cache in use (tokens) as far as admitting a prompt goes: what this
// router's sequences hold, or less when the replica's metrics say so: sequences that share a
// prefix share its blocks (vLLM's prefix cache), which a sum of contexts counts again for
// each of them.
func (w *twin) kvInUse(now time.Time) float64 {
	kv := w.kvUsed()
	if scraped, ok := w.scrapedKVAt(now); ok {
		kv = min(kv, scraped*float64(w.prof.KVTokens))
	}
	return kv
}

// kvShare is the replica's KV cache in use, 0..1: what its metrics said if fresh, else what
// this router's sequences hold.
func (w *twin) kvShare(now time.Time) float64 {
	share := w.kvUsed() / float64(w.prof.KVTokens)
	if scraped, ok := w.scrapedKVAt(now); ok {
		share = max(share, scraped)
	}
	return share
}

// scrapedKVAt is the replica's KV cache usage (0..1) from its metrics, if fresh at now.
func (w *twin) scrapedKVAt(now time.Time) (float64, bool) {
	return w.scrapedKV, !w.scrapedAt.IsZero() && now.Sub(w.scrapedAt) < kvFresh
}

// kvFresh is how long a scraped KV cache usage is taken as current.
const kvFresh = 2 * time.Second

// fits reports whether a prompt not yet admitted gets KV blocks for need more tokens with
// kv in use: vLLM's scheduler admits a waiting request only if kv_cache_manager.allocate_slots
// finds the blocks, else it waits (vllm/v1/core/sched/scheduler.py).
func (w *twin) fits(kv float64, need int) bool { return kv+float64(need) <= float64(w.prof.KVTokens) }

// stalled reports whether the model waits for a first token: the prompt at the head of the
// queue is computed in the model but not yet seen done.
func (w *twin) stalled() bool { return len(w.queue) > 0 && w.queue[0].left == 0 }

func (w *twin) idle() bool { return len(w.queue) == 0 && w.nDec == 0 }

// advance applies every step that ends by now.
func (w *twin) advance(now time.Time) {
	for range maxDryRunSteps {
		if !w.inStep && !w.compose(now) {
			return
		}
		if w.stepAt.After(now) {
			return
		}
		w.apply(now)
	}
}

// compose starts the next step at the model's clock; it reports false when there is none
// to run (idle, or waiting for a first token), and then the clock moves to now.
func (w *twin) compose(now time.Time) bool {
	if w.idle() || w.stalled() {
		return w.wait(now)
	}
	if w.nDec == 0 && w.queue[0].arrive.After(w.clock) {
		// Nothing to run until the next prompt reaches the engine.
		if w.queue[0].arrive.After(now) {
			return w.wait(now)
		}
		w.clock = w.queue[0].arrive
	}
	if len(w.queue) == 0 {
		// Decoding only: the steps until now are alike, so run them at once.
		c := w.decodeOnly()
		if d := w.scaled(c, now); d > 0 {
			if k := math.Floor(float64(now.Sub(w.clock)) / float64(d)); k > 1 {
				k--
				w.cum.decode += k * c.decode
				w.steps += k
				w.shareOver(time.Duration(k*float64(d)), 0)
				w.clock = w.clock.Add(time.Duration(k * float64(d)))
			}
		}
	}
	budget := w.budget(w.nDec)
	var sh engine.StepShape
	kv := w.kvInUse(now)
	for _, s := range w.queue {
		if budget <= 0 || s.arrive.After(w.clock) {
			break // the queue is in arrival order: the rest are not in the engine yet
		}
		if s.left == 0 {
			continue
		}
		n := min(s.left, budget)
		need := n
		if !s.admitted {
			need += s.done
		}
		if !w.fits(kv, need) && (w.nDec > 0 || sh.Tokens > 0) {
			break // no KV room: it waits for sequences to end, and so does the rest
		}
		s.admitted = true
		kv += float64(need)
		s.chunk = n
		budget -= n
		addChunk(&sh, n, s.done)
	}
	if sh.Tokens == 0 && w.nDec == 0 {
		return w.wait(now)
	}
	sh.DecodeBatch, sh.DecodeCtx = w.nDec, w.ctx()
	pf, df := w.prof.StepMs(sh)
	w.step = stepCost{pf, df}
	w.inStep = true
	w.stepAt = w.clock.Add(max(w.scaled(w.step, now), time.Microsecond))
	return true
}

// wait is compose with no step to run: the engine idles until now. It reports false.
func (w *twin) wait(now time.Time) bool {
	if now.After(w.clock) {
		w.clock = now
	}
	return false
}

// shareOver moves prefillShare toward share, observed over d of decoding.
func (w *twin) shareOver(d time.Duration, share float64) {
	a := -math.Expm1(-float64(d) / float64(shareWindow))
	w.prefillShare += a * (share - w.prefillShare)
}

func (w *twin) decodeOnly() stepCost {
	_, df := w.prof.StepMs(engine.StepShape{DecodeBatch: w.nDec, DecodeCtx: w.ctx()})
	return stepCost{decode: df}
}

// budget is a step's prompt tokens after one token for each of dec decoding sequences.
func (w *twin) budget(dec int) int {
	return w.prof.MaxBatchedTokens - min(dec, w.prof.MaxBatch)
}

func addChunk(sh *engine.StepShape, n, done int) {
	N, P := float64(n), float64(done)
	sh.Tokens += N
	sh.SumN2 += N * N
	sh.SumNP += N * P
	sh.SumP += P
	if done > 0 {
		sh.CachedSeqs++
	}
}

// apply ends the running step: its chunks are computed, and prompts it finished start
// decoding (a streamed one only once its first token is seen).
func (w *twin) apply(now time.Time) {
	for _, s := range w.queue {
		if s.chunk > 0 {
			s.left -= s.chunk
			s.done += s.chunk
			s.chunk = 0
		}
	}
	if w.nDec > 0 {
		w.steps++
	}
	w.cum.prefill += w.step.prefill
	w.cum.decode += w.step.decode
	if p, d := w.step.prefill*w.prefill.factor(now), w.step.decode*w.decop.factor(now); d > 0 {
		w.shareOver(w.stepAt.Sub(w.clock), p/(p+d))
	}
	w.clock, w.inStep = w.stepAt, false
	w.queue = slices.DeleteFunc(w.queue, func(s *twinSeq) bool {
		if s.left == 0 && !s.gated {
			w.startDecoding(s)
			return true
		}
		return false
	})
}

func (w *twin) startDecoding(s *twinSeq) {
	s.decoding = true
	s.steps0, s.cum0 = w.steps, w.cum
	w.nDec++
	w.decs = append(w.decs, s)
	w.ctx0 += float64(s.prompt) - w.steps
}

// shape is a prompt as the model sees it.
type shape struct {
	prompt, cached int
	out            int // the most tokens it may generate
	prefix         []uint64
	blockTokens    float64
}

// cachedAtAdmission is how much of a prompt's cached prefix the replica will have computed
// when it takes the prompt: a prefix that a prompt still queued ahead is computing is not in
// the cache yet. The engine admits a prompt in the step that computes the last chunk of the
// one ahead, so it finds all of that one's prompt computed but its last chunk (vLLM
// publishes blocks as they are computed: kv_cache_manager.cache_blocks).
func (w *twin) cachedAtAdmission(p shape) int {
	cached := min(p.cached, p.prompt-1)
	if cached <= 0 || len(p.prefix) == 0 {
		return max(cached, 0)
	}
	for _, e := range w.queue {
		if e.left == 0 || len(e.prefix) == 0 || e.prefix[0] != p.prefix[0] {
			continue
		}
		shared := sort.Search(min(len(e.prefix), len(p.prefix)), func(i int) bool { return e.prefix[i] != p.prefix[i] })
		if shared == 0 {
			continue
		}
		sharedTokens := cached // blocks of unknown size: assume they cover the match
		if p.blockTokens > 0 {
			sharedTokens = int(float64(shared) * p.blockTokens)
		}
		avail := max(e.done, e.prompt-w.prof.MaxBatchedTokens)
		cached = min(cached, max(avail, cached-sharedTokens))
	}
	return max(cached, 0)
}

// add queues a prompt sent at now.
func (w *twin) add(now time.Time, p shape, gated bool) *twinSeq {
	w.advance(now)
	if len(w.queue) == 0 {
		// No prefill pending: the model and the replica agree on what is ahead of this
		// prompt (decode steps at most), so the prefill calibration starts afresh here, at
		// the step it waits for.
		if w.idle() {
			w.clock = now
		}
		w.syncAt, w.cumAtSync = w.clock, w.cum
	}
	cached := w.cachedAtAdmission(p)
	s := &twinSeq{arrive: arrival(now, p.prompt), prompt: p.prompt, out: max(p.out, 1), done: cached, left: p.prompt - cached, prefix: p.prefix, blockTokens: p.blockTokens, gated: gated}
	w.promptTokens.observe(float64(s.left))
	w.queue = slices.Insert(w.queue, w.position(s.arrive), s)
	w.advance(now)
	return s
}

// arrival is when a prompt of n tokens sent at now reaches the engine.
func arrival(now time.Time, n int) time.Time { return now.Add(time.Duration(n) * PrepPerToken) }

// position is where a prompt arriving at t goes in the queue: after everything that
// arrives no later.
func (w *twin) position(t time.Time) int {
	return sort.Search(len(w.queue), func(i int) bool { return w.queue[i].arrive.After(t) })
}

// remove drops a request that ended (answered, failed or cancelled).
func (w *twin) remove(s *twinSeq, now time.Time) {
	if s == nil || s.gone {
		return
	}
	w.advance(now)
	s.gone = true
	if s.decoding {
		if i := slices.Index(w.decs, s); i >= 0 {
			w.decs = slices.Delete(w.decs, i, i+1)
		}
		w.nDec--
		w.ctx0 -= float64(s.prompt) - s.steps0
		if w.nDec == 0 {
			w.ctx0 = 0
		}
		return
	}
	if i := slices.Index(w.queue, s); i >= 0 {
		w.queue = slices.Delete(w.queue, i, i+1)
	}
}

// prefilled says s's prefill ended at now (its first token came, or its whole answer): so
// did every prompt's ahead of it. calibrate says now is exact (a streamed first token),
// so the time since the last such moment calibrates the prefill scale.
func (w *twin) prefilled(s *twinSeq, now time.Time, calibrate bool) {
	if s == nil || s.gone || s.decoding {
		return
	}
	w.advance(now)
	i := slices.Index(w.queue, s)
	if i < 0 {
		return
	}
	early := s.left > 0 // the replica is ahead of the model
	// Calibrate only from a prompt alone in the queue, while the KV cache has room. A prompt
	// queued behind it may have joined its last step in the engine and not in the model (a
	// millisecond either way decides), and when the cache is nearly full the engine preempts
	// and recomputes, which the model does not follow: neither says the prefill is slow. A
	// replica unlike its profile shows it on quiet answers too.
	if calibrate && now.After(w.syncAt) && len(w.queue) == 1 && w.kvShare(now) < 0.5 {
		ran := stepCost{w.cum.prefill - w.cumAtSync.prefill, w.cum.decode - w.cumAtSync.decode}
		if early {
			rest := w.dryRun(now, i, shape{}, others{})
			ran.prefill += rest.cost.prefill
			ran.decode += rest.cost.decode
		}
		// What the prefill part took, once the decode part (at its own scale) is set aside.
		real := float64(now.Sub(w.syncAt)) / float64(time.Millisecond)
		// Only where the prefill is a fair part of what ran (a third), and the decode part set
		// aside, which is the model's, is less than half of what was seen: where it explains
		// nearly all of it, a small error in it is a large one in the ratio. A client that
		// sends its next prompt the moment the last answer ends reaches the router before
		// that answer's end does; the model then has its decode still running beside the
		// new prefill (68 ms modelled of each, 68 ms seen), and an L4 calibrated from such
		// answers to 0.05 of its profile took a 40k-token prompt it prefills in 14 s
		// (TestEachReplicaIsPredictedOnItsOwnGPU). A replica decoding steadily still
		// calibrates: its prefill is then most of the time its decodes do not explain.
		decodeSeen := ran.decode * w.decop.factor(now)
		if ran.prefill > 0.3*(ran.prefill+ran.decode) && decodeSeen < real/2 {
			w.prefill.observe(now, deadband((real-decodeSeen)/ran.prefill))
		}
	}
	for _, q := range w.queue[:i+1] {
		q.left, q.chunk = 0, 0
		w.startDecoding(q)
	}
	w.queue = slices.Delete(w.queue, 0, i+1)
	if early || w.clock.Before(now) {
		// The step the model was running no longer exists as composed: the engine's next
		// step starts now.
		w.inStep, w.clock = false, now
	}
	if calibrate {
		w.syncAt, w.cumAtSync = now, w.cum
	}
	w.advance(now)
}

// decoded calibrates the decode scale from a stream's time per token (tpot, seconds) over
// the steps it generated in.
func (w *twin) decoded(s *twinSeq, tpot float64, now time.Time) {
	if s == nil || !s.decoding || s.gone {
		return
	}
	w.advance(now)
	n := w.steps - s.steps0
	dp, dd := w.cum.prefill-s.cum0.prefill, w.cum.decode-s.cum0.decode
	if n < 2 || dd <= 0 {
		return
	}
	ms := tpot * 1000 * n
	w.decop.observe(now, (ms-dp*w.prefill.factor(now))/dd)
}

// others is the load other routers put on the replica, known from its scraped metrics.
type others struct {
	decoding int
	waiting  int // prompts queued
}

// dryRunResult is when a prompt's prefill would start and end (model time), and the
// unscaled step time run until then.
type dryRunResult struct {
	start, end time.Time
	cost       stepCost
	decoding   int // sequences generating when it ends
	ctx        float64
	// For a new prompt: its place in the queue and its tokens found cached.
	at, cached int
}

// dryRun runs the model forward from now, changing nothing, until the prompt at queue
// index target is prefilled; target −1 is a new prompt p, sent now. o's waiting prompts go
// first.
func (w *twin) dryRun(now time.Time, target int, p shape, o others) dryRunResult {
	newAt, cached := -1, 0 // the new prompt's place in the queue
	var newArrive time.Time
	if target < 0 {
		newArrive = arrival(now, p.prompt)
		newAt = w.position(newArrive)
		target = newAt
		cached = w.cachedAtAdmission(p)
	}
	res := dryRunResult{at: newAt, cached: cached}
	t := w.clock
	dec, ctx := w.nDec+o.decoding, w.ctx()
	extra := o.waiting * int(w.promptTokens.v)
	if w.inStep {
		t = w.stepAt
		res.cost = w.step
		if w.nDec > 0 {
			ctx += float64(w.nDec)
		}
	} else if now.After(t) {
		t = now // idle or waiting for a first token that is due
	}
	kv := w.kvInUse(now)
	if w.inStep {
		for _, q := range w.queue {
			kv += float64(q.chunk) // what the running step computes
		}
	}
	ended := w.endsByStep()
	joins := w.joins[:0]
	k := 0.0 // decode steps run so far
	type cursor struct {
		i, left, done, prompt, out int
		arrive                     time.Time
		admitted                   bool
	}
	var c cursor
	// load points c at entry i: −1 the others' prompts, newAt the new one, else the queue's
	// (what the running step leaves of it).
	load := func(i int) {
		c.i = i
		switch {
		case i == -1: // other routers' prompts: their KV is theirs
			c.left, c.done, c.prompt, c.arrive, c.admitted, c.out = extra, 0, 0, time.Time{}, true, 0
			return
		case i == newAt:
			c.left, c.done, c.prompt, c.arrive, c.admitted, c.out = p.prompt-cached, cached, p.prompt, newArrive, false, max(p.out, 1)
			return
		case newAt >= 0 && i > newAt:
			i--
		}
		q := w.queue[i]
		c.left, c.done, c.prompt, c.arrive, c.admitted, c.out = q.left-q.chunk, q.done+q.chunk, q.prompt, q.arrive, q.admitted, q.out
	}
	load(-1)
	for range maxDryRunSteps + 1 {
		// Skip what is already computed: those prompts decode.
		for c.left <= 0 && c.i < target {
			if c.i >= 0 {
				dec++
				ctx += float64(c.prompt)
			}
			load(c.i + 1)
		}
		if c.left <= 0 { // the target was prefilled by the running step
			break
		}
		budget := w.budget(dec)
		var sh engine.StepShape
		joined := 0
		for budget > 0 {
			if c.arrive.After(t) {
				if sh.Tokens > 0 || dec > 0 {
					break // not in the engine yet: later steps take it
				}
				t = c.arrive // nothing runs until it comes
			}
			n := min(c.left, budget)
			need := n
			if !c.admitted {
				need += c.done
			}
			if !w.fits(kv, need) {
				if sh.Tokens > 0 {
					break // later steps take it, once there is room
				}
				// Nothing can start until generating sequences end and free their KV.
				var d float64
				var freed int
				d, freed, k, kv, ctx = w.waitForRoom(ended, k, kv, ctx, need, dec)
				ended = ended[freed:]
				dec -= freed
				res.cost.decode += d
				t = t.Add(w.scaled(stepCost{decode: d}, now))
			}
			c.admitted = true
			kv += float64(need)
			addChunk(&sh, n, c.done)
			if c.i == target && res.start.IsZero() {
				res.start = t
			}
			budget -= n
			c.left -= n
			c.done += n
			if c.left > 0 || c.i == target {
				break
			}
			if c.i >= 0 {
				joined++
				ctx += float64(c.prompt)
				// It generates from the next step, until its most tokens at the latest. It
				// cannot end in this step, so it joins ended after it (see below).
				joins = append(joins, seqEnd{steps: k + 1 + float64(c.out), ctx: float64(c.prompt + c.out)})
			}
			load(c.i + 1)
		}
		sh.DecodeBatch, sh.DecodeCtx = dec, ctx
		pf, df := w.prof.StepMs(sh)
		res.cost.prefill += pf
		res.cost.decode += df
		t = t.Add(w.scaled(stepCost{pf, df}, now))
		if dec > 0 {
			ctx += float64(dec)
			kv += float64(dec)
			k++
		}
		dec += joined
		// Sequences that have generated their most tokens end, and free their KV.
		for len(ended) > 0 && ended[0].steps <= k && dec > 0 {
			dec--
			ctx = max(ctx-ended[0].ctx, 0)
			kv = max(kv-ended[0].ctx, 0)
			ended = ended[1:]
		}
		if c.i == target && c.left <= 0 {
			break
		}
		if len(joins) > 0 {
			// Merged only when another step runs: most predictions end in the step that
			// admits every prompt ahead, and sorting them in one by one was a third of a
			// prediction's time.
			ended = mergeEnds(ended, joins)
			joins = joins[:0]
		}
	}
	if c.left > 0 { // beyond maxDryRunSteps: price the rest by its tokens
		per, _ := w.prof.StepMs(engine.StepShape{Tokens: float64(w.prof.MaxBatchedTokens)})
		t = t.Add(w.scaled(stepCost{prefill: per * float64(c.left) / float64(w.prof.MaxBatchedTokens)}, now))
	}
	if res.start.IsZero() {
		res.start = t
	}
	res.end, res.decoding, res.ctx = t, dec, ctx
	w.joins = joins[:0] // keep what it grew to
	return res
}

// seqEnd is a generating sequence's end, as far as the model can tell: in steps from now,
// and the context it then frees.
type seqEnd struct {
	steps, ctx float64
}

// endsByStep lists this router's generating sequences by when they will have generated
// their most tokens (max_tokens: they may end sooner, never later), soonest first.
func (w *twin) endsByStep() []seqEnd {
	w.ends = w.ends[:0]
	for _, s := range w.decs {
		gen := w.steps - s.steps0
		left := max(float64(s.out)-gen, 1)
		w.ends = append(w.ends, seqEnd{steps: left, ctx: float64(s.prompt) + gen + left})
	}
	slices.SortFunc(w.ends, bySteps)
	return w.ends
}

// mergeEnds adds joins to ended (sorted by steps), in place from the back: a step's joins
// are few against the sequences generating, so sorting them alone and merging is linear.
func mergeEnds(ended, joins []seqEnd) []seqEnd {
	slices.SortFunc(joins, bySteps)
	n := len(ended)
	ended = append(ended, joins...)
	i, j := n-1, len(joins)-1
	for k := len(ended) - 1; j >= 0; k-- {
		if i >= 0 && ended[i].steps >= joins[j].steps {
			ended[k] = ended[i]
			i--
		} else {
			ended[k] = joins[j]
			j--
		}
	}
	return ended
}

func bySteps(a, b seqEnd) int {
	switch {
	case a.steps < b.steps:
		return -1
	case a.steps > b.steps:
		return 1
	}
	return 0
}

// waitForRoom runs decode steps until enough of the sequences in ends (soonest first, in
// steps from the dry run's start; k have run) end for need more KV tokens to fit: it
// returns the decode time (unscaled ms), how many ended, the steps run by then, and the KV
// and context after. Without enough of them, the prompt is let in when they have all ended
// (the rest is other routers' or unknown).
func (w *twin) waitForRoom(ends []seqEnd, k, kv, ctx float64, need, dec int) (ms float64, ended int, kAfter, kvAfter, ctxAfter float64) {
	for _, e := range ends {
		if w.fits(kv, need) || dec <= 0 {
			break
		}
		if run := e.steps - k; run > 0 {
			_, df := w.prof.StepMs(engine.StepShape{DecodeBatch: dec, DecodeCtx: ctx + float64(dec)*run/2})
			ms += run * df
			ctx += float64(dec) * run
			kv += float64(dec) * run
			k = e.steps
		}
		kv = max(kv-e.ctx, 0)
		ctx = max(ctx-e.ctx, 0)
		dec--
		ended++
	}
	return ms, ended, k, kv, ctx
}

// tpot is the time per output token of a sequence that starts decoding with dec others
// reading ctx tokens: a decode step, stretched by the share of time prefill takes.
func (w *twin) tpot(now time.Time, dec int, ctx float64) float64 {
	_, df := w.prof.StepMs(engine.StepShape{DecodeBatch: dec + 1, DecodeCtx: ctx})
	step := df * w.decop.factor(now) / 1000
	return step / (1 - min(w.prefillShare, 0.9))
}
