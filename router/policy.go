package router

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// SLO is a model's latency objective, in seconds; zero fields are not constrained.
type SLO struct {
	TTFT float64 `yaml:"ttft_seconds"`
	TPOT float64 `yaml:"tpot_seconds"`
	E2E  float64 `yaml:"e2e_seconds"`
	// Percentile is the share of requests that must meet it (reported, e.g. 0.9).
	Percentile float64 `yaml:"percentile"`
}

// Meets reports whether a prediction is within the SLO: its TTFT and TPOT as the replica's
// answers have turned out at the SLO's percentile (Prediction.Spread, TPOTSpread), the
// end-to-end time as predicted.
func (s SLO) Meets(p Prediction) bool {
	ttft, tpot := p.TTFT, p.TPOT
	if p.Spread > 0 {
		ttft *= p.Spread
	}
	if p.TPOTSpread > 0 {
		tpot *= p.TPOTSpread
	}
	return (s.TTFT <= 0 || ttft <= s.TTFT) && (s.TPOT <= 0 || tpot <= s.TPOT) && (s.E2E <= 0 || p.E2E <= s.E2E)
}

// Request is what a policy knows about the request being routed. Policies never see HTTP.
type Request struct {
	Model        string
	PromptTokens int
	// OutTokens is the expected completion length.
	OutTokens int
	// Prefix holds chained hashes of the prompt's leading blocks (nil: too short to matter).
	Prefix []uint64
	// BlockTokens is the prompt's tokens per Prefix block (0: the affinity table's default).
	BlockTokens float64
	SLO         SLO
	Now         time.Time
	// Streamed says the router will see the request's first token (a stream).
	Streamed bool
	// Adapter is the LoRA adapter the request runs with ("": the base model), and
	// AdapterStatic that its replicas load it at start. MaxLoRAs is the service's
	// --max-loras and AdapterLoad the load expected (seconds), for adapterDelay.
	Adapter       string
	AdapterStatic bool
	MaxLoRAs      int
	AdapterLoad   float64

	// Tried are replicas this request already failed on: a retry skips them.
	Tried []*Replica

	// holder is the replica the affinity table last saw get the prompt's prefix (set by a
	// policy that follows prefixes): a sampling pick examines it first. What it holds of
	// the prompt is its prefix memory's to say (withKnownPrefix), as for any replica.
	holder *Replica
	// picked is the replica the policy chose by prediction, and pickedPred that prediction:
	// Begin takes it as the request's own rather than run the replica's model again (it
	// was a third of a pick's cost), and it is the prediction that chose the replica.
	picked     *Replica
	pickedPred Prediction
	// gate, when positive, makes a predicting policy pick only a replica that has room for
	// the request (hasRoom, the SLO scaled by gate), and nil when none has: the fleet is
	// saturated for it, and it waits in the router's queue (queue.go). Zero: the best
	// replica whatever the predictions (the least loaded when none meets the SLO).
	gate float64
	// patient: a gated request that would rather wait for room than go where it misses
	// (a sheddable one, which waits up to queue.max_wait): only an idle replica has room
	// for it without meeting the scaled SLO.
	patient bool
	// Late marks a request held (no replica ready) past its TTFT target: its SLO is lost
	// whatever happens, and the held backlog, sent at once onto the replica that came up,
	// would queue every fresh request behind it in the engine (on azure-conversation a
	// preemption's 1,650 requests held through a cold start made the next minutes' fresh
	// requests miss too). A predicting policy gives it a replica only where it has room at
	// its SLO (gate 1; hasRoom, not patient: one whose own prefill misses the target goes
	// as it would), and nil when none has: it waits on in the router, fresh requests first,
	// for no longer than it was held (then it goes as any request does).
	Late bool
	// fallback marks a pick made for the retries of a gateway (the endpoint picker's
	// ordered list, after its first entry): it is not where the request goes unless the
	// first fails, so it neither teaches prefix affinity, nor claims a re-sample, nor
	// counts as a pick.
	fallback bool
}

// gating is the gate and patience req is picked with: the queue's, else a late request's
// (gate 1, not patient).
func (req *Request) gating() (float64, bool) {
	if req.gate == 0 && req.Late {
		return 1, false
	}
	return req.gate, req.patient
}

// anyUsable reports whether req may use one of cands.
func anyUsable(req *Request, cands []*Replica) bool {
	for _, r := range cands {
		if req.usable(r) {
			return true
		}
	}
	return false
}

// usable reports whether a candidate may take the request: not ejected by passive health
// and not already tried by it.
func (req *Request) usable(r *Replica) bool {
	return !r.ejected(req.Now) && !slices.Contains(req.Tried, r)
}

// shape is the prompt as a replica's model sees it before the replica's prefix memory
// counts what it holds of it (withKnownPrefix). The affinity table's match is not counted:
// the table remembers the last replica a prefix went to, not whether its cache has since
// dropped it, and on Mooncake's conversations counting it kept the TTFT error of requests
// that reach their replica alone at 14.3 % where the prefix memory alone gave 4.6 %
// (virtual time, `simulate routers`, 2026-11-30).
func (req *Request) shape() shape {
	return shape{prompt: max(req.PromptTokens, 1), out: req.OutTokens, prefix: req.Prefix, blockTokens: req.BlockTokens}
}

// Policy picks one replica among candidates, or nil when none is usable. Candidates come
// cheapest first (SortByCost) and are shared: a policy reads them, never changes them, and
// skips those its request cannot use (Request.usable).
type Policy interface {
	Pick(req *Request, cands []*Replica, rng *rand.Rand) *Replica
}

var (
	_ Policy = (*RoundRobin)(nil)
	_ Policy = LeastLoad{}
	_ Policy = (*SLOCheapest)(nil)
)

// RoundRobin cycles through the candidates.
type RoundRobin struct{ n atomic.Uint64 }

// Pick implements Policy.
func (p *RoundRobin) Pick(req *Request, cands []*Replica, _ *rand.Rand) *Replica {
	if len(cands) == 0 {
		return nil
	}
	start := (p.n.Add(1) - 1) % uint64(len(cands))
	for i := range uint64(len(cands)) {
		if r := cands[(start+i)%uint64(len(cands))]; req.usable(r) {
			return r
		}
	}
	return nil
}

// LeastLoad is SkyServe's default: fewest requests in flight from this router, ties broken
// at random.
type LeastLoad struct{}

// Pick implements Policy.
func (LeastLoad) Pick(req *Request, cands []*Replica, rng *rand.Rand) *Replica {
	var best *Replica
	bestN, ties := int64(math.MaxInt64), 0
	for _, r := range cands {
		if !req.usable(r) {
			continue
		}
		n := r.InFlight()
		switch {
		case n < bestN:
			best, bestN, ties = r, n, 1
		case n == bestN:
			ties++
			if rng.IntN(ties) == 0 { // reservoir sampling over the ties
				best = r
			}
		}
	}
	return best
}

// SLOCheapest sends a request to the cheapest replica predicted to meet its SLO: it filters
// by prediction, keeps those that would start the request at once (else takes the least
// loaded), then ranks by marginal cost per token, a rendezvous hash of the prompt's first
// block choosing within the cheapest tier (so a conversation returns to the replica that
// holds its cache while that replica can start it at once). A replica's cached prefix
// counts in its prediction, which can make it the only one to meet the SLO, not in the
// ranking. With no replica predicted to meet the SLO it takes the least loaded. Over a large
// fleet it predicts a bounded sample, cheapest tiers first, so a pick costs about the same
// with 4,096 candidates as with 16.
type SLOCheapest struct {
	// Affinity remembers which replica got which prefix; nil disables prefix affinity.
	Affinity *Affinity
	// StaleAfter is how old a replica's scraped load may be before it is ignored.
	StaleAfter time.Duration
	// CostTolerance treats costs within this fraction of the cheapest as equal (default
	// 0.5), so near-equal prices spread load by prefix and latency instead of one winner.
	// Replicas billed by the hour cost the same used or idle: packing one zone's spot
	// replica because it is 20 % cheaper than the next zone's saves nothing and slows its
	// streams (the simulator's azure-code day: 83 % SLO attainment at 0.05, 98.5 % at 0.5,
	// for the same fleet). 0.5 still tells the capacity kinds apart: spot is bought at
	// ≤ 0.6 × on-demand (1.67× apart), reserved capacity costs nothing.
	CostTolerance float64
	// ResampleEvery is how often a replica cheaper than the choice but predicted to miss
	// the SLO still gets one request (default 10 s; negative: never). Only traffic corrects
	// what the predictor learned from a replica's slow answers, and a replica the SLO
	// filter keeps out gets none: without this, one that recovers stays unused for good.
	ResampleEvery time.Duration
	// OnPick, if set, hears of each pick and its reason (Reason…), for metrics.
	OnPick func(r *Replica, reason string)
	// ScanAll is the most candidates a pick predicts every one of (default 16; negative:
	// always sample). Beyond it, see sample.
	ScanAll int
}

const (
	defaultScanAll = 16
	// tierSamples is how many replicas of one cost tier a sampling pick predicts: enough
	// for the power of several choices, few enough to stay cheap.
	tierSamples = 4
	// maxExamined bounds a sampling pick's predictions (the prefix holder besides): the
	// walk up the cost tiers stops there.
	maxExamined = 16
)

type scored struct {
	r    *Replica
	p    Prediction
	cost float64
	// adapter is what the request's LoRA adapter adds to its TTFT there: its load and the
	// wait for a GPU slot (adapterDelay); merged: the replica is one of the adapter's own.
	adapter float64
	merged  bool
}

// Pick implements Policy.
func (p *SLOCheapest) Pick(req *Request, cands []*Replica, rng *rand.Rand) *Replica {
	var buf [maxExamined + 1]scored
	all := buf[:0]
	scanAll := p.ScanAll
	if scanAll == 0 {
		scanAll = defaultScanAll
	}
	if len(cands) <= scanAll {
		for _, r := range cands {
			if req.usable(r) {
				all = append(all, p.score(req, r))
			}
		}
	} else {
		// Only a sample is predicted: the replica the prefix last went to is one of it.
		req.holder, _ = p.Affinity.lookup(req.Prefix, req.BlockTokens)
		all = p.sample(req, cands, rng, all)
	}
	if len(all) == 0 {
		return nil
	}
	all = holding(all)
	choice, reason := p.choose(req, all)
	if choice.r == nil || req.fallback {
		return choice.r // nil: saturated for a gated request
	}
	if s, ok := p.resample(req, all, choice); ok {
		choice, reason = s, ReasonResample
	} else {
		p.Affinity.record(req.Prefix, choice.r) // not a re-sample's: one request proves little
	}
	if p.OnPick != nil {
		p.OnPick(choice.r, reason)
	}
	req.picked, req.pickedPred = choice.r, choice.p
	return choice.r
}

// holding keeps the candidates whose profile holds the request (on a fleet of several GPU
// types a small card's context may be shorter than a long prompt): one that would refuse it
// is neither meeting the SLO nor worth re-sampling. When none is known to hold it, all
// stay: the profiles may be wrong, and the replica's own answer says.
func holding(all []scored) []scored {
	n := 0
	for _, s := range all {
		if !s.p.TooLong {
			n++
		}
	}
	if n == 0 || n == len(all) {
		return all
	}
	return slices.DeleteFunc(all, func(s scored) bool { return s.p.TooLong })
}

func (p *SLOCheapest) score(req *Request, r *Replica) scored {
	s := scored{r: r, p: r.predict(req.Now, req.shape(), req.OutTokens, p.StaleAfter), cost: r.MarginalCost()}
	if req.Adapter != "" {
		load, wait := r.adapterDelay(req.Adapter, req.AdapterStatic, req.MaxLoRAs, s.p.E2E-s.p.TTFT, req.AdapterLoad, req.Now)
		s.p.TTFT += load + wait
		s.p.E2E += load + wait
		s.p.Wait += load + wait
		s.p.adapterLoad, s.adapter = load, load+wait
		s.merged = r.servesMerged(req.Adapter)
	}
	return s
}

func (p *SLOCheapest) tolerance() float64 {
	if p.CostTolerance <= 0 {
		return 0.5
	}
	return p.CostTolerance
}

// sample predicts a bounded share of a large fleet, in the order the full scan would
// choose: the prefix holder, then cost tier by tier (cheapest first, a tier being the
// replicas within CostTolerance of its cheapest) a few replicas each, until a tier has one
// predicted to meet the SLO or maxExamined are predicted. A prompt with a prefix samples
// positions its first block's hash selects, so every router with the same set samples
// the same replicas and the rendezvous choice among them agrees without coordination;
// other prompts sample at random (the power of several choices). cands are sorted by cost.
func (p *SLOCheapest) sample(req *Request, cands []*Replica, rng *rand.Rand, all []scored) []scored {
	if h := req.holder; h != nil && req.usable(h) && holds(cands, h) {
		all = append(all, p.score(req, h))
	}
	tol := p.tolerance()
	keyed := len(req.Prefix) > 0
	for lo := 0; lo < len(cands) && len(all) < maxExamined; {
		limit := cands[lo].MarginalCost() * (1 + tol)
		tier := cands[lo : lo+sort.Search(len(cands)-lo, func(i int) bool { return cands[lo+i].MarginalCost() > limit })]
		lo += len(tier)
		met := false
		// A prefix's own positions first; if none of them meets the SLO (a prefix many
		// prompts share, such as a system prompt, has filled them), random ones, so the
		// prompts spill over the tier instead of piling onto the same few replicas.
		for pass := range 2 {
			if pass == 1 && (met || !keyed || len(tier) <= tierSamples) {
				break
			}
			for i := range min(tierSamples, len(tier)) {
				var r *Replica
				switch {
				case len(tier) <= tierSamples:
					r = tier[i]
				case keyed && pass == 0:
					r = tier[mix(req.Prefix[0]+uint64(i))%uint64(len(tier))]
				case rng != nil:
					r = tier[rng.IntN(len(tier))]
				default:
					r = tier[(i*len(tier)/tierSamples+int(req.Now.UnixNano()))%len(tier)]
				}
				if !req.usable(r) || examined(all, r) {
					continue
				}
				s := p.score(req, r)
				all = append(all, s)
				met = met || (req.SLO.Meets(s.p) && startsNow(s.p))
			}
		}
		if met {
			break
		}
	}
	if len(all) == 0 {
		// Every sampled replica was ejected or already tried: take the first usable ones
		// rather than refuse a request the fleet can serve. Rare, so linear is fine.
		for _, r := range cands {
			if len(all) == tierSamples {
				break
			}
			if req.usable(r) {
				all = append(all, p.score(req, r))
			}
		}
	}
	return all
}

// holds reports whether r is among cands (sorted by cost), in O(log n).
func holds(cands []*Replica, r *Replica) bool {
	i, found := slices.BinarySearchFunc(cands, r, compareCost)
	return found && cands[i] == r
}

func examined(all []scored, r *Replica) bool {
	for _, s := range all {
		if s.r == r {
			return true
		}
	}
	return false
}

const defaultResampleEvery = 10 * time.Second

// resample finds a replica cheaper than the choice that is predicted to miss the SLO only
// because of what it was seen to do (not queued work, which the scrapes keep current) and
// that has had no request for ResampleEvery.
func (p *SLOCheapest) resample(req *Request, all []scored, choice scored) (scored, bool) {
	every := p.ResampleEvery
	if every == 0 {
		every = defaultResampleEvery
	}
	if every < 0 {
		return scored{}, false
	}
	for _, s := range all {
		if s.cost < choice.cost && !req.SLO.Meets(s.p) && s.p.Ahead == 0 && missesForWhatItDid(req, s) && s.r.claimResample(req.Now, every) {
			return s, true
		}
	}
	return scored{}, false
}

// missesForWhatItDid says whether a replica predicted to miss the SLO would meet it but for
// what its answers taught the router: its prediction with the learned prefill and decode
// factors taken out, and no spread. A request its profile alone says it cannot serve in
// time (a 40k-token prompt on an L4 against a 5 s TTFT) is no re-sample: it would only be
// late.
func missesForWhatItDid(req *Request, s scored) bool {
	_, prefill, decode := s.r.StepScales(req.Now)
	p := s.p
	if prefill > 0 {
		p.TTFT /= prefill
	}
	if decode > 0 {
		p.TPOT /= decode
	}
	p.Spread, p.TPOTSpread = 0, 0
	return req.SLO.Meets(p)
}

// Pick reasons, as arbiter_router_picks_total{reason} counts them.
const (
	ReasonCheapest  = "cheapest"  // the cheapest replica predicted to meet the SLO and to start the request at once
	ReasonFastest   = "fastest"   // none predicted to meet the SLO: the least loaded, then the fastest prediction
	ReasonQueued    = "queued"    // every replica predicted to meet the SLO has prompts queued: the least loaded of them
	ReasonResample  = "resample"  // re-sampling a cheaper replica predicted to miss
	ReasonSaturated = "saturated" // a gated request: no replica has room (not counted as a pick)
)

func (p *SLOCheapest) choose(req *Request, all []scored) (scored, string) {
	// Phase 1: keep the replicas predicted to meet the SLO.
	var buf [maxExamined + 1]scored
	ok := buf[:0]
	slo := req.SLO
	gate, patient := req.gating()
	if gate > 0 {
		slo = slo.scaled(gate)
	}
	for _, s := range all {
		if slo.Meets(s.p) {
			ok = append(ok, s)
		}
	}
	if len(ok) == 0 && gate > 0 {
		// Saturated for this request, unless a replica has room all the same.
		for _, s := range all {
			if hasRoom(req.SLO, s.p, patient) {
				ok = append(ok, s)
			}
		}
		if len(ok) == 0 {
			return scored{}, ReasonSaturated
		}
		return leastLoaded(ok), ReasonFastest
	}
	if len(ok) == 0 {
		// No replica is predicted to meet the SLO: the predictions are at their least
		// trustworthy, and following the fastest one herds every request onto one replica
		// until its prediction catches up (bench/policies saw one take a third of the
		// requests at 9.7 s TTFT p50 while two predicted at 8.5 s answered in 0.7 s).
		// Spread by load, as least_load does; the fastest prediction breaks ties.
		return leastLoaded(all), ReasonFastest
	}
	if req.Adapter != "" {
		// An adapter's own replica predicted to meet the SLO takes its request, queued or
		// not: it exists to take that adapter's load, its steps cost a base model's, and
		// each request it takes spares the shared replicas' GPU slots for the others.
		if own := slices.DeleteFunc(slices.Clone(ok), func(s scored) bool { return !s.merged }); len(own) > 0 {
			return leastLoaded(own), ReasonCheapest
		}
	}
	// Phase 2: of those, the ones that would start the request at once, with no prompt
	// queued ahead of it. A replica billed by the hour costs the same used or idle, so
	// queueing a request on a cheap replica while a dearer one could start it saves
	// nothing there, and it costs where the money is: the wait adds to the concurrency the
	// autoscaler sizes the fleet by, and the requests served near the SLO's edge miss it
	// more often. In the simulator (azure-code, spot and on-demand mixed, 2 traces × 2
	// days) queueing up to the SLO cost 31–39 % more a day than least_load, at 2 points less
	// SLO attainment; queueing up to half of each TTFT still 22–26 % more; this, 3–5 %.
	free, minCost, tol := 0, math.Inf(1), p.tolerance()
	for _, s := range ok {
		if startsNow(s.p) {
			free++
			minCost = math.Min(minCost, s.cost)
		}
	}
	var cheapest scored
	reason := ReasonCheapest
	if free == 0 {
		// Every replica that meets the SLO has prompts queued: the one with the least.
		cheapest, reason = leastLoaded(ok), ReasonQueued
	} else {
		// The cheapest tier; within it a rendezvous choice by prefix, so every router
		// sends a new prefix to the same replica without talking to the others, else the
		// least loaded. Not the fastest prediction: predictions are noisy, and whichever
		// replica looks fastest would take every request until the SLO filter caught up.
		tier := ok[:0] // filtered in place
		for _, s := range ok {
			if startsNow(s.p) && s.cost <= minCost*(1+tol) {
				tier = append(tier, s)
			}
		}
		if req.Adapter != "" {
			tier = adapterReady(tier)
		}
		if len(req.Prefix) > 0 {
			cheapest = mostCached(tier, rendezvous(req.Prefix[0], tier))
		} else {
			cheapest = leastLoaded(tier)
		}
	}
	// No phase for the prefix holder. It used to keep a prompt, queued or not, whenever the
	// prefill its cache saved was worth the price gap over the cheapest replica: on a day
	// of Mooncake's conversations that fleet cost $1,796.98 for 89.04 % SLO attainment,
	// against $1,399.44 for 89.02 % without it (the holder's queue, like any queue, is
	// concurrency the autoscaler buys replicas for), and eight routers sharing one view met
	// the SLO 1.9 points below one router, against 0.8 without it (each router followed the
	// holder its own picks had last made, so conversations were pulled apart).
	return cheapest, reason
}

// scaled is the SLO with its targets multiplied by f.
func (s SLO) scaled(f float64) SLO {
	s.TTFT *= f
	s.TPOT *= f
	s.E2E *= f
	return s
}

// hasRoom reports whether a replica predicted p should take a gated request although it
// is not predicted to meet its gate: it runs nothing else (an idle replica is never held
// back: the SLO is out of its reach whatever waits), or, for a request that is not patient,
// its own prefill misses the SLO's TTFT target (unscaled) by itself, so waiting in the
// router would only add to a miss (and end in a 429 at the target, where the request would
// have been served late). A patient (sheddable) request waits for room instead: let
// through on its own prefill's length, a flood of long batch prompts filled the replicas
// past any gate (bench/tenants, sheddable_fill 0.25: 1,910 of 2,113 batch requests went
// that way, and the interactive tenant's requests were refused at their TTFT target).
func hasRoom(slo SLO, p Prediction, patient bool) bool {
	if p.Load == 0 {
		return true
	}
	if patient {
		return false
	}
	own := p.TTFT - p.Wait
	if p.Spread > 0 {
		own *= p.Spread
	}
	return slo.TTFT > 0 && own > slo.TTFT
}

// adapterReady keeps, of a tier (replicas predicted to meet the SLO), those that serve the
// request's adapter best: the adapter's own replicas (its merged checkpoint, at the base
// model's step cost, which exist to take its load), else where it costs nothing (loaded, and
// active or with a GPU slot free), else where it is loaded and waits for a slot, else any,
// which must load it: after the first, the
// Gateway API Inference Extension's LoRA affinity (active, then a free slot, then
// waiting). A load stalls the whole replica's engine while it runs (vLLM loads between
// steps), so a request that can wait for a slot within the SLO waits rather than load its
// adapter on one more replica.
func adapterReady(tier []scored) []scored {
	rank := func(s scored) int {
		switch {
		case s.merged:
			return 0
		case s.adapter == 0:
			return 1
		case s.p.adapterLoad == 0:
			return 2
		}
		return 3
	}
	best := 3
	for _, s := range tier {
		best = min(best, rank(s))
	}
	return slices.DeleteFunc(tier, func(s scored) bool { return rank(s) > best })
}

// startsNow reports whether a replica would start the request's prefill with no prompt
// queued ahead of it (it may join a step already running).
func startsNow(p Prediction) bool { return p.Ahead == 0 }

// mostCached is a replica of tier whose cache holds more of the prompt than choice by more
// than a block (defaultBlockTokens), each replica compared in tier's order with the last one
// taken (so within a block of the one holding the most, ties kept by the earlier), else
// choice: the rendezvous pick, which sends a new prefix to the same replica from every
// router. Within a tier the prices are equal for the pick's purpose, so the replica that
// computes least of the prompt takes it; outside it, a holder's cache does not buy a
// dearer replica (see choose). On Mooncake's
// conversations in virtual time (2026-11-30): one router 90.28 % SLO attainment against
// 90.00 % with the rendezvous alone, eight sharing one view 89.58 against 89.21 %, eight on
// their own views 85.37 against 82.47 %, at the same $/M tokens.
func mostCached(tier []scored, choice scored) scored {
	for _, s := range tier {
		if s.p.Uncached < choice.p.Uncached-defaultBlockTokens {
			choice = s
		}
	}
	return choice
}

// leastLoaded returns the lowest projected load, ties going to the fastest prediction.
func leastLoaded(all []scored) scored {
	best := all[0]
	for _, s := range all[1:] {
		if s.p.Load < best.p.Load || (s.p.Load == best.p.Load && s.p.E2E < best.p.E2E) {
			best = s
		}
	}
	return best
}

// rendezvous returns the candidate with the highest hash of (key, replica): the same key
// maps to the same replica on every router, and removing a replica moves only its keys.
func rendezvous(key uint64, all []scored) scored {
	best, bestH := all[0], uint64(0)
	for i, s := range all {
		if h := mix(key ^ s.r.idHash); i == 0 || h > bestH {
			best, bestH = s, h
		}
	}
	return best
}

// mix is splitmix64's finaliser: a cheap bijection that spreads xor-combined hashes.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// Affinity is an LRU of recent prompt-prefix block hashes → the replica that got them.
type Affinity struct {
	cache *lru.Cache[uint64, *Replica]
	// BlockTokens is the approximate tokens per prefix block (lookup's count of what the
	// holder was sent; the pick takes what each replica holds from its prefix memory).
	BlockTokens int
}

// NewAffinity returns an affinity table of the given size.
func NewAffinity(size, blockTokens int) (*Affinity, error) {
	c, err := lru.New[uint64, *Replica](size)
	if err != nil {
		return nil, fmt.Errorf("affinity cache: %w", err)
	}
	return &Affinity{cache: c, BlockTokens: blockTokens}, nil
}

// Long prompts are remembered at checkpoints rather than at every block: every one of the
// first denseBlocks, then checkpointsPerDoubling per doubling of the length. A 32k-token
// prompt (512 blocks) costs 96 entries instead of 512, and a later prompt that extends it
// (the next turn of a conversation) is found holding all but at most 1/16 of what the
// replica has cached.
// defaultBlockTokens is the tokens a prefix block stands for when the prompt does not say.
const defaultBlockTokens = 64

const (
	denseBlocks            = 32
	checkpointsPerDoubling = 16
)

// checkpoint reports whether a prefix of k blocks is remembered.
func checkpoint(k int) bool {
	if k <= denseBlocks {
		return true
	}
	stride := 1 << max(bits.Len(uint(k))-1-bits.Len(checkpointsPerDoubling-1), 0)
	return k%stride == 0
}

// lookup finds the replica holding the longest known prefix and how many tokens it holds.
// blockTokens is the prompt's tokens per prefix block (0: the table's default).
func (a *Affinity) lookup(prefix []uint64, blockTokens float64) (*Replica, int) {
	if a == nil || len(prefix) == 0 {
		return nil, 0
	}
	if blockTokens <= 0 {
		blockTokens = float64(a.BlockTokens)
	}
	// A prompt's prefixes are recorded together, so the ones remembered are a run from the
	// first: binary search for its end over the checkpoints (a handful of lookups where a
	// scan from the longest would take a hundred for a new prompt).
	var holder *Replica
	held := 0
	lo, hi := 1, len(prefix) // the longest held prefix is in [held, hi]
	for lo <= hi {
		k := nextCheckpoint((lo+hi)/2, hi)
		if k == 0 {
			hi = (lo+hi)/2 - 1
			continue
		}
		if r, ok := a.cache.Peek(prefix[k-1]); ok {
			holder, held, lo = r, k, k+1
		} else {
			hi = k - 1
		}
	}
	if holder == nil {
		return nil, 0
	}
	a.cache.Get(prefix[held-1]) // a hit keeps its entry fresh
	return holder, int(float64(held) * blockTokens)
}

// nextCheckpoint is the first checkpoint in [k, limit], or 0.
func nextCheckpoint(k, limit int) int {
	for ; k <= limit; k++ {
		if checkpoint(k) {
			return k
		}
	}
	return 0
}

// record remembers that r got the prompt, at its checkpoints, longest first: an LRU evicts
// the oldest entries, and a prompt's long prefixes are worth less than its short ones,
// which later prompts share more often.
func (a *Affinity) record(prefix []uint64, r *Replica) {
	if a == nil {
		return
	}
	for k := len(prefix); k >= 1; k-- {
		if checkpoint(k) {
			a.cache.Add(prefix[k-1], r)
		}
	}
}

// forget drops every entry pointing at r (the replica left the set).
func (a *Affinity) forget(r *Replica) {
	if a == nil {
		return
	}
	for _, k := range a.cache.Keys() {
		if v, ok := a.cache.Peek(k); ok && v == r {
			a.cache.Remove(k)
		}
	}
}

// NewPolicy returns the policy with the given name.
func NewPolicy(name string, aff *Affinity, staleAfter time.Duration) (Policy, error) {
	switch name {
	case "slo_cheapest", "":
		return &SLOCheapest{Affinity: aff, StaleAfter: staleAfter}, nil
	case "least_load":
		return LeastLoad{}, nil
	case "round_robin":
		return &RoundRobin{}, nil
	}
	return nil, fmt.Errorf("unknown routing policy %q: want slo_cheapest, least_load or round_robin", name)
}
