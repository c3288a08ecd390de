package engine

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func mustProfile(t *testing.T, name string) Profile {
	t.Helper()
	p, err := LoadProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	return *p
}

func TestBuiltinProfilesFitTheMeasurements(t *testing.T) {
	for _, name := range ProfileNames() {
		p := mustProfile(t, name)
		if p.MaxFitError > 0.10 {
			t.Errorf("%s: max fit error %.3f, want <= 0.10", name, p.MaxFitError)
		}
		if p.KVTokens < 100_000 {
			t.Errorf("%s: kv tokens %d, implausibly small", name, p.KVTokens)
		}
	}
	// Spot checks against shared/data/gpu_profiles/README.md headline numbers (median ms).
	h100 := mustProfile(t, "h100-llama-3.1-8b")
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"prefill 2048", h100.PrefillMs(2048, 0), 66.8},
		{"prefill 512 after 8192 cached", h100.PrefillMs(512, 8192), 30.1},
		{"decode b1 ctx2048", h100.DecodeMs(1, 2048), 9.05},
		{"decode b64 ctx2048", h100.DecodeMs(64, 64*2048), 17.3},
	} {
		if math.Abs(c.got-c.want)/c.want > 0.2 {
			t.Errorf("h100 8b %s: model %.1f ms, measured %.1f ms", c.name, c.got, c.want)
		}
	}
	// KV capacity per the README: roughly 440k tokens for the 8B shape on an H100.
	if h100.KVTokens < 380_000 || h100.KVTokens > 500_000 {
		t.Errorf("h100 8b kv tokens %d, want about 440k", h100.KVTokens)
	}
	if _, err := LoadProfile("a100-llama"); err == nil {
		t.Error("unknown profile loaded")
	}
}

// drive runs the engine to idle in virtual time and returns each request's TTFT and finish.
func drive(t *testing.T, e *Engine) (ttft, done map[uint64]time.Duration) {
	t.Helper()
	ttft, done = map[uint64]time.Duration{}, map[uint64]time.Duration{}
	next := map[uint64]int{}
	runToEnd(t, e, func(now time.Duration, em Emit) {
		if em.Index != next[em.ID] {
			t.Fatalf("request %d: token %d emitted, want %d", em.ID, em.Index, next[em.ID])
		}
		next[em.ID]++
		if em.Index == 0 {
			ttft[em.ID] = now
		}
		if em.Done {
			done[em.ID] = now
		}
	})
	return ttft, done
}

// runToEnd steps e until it is idle, handing each token to emit with the time it came.
func runToEnd(t *testing.T, e *Engine, emit func(now time.Duration, em Emit)) {
	t.Helper()
	var now time.Duration
	for steps := 0; !e.Idle(); steps++ {
		if steps > 1_000_000 {
			t.Fatal("engine did not finish")
		}
		st := e.Step()
		now += st.Duration
		for _, em := range st.Emits {
			emit(now, em)
		}
	}
}

func newEngine(t *testing.T, mod func(*Profile)) *Engine {
	t.Helper()
	p := mustProfile(t, "h100-llama-3.1-8b")
	if mod != nil {
		mod(&p)
	}
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestTTFTGrowsWithUncachedTokensAndPrefixHitsCutIt(t *testing.T) {
	e := newEngine(t, nil)
	hashes := make([]uint64, 4096/16)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	must(t, e.Add(Request{ID: 1, PromptTokens: 256, MaxTokens: 1}))
	t1, _ := drive(t, e)
	must(t, e.Add(Request{ID: 2, PromptTokens: 4096, MaxTokens: 1, BlockHashes: hashes}))
	t2, _ := drive(t, e)
	// Same prompt again: all but the last block comes from the prefix cache (vLLM computes
	// the last token of a fully cached prompt, so the last whole block is recomputed).
	must(t, e.Add(Request{ID: 3, PromptTokens: 4096, MaxTokens: 1, BlockHashes: hashes}))
	t3, _ := drive(t, e)
	if !(t2[2] > 4*t1[1]) {
		t.Errorf("4096-token TTFT %v not well above 256-token TTFT %v", t2[2], t1[1])
	}
	if !(t3[3]*5 < t2[2]) {
		t.Errorf("prefix-hit TTFT %v not well below cold TTFT %v", t3[3], t2[2])
	}
	st := e.Stats()
	if st.PrefixHits != 4080 || st.PrefixQueries != 256+4096+4096 {
		t.Errorf("prefix stats hits=%d queries=%d", st.PrefixHits, st.PrefixQueries)
	}
}

func TestDecodeStepGrowsWithBatch(t *testing.T) {
	itl := func(batch int) time.Duration {
		e := newEngine(t, nil)
		for i := range batch {
			must(t, e.Add(Request{ID: uint64(i), PromptTokens: 512, MaxTokens: 64}))
		}
		ttft, done := drive(t, e)
		return (done[0] - ttft[0]) / 63
	}
	i1, i64 := itl(1), itl(64)
	if !(i64 > i1+time.Millisecond) {
		t.Errorf("ITL batch 64 = %v, batch 1 = %v: want larger at larger batch", i64, i1)
	}
}

func TestQueueFormsWhenBatchIsFull(t *testing.T) {
	fill := func() *Engine {
		e := newEngine(t, func(p *Profile) { p.MaxBatch = 4 })
		for i := range 10 {
			must(t, e.Add(Request{ID: uint64(i), PromptTokens: 100, MaxTokens: 20}))
		}
		return e
	}
	e := fill()
	e.Step()
	if st := e.Stats(); st.Running != 4 || st.Waiting != 6 {
		t.Fatalf("running=%d waiting=%d, want 4 and 6", st.Running, st.Waiting)
	}
	ttft, _ := drive(t, fill())
	if !(ttft[9] > ttft[0]) {
		t.Errorf("queued request TTFT %v not above first %v", ttft[9], ttft[0])
	}
}

func TestKVExhaustionPreemptsAndStillFinishesEverything(t *testing.T) {
	e := newEngine(t, func(p *Profile) { p.KVTokens = 4096 })
	for i := range 8 {
		must(t, e.Add(Request{ID: uint64(i), PromptTokens: 400, MaxTokens: 300}))
	}
	_, done := drive(t, e)
	if len(done) != 8 {
		t.Fatalf("%d of 8 finished", len(done))
	}
	if e.Stats().Preemptions == 0 {
		t.Error("no preemption although 8×700 tokens exceed a 4096-token cache")
	}
	if e.kv.used() != 0 {
		t.Errorf("%d blocks still held after all finished", e.kv.used())
	}
	if err := e.Add(Request{ID: 99, PromptTokens: 4000, MaxTokens: 200}); err == nil {
		t.Error("request larger than the cache accepted")
	}
}

// A step that preempts admits nothing, as vLLM's scheduler (it schedules waiting requests
// only "if not preempted_reqs"): the victim taken back at once would recompute its prompt
// only to be preempted again. Here (400-token prompts, 256-token steps) it was: 28 of 32
// preemptions took the victim back in the same step; 25 preemptions, none, after.
func TestAStepThatPreemptsAdmitsNothing(t *testing.T) {
	e := newEngine(t, func(p *Profile) { p.KVTokens = 4096; p.MaxBatchedTokens = 256 })
	for i := range 8 {
		must(t, e.Add(Request{ID: uint64(i), PromptTokens: 400, MaxTokens: 300}))
	}
	for !e.Idle() {
		waiting := len(e.waiting)
		res := e.Step()
		if res.Preempted > 0 && len(e.waiting) < waiting+res.Preempted {
			t.Fatalf("a step preempted %d with %d waiting and left %d waiting: it admitted", res.Preempted, waiting, len(e.waiting))
		}
	}
}

func TestLongPromptsTakeBlocksChunkByChunkAndNeverDeadlock(t *testing.T) {
	// 4,096 tokens of cache, 512-token chunks: three 2,000-token prompts are admitted on
	// their first chunk's blocks and run out of memory mid-prompt together.
	e := newEngine(t, func(p *Profile) { p.KVTokens = 4096; p.MaxBatchedTokens = 512 })
	for i := range 3 {
		must(t, e.Add(Request{ID: uint64(i), PromptTokens: 2000, MaxTokens: 50}))
	}
	e.Step()
	if st := e.Stats(); st.Running == 0 || e.kv.used() > e.blocksFor(512)+1 {
		t.Fatalf("first step: %d running holding %d blocks; want the first chunk's blocks only", st.Running, e.kv.used())
	}
	_, done := drive(t, e)
	if len(done) != 3 {
		t.Fatalf("%d of 3 finished", len(done))
	}
	if e.Stats().Preemptions == 0 {
		t.Error("three 2,050-token requests fit a 4,096-token cache without a preemption")
	}
}

func TestCancelFreesKV(t *testing.T) {
	e := newEngine(t, nil)
	must(t, e.Add(Request{ID: 1, PromptTokens: 1000, MaxTokens: 1000}))
	must(t, e.Add(Request{ID: 2, PromptTokens: 1000, MaxTokens: 1000}))
	e.Step()
	if !e.Cancel(1) || !e.Cancel(2) || e.Cancel(3) {
		t.Fatal("cancel results wrong")
	}
	if !e.Idle() || e.kv.used() != 0 {
		t.Errorf("idle=%v used=%d after cancelling everything", e.Idle(), e.kv.used())
	}
}

func TestRandomLoadEmitsEveryTokenOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	e := newEngine(t, func(p *Profile) { p.KVTokens = 8000; p.MaxBatch = 16; p.MaxBatchedTokens = 1024 })
	want := map[uint64]int{}
	for i := range 200 {
		n := 1 + rng.IntN(300)
		prompt := 1 + rng.IntN(2000)
		// Prompts share one of five prefixes, so blocks are shared, evicted and reused.
		hashes := chain(uint64(rng.IntN(5))<<32, prompt/16)
		must(t, e.Add(Request{ID: uint64(i), PromptTokens: prompt, MaxTokens: n, BlockHashes: hashes}))
		want[uint64(i)] = n
	}
	_, done := drive(t, e)
	if len(done) != len(want) {
		t.Fatalf("%d of %d finished", len(done), len(want))
	}
	if e.kv.used() != 0 || e.kv.nfree != e.totalBlock {
		t.Errorf("after all finished: %d blocks used, %d of %d free", e.kv.used(), e.kv.nfree, e.totalBlock)
	}
	ix := &e.kv.cached
	for _, sl := range ix.slots {
		if sl.id < 0 {
			continue
		}
		if b := e.kv.blocks[sl.id]; !b.hashed || b.hash != sl.hash || b.ref != 0 {
			t.Fatalf("cache entry %x -> block %d holding %+v", sl.hash, sl.id, b)
		}
	}
	// Every block that says it answers its hash does.
	for id, b := range e.kv.blocks[:e.totalBlock] {
		if got, ok := ix.get(b.hash); b.hashed && (!ok || got != int32(id)) {
			t.Fatalf("block %d holds hash %x, which finds block %d (%v)", id, b.hash, got, ok)
		}
	}
	if st := e.Stats(); st.PrefixHits == 0 || st.Preemptions == 0 {
		t.Errorf("load did not exercise sharing and preemption: %+v", st)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestEveryMeasuredRowWithinTenPercent checks each built-in profile against every row of the
// GPU measurements it was fitted to (engine/profiles, copied from shared/data/gpu_profiles):
// prefill, prefill after a cached prefix, and decode, as the engine composes a step.
func TestEveryMeasuredRowWithinTenPercent(t *testing.T) {
	for _, name := range ProfileNames() {
		card, model, _ := strings.Cut(name, "-")
		data, err := measured.ReadFile("profiles/" + measuredCards[card] + ".csv")
		if err != nil {
			t.Fatal(err)
		}
		if shared, err := os.ReadFile(filepath.Join("..", "..", "shared", "data", "gpu_profiles", measuredCards[card]+".csv")); err == nil && !bytes.Equal(shared, data) {
			t.Errorf("engine/profiles/%s.csv differs from shared/data/gpu_profiles: copy it again", measuredCards[card])
		}
		rows, err := parseMeasurements(bytes.NewReader(data), model)
		if err != nil {
			t.Fatal(err)
		}
		p := mustProfile(t, name)
		checked := map[string]int{}
		for _, m := range rows {
			var got float64
			if m.phase == "decode" {
				got = p.DecodeMs(m.batch, m.batch*m.tokens)
			} else {
				// One step of m.batch prompts of m.tokens tokens, each after m.cached cached ones.
				B, N, P := float64(m.batch), float64(m.tokens), float64(m.cached)
				seqs := 0
				if m.cached > 0 {
					seqs = m.batch
				}
				got = p.prefillStepMs(B*N, B*N*N, B*N*P, B*P, seqs)
			}
			checked[m.phase]++
			if e := (got - m.ms) / m.ms; math.Abs(e) > 0.10 {
				t.Errorf("%s %s batch %d, %d tokens after %d cached: model %.2f ms, measured %.2f ms (%+.1f%%)",
					name, m.phase, m.batch, m.tokens, m.cached, got, m.ms, 100*e)
			}
		}
		if checked["prefill"] == 0 || checked["prefill_after"] == 0 || checked["decode"] == 0 {
			t.Errorf("%s: rows checked %v, want every phase", name, checked)
		}
	}
}

// Every profiled GPU (an H100 or H200: 70 GiB or more, not an A100) runs with vLLM 0.11's
// defaults for the OpenAI server (vllm/engine/arg_utils.py, EngineArgs._set_default_args:
// max_num_seqs 1024, max_num_batched_tokens 8192; block size 16 on CUDA), and the Llama
// shapes' 131,072-token context; and the engine holds the 1,025th sequence back.
func TestProfilesRunWithVLLMsDefaults(t *testing.T) {
	for _, name := range ProfileNames() {
		p := mustProfile(t, name)
		if p.MaxBatch != 1024 || p.MaxBatchedTokens != 8192 || p.BlockSize != 16 || p.MaxModelLen != 131072 {
			t.Errorf("%s: max_num_seqs %d, max_num_batched_tokens %d, block %d, max_model_len %d; want vLLM 0.11's 1024, 8192, 16, 131072",
				name, p.MaxBatch, p.MaxBatchedTokens, p.BlockSize, p.MaxModelLen)
		}
	}
	e := newEngine(t, nil)
	for i := range 1025 {
		must(t, e.Add(Request{ID: uint64(i), PromptTokens: 4, MaxTokens: 20}))
	}
	e.Step() // 1,025 × 4 prompt tokens fit one step's 8,192
	if st := e.Stats(); st.Running != 1024 || st.Waiting != 1 {
		t.Fatalf("running=%d waiting=%d after one step; want 1024 and 1", st.Running, st.Waiting)
	}
}
