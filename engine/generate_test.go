package engine

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"
)

// The shapes give the parameter counts the model cards state, and for the two measured
// shapes the weights and KV bytes per token measure.py recorded.
func TestModelShapesMatchPublishedAndMeasured(t *testing.T) {
	for _, m := range models {
		if got := m.Params() / 1e9; math.Abs(got-m.PublishedParams)/m.PublishedParams > 0.01 {
			t.Errorf("%s: %.3fB parameters from the shape, the card says %.2fB", m.Name, got, m.PublishedParams)
		}
	}
	data, err := measured.ReadFile("profiles/h100-80gb-hbm3.csv")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"llama-3.2-1b", "llama-3.1-8b"} {
		rows, err := parseMeasurements(bytes.NewReader(data), name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := LookupModel(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.WeightBytes() / (1 << 30); math.Abs(got-rows[0].weightGiB) > 0.01 {
			t.Errorf("%s: %.3f GiB of weights from the shape, measured %.3f", name, got, rows[0].weightGiB)
		}
		if m.KVBytesPerToken() != rows[0].kvBytesPerToken {
			t.Errorf("%s: %d KV bytes per token from the shape, measured %d", name, m.KVBytesPerToken(), rows[0].kvBytesPerToken)
		}
	}
	for _, id := range []string{"meta-llama/Llama-3.1-8B-Instruct", "LLAMA-3.1-8B", "meta-llama/Llama-2-7b-chat-hf"} {
		if _, err := LookupModel(id); err != nil {
			t.Error(err)
		}
	}
	if _, err := LookupModel("gpt-5"); err == nil || !strings.Contains(err.Error(), "llama-3.1-8b") {
		t.Errorf("unknown model: %v", err)
	}
}

// TestLeaveOneOutWithinFifteenPercent calibrates on one measured card and predicts every
// row of the other, both ways: the bound bench/docs/gpu-model.md states (achieved: 13.7 % from the
// H100 to the H200, 14.6 % back).
func TestLeaveOneOutWithinFifteenPercent(t *testing.T) {
	for _, pair := range [][2]string{{"h100", "h200"}, {"h200", "h100"}} {
		rows, err := LeaveOneOut(pair[0], pair[1])
		if err != nil {
			t.Fatal(err)
		}
		phases := map[string]int{}
		errs := map[string][]float64{}
		for _, r := range rows {
			phases[r.Phase]++
			errs[r.Model+" "+r.Phase] = append(errs[r.Model+" "+r.Phase], math.Abs(r.Err()))
			if math.Abs(r.Err()) > 0.15 {
				t.Errorf("calibrated on %s: %s %s %s batch %d, %d tokens after %d cached: model %.2f ms, measured %.2f ms (%+.1f%%)",
					pair[0], r.GPU, r.Model, r.Phase, r.Batch, r.Tokens, r.Cached, r.ModelMs, r.MeasuredMs, 100*r.Err())
			}
		}
		keys := make([]string, 0, len(errs))
		for k := range errs {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			e := errs[k]
			slices.Sort(e)
			t.Logf("| %s → %s | %s | %d | %.1f %% | %.1f %% |", pair[0], pair[1], k, len(e), 100*e[len(e)/2], 100*e[len(e)-1])
		}
		if phases["prefill"] == 0 || phases["prefill_after"] == 0 || phases["decode"] == 0 || len(rows) < 80 {
			t.Errorf("%s→%s: rows %v, want every phase of both shapes", pair[0], pair[1], phases)
		}
	}
}

// A public measurement of a card never measured here: Llama-3.1-8B-Instruct (bf16) on one
// A100 40GB under vLLM 0.23.0 decodes at about 75 tokens/s at concurrency 1 with 1,024-token
// prompts and 128-token answers (J. Musgrave, "vLLM throughput-latency sweep on NVIDIA
// A100", https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on): 13.3 ms a token.
// The model, calibrated on eager PyTorch kernels (an upper bound on vLLM's), gives 15.3 ms
// (+15 %) at the sweep's mean context of 1,088 tokens.
func TestA100DecodeAgainstPublishedVLLM(t *testing.T) {
	p, err := LoadProfile("a100-llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	const published = 1000.0 / 75
	if got := p.DecodeMs(1, 1024+64); math.Abs(got-published)/published > 0.16 {
		t.Errorf("a100 8b decode at batch 1: model %.2f ms, published %.2f ms", got, published)
	}
}

func TestGeneratedProfiles(t *testing.T) {
	for _, tc := range []struct {
		name         string
		tp, maxBatch int
		minKV, maxKV int
		maxModelLen  int
		gpu          string
	}{
		// 0.9 × 23.8 GiB − 15.0 GiB of weights − vLLM's 1.3 GiB reserve at 256 sequences,
		// at 128 KiB a token.
		{"l4-llama-3.1-8b", 1, 256, 38_000, 45_000, 41_776, "l4"},
		{"a100-80gb-llama-2-7b", 1, 256, 100_000, 120_000, 4096, "a100-80gb"},
		{"h100-llama-2-7b", 1, 1024, 100_000, 120_000, 4096, "h100"},
		{"h100x8-llama-3.1-70b", 8, 1024, 1_000_000, 1_500_000, 131072, "8 × h100"},
		{"L40S-qwen2.5-7b", 1, 256, 400_000, 560_000, 32768, "l40s"},
	} {
		p := mustProfile(t, tc.name)
		if !p.Modelled || !strings.Contains(p.Source, "generated (modelled") || p.ModelError <= 0 || p.ModelError > 0.15 {
			t.Errorf("%s: modelled %v, model error %.3f, source %q", tc.name, p.Modelled, p.ModelError, p.Source)
		}
		if p.TensorParallel != tc.tp || p.MaxBatch != tc.maxBatch || p.KVTokens < tc.minKV || p.KVTokens > tc.maxKV || p.MaxModelLen != tc.maxModelLen || p.GPU != tc.gpu {
			t.Errorf("%s: tp %d, max_num_seqs %d, kv %d, max_model_len %d, gpu %q; want %d, %d, %d..%d, %d, %q",
				tc.name, p.TensorParallel, p.MaxBatch, p.KVTokens, p.MaxModelLen, p.GPU, tc.tp, tc.maxBatch, tc.minKV, tc.maxKV, tc.maxModelLen, tc.gpu)
		}
		if _, err := New(p); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	// A slower card is slower: the 8B decodes a token on an L4 (300 GB/s) several times
	// slower than on an H100 (3.35 TB/s), and prefills slower too.
	l4, h100 := mustProfile(t, "l4-llama-3.1-8b"), mustProfile(t, "h100-llama-3.1-8b")
	if l4.DecodeMs(1, 1000) < 4*h100.DecodeMs(1, 1000) || l4.PrefillMs(2048, 0) < 2*h100.PrefillMs(2048, 0) {
		t.Errorf("l4 decode %.1f ms, prefill %.1f ms; h100 %.1f, %.1f", l4.DecodeMs(1, 1000), l4.PrefillMs(2048, 0), h100.DecodeMs(1, 1000), h100.PrefillMs(2048, 0))
	}
	// Measured pairs stay measured.
	if h100.Modelled || !strings.HasPrefix(h100.Source, "fitted to shared/data/gpu_profiles/") {
		t.Errorf("h100-llama-3.1-8b: modelled %v, source %q", h100.Modelled, h100.Source)
	}
	for name, want := range map[string]string{
		"t4-llama-3.1-70b":    "does not fit 8 × t4",
		"l4x1-llama-3.1-70b":  "does not fit 1 × l4",
		"h100x3-llama-3.1-8b": "must divide the 32 attention heads",
		"mi300-llama-3.1-8b":  `unknown GPU "mi300"`,
		"l4-gpt-5":            "want GPU-MODEL",
	} {
		if _, err := LoadProfile(name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one saying %q", name, err, want)
		}
	}
	if err := CheckProfileName("/tmp/p.json"); err == nil {
		t.Error("a .json profile passed the router check")
	}
}

func TestProfileOnTakesTheModelAndSwapsTheGPU(t *testing.T) {
	for _, c := range []struct{ acc, model, want string }{
		{"L4", "h100-llama-3.1-8b", "l4-llama-3.1-8b"},
		{"A100-80GB", "meta-llama/Llama-3.1-8B-Instruct", "a100-80gb-llama-3.1-8b"},
		{"h100", "h100x4-llama-3.1-70b", "h100-llama-3.1-70b"},
		{"H100", "qwen2.5-7b", "h100-qwen2.5-7b"},
	} {
		got, err := ProfileOn(c.acc, c.model)
		if err != nil || got != c.want {
			t.Errorf("ProfileOn(%q, %q) = %q, %v; want %q", c.acc, c.model, got, err, c.want)
		}
	}
	for _, c := range [][2]string{{"TPU-v5", "llama-3.1-8b"}, {"L4", "gpt-oss"}} {
		if got, err := ProfileOn(c[0], c[1]); err == nil {
			t.Errorf("ProfileOn(%q, %q) = %q, want an error", c[0], c[1], got)
		}
	}
}

// An FP8 checkpoint (the suffix -fp8): the decoder layers' weights and the KV cache at one
// byte, the embedding and LM head at two; on a card with FP8 tensor cores its matrix
// multiplies run at that rate, on an A100 at the 16-bit rate with half the weight bytes.
func TestFP8Checkpoint(t *testing.T) {
	bf, err := LookupModel("llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	f8, err := LookupModel("Llama-3.1-8B-FP8")
	if err != nil {
		t.Fatal(err)
	}
	if !f8.FP8 || f8.Name != "llama-3.1-8b-fp8" || bf.FP8 {
		t.Fatalf("lookup: %q fp8=%v, %q fp8=%v", f8.Name, f8.FP8, bf.Name, bf.FP8)
	}
	if r := f8.WeightBytes() / bf.WeightBytes(); r < 0.53 || r > 0.60 {
		t.Errorf("FP8 weights %.2f of bf16's: want the layers halved and the 1.05 B embedding and head parameters kept at 2 bytes (≈ 0.57)", r)
	}
	if 2*f8.KVBytesPerToken() != bf.KVBytesPerToken() {
		t.Errorf("FP8 KV %d bytes a token, bf16 %d: want half", f8.KVBytesPerToken(), bf.KVBytesPerToken())
	}
	for _, bad := range []string{"llama-3.1-8b-fp8-fp8", "gpt-5-fp8"} {
		if _, err := LookupModel(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	load := func(name string) *Profile {
		t.Helper()
		p, err := LoadProfile(name)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, gpu := range []string{"l40s", "h100", "a100-80gb"} {
		b, f := load(gpu+"-llama-3.1-8b"), load(gpu+"-llama-3.1-8b-fp8")
		if f.Model != "llama-3.1-8b-fp8" || f.KVTokens < 19*b.KVTokens/10 {
			t.Errorf("%s: FP8 profile %q holds %d KV tokens, bf16 %d: want about twice (half the bytes a token, less memory for weights)", gpu, f.Model, f.KVTokens, b.KVTokens)
		}
		if f.DecodeBaseMs >= 0.75*b.DecodeBaseMs {
			t.Errorf("%s: a decode step's weight read %.2f ms in FP8, %.2f in bf16: want it near halved", gpu, f.DecodeBaseMs, b.DecodeBaseMs)
		}
		faster := f.PrefillPastKneeMs < 0.7*b.PrefillPastKneeMs
		if hasFP8 := gpu != "a100-80gb"; faster != hasFP8 {
			t.Errorf("%s: prefill matmuls %.4g ms a token in FP8, %.4g in bf16: FP8 tensor cores %v", gpu, f.PrefillPastKneeMs, b.PrefillPastKneeMs, hasFP8)
		}
	}
}

// vLLM's KV reserve against its own logged start-ups (engine/public/vllm_memory.md §1e, and
// vLLM PR #10511's example): fitted on one row (Llama-3.1-8B-Instruct on an H100), the
// activation peaks of the others within 10 %, each at the max_num_seqs its vLLM used
// (1,024 on an H100 since the larger defaults; 256 before them).
func TestVLLMReserveAgainstLoggedStartups(t *testing.T) {
	qwen3_32b := ModelShape{Name: "qwen3-32b", Vocab: 151936}     // Qwen/Qwen3-32B config.json vocab_size
	gptOSS120b := ModelShape{Name: "gpt-oss-120b", Vocab: 201088} // openai/gpt-oss-120b config.json vocab_size
	llama3, _ := LookupModel("llama-3.1-8b")                      // Llama 3 and 3.1 share the 128,256 vocabulary
	llama70fp8, _ := LookupModel("llama-3.1-70b-fp8")             // Llama-3.3-70B's shape is 3.1-70B's
	for _, tc := range []struct {
		what            string
		m               ModelShape
		seqs, tp        int
		activation, non float64 // GiB, as logged
	}{
		{"Llama-3.1-8B-Instruct, H100, TP 1 (the fit)", llama3, 1024, 1, 4.76, 0.13},
		{"Qwen3-32B, H100, TP 1", qwen3_32b, 1024, 1, 5.64, 0.14},
		{"gpt-oss-120b, H100, TP 1", gptOSS120b, 1024, 1, 7.38, 0.13},
		{"Llama-3.3-70B-Instruct-FP8-dynamic, H100, TP 2", llama70fp8, 1024, 2, 4.84, 0.55},
		{"Meta-Llama-3-8B, vLLM PR #10511 (256 sequences)", llama3, 256, 1, 1.26, 0},
	} {
		got := vllmReserveGiB(tc.m, tc.seqs, tc.tp)
		want := tc.activation + tc.non
		if tc.non == 0 {
			got -= vllmReserveGiB(ModelShape{}, 0, tc.tp) // the activation peak alone
		}
		if math.Abs(got-want)/want > 0.10 {
			t.Errorf("%s: reserve %.2f GiB, logged %.2f", tc.what, got, want)
		}
	}
}
