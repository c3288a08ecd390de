package router

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
)

func testReplica(id string, capacity fleet.Capacity, price float64) *Replica {
	return newReplica(fleet.Replica{ID: id, Address: "127.0.0.1:1", Model: "m", Capacity: capacity, PricePerHour: price, TokensPerSecond: 5000}, nil, defaultProfile())
}

// defaultProfile is the router's default profile, fitted once for all tests.
var defaultProfile = sync.OnceValue(func() *engine.Profile {
	p, err := LoadProfile(DefaultProfile)
	if err != nil {
		panic(err)
	}
	return p
})

// setLoad makes the replica's scraped engine load n requests, as of now.
func setLoad(r *Replica, now time.Time, running, waiting float64) {
	r.observeScrape(now, running, waiting, 0.5)
}

func TestSLOCheapestPrefersCheaperWhenBothMeetTheSLO(t *testing.T) {
	now := time.Unix(1000, 0)
	reserved := testReplica("reserved", fleet.Reserved, 3)
	spot := testReplica("spot", fleet.Spot, 1)
	onDemand := testReplica("ondemand", fleet.OnDemand, 4)
	p := &SLOCheapest{StaleAfter: time.Second}
	req := &Request{Model: "m", PromptTokens: 500, OutTokens: 100, SLO: SLO{TTFT: 1, TPOT: 0.1}, Now: now}
	rng := rand.New(rand.NewPCG(1, 1))
	if got := p.Pick(req, []*Replica{onDemand, spot, reserved}, rng); got != reserved {
		t.Fatalf("picked %s, want reserved (already paid for)", got.Info().ID)
	}
	if got := p.Pick(req, []*Replica{onDemand, spot}, rng); got != spot {
		t.Fatalf("picked %s, want spot (cheaper per token than on-demand)", got.Info().ID)
	}
}

func TestSLOCheapestTakesTheFasterWhenTheCheaperCannotMeetTheSLO(t *testing.T) {
	now := time.Unix(1000, 0)
	cheap := testReplica("cheap", fleet.Spot, 1)
	fast := testReplica("fast", fleet.OnDemand, 4)
	// The cheap replica has a deep queue: 512 waiting behind a full batch of 256.
	setLoad(cheap, now, 256, 512)
	p := &SLOCheapest{StaleAfter: time.Second}
	req := &Request{Model: "m", PromptTokens: 500, OutTokens: 100, SLO: SLO{TTFT: 1, TPOT: 0.1}, Now: now}
	if pc := cheap.Predict(now, 500, 500, 100, time.Second); pc.TTFT <= 1 {
		t.Fatalf("test setup: cheap replica predicted TTFT %.2fs, want > 1s", pc.TTFT)
	}
	if got := p.Pick(req, []*Replica{cheap, fast}, rand.New(rand.NewPCG(1, 1))); got != fast {
		t.Fatalf("picked %s, want fast (cheap cannot meet the TTFT SLO)", got.Info().ID)
	}
	// With no replica meeting the SLO, the least loaded wins (here also the faster).
	setLoad(fast, now, 256, 1024)
	if got := p.Pick(req, []*Replica{cheap, fast}, rand.New(rand.NewPCG(1, 1))); got != cheap {
		t.Fatalf("picked %s, want cheap (now the less loaded of two that both miss)", got.Info().ID)
	}
}

// When no replica is predicted to meet the SLO, requests spread by load instead of all going
// to the fastest prediction: a replica that learned it was slow during a burst, and is idle
// now, takes the next request rather than the busy one whose line looks faster.
func TestNoneMeetingTheSLOSpreadsByLoad(t *testing.T) {
	now := time.Unix(1000, 0)
	learnedSlow := testReplica("learned-slow", fleet.OnDemand, 4)
	busy := testReplica("busy", fleet.OnDemand, 4)
	for range 20 {
		learnedSlow.twin.prefill.observe(now, 16)
	}
	setLoad(learnedSlow, now, 0, 0)
	setLoad(busy, now, 10, 0)
	p := &SLOCheapest{StaleAfter: time.Second}
	req := &Request{Model: "m", PromptTokens: 500, OutTokens: 2, SLO: SLO{TTFT: 0.001}, Now: now}
	slow, fast := learnedSlow.Predict(now, 500, 500, 2, time.Second), busy.Predict(now, 500, 500, 2, time.Second)
	if !(slow.E2E > fast.E2E) || (SLO{TTFT: 0.001}).Meets(slow) || (SLO{TTFT: 0.001}).Meets(fast) {
		t.Fatalf("test setup: predictions %+v and %+v, want both missing and the idle one slower", slow, fast)
	}
	if got := p.Pick(req, []*Replica{busy, learnedSlow}, rand.New(rand.NewPCG(1, 1))); got != learnedSlow {
		t.Fatalf("picked %s, want the idle replica (none meets the SLO: spread by load)", got.Info().ID)
	}
}

func TestPrefixAffinityHoldsUntilTheReplicaIsOverloaded(t *testing.T) {
	now := time.Unix(1000, 0)
	a, b := testReplica("a", fleet.Reserved, 2), testReplica("b", fleet.Reserved, 2)
	aff, err := NewAffinity(100, 64)
	if err != nil {
		t.Fatal(err)
	}
	p := &SLOCheapest{Affinity: aff, StaleAfter: time.Second}
	prompt := string(make([]byte, 4*prefixBlockBytes))
	req := &Request{Model: "m", PromptTokens: 1000, OutTokens: 50, Prefix: prefixBlocks(prompt, 0), SLO: SLO{TTFT: 1, TPOT: 0.1}, Now: now}
	rng := rand.New(rand.NewPCG(1, 1))
	first := p.Pick(req, []*Replica{a, b}, rng)
	other := a
	if first == a {
		other = b
	}
	// Load the holder up (but within its SLO) and make the other idle: the prefix stays.
	setLoad(first, now, 100, 0)
	for i := range 20 {
		if got := p.Pick(req, []*Replica{a, b}, rng); got != first {
			t.Fatalf("pick %d went to %s, want the prefix holder %s", i, got.Info().ID, first.Info().ID)
		}
	}
	// Overload the holder: a queue deeper than its batch pushes TTFT past the SLO.
	setLoad(first, now, 256, 600)
	if got := p.Pick(req, []*Replica{a, b}, rng); got != other {
		t.Fatalf("overloaded holder still picked")
	}
	// The prefix now lives on the other replica too, and sticks there.
	if got := p.Pick(req, []*Replica{a, b}, rng); got != other {
		t.Fatalf("new holder not kept")
	}
}

func TestRendezvousIsStableAcrossRouters(t *testing.T) {
	now := time.Unix(1000, 0)
	mk := func() []*Replica {
		return []*Replica{testReplica("a", fleet.Reserved, 0), testReplica("b", fleet.Reserved, 0), testReplica("c", fleet.Reserved, 0)}
	}
	r1, r2 := mk(), mk()
	// Two routers, no shared state: the same new prefix goes to the same replica ID.
	p1, p2 := &SLOCheapest{StaleAfter: time.Second}, &SLOCheapest{StaleAfter: time.Second}
	for i := range 50 {
		prompt := string(rune('a'+i%26)) + string(make([]byte, prefixBlockBytes))
		req := &Request{Model: "m", PromptTokens: 100, OutTokens: 10, Prefix: prefixBlocks(prompt, 0), SLO: SLO{TTFT: 5}, Now: now}
		x, y := p1.Pick(req, r1, nil), p2.Pick(req, r2, nil)
		if x.Info().ID != y.Info().ID {
			t.Fatalf("prefix %d: router 1 chose %s, router 2 chose %s", i, x.Info().ID, y.Info().ID)
		}
	}
}

func TestLeastLoadAndRoundRobin(t *testing.T) {
	a, b := testReplica("a", fleet.Spot, 1), testReplica("b", fleet.Spot, 1)
	a.inflight.Add(3)
	rng := rand.New(rand.NewPCG(1, 2))
	req := &Request{Now: time.Unix(1000, 0)}
	if got := (LeastLoad{}).Pick(req, []*Replica{a, b}, rng); got != b {
		t.Fatal("least_load did not pick the replica with fewer in flight")
	}
	rr := &RoundRobin{}
	if rr.Pick(req, []*Replica{a, b}, rng) != a || rr.Pick(req, []*Replica{a, b}, rng) != b || rr.Pick(req, []*Replica{a, b}, rng) != a {
		t.Fatal("round_robin did not cycle")
	}
}

// Candidates come shared and unfiltered for the transient states: every policy skips a
// replica passive health ejected and one the request already failed on, and answers nil
// when none is left, at every fleet size (the sampling pick included).
func TestPoliciesSkipEjectedAndTriedReplicas(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, n := range []int{3, 300} {
		rs := make([]*Replica, n)
		for i := range rs {
			rs[i] = testReplica(fmt.Sprintf("r%03d", i), fleet.OnDemand, 1)
		}
		SortByCost(rs)
		policies := map[string]Policy{"round_robin": &RoundRobin{}, "least_load": LeastLoad{}, "slo_cheapest": &SLOCheapest{StaleAfter: time.Second}}
		for name, p := range policies {
			// Every replica but the last is ejected or tried.
			for _, r := range rs {
				r.ejectedUntil.Store(0)
			}
			var tried []*Replica
			for i, r := range rs[:n-1] {
				if i%2 == 0 {
					r.ejectedUntil.Store(now.Add(time.Minute).UnixNano())
				} else {
					tried = append(tried, r)
				}
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for i := range 5 {
				req := &Request{Model: "m", PromptTokens: 100, OutTokens: 10, Prefix: []uint64{uint64(i)}, Now: now, Tried: tried}
				if got := p.Pick(req, rs, rng); got != rs[n-1] {
					t.Fatalf("%s over %d: picked %v; want the only usable replica %s", name, n, got, rs[n-1].Info().ID)
				}
			}
			req := &Request{Model: "m", PromptTokens: 100, OutTokens: 10, Now: now, Tried: append(tried, rs[n-1])}
			if got := p.Pick(req, rs, rng); got != nil {
				t.Fatalf("%s over %d: picked %s with every replica ejected or tried; want nil", name, n, got.Info().ID)
			}
			if got := p.Pick(&Request{Now: now.Add(time.Hour), Tried: tried}, rs, rng); got == nil || slices.Contains(tried, got) {
				t.Fatalf("%s over %d: after the ejections ended, picked %v", name, n, got)
			}
		}
	}
}

// tiered is n replicas in four price tiers of n/4 (1, 2, 3 and 4 $/h), sorted as a pool
// keeps them.
func tiered(n int) []*Replica {
	rs := make([]*Replica, n)
	for i := range rs {
		rs[i] = testReplica(fmt.Sprintf("r%04d", i), fleet.OnDemand, float64(1+i%4))
	}
	SortByCost(rs)
	return rs
}

// Over a large fleet the pick predicts a bounded sample, but still in the full scan's
// order: the cheapest tier while any of it is predicted to meet the SLO, the next tier when
// the sampled cheap ones are full, spread over the tier rather than piled on one replica,
// and a prompt's prefix sends it to the same replica on every router.
func TestSampledPickKeepsTheFullScansOrder(t *testing.T) {
	now := time.Unix(1000, 0)
	const n = 400
	rs := tiered(n)
	price := func(r *Replica) float64 { return r.Info().PricePerHour }
	// Tiers 1, 2, 3 and 4 $/h: a tolerance under their gaps keeps them apart.
	p := &SLOCheapest{StaleAfter: time.Second, ResampleEvery: -1, CostTolerance: 0.05}
	rng := rand.New(rand.NewPCG(1, 2))
	count := map[*Replica]int{}
	for range 400 {
		req := &Request{Model: "m", PromptTokens: 500, OutTokens: 50, SLO: SLO{TTFT: 1, TPOT: 0.1}, Now: now}
		got := p.Pick(req, rs, rng)
		if price(got) != 1 {
			t.Fatalf("picked a %v $/h replica while every 1 $/h one meets the SLO", price(got))
		}
		count[got]++
	}
	if len(count) < 60 {
		t.Errorf("400 fresh prompts went to %d of the 100 cheapest replicas; want them spread", len(count))
	}
	for r, c := range count {
		if c > 12 {
			t.Errorf("%s took %d of 400 prompts: piled on", r.Info().ID, c)
		}
	}

	// The cheapest tier is full (a queue on every 1 $/h replica): the 2 $/h tier serves.
	for _, r := range rs[:n/4] {
		setLoad(r, now, 256, 400)
	}
	for range 50 {
		req := &Request{Model: "m", PromptTokens: 500, OutTokens: 50, SLO: SLO{TTFT: 1, TPOT: 0.1}, Now: now}
		if got := p.Pick(req, rs, rng); price(got) != 2 {
			t.Fatalf("with every 1 $/h replica queued, picked a %v $/h one; want 2", price(got))
		}
	}
	// Every tier full: the least loaded of the sample, not nothing.
	for _, r := range rs {
		setLoad(r, now, 256, 400)
	}
	setLoad(rs[n-1], now, 256, 300)
	req := &Request{Model: "m", PromptTokens: 500, OutTokens: 50, SLO: SLO{TTFT: 1, TPOT: 0.1}, Now: now}
	if got := p.Pick(req, rs, rng); got == nil {
		t.Fatal("with every replica predicted to miss, no pick")
	}

	// Two routers, each with its own view of the same replicas: the same prefix goes to
	// the same replica, new prefixes spread.
	a, b := tiered(n), tiered(n)
	pa, pb := &SLOCheapest{StaleAfter: time.Second}, &SLOCheapest{StaleAfter: time.Second}
	owners := map[string]bool{}
	for i := range 100 {
		prefix := []uint64{mix(uint64(i) + 7), 1}
		ra := pa.Pick(&Request{Model: "m", PromptTokens: 500, OutTokens: 50, Prefix: prefix, SLO: SLO{TTFT: 1}, Now: now}, a, rng)
		rb := pb.Pick(&Request{Model: "m", PromptTokens: 500, OutTokens: 50, Prefix: prefix, SLO: SLO{TTFT: 1}, Now: now}, b, rand.New(rand.NewPCG(9, 9)))
		if ra.Info().ID != rb.Info().ID {
			t.Fatalf("prefix %d: router a chose %s, router b %s", i, ra.Info().ID, rb.Info().ID)
		}
		owners[ra.Info().ID] = true
	}
	if len(owners) < 50 {
		t.Errorf("100 new prefixes have %d owners; want them spread over the cheapest tier", len(owners))
	}
}

// A prefix that many prompts share (a system prompt) fills the replicas its hash selects;
// its prompts then spill over the rest of the cheapest tier, not onto a dearer one and not
// onto the full ones.
func TestSampledPickSpillsAHotPrefixOverTheTier(t *testing.T) {
	now := time.Unix(1000, 0)
	rs := tiered(400)
	p := &SLOCheapest{StaleAfter: time.Second, ResampleEvery: -1}
	rng := rand.New(rand.NewPCG(5, 6))
	full := map[*Replica]bool{}
	for i := range 40 {
		req := &Request{Model: "m", PromptTokens: 500, OutTokens: 50, Prefix: []uint64{42, uint64(i)}, SLO: SLO{TTFT: 1}, Now: now}
		got := p.Pick(req, rs, rng)
		if got.Info().PricePerHour != 1 || full[got] {
			t.Fatalf("prompt %d of a hot prefix went to %s at %v $/h (full: %v) while most of the 1 $/h tier is idle", i, got.Info().ID, got.Info().PricePerHour, full[got])
		}
		setLoad(got, now, 256, 400) // it is full now
		full[got] = true
	}
}

// In a fleet too large to scan, the replica a prompt went to is examined and keeps it: it is
// in the cheapest tier, and its cache holds the prompt.
func TestSampledPickFollowsTheHolder(t *testing.T) {
	now := time.Unix(1000, 0)
	rs := tiered(4096)
	aff, err := NewAffinity(1000, 64)
	if err != nil {
		t.Fatal(err)
	}
	p := &SLOCheapest{Affinity: aff, StaleAfter: time.Second, ResampleEvery: -1}
	long := "z" + string(make([]byte, 32*prefixBlockBytes))
	req := func() *Request {
		return &Request{Model: "m", PromptTokens: 8000, OutTokens: 20, Prefix: prefixBlocks(long, 0), SLO: SLO{TTFT: 5}, Now: now}
	}
	r0 := req()
	first := p.Pick(r0, rs, nil)
	first.End(first.Begin(r0, time.Second), now)
	for range 20 {
		if got := p.Pick(req(), rs, rand.New(rand.NewPCG(3, 4))); got != first {
			t.Fatalf("the holder %s lost its prompt to %s", first.Info().ID, got.Info().ID)
		}
	}
	// Not in this model's candidates (another list): never picked from outside it.
	if got := p.Pick(req(), rs[:100], nil); got == first && !slices.Contains(rs[:100], first) {
		t.Fatal("picked a holder that is not a candidate")
	}
}

func TestPassiveEjectionBacksOff(t *testing.T) {
	r := testReplica("a", fleet.Spot, 1)
	now := time.Unix(1000, 0)
	for i := range 2 {
		if r.requestFailed(now, 3, time.Second, 10*time.Second) {
			t.Fatalf("ejected after %d failures", i+1)
		}
	}
	if !r.requestFailed(now, 3, time.Second, 10*time.Second) || r.Available(now.Add(999*time.Millisecond)) || !r.Available(now.Add(time.Second)) {
		t.Fatal("first ejection should last 1s")
	}
	for range 3 {
		r.requestFailed(now, 3, time.Second, 10*time.Second)
	}
	if r.Available(now.Add(1500*time.Millisecond)) || !r.Available(now.Add(2*time.Second)) {
		t.Fatal("second consecutive ejection should last 2s")
	}
	r.requestSucceeded()
	for range 3 {
		r.requestFailed(now, 3, time.Second, 10*time.Second)
	}
	if !r.Available(now.Add(time.Second)) {
		t.Fatal("a success should reset the backoff")
	}
}

// Equally priced replicas share the load: within the cheapest tier the least loaded one
// takes the request, whatever each replica's predictor has learned. (Ranking by the fastest
// prediction, or by a throughput learned from traffic, sent almost every request to one
// replica in the simulator.)
func TestSLOCheapestSpreadsOverEquallyPricedReplicas(t *testing.T) {
	now := time.Unix(1000, 0)
	var rs []*Replica
	for _, id := range []string{"a", "b", "c", "d"} {
		r := newReplica(fleet.Replica{ID: id, Address: "127.0.0.1:1", Model: "m", Capacity: fleet.OnDemand, PricePerHour: 11}, nil, defaultProfile())
		rs = append(rs, r)
	}
	// "a" has learned that it is fast and serves a lot: it must not look cheaper for it.
	for range 50 {
		rs[0].twin.prefill.observe(now, 0.5)
		rs[0].twin.decop.observe(now, 0.5)
	}
	if rs[0].MarginalCost() != rs[1].MarginalCost() {
		t.Fatalf("marginal cost %v vs %v: same price and no described throughput must cost the same", rs[0].MarginalCost(), rs[1].MarginalCost())
	}
	p := &SLOCheapest{StaleAfter: time.Second}
	count := map[string]int{}
	for range 40 {
		req := &Request{Model: "m", PromptTokens: 2000, OutTokens: 30, SLO: SLO{TTFT: 2, TPOT: 0.1}, Now: now}
		r := p.Pick(req, rs, rand.New(rand.NewPCG(1, 1)))
		r.Begin(req, time.Second) // in flight until the end of the test
		count[r.Info().ID]++
	}
	for _, r := range rs {
		if n := count[r.Info().ID]; n != 10 {
			t.Fatalf("requests per replica %v, want 10 each", count)
		}
	}
}

// Prompts sent ahead and not yet prefilled delay a new request's first token for as long as
// the replica's engine takes to compute them; a first token ends the wait at once; a request
// whose first token the router never sees (not streamed) stops delaying others when its
// prefill should be over; a request that fails early takes its prefill with it.
func TestPredictionCountsPrefillAhead(t *testing.T) {
	now := time.Unix(1000, 0)
	r := testReplica("r", fleet.OnDemand, 4)
	r.rtt.observe(0)
	prof := defaultProfile()
	prep := func(n int) float64 { return (time.Duration(n) * PrepPerToken).Seconds() }
	alone := prof.PrefillMs(1000, 0) / 1000
	idle := r.Predict(now, 1000, 1000, 10, time.Second)
	if math.Abs(idle.TTFT-prep(1000)-alone) > 1e-6 || math.Abs(idle.Wait-prep(1000)) > 1e-6 || idle.Ahead != 0 {
		t.Fatalf("idle replica: %+v, want TTFT = the server's preparation and the profile's prefill of 1,000 tokens (%.4fs)", idle, alone)
	}
	big := &Request{Model: "m", PromptTokens: 30000, OutTokens: 10, Now: now, Streamed: true}
	pred := r.Begin(big, time.Second)
	bigIn := now.Add(time.Duration(prep(30000) * float64(time.Second))) // when the engine has it
	// 30,000 tokens in chunks of 8,192: four steps, the last of 5,424 tokens.
	var work float64
	for done := 0; done < 30000; done += 8192 {
		n := min(8192, 30000-done)
		pf, _ := prof.StepMs(engine.StepShape{Tokens: float64(n), SumN2: float64(n * n), SumNP: float64(n * done), SumP: float64(done), CachedSeqs: min(done, 1)})
		work += pf / 1000
	}
	if math.Abs(pred.TTFT-prep(30000)-work) > 1e-6 {
		t.Fatalf("Begin on an idle replica predicted %.4fs for 30,000 tokens, want the profile's four chunks, %.4fs", pred.TTFT, work)
	}
	// A short prompt sent at once reaches the engine first and goes ahead.
	if got := r.Predict(now, 1000, 1000, 10, time.Second); got.Ahead != 0 || math.Abs(got.TTFT-idle.TTFT) > 1e-6 {
		t.Fatalf("a short prompt sent with a long one: %+v, want it ahead of the long one (%.4fs)", got, idle.TTFT)
	}
	// Once the long one is in, a new prompt waits for it, and shares its last step.
	at := bigIn.Add(10 * time.Millisecond)
	lo := bigIn.Add(time.Duration(work * float64(time.Second))).Sub(at).Seconds()
	busy := r.Predict(at, 1000, 1000, 10, time.Second)
	if busy.Ahead != 1 || busy.TTFT <= lo || busy.TTFT > lo+alone {
		t.Fatalf("with 30k tokens ahead (%.3fs of prefill left): %+v", lo, busy)
	}
	half := bigIn.Add(time.Duration(work / 2 * float64(time.Second)))
	if got := r.Predict(half, 1000, 1000, 10, time.Second); math.Abs(got.TTFT-(busy.TTFT-half.Sub(at).Seconds())) > 1e-3 {
		t.Fatalf("halfway through its prefill, TTFT %.4fs, want %.4f", got.TTFT, busy.TTFT-half.Sub(at).Seconds())
	}
	r.FirstToken(pred, half) // the replica was faster than its profile
	after := r.Predict(half, 1000, 1000, 10, time.Second)
	if after.Ahead != 0 || after.Wait > 0.05 {
		t.Fatalf("prefill done, still waiting %+v", after)
	}
	r.End(pred, half)
	if r.InFlight() != 0 || len(r.twin.queue) != 0 || r.twin.nDec != 0 {
		t.Fatalf("after End: in flight %d, model %+v", r.InFlight(), r.twin)
	}

	// Not streamed: no first token, yet the wait is over once its prefill should be.
	r = testReplica("r2", fleet.OnDemand, 4)
	r.rtt.observe(0)
	plain := &Request{Model: "m", PromptTokens: 30000, OutTokens: 10, Now: now}
	pred = r.Begin(plain, time.Second)
	over := now.Add(time.Duration(pred.TTFT*float64(time.Second)) + 100*time.Millisecond)
	if got := r.Predict(over, 1000, 1000, 10, time.Second); got.Ahead != 0 || got.Wait > 0.05 {
		t.Fatalf("past its prefill a non-streamed request still delays others: %+v", got)
	}

	// Two queued, the first ends before its first token (failed): the step it is in runs
	// to its end, the second's work stays.
	r = testReplica("r3", fleet.OnDemand, 4)
	r.rtt.observe(0)
	first := r.Begin(big, time.Second)
	r.Begin(plain, time.Second)
	r.End(first, at)
	firstChunk := prof.PrefillMs(8192, 0) / 1000
	lo = bigIn.Add(time.Duration((firstChunk + work) * float64(time.Second))).Sub(at).Seconds()
	if got := r.Predict(at, 1000, 1000, 10, time.Second); got.Ahead != 1 || got.TTFT < lo || got.TTFT > lo+alone {
		t.Fatalf("after the first of two queued prompts ended: %+v, want its running step (%.4fs) and the second's %.4fs ahead", got, firstChunk, work)
	}
}

// A replica's cached prefix counts in its prediction, not in the ranking: the cheapest
// replica that meets the SLO and starts the prompt at once takes it though a dearer one
// holds its prefix (the holder used to keep it when its cache saved more prefill than the
// price gap: on a Mooncake day that cost 28 % more for the same SLO attainment, see
// SLOCheapest.choose); the holder takes it when its cache is what meets the SLO.
func TestCachedPrefixCountsInThePredictionNotTheRanking(t *testing.T) {
	now := time.Unix(1000, 0)
	aff, err := NewAffinity(100, 64)
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	p := &SLOCheapest{Affinity: aff, StaleAfter: time.Second, ResampleEvery: -1,
		OnPick: func(_ *Replica, reason string) { reasons = append(reasons, reason) }}
	pick := func(prompt string, tokens, out int, ttft float64, rs ...*Replica) (*Replica, string) {
		t.Helper()
		req := &Request{Model: "m", PromptTokens: tokens, OutTokens: out, Prefix: prefixBlocks(prompt, 0), SLO: SLO{TTFT: ttft}, Now: now}
		got := p.Pick(req, rs, rand.New(rand.NewPCG(1, 1)))
		if got != nil {
			got.End(got.Begin(req, time.Second), now) // sent and answered: its prefix memory has it
		}
		return got, reasons[len(reasons)-1]
	}
	// A long prompt, a short answer, first sent to a replica twice as dear (two cost tiers).
	cheap, dear := testReplica("cheap", fleet.OnDemand, 1), testReplica("dear", fleet.OnDemand, 2)
	long := "x" + string(make([]byte, 32*prefixBlockBytes))
	if got, _ := pick(long, 8000, 20, 5, dear); got != dear {
		t.Fatalf("setup: %s", got.Info().ID)
	}
	if u := cheap.Predict(now, 8000, 8000, 20, time.Second); u.TTFT > 5 {
		t.Fatalf("setup: the cheap replica's twin computes 8,000 tokens in %.2fs, want within the 5 s SLO", u.TTFT)
	}
	if got, why := pick(long, 8000, 20, 5, cheap, dear); got != cheap || why != ReasonCheapest {
		t.Fatalf("the dearer holder of the prompt's prefix took a prompt the cheap replica starts at once within the SLO: %s (%s)", got.Info().ID, why)
	}
	if got, why := pick(long, 8000, 20, 5, cheap, dear); got != cheap || why != ReasonCheapest {
		t.Fatalf("the repeat: %s (%s), want cheap", got.Info().ID, why)
	}

	// Needed for the SLO: without the cache no replica computes the 2,100-token prompt
	// within 40 ms; the 2x dearer holder, with 2,048 of them cached, does.
	cheap, dear = testReplica("cheap3", fleet.OnDemand, 1), testReplica("dear3", fleet.OnDemand, 2)
	other := "y" + string(make([]byte, 32*prefixBlockBytes))
	pick(other, 2100, 200, 5, dear)
	if pc := cheap.Predict(now, 2100, 2100, 200, time.Second); pc.TTFT <= 0.04 {
		t.Fatalf("setup: 2,100 uncached tokens predicted in %.3fs, want > 40 ms", pc.TTFT)
	}
	if got, why := pick(other, 2100, 200, 0.04, cheap, dear); got != dear || why != ReasonCheapest {
		t.Fatalf("only the holder meets the SLO, yet the pick was %s (%s)", got.Info().ID, why)
	}
}

// Within the cheapest tier the replica whose cache holds the prompt takes it, though the
// rendezvous hash that places new prefixes names another; a prompt no replica holds goes
// where the hash says.
func TestCheapestTierPrefersTheReplicaHoldingThePrompt(t *testing.T) {
	now := time.Unix(1000, 0)
	a, b := testReplica("a", fleet.OnDemand, 1), testReplica("b", fleet.OnDemand, 1.2) // one tier
	p := &SLOCheapest{StaleAfter: time.Second, ResampleEvery: -1}
	for i := range 64 {
		prompt := fmt.Sprintf("conversation %d ", i) + string(make([]byte, 16*prefixBlockBytes))
		req := &Request{Model: "m", PromptTokens: 4000, OutTokens: 20, Prefix: prefixBlocks(prompt, 0), SLO: SLO{TTFT: 5}, Now: now}
		hashed := rendezvous(req.Prefix[0], []scored{{r: a}, {r: b}}).r
		other := a
		if hashed == a {
			other = b
		}
		if got := p.Pick(req, []*Replica{a, b}, nil); got != hashed {
			t.Fatalf("prompt %d, held nowhere, went to %s; want %s, the rendezvous choice", i, got.Info().ID, hashed.Info().ID)
		}
		other.End(other.Begin(req, time.Second), now) // its earlier turn went to the other
		if got := p.Pick(req, []*Replica{a, b}, nil); got != other {
			t.Fatalf("prompt %d went to %s; want %s, whose cache holds its prefix", i, got.Info().ID, other.Info().ID)
		}
		now = now.Add(time.Minute)
	}
}

// A conversation's next turn extends the last prompt: the holder is found with nearly all
// of the shared prefix, at any length up to maxPrefixBlocks, while a long prompt costs the
// table a bounded number of entries and a new prompt a handful of lookups.
func TestAffinityMatchesLongSharedPrefixes(t *testing.T) {
	aff, err := NewAffinity(100_000, 64)
	if err != nil {
		t.Fatal(err)
	}
	words := func(n int, seed uint64) string {
		rng := rand.New(rand.NewPCG(seed, 1))
		b := make([]byte, 0, n)
		for len(b) < n {
			b = append(b, byte('a'+rng.IntN(26)))
		}
		return string(b)
	}
	r := testReplica("holder", fleet.OnDemand, 1)
	for _, shared := range []int{3, 31, 40, 100, 257, 500} {
		conv := words(512*prefixBlockBytes, uint64(shared))
		turn1 := prefixBlocks(conv[:shared*prefixBlockBytes+100], 0)
		aff.record(turn1, r)
		turn2 := prefixBlocks(conv, 0)
		got, tokens := aff.lookup(turn2, 10)
		if got != r {
			t.Fatalf("shared %d blocks: holder not found", shared)
		}
		if held := tokens / 10; held > shared || held < shared-shared/checkpointsPerDoubling {
			t.Fatalf("shared %d blocks: found %d held; want within 1/%d below", shared, held, checkpointsPerDoubling)
		}
	}
	if got, _ := aff.lookup(prefixBlocks(words(300*prefixBlockBytes, 999), 0), 10); got != nil {
		t.Fatal("a new prompt found a holder")
	}
	n := 0
	for k := 1; k <= maxPrefixBlocks; k++ {
		if checkpoint(k) {
			n++
		}
	}
	if n != 96 {
		t.Fatalf("a %d-block prompt takes %d entries; want 96", maxPrefixBlocks, n)
	}
}

// Spot replicas in zones priced $4.60 to $6.30/h are one cost tier: billed by the hour,
// they cost the same used or idle, so the pick spreads over them instead of packing the
// cheapest zone's replica (which slowed its streams past the TPOT target in the simulator);
// an on-demand replica at $11.06/h is a tier apart and gets nothing while a spot replica
// meets the SLO and can start the request at once.
func TestNearPricesAreOneTier(t *testing.T) {
	rs := spotAndOnDemand()
	p := &SLOCheapest{StaleAfter: time.Second}
	count := map[string]int{}
	now := time.Unix(1000, 0)
	for range 30 {
		// 250 ms apart: each prompt is computed before the next comes, its stream goes on.
		now = now.Add(250 * time.Millisecond)
		req := &Request{Model: "m", PromptTokens: 2000, OutTokens: 30, SLO: SLO{TTFT: 2, TPOT: 0.1}, Now: now}
		r := p.Pick(req, rs, rand.New(rand.NewPCG(1, 1)))
		r.Begin(req, time.Second)
		count[r.Info().ID]++
	}
	if count["r0"] != 10 || count["r1"] != 10 || count["r2"] != 10 || count["r3"] != 0 {
		t.Fatalf("requests per replica %v: want the three spot replicas 10 each, on-demand none", count)
	}
}

// A burst that queues prompts on every spot replica goes on to the on-demand replica that
// can start one at once, though the spot ones would still meet the SLO: billed by the hour,
// the idle replica costs the same either way, and the wait would add to the concurrency the
// autoscaler buys replicas for. Once every replica has prompts queued, the least loaded
// takes the next.
func TestQueueingOnCheapReplicasIsNotCheaper(t *testing.T) {
	rs := spotAndOnDemand()
	p := &SLOCheapest{StaleAfter: time.Second}
	now := time.Unix(1000, 0)
	var got []string
	var reasons []string
	p.OnPick = func(_ *Replica, reason string) { reasons = append(reasons, reason) }
	for range 8 {
		req := &Request{Model: "m", PromptTokens: 2000, OutTokens: 30, SLO: SLO{TTFT: 2, TPOT: 0.1}, Now: now}
		r := p.Pick(req, rs, rand.New(rand.NewPCG(1, 1)))
		if !req.SLO.Meets(req.pickedPred) {
			t.Fatalf("pick %d: %s predicted to miss the SLO (%+v)", len(got), r.Info().ID, req.pickedPred)
		}
		r.Begin(req, time.Second)
		got = append(got, r.Info().ID)
	}
	if !sameSet(got[:3], []string{"r0", "r1", "r2"}) || got[3] != "r3" {
		t.Fatalf("picks %v: want the three spot replicas, then the on-demand one (the only one that starts at once)", got)
	}
	for i, why := range reasons[:4] {
		if why != ReasonCheapest {
			t.Fatalf("pick %d: reason %q, want %q", i, why, ReasonCheapest)
		}
	}
	for i, why := range reasons[4:] {
		if why != ReasonQueued {
			t.Fatalf("pick %d: reason %q, want %q (every replica has a prompt queued)", i+4, why, ReasonQueued)
		}
	}
	if !sameSet(got[4:], []string{"r0", "r1", "r2", "r3"}) {
		t.Fatalf("picks %v: with a prompt queued on each, the next four should go one to each replica", got)
	}
}

func spotAndOnDemand() []*Replica {
	var rs []*Replica
	for i, price := range []float64{4.6, 5.4, 6.3, 11.06} {
		capacity := fleet.Spot
		if price > 10 {
			capacity = fleet.OnDemand
		}
		rs = append(rs, newReplica(fleet.Replica{ID: fmt.Sprint("r", i), Address: "127.0.0.1:1", Model: "m", Capacity: capacity, PricePerHour: price}, nil, defaultProfile()))
	}
	return rs
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// A stream's time per token grows with the requests sent after it: a replica whose streams
// have run at twice their predicted TPOT is held to that, so a pick does not fill it up to
// the target with streams that will then miss it.
func TestTPOTVerdictUsesItsSpread(t *testing.T) {
	r := newReplica(fleet.Replica{ID: "a", Address: "127.0.0.1:1", Model: "m", PricePerHour: 1}, nil, defaultProfile())
	now := time.Unix(1000, 0)
	slo := SLO{TTFT: 2, TPOT: 0.1, Percentile: 0.9}
	for range 60 {
		req := &Request{Model: "m", PromptTokens: 100, OutTokens: 11, SLO: slo, Now: now, Streamed: true}
		pred := r.Begin(req, time.Second)
		if pred.TPOT <= 0 {
			t.Fatalf("no TPOT prediction: %+v", pred)
		}
		ttft := pred.TTFT
		r.Completed(req, pred, ttft, ttft+10*2*pred.TPOT, 11, true) // every token twice as slow
		now = now.Add(time.Second)
	}
	p := r.Predict(now, 100, 100, 11, time.Second)
	if p.TPOTSpread < 1.5 {
		t.Fatalf("TPOT spread %.2f after streams at twice their prediction, want near 2", p.TPOTSpread)
	}
	if p.TPOT*p.TPOTSpread > 0.1 == slo.Meets(p) {
		t.Fatalf("verdict %v for TPOT %.3f × spread %.2f against 0.1", slo.Meets(p), p.TPOT, p.TPOTSpread)
	}
}

// A late request (held past its TTFT target, Request.Late) goes only where a replica has
// room for it at its SLO, and nowhere (nil: it waits in the router) while none has, unless
// its own prefill misses the target; a fresh request goes to the least loaded all the same.
func TestLateRequestTakesOnlyRoom(t *testing.T) {
	now := time.Unix(1000, 0)
	r := testReplica("a", fleet.Spot, 1)
	setLoad(r, now, 256, 512) // the backlog a hold released
	p := &SLOCheapest{StaleAfter: time.Second}
	slo := SLO{TTFT: 1, TPOT: 0.1}
	if slo.Meets(r.Predict(now, 500, 500, 100, time.Second)) {
		t.Fatal("test setup: the loaded replica is predicted to meet the SLO")
	}
	rng := rand.New(rand.NewPCG(1, 1))
	fresh := &Request{Model: "m", PromptTokens: 500, OutTokens: 100, SLO: slo, Now: now}
	if got := p.Pick(fresh, []*Replica{r}, rng); got != r {
		t.Fatalf("a fresh request picked %v; want the only replica", got)
	}
	late := &Request{Model: "m", PromptTokens: 500, OutTokens: 100, SLO: slo, Now: now, Late: true}
	if got := p.Pick(late, []*Replica{r}, rng); got != nil {
		t.Fatalf("a late request picked %s with no room; want none (it waits)", got.Info().ID)
	}
	// A prompt whose own prefill misses the TTFT target would miss it anywhere: waiting for
	// room would only add to the miss.
	long := &Request{Model: "m", PromptTokens: 100_000, OutTokens: 100, SLO: slo, Now: now, Late: true}
	if got := p.Pick(long, []*Replica{r}, rng); got != r {
		t.Fatalf("a late request that misses its TTFT target on its own prefill picked %v; want the replica", got)
	}
	later := now.Add(time.Second)
	setLoad(r, later, 4, 0) // drained
	late.Now = later
	if got := p.Pick(late, []*Replica{r}, rng); got != r {
		t.Fatalf("a late request picked %v with room; want the replica", got)
	}
}
