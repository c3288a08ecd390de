package engine

import "testing"

// Requests that arrive together cost a GPU whose prefill of one prompt is longer than the
// TPOT target (the L40S: about 165 ms for 2,048 tokens of Llama-3.1-8B) more of its rate
// than one that prefills it within the target (the H100: about 67 ms): every request
// decoding beside a burst's prefills waits for them. Bursts of one are MaxRate's Poisson
// arrivals.
func TestBurstsCostASlowPrefillMore(t *testing.T) {
	rate := func(gpu string, burst int) float64 {
		t.Helper()
		name, err := ProfileOn(gpu, "llama-3.1-8b")
		if err != nil {
			t.Fatal(err)
		}
		p, err := LoadProfile(name)
		if err != nil {
			t.Fatal(err)
		}
		r, err := MaxRateInBursts(*p, 2048, 32, 100, 2000, 400, burst, 1)
		if err != nil {
			t.Fatal(err)
		}
		if burst == 1 {
			if plain, err := MaxRate(*p, 2048, 32, 100, 2000, 400, 1); err != nil || plain != r {
				t.Fatalf("%s: MaxRate %v (%v), bursts of one %v: want the same", gpu, plain, err, r)
			}
		}
		return r
	}
	l1, l8, h1, h8 := rate("l40s", 1), rate("l40s", 8), rate("h100", 1), rate("h100", 8)
	t.Logf("L40S %.3f → %.3f req/s, H100 %.3f → %.3f in bursts of 8", l1, l8, h1, h8)
	if l8 >= l1 || h8 >= h1 {
		t.Errorf("bursts of 8 sustain no less than one by one: L40S %v vs %v, H100 %v vs %v", l8, l1, h8, h1)
	}
	if l8/l1 >= 0.8*(h8/h1) {
		t.Errorf("the L40S keeps %.2f of its rate in bursts, the H100 %.2f: want the L40S to lose clearly more", l8/l1, h8/h1)
	}
	p, _ := LoadProfile("h100-llama-3.1-8b")
	if _, err := MaxRateInBursts(*p, 2048, 32, 100, 2000, 400, 0, 1); err == nil {
		t.Error("bursts of 0: want an error")
	}
}

// Without a TTFT target, a rate whose queue grows without bound keeps every admitted
// request's TPOT within the target (the batch is capped, the rest wait), and was counted as
// sustained up to the search's ceiling (issue 48: 131,072 req/s for the H100 at short
// shapes). Capacity is the highest rate whose queue stays steady: with no TTFT target it
// is within a few percent of the rate with a generous one, and far below the ceiling.
func TestCapacityIsASteadyQueueWithOrWithoutTTFT(t *testing.T) {
	p, err := LoadProfile("h100-llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	free, err := MaxRate(*p, 128, 128, 120, 0, 400, 1)
	if err != nil {
		t.Fatal(err)
	}
	bounded, err := MaxRate(*p, 128, 128, 120, 30000, 400, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("128:128 on the H100 at 120 ms TPOT: %.1f req/s with no TTFT target, %.1f within 30 s", free, bounded)
	if free > 1000 || free > 1.3*bounded || free < 0.7*bounded {
		t.Errorf("no TTFT target: %.1f req/s; with a 30 s TTFT target %.1f: want a steady queue's rate, near the bounded one", free, bounded)
	}
}
