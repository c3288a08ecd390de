package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// MaxRate finds by bisection the highest Poisson arrival rate (requests/s) of prompts of
// in tokens generating out tokens at which one engine running p keeps the p90 time per
// output token within tpotMs and the p90 time to first token within ttftMs (0: no target),
// in virtual time. Each trial runs requests arrivals (at least a minute's, at most
// 20,000; the first 10 % warm the engine up and are not scored). 0 means even one request
// alone misses a target.
func MaxRate(p Profile, in, out int, tpotMs, ttftMs float64, requests int, seed uint64) (float64, error) {
	return MaxRateInBursts(p, in, out, tpotMs, ttftMs, requests, 1, seed)
}

// MaxRateInBursts is MaxRate for arrivals in bursts: groups of burst requests arriving
// within one second (each at a uniform instant of it), the groups a Poisson process at
// rate/burst. Real traces arrive so (Azure's code trace: 40 % of its requests share their
// second with 15 others or more), and a GPU whose prefill of one prompt takes longer than
// the TPOT target breaks it for every request decoding beside a burst. burst 1 is MaxRate.
func MaxRateInBursts(p Profile, in, out int, tpotMs, ttftMs float64, requests, burst int, seed uint64) (float64, error) {
	if burst < 1 {
		return 0, fmt.Errorf("bursts of %d requests: want ≥ 1", burst)
	}
	if in < 1 || out < 2 || !(tpotMs > 0) || !(ttftMs >= 0) || requests < 20 {
		return 0, fmt.Errorf("max rate of %d:%d tokens at TPOT %g ms, TTFT %g ms over %d requests: want ≥ 1 prompt and ≥ 2 output tokens, a TPOT target > 0, a TTFT target ≥ 0 and ≥ 20 requests",
			in, out, tpotMs, ttftMs, requests)
	}
	meets := func(rate float64) (bool, error) {
		// At least a minute of arrivals, so a fast card's queue has time to build, and at
		// most 20,000 requests, so a trial stays bounded.
		tpot, ttft, steady, err := p90s(p, in, out, rate, min(max(requests, int(rate*60)), max(requests, 20000)), burst, seed)
		return err == nil && steady && tpot <= tpotMs && (ttftMs == 0 || ttft <= ttftMs), err
	}
	lo, hi := 0.0, 0.25
	for ; ; hi *= 2 {
		ok, err := meets(hi)
		if err != nil {
			return 0, err
		}
		if !ok {
			break
		}
		lo = hi
		if hi > 1e5 {
			return 0, fmt.Errorf("max rate of %d:%d tokens: the queue stays steady and the targets are met past %g req/s: the profile sets no limit", in, out, hi)
		}
	}
	for range 12 {
		mid := (lo + hi) / 2
		ok, err := meets(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// p90s runs n requests of one shape arriving as a Poisson process at rate per second (in
// groups of burst within a second, see MaxRateInBursts) through an engine and returns the
// p90 TPOT and TTFT (ms) of all but the first 10 %, and whether its queue stayed steady.
// A run whose backlog outgrows an hour past the last arrival counts as missing both.
func p90s(p Profile, in, out int, rate float64, n, burst int, seed uint64) (tpot, ttft float64, steady bool, err error) {
	r, ok, err := runPoisson(p, in, out, rate, n, burst, seed)
	if err != nil {
		return 0, 0, false, err
	}
	if !ok {
		return math.Inf(1), math.Inf(1), false, nil
	}
	var tpots, ttfts []float64
	for id := n / 10; id < n; id++ {
		ttfts = append(ttfts, r.first[id]-r.arrive[id])
		tpots = append(tpots, r.tpot[id])
	}
	return p90(tpots), p90(ttfts), steadyQueue(r.arrive, r.first, burst), nil
}

// poissonRun is one run of runPoisson, by request: when it arrived, when its first token
// came, and its time per output token (ms).
type poissonRun struct{ arrive, first, tpot []float64 }

// runPoisson runs n requests of in:out tokens arriving as a Poisson process at rate per
// second (in groups of burst within a second, see MaxRateInBursts; seed seeds the
// arrivals) through an engine running p. ok is false where the backlog outgrew an hour
// past the last arrival: the run stopped there.
func runPoisson(p Profile, in, out int, rate float64, n, burst int, seed uint64) (r poissonRun, ok bool, err error) {
	e, err := New(p)
	if err != nil {
		return r, false, err
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	r = poissonRun{arrive: make([]float64, n), first: make([]float64, n), tpot: make([]float64, n)}
	t := 0.0
	for i := range r.arrive {
		if burst == 1 {
			t += rng.ExpFloat64() / rate * 1000
			r.arrive[i] = t
			continue
		}
		if i%burst == 0 {
			t += rng.ExpFloat64() / (rate / float64(burst)) * 1000
		}
		r.arrive[i] = t + rng.Float64()*1000
	}
	if burst > 1 {
		slices.Sort(r.arrive) // a burst's second can overlap the next burst's
	}
	now, next, done := 0.0, 0, 0
	for done < n {
		for next < n && r.arrive[next] <= now {
			if err := e.Add(Request{ID: uint64(next), PromptTokens: in, MaxTokens: out}); err != nil {
				return r, false, err
			}
			next++
		}
		if e.Idle() {
			now = r.arrive[next]
			continue
		}
		if now > r.arrive[n-1]+3.6e6 {
			return r, false, nil
		}
		st := e.Step()
		now += float64(st.Duration) / float64(time.Millisecond)
		for _, em := range st.Emits {
			id := int(em.ID)
			if em.Index == 0 {
				r.first[id] = now
			}
			if em.Done {
				done++
				r.tpot[id] = (now - r.first[id]) / float64(out-1)
			}
		}
	}
	return r, true, nil
}

// steadyQueue says whether the requests waiting for their first token (arrived, not yet
// started) stayed level over the arrivals after the warm-up: in a queue the engine keeps
// up with they are as many at the last arrival as halfway through, give or take the
// noise of arrivals (2 % of the requests between the two, and two bursts); in one that
// grows without bound they are (rate − capacity) × the time between more. A capped batch
// keeps the admitted requests' TPOT within any target while the rest wait, so the TPOT
// alone cannot tell (issue 48).
func steadyQueue(arrive, first []float64, burst int) bool {
	n := len(arrive)
	mid, end := arrive[n/10+(n-n/10)/2], arrive[n-1]
	waiting := func(t float64) int {
		arrived, started := 0, 0
		for i := range arrive {
			if arrive[i] <= t {
				arrived++
				if first[i] <= t {
					started++
				}
			}
		}
		return arrived - started
	}
	between := (n - n/10) / 2
	return waiting(end)-waiting(mid) <= max(2*burst, between/50)
}

func p90(v []float64) float64 {
	slices.Sort(v)
	return v[int(math.Ceil(0.9*float64(len(v))))-1]
}

// Sustained is what one replica of a profile sustains within a latency target for a
// request mix: requests and tokens (prompt plus output) a second.
type Sustained struct {
	Profile           string
	RequestsPerSecond float64
	TokensPerSecond   float64
	// In and Out are the request shape it was computed for (the mix rounded, see
	// SustainedRate).
	In, Out int
}

type sustainedKey struct {
	profile        string
	in, out        int
	tpotUs, ttftUs int64
}

var (
	sustainedMu   sync.Mutex
	sustainedMemo = map[sustainedKey]Sustained{}
)

// sustainedMemoMax bounds the memo; past it, it starts again empty (a control plane asks
// for some GPUs × a few mixes × a service's SLO, far fewer).
const sustainedMemoMax = 4096

// SustainedRate is MaxRate for the named profile (LoadProfile) at a mean prompt of in and
// output of out tokens, remembered: a bisection runs some dozens of simulated minutes of
// engine steps (tens of milliseconds to a second), and a control loop asks again at every
// placement. The mix is rounded to a grid of quarter powers of two (within 10 %) so that
// a mix that drifts a little is not computed again; the answer is for the rounded shape.
func SustainedRate(profile string, in, out int, tpot, ttft time.Duration) (Sustained, error) {
	in, out = roundShape(in, 1), roundShape(out, 2)
	key := sustainedKey{profile, in, out, tpot.Microseconds(), ttft.Microseconds()}
	sustainedMu.Lock()
	s, ok := sustainedMemo[key]
	sustainedMu.Unlock()
	if ok {
		return s, nil
	}
	p, err := LoadProfile(profile)
	if err != nil {
		return Sustained{}, err
	}
	rate, err := MaxRate(*p, in, out, float64(tpot.Microseconds())/1000, float64(ttft.Microseconds())/1000, 200, 1)
	if err != nil {
		return Sustained{}, fmt.Errorf("profile %s: %w", profile, err)
	}
	s = Sustained{Profile: p.Name, RequestsPerSecond: rate, TokensPerSecond: rate * float64(in+out), In: in, Out: out}
	sustainedMu.Lock()
	if len(sustainedMemo) >= sustainedMemoMax {
		clear(sustainedMemo)
	}
	sustainedMemo[key] = s
	sustainedMu.Unlock()
	return s, nil
}

// roundShape rounds n to the nearest quarter power of two, at least least.
func roundShape(n, least int) int {
	if n <= least {
		return least
	}
	return max(least, int(math.Round(math.Exp2(math.Round(4*math.Log2(float64(n)))/4))))
}
