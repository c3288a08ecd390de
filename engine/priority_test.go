package engine

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// scheduledOrder runs e to the end and returns the requests in the order they first left
// the queue.
func scheduledOrder(t *testing.T, e *Engine) []uint64 {
	t.Helper()
	var order []uint64
	for steps := 0; !e.Idle(); steps++ {
		if steps > 1_000_000 {
			t.Fatal("engine did not finish")
		}
		order = append(order, e.Step().Scheduled...)
	}
	return order
}

// finishTimes runs e to the end and returns when each request finished.
func finishTimes(t *testing.T, e *Engine) map[uint64]time.Duration {
	t.Helper()
	done := map[uint64]time.Duration{}
	runToEnd(t, e, func(now time.Duration, em Emit) {
		if em.Done {
			done[em.ID] = now
		}
	})
	return done
}

// Under priority scheduling the queue is ordered by priority, then arrival; first come
// first served ignores the priority.
func TestPrioritySchedulingOrdersTheQueue(t *testing.T) {
	for _, prio := range []bool{false, true} {
		e := newEngine(t, func(p *Profile) { p.MaxBatch = 1 })
		if prio {
			must(t, e.SetPriorityScheduling())
		}
		// 1 and 2 are batch work (priority 2), 3 interactive (0), 4 standard (1), 5 batch.
		for i, pr := range []int{2, 2, 0, 1, 2} {
			must(t, e.Add(Request{ID: uint64(i + 1), PromptTokens: 64, MaxTokens: 4, Priority: pr}))
		}
		got := scheduledOrder(t, e)
		want := []uint64{1, 2, 3, 4, 5}
		if prio {
			want = []uint64{3, 4, 1, 2, 5}
		}
		if !slices.Equal(got, want) {
			t.Errorf("priority %v: scheduled %v, want %v", prio, got, want)
		}
	}
}

// An arrival goes ahead of the queue, not of sequences already running.
func TestPriorityArrivalWaitsForNoRunningPrefillButGoesAheadOfTheQueue(t *testing.T) {
	e := newEngine(t, func(p *Profile) { p.MaxBatch = 2 })
	must(t, e.SetPriorityScheduling())
	for i := range 4 {
		must(t, e.Add(Request{ID: uint64(i + 1), PromptTokens: 64, MaxTokens: 50, Priority: 2}))
	}
	first := e.Step().Scheduled
	if !slices.Equal(first, []uint64{1, 2}) {
		t.Fatalf("first step scheduled %v, want [1 2]", first)
	}
	must(t, e.Add(Request{ID: 9, PromptTokens: 64, MaxTokens: 4, Priority: 0}))
	if got := scheduledOrder(t, e); !slices.Equal(got, []uint64{9, 3, 4}) {
		t.Errorf("then scheduled %v, want [9 3 4]: the urgent arrival first of the queue", got)
	}
	if e.Stats().Preemptions != 0 {
		t.Errorf("%d preemptions with room for all", e.Stats().Preemptions)
	}
}

// When the KV cache runs short, priority scheduling evicts the least urgent running
// sequence (the latest of those), where first come first served evicts the newest.
func TestPriorityPreemptsTheLeastUrgent(t *testing.T) {
	for _, prio := range []bool{false, true} {
		e := newEngine(t, func(p *Profile) { p.KVTokens = 1024; p.MaxBatch = 4 })
		if prio {
			must(t, e.SetPriorityScheduling())
		}
		// The old one is batch work; the two newer are interactive: all three fit at first
		// and outgrow the cache as they decode.
		must(t, e.Add(Request{ID: 1, PromptTokens: 200, MaxTokens: 300, Priority: 2}))
		if got := e.Step().Scheduled; !slices.Equal(got, []uint64{1}) {
			t.Fatalf("first step scheduled %v, want [1]", got)
		}
		must(t, e.Add(Request{ID: 2, PromptTokens: 200, MaxTokens: 300, Priority: 0}))
		must(t, e.Add(Request{ID: 3, PromptTokens: 200, MaxTokens: 300, Priority: 0}))
		done := finishTimes(t, e)
		if len(done) != 3 {
			t.Fatalf("priority %v: %d of 3 finished", prio, len(done))
		}
		if e.Stats().Preemptions == 0 {
			t.Fatalf("priority %v: no preemption though 3×500 tokens exceed 1,024", prio)
		}
		last := slices.MaxFunc([]uint64{1, 2, 3}, func(a, b uint64) int { return int(done[a] - done[b]) })
		want := uint64(3) // first come first served: the newest is evicted, finishes last
		if prio {
			want = 1 // the batch request, though it arrived first
		}
		if last != want {
			t.Errorf("priority %v: request %d finished last (%v), want %d", prio, last, done, want)
		}
	}
}

// Random priorities and sizes under a tight cache: every token of every request once.
func TestPriorityRandomLoadEmitsEveryTokenOnce(t *testing.T) {
	e := newEngine(t, func(p *Profile) { p.KVTokens = 4096; p.MaxBatch = 16 })
	must(t, e.SetPriorityScheduling())
	rng := rand.New(rand.NewPCG(7, 7))
	want, next := map[uint64]int{}, map[uint64]int{}
	finished := 0
	step := func() {
		for _, em := range e.Step().Emits {
			if em.Index != next[em.ID] {
				t.Fatalf("request %d: token %d emitted, want %d", em.ID, em.Index, next[em.ID])
			}
			next[em.ID]++
			if em.Done {
				finished++
			}
		}
	}
	for i := range 200 {
		r := Request{ID: uint64(i), PromptTokens: 1 + rng.IntN(1500), MaxTokens: 1 + rng.IntN(400), Priority: rng.IntN(3)}
		must(t, e.Add(r))
		want[r.ID] = r.MaxTokens
		if i%10 == 9 {
			step()
		}
	}
	for steps := 0; !e.Idle(); steps++ {
		if steps > 1_000_000 {
			t.Fatal("engine did not finish")
		}
		step()
	}
	if finished != len(want) {
		t.Fatalf("%d of %d finished", finished, len(want))
	}
	for id, n := range want {
		if next[id] != n {
			t.Errorf("request %d: %d tokens, want %d", id, next[id], n)
		}
	}
	if e.Stats().Preemptions == 0 {
		t.Error("no preemption: the cache was not tight")
	}
	if e.kv.used() != 0 {
		t.Errorf("%d blocks still held", e.kv.used())
	}
}
