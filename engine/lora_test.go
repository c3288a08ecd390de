package engine

import (
	"math"
	"testing"
	"time"
)

func loraEngine(t *testing.T, l LoRA) *Engine {
	t.Helper()
	e := newEngine(t, nil)
	must(t, e.SetLoRA(l))
	return e
}

// With one GPU slot, a request for a second adapter waits while the first adapter's requests
// run, and the base model's and the first adapter's later requests go past it, as vLLM's V1
// scheduler skips it.
func TestLoRASlotsSkipAnAdapterWithoutASlot(t *testing.T) {
	fill := func() *Engine {
		e := loraEngine(t, LoRA{MaxLoRAs: 1})
		for i, a := range []uint32{7, 8, 0, 7} {
			must(t, e.Add(Request{ID: uint64(i + 1), PromptTokens: 100, MaxTokens: 50, Adapter: a}))
		}
		return e
	}
	e := fill()
	st := e.Step()
	if len(st.Scheduled) != 3 || st.Scheduled[0] != 1 || st.Scheduled[1] != 3 || st.Scheduled[2] != 4 {
		t.Fatalf("first step scheduled %v, want [1 3 4] (adapter 8 has no slot)", st.Scheduled)
	}
	run, wait := e.Adapters(nil, nil)
	if len(run) != 1 || run[0] != 7 || len(wait) != 1 || wait[0] != 8 {
		t.Errorf("adapters running %v waiting %v, want [7] and [8]", run, wait)
	}
	ttft, done := drive(t, fill())
	if !(ttft[2] >= done[1] && ttft[2] >= done[4]) {
		t.Errorf("adapter 8's first token at %v, before adapter 7's requests ended (%v, %v)", ttft[2], done[1], done[4])
	}

	// Two slots: all four start at once.
	e = loraEngine(t, LoRA{MaxLoRAs: 2})
	for i, a := range []uint32{7, 8, 0, 7} { // two slots
		must(t, e.Add(Request{ID: uint64(i + 1), PromptTokens: 100, MaxTokens: 50, Adapter: a}))
	}
	if st := e.Step(); len(st.Scheduled) != 4 {
		t.Errorf("two slots: scheduled %v, want all four", st.Scheduled)
	}
}

func TestLoRARefusedWithoutLoRA(t *testing.T) {
	e := newEngine(t, nil)
	if err := e.Add(Request{ID: 1, PromptTokens: 10, MaxTokens: 1, Adapter: 3}); err == nil {
		t.Error("an adapter's request was accepted by an engine without LoRA")
	}
	if _, err := e.Preload(3, time.Second); err == nil {
		t.Error("Preload accepted without LoRA")
	}
	if err := e.SetLoRA(LoRA{MaxLoRAs: 2, MaxCPULoRAs: 1}); err == nil || err.Error() != "max_cpu_loras (1) must be >= max_loras (2)" {
		t.Errorf("SetLoRA with fewer CPU than GPU slots: %v", err)
	}
}

// An adapter read from disk costs its step the load time; one kept in CPU memory does not,
// and the least recently used is the one evicted.
func TestLoRACPUCacheLoadsOnMissOnly(t *testing.T) {
	const load = 2 * time.Second
	run := func(cpu int, adapters ...uint32) (loads int, total time.Duration) {
		e := loraEngine(t, LoRA{MaxLoRAs: 1, MaxCPULoRAs: cpu})
		base := loraEngine(t, LoRA{MaxLoRAs: 1, MaxCPULoRAs: cpu})
		var now, baseNow time.Duration
		for i, a := range adapters {
			must(t, e.Add(Request{ID: uint64(i), PromptTokens: 64, MaxTokens: 2, Adapter: a, AdapterLoad: load}))
			must(t, base.Add(Request{ID: uint64(i), PromptTokens: 64, MaxTokens: 2, Adapter: a}))
			_, d := drive(t, e)
			_, bd := drive(t, base)
			now += d[uint64(i)]
			baseNow += bd[uint64(i)]
		}
		return int(math.Round(float64(now-baseNow) / float64(load))), now
	}
	if n, _ := run(1, 1, 2, 1); n != 3 {
		t.Errorf("one CPU slot, adapters 1 2 1: %d loads, want 3", n)
	}
	if n, _ := run(2, 1, 2, 1); n != 2 {
		t.Errorf("two CPU slots, adapters 1 2 1: %d loads, want 2", n)
	}
	if n, _ := run(2, 1, 2, 1, 3, 2); n != 4 {
		t.Errorf("two CPU slots, adapters 1 2 1 3 2: %d loads, want 4 (3 evicts 2, the least recently used)", n)
	}

	// Preloaded adapters cost the next step, once.
	e := loraEngine(t, LoRA{MaxLoRAs: 1})
	if read, err := e.Preload(5, load); err != nil || !read {
		t.Fatalf("Preload: read %v err %v", read, err)
	}
	if read, _ := e.Preload(5, load); read {
		t.Error("a second Preload read the adapter again")
	}
	must(t, e.Add(Request{ID: 1, PromptTokens: 64, MaxTokens: 1, Adapter: 5, AdapterLoad: load}))
	if st := e.Step(); st.Duration < load || st.Duration > load+time.Second {
		t.Errorf("step after Preload took %v, want the load (%v) and a short prefill", st.Duration, load)
	}
	if !e.Cached(5) || e.Cached(6) {
		t.Error("Cached disagrees with what was loaded")
	}
}

// A batch of adapter tokens takes DefaultLoRAStepCost longer than the base model's; a mixed
// batch in proportion to its adapter tokens.
func TestLoRAStepCost(t *testing.T) {
	itl := func(adapters ...uint32) float64 {
		e := loraEngine(t, LoRA{MaxLoRAs: 4})
		for i, a := range adapters {
			must(t, e.Add(Request{ID: uint64(i), PromptTokens: 512, MaxTokens: 65, Adapter: a}))
		}
		ttft, done := drive(t, e)
		return float64(done[0]-ttft[0]) / 64
	}
	base := itl(0, 0, 0, 0)
	for _, c := range []struct {
		adapters []uint32
		want     float64
	}{
		{[]uint32{1, 1, 1, 1}, 1 + DefaultLoRAStepCost},
		{[]uint32{1, 2, 3, 4}, 1 + DefaultLoRAStepCost},
		{[]uint32{1, 0, 2, 0}, 1 + DefaultLoRAStepCost/2},
	} {
		if got := itl(c.adapters...) / base; math.Abs(got-c.want) > 0.01 {
			t.Errorf("adapters %v: decode step %.3f× the base model's, want %.3f×", c.adapters, got, c.want)
		}
	}
}
