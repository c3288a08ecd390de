package router

import (
	"fmt"
	"math"
	"math/rand/v2"
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

// Meets reports whether a prediction is within the SLO.
func (s SLO) Meets(p Prediction) bool {
	return (s.TTFT <= 0 || p.TTFT <= s.TTFT) && (s.TPOT <= 0 || p.TPOT <= s.TPOT) && (s.E2E <= 0 || p.E2E <= s.E2E)
}

// Request is what a policy knows about the request being routed. Policies never see HTTP.
type Request struct {
	Model        string
	PromptTokens int
	// OutTokens is the expected completion length.
	OutTokens int
	// Prefix holds chained hashes of the prompt's leading blocks (nil: too short to matter).
	Prefix []uint64
	SLO    SLO
	Now    time.Time

	// holder is the replica that affinity says holds the prompt's first matched blocks
	// (set by a policy that follows prefixes); those tokens are not computed again there.
	holder  *Replica
	matched int
}

// uncachedOn is the prompt tokens r would have to compute: all of them, except on the
// known holder of the prompt's prefix.
func (req *Request) uncachedOn(r *Replica) int {
	if r != nil && r == req.holder {
		return max(req.PromptTokens-req.matched, 1)
	}
	return req.PromptTokens
}

// Policy picks one replica among available candidates (never empty).
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
func (p *RoundRobin) Pick(_ *Request, cands []*Replica, _ *rand.Rand) *Replica {
	return cands[(p.n.Add(1)-1)%uint64(len(cands))]
}

// LeastLoad is SkyServe's default: fewest requests in flight from this router, ties broken
// at random.
type LeastLoad struct{}

// Pick implements Policy.
func (LeastLoad) Pick(_ *Request, cands []*Replica, rng *rand.Rand) *Replica {
	var best *Replica
	bestN, ties := int64(math.MaxInt64), 0
	for _, r := range cands {
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
// by prediction, then ranks by marginal cost per token; a known prefix holder is followed
// while it meets the SLO. With no replica predicted to meet the SLO it takes the fastest.
type SLOCheapest struct {
	// Affinity remembers which replica got which prefix; nil disables prefix affinity.
	Affinity *Affinity
	// StaleAfter is how old a replica's scraped load may be before it is ignored.
	StaleAfter time.Duration
	// CostTolerance treats costs within this fraction of the cheapest as equal (default
	// 0.05), so near-equal prices spread load by prefix and latency instead of one winner.
	CostTolerance float64
	// ResampleEvery is how often a replica cheaper than the choice but predicted to miss
	// the SLO still gets one request (default 10 s; negative: never). Only traffic corrects
	// what the predictor learned from a replica's slow answers, and a replica the SLO
	// filter keeps out gets none: without this, one that recovers stays unused for good.
	ResampleEvery time.Duration
	// OnPick, if set, hears of each pick and its reason (Reason…), for metrics.
	OnPick func(r *Replica, reason string)
}

type scored struct {
	r    *Replica
	p    Prediction
	cost float64
}

// Pick implements Policy.
func (p *SLOCheapest) Pick(req *Request, cands []*Replica, _ *rand.Rand) *Replica {
	req.holder, req.matched = p.Affinity.lookup(req.Prefix)
	var buf [16]scored
	all := buf[:0]
	for _, r := range cands {
		all = append(all, scored{r: r, p: r.Predict(req.Now, req.uncachedOn(r), req.OutTokens, p.StaleAfter), cost: r.MarginalCost()})
	}
	choice, reason := p.choose(req, all)
	if s, ok := p.resample(req, all, choice); ok {
		choice, reason = s, ReasonResample
	} else {
		p.Affinity.record(req.Prefix, choice.r) // not a re-sample's: one request proves little
	}
	if p.OnPick != nil {
		p.OnPick(choice.r, reason)
	}
	return choice.r
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
		if s.cost < choice.cost && !req.SLO.Meets(s.p) && s.p.QueueWait == 0 && s.p.PrefillWait == 0 && s.r.claimResample(req.Now, every) {
			return s, true
		}
	}
	return scored{}, false
}

// Pick reasons, as arbiter_router_picks_total{reason} counts them.
const (
	ReasonCheapest     = "cheapest"      // the cheapest replica predicted to meet the SLO
	ReasonPrefixHolder = "prefix_holder" // the prompt's prefix holder: its cache saves more than it costs over the cheapest
	ReasonFastest      = "fastest"       // none predicted to meet the SLO: the least loaded, then the fastest prediction
	ReasonResample     = "resample"      // re-sampling a cheaper replica predicted to miss
)

func (p *SLOCheapest) choose(req *Request, all []scored) (scored, string) {
	// Phase 1: keep the replicas predicted to meet the SLO.
	var buf [16]scored
	ok := buf[:0]
	for _, s := range all {
		if req.SLO.Meets(s.p) {
			ok = append(ok, s)
		}
	}
	if len(ok) == 0 {
		// No replica is predicted to meet the SLO: the predictions are at their least
		// trustworthy, and following the fastest one herds every request onto one replica
		// until its prediction catches up (bench/policies saw one take a third of the
		// requests at 9.7 s TTFT p50 while two predicted at 8.5 s answered in 0.7 s).
		// Spread by load, as least_load does; the fastest prediction breaks ties.
		return leastLoaded(all), ReasonFastest
	}
	// Phase 2: the cheapest tier; within it a rendezvous choice by prefix, so every router
	// sends a new prefix to the same replica without talking to the others, else the
	// least loaded. Not the fastest prediction: predictions are noisy, and whichever
	// replica looks fastest would take every request until the SLO filter caught up.
	minCost := math.Inf(1)
	var held scored // the holder, if it meets the SLO
	for _, s := range ok {
		minCost = math.Min(minCost, s.cost)
		if s.r == req.holder {
			held = s
		}
	}
	tol := p.CostTolerance
	if tol <= 0 {
		tol = 0.05
	}
	tier := ok[:0] // filtered in place
	for _, s := range ok {
		if s.cost <= minCost*(1+tol) {
			tier = append(tier, s)
		}
	}
	var cheapest scored
	if len(req.Prefix) > 0 {
		cheapest = rendezvous(req.Prefix[0], tier)
	} else {
		cheapest = leastLoaded(tier)
	}
	// Phase 3: the prefix holder, predicted to meet the SLO, keeps the prompt when the
	// prefill its cache saves is worth at least the price gap: what the request costs
	// there (its uncached prompt and its output, at the holder's marginal cost) against
	// what it costs on the cheapest replica, which must compute the whole prompt. A dear
	// holder does not keep a prompt that a cheap replica serves within the SLO anyway.
	switch {
	case held.r == nil:
	case held.r == cheapest.r:
		return cheapest, ReasonPrefixHolder
	default:
		out := float64(max(req.OutTokens, 0))
		there := held.cost * (float64(held.p.Uncached) + out)
		here := cheapest.cost * (float64(cheapest.p.Uncached) + out)
		if there <= here*(1+tol) {
			return held, ReasonPrefixHolder
		}
	}
	return cheapest, ReasonCheapest
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
	// BlockTokens is the approximate tokens per prefix block, to estimate cached tokens.
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

// lookup finds the replica holding the longest known prefix and how many tokens it holds.
func (a *Affinity) lookup(prefix []uint64) (*Replica, int) {
	if a == nil {
		return nil, 0
	}
	for i := len(prefix) - 1; i >= 0; i-- {
		if r, ok := a.cache.Get(prefix[i]); ok {
			return r, (i + 1) * a.BlockTokens
		}
	}
	return nil, 0
}

func (a *Affinity) record(prefix []uint64, r *Replica) {
	if a == nil {
		return
	}
	for _, h := range prefix {
		a.cache.Add(h, r)
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
