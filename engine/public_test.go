package engine

import (
	"encoding/csv"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The GPU model against measurements of real engines it was not fitted on (issue 48): the
// rows of public/serving_7b.csv whose GPU, model, shape and load are all stated and that
// the engine simulator can replay. Each is replayed on the modelled profile of its GPU and
// model, with the source's own settings where it states them (max_num_seqs), and the
// model's figure divided by the published one. Where the published engine is not vLLM, or
// its absolute speed is not the question, a GPU's figure is compared as a ratio to another
// GPU's in the same source and shape (the TensorRT-LLM tables).

// pubRow is one published figure.
type pubRow struct {
	source, gpu, model, engine, precision, metric, notes string
	in, out, conc                                        int
	value                                                float64
}

func loadPublic(t *testing.T) []pubRow {
	t.Helper()
	f, err := os.Open("public/serving_7b.csv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	atoi := func(s string) int {
		n, _ := strconv.Atoi(strings.Fields(s + " 0")[0])
		return n
	}
	var out []pubRow
	for _, r := range recs[1:] {
		v, err := strconv.ParseFloat(r[col["value"]], 64)
		if err != nil {
			t.Fatalf("public/serving_7b.csv: value %q: %v", r[col["value"]], err)
		}
		out = append(out, pubRow{source: r[col["source_id"]], gpu: r[col["gpu"]], model: r[col["model"]], engine: r[col["engine"]],
			precision: r[col["precision"]], metric: r[col["metric"]], notes: r[col["notes"]],
			in: atoi(r[col["input_tokens"]]), out: atoi(r[col["output_tokens"]]), conc: atoi(r[col["concurrency_or_batch"]]), value: v})
	}
	return out
}

// closedLoop replays c clients that each send a request of in:out tokens as soon as their
// last one is answered, until n are done, and returns the median time per output token
// (ms) and the output tokens per second of the answers after the first c (warm-up). With
// samePrompt every request sends one prompt, which vLLM's prefix cache then holds once.
func closedLoop(t *testing.T, p Profile, in, out, c, n int, samePrompt bool) (tpotMs, outPerS float64) {
	t.Helper()
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	var hashes []uint64
	if samePrompt {
		for i := range in / p.BlockSize {
			hashes = append(hashes, uint64(i+1))
		}
	}
	next := 0
	add := func() {
		if err := e.Add(Request{ID: uint64(next), PromptTokens: in, MaxTokens: out, BlockHashes: hashes}); err != nil {
			t.Fatal(err)
		}
		next++
	}
	for range c {
		add()
	}
	first := map[uint64]float64{}
	var tpots []float64
	now, done, tokens, from := 0.0, 0, 0, -1.0
	for done < n {
		st := e.Step()
		now += float64(st.Duration) / float64(time.Millisecond)
		for _, em := range st.Emits {
			if em.Index == 0 {
				first[em.ID] = now
			}
			if done >= c && from >= 0 {
				tokens++
			}
			if !em.Done {
				continue
			}
			done++
			if done == c {
				from = now
			}
			if done > c {
				tpots = append(tpots, (now-first[em.ID])/float64(out-1))
			}
			if next < n+c {
				add()
			}
		}
	}
	slices.Sort(tpots)
	return tpots[len(tpots)/2], float64(tokens) / ((now - from) / 1000)
}

// offline runs n requests of in:out tokens all present at once (an offline benchmark, a
// client at an infinite rate) and returns the output tokens per second.
func offline(t *testing.T, p Profile, in, out, n int) float64 {
	t.Helper()
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := e.Add(Request{ID: uint64(i), PromptTokens: in, MaxTokens: out}); err != nil {
			t.Fatal(err)
		}
	}
	now := 0.0
	for !e.Idle() {
		now += float64(e.Step().Duration) / float64(time.Millisecond)
	}
	return float64(n*out) / (now / 1000)
}

// pubCheck is one comparison: the model's figure over the published one.
type pubCheck struct {
	gpu, what string
	ratio     float64
}

// publicChecks replays every usable published row on the model.
func publicChecks(t *testing.T) []pubCheck {
	t.Helper()
	rows := loadPublic(t)
	profile := func(gpu, model string, maxSeqs int) Profile { return publicProfile(t, gpu, model, maxSeqs, 0) }
	var out []pubCheck
	// vLLM 0.8.5 serving Qwen2.5-7B-Instruct in FP16 with --max-num-seqs 64 on an L4 and an
	// A100 80GB (INFBENCH): closed loops of 1 to 64 clients, ~200:128 ("short") and
	// ~1,800:512 ("long") tokens. The TPOT is a decode step's time with the prefills that
	// join it. Its long prompts repeat (a median TTFT of 76 ms for 1,800 tokens on an L4 is
	// a prefix-cache hit; the p95, 423 ms, the first, computed): replayed as one prompt, held
	// once. The TTFTs are left out.
	shape := map[string][2]int{"short": {200, 128}, "long": {1800, 512}}
	for _, r := range rows {
		if r.source != "INFBENCH" || r.engine != "vLLM" {
			continue
		}
		regime := "short"
		if strings.Contains(r.notes, "regime=long") {
			regime = "long"
		}
		sh := shape[regime]
		gpu := map[string]string{"L4": "l4", "A100 80GB": "a100-80gb"}[r.gpu]
		if gpu == "" {
			continue
		}
		switch r.metric {
		case "tpot_p50":
			tpot, _ := closedLoop(t, profile(gpu, "qwen2.5-7b", 64), sh[0], sh[1], r.conc, 4*r.conc+8, regime == "long")
			out = append(out, pubCheck{gpu, fmt.Sprintf("INFBENCH vLLM %s ×%d TPOT", regime, r.conc), tpot / (r.value * 1000)})
		case "output_tok_per_s":
			_, tps := closedLoop(t, profile(gpu, "qwen2.5-7b", 64), sh[0], sh[1], r.conc, 4*r.conc+8, regime == "long")
			out = append(out, pubCheck{gpu, fmt.Sprintf("INFBENCH vLLM %s ×%d output tok/s", regime, r.conc), tps / r.value})
		}
	}
	// TGI 1.0.3 serving Llama-2-7B (fp16) on one A10G (HF_TGI_SM): 1 to 20 clients, 50 new
	// tokens each; the prompt length is not stated, taken as short (64 tokens, a few % of
	// the latency either way).
	for _, r := range rows {
		if r.source == "HF_TGI_SM" && r.metric == "latency_ms_per_token_p50" {
			p := profile("a10g", "llama-2-7b", 0)
			e2e := closedLoopLatency(t, p, 64, r.out, r.conc, 4*r.conc+8)
			out = append(out, pubCheck{"a10g", fmt.Sprintf("TGI ×%d latency per token", r.conc), e2e / float64(r.out) / r.value})
		}
	}
	// TensorRT-LLM 0.14.0's offline throughput of Llama 3.1 8B and Mistral 7B in FP16
	// (TRTLLM_V014): the A100-SXM4-80GB's over the H100's, per shape. Its in-flight batcher
	// is not held to vLLM's smaller defaults on the A100 (256 sequences, 2,048 tokens a
	// step): both cards replay with the H100's (1,024 and 8,192).
	//
	// In FP8 (weights and KV cache), the same for the L40S and the H200 against the H100 in
	// FP8: the model's FP8 checkpoint of each.
	byKey := map[string]float64{}
	for _, r := range rows {
		if r.source == "TRTLLM_V014" {
			byKey[r.precision+"|"+r.gpu+"|"+r.model+"|"+strconv.Itoa(r.in)+"|"+strconv.Itoa(r.out)] = r.value
		}
	}
	for _, set := range []struct{ precision, label, gpu, suffix string }{
		{"FP16", "A100-SXM4-80GB", "a100-80gb", ""}, {"FP16", "A100-PCIE-80GB", "a100-80gb-pcie", ""},
		{"FP8", "L40S", "l40s", fp8Suffix}, {"FP8", "H200 141GB HBM3", "h200", fp8Suffix},
	} {
		for _, model := range []struct{ label, name string }{{"LLaMA v3.1 8B", "llama-3.1-8b"}, {"Mistral 7B", "mistral-7b"}} {
			for _, sh := range [][2]int{{128, 128}, {128, 2048}, {128, 4096}, {500, 2000}, {1000, 1000}, {2048, 128}, {2048, 2048}, {5000, 500}} {
				k := "|" + model.label + "|" + strconv.Itoa(sh[0]) + "|" + strconv.Itoa(sh[1])
				g, h := byKey[set.precision+"|"+set.label+k], byKey[set.precision+"|H100 80GB HBM3"+k]
				if g == 0 || h == 0 {
					continue
				}
				n := max(64, min(1024, 400_000/(sh[0]+sh[1])))
				mg := offline(t, publicProfile(t, set.gpu, model.name+set.suffix, 1024, 8192), sh[0], sh[1], n)
				mh := offline(t, publicProfile(t, "h100", model.name+set.suffix, 1024, 8192), sh[0], sh[1], n)
				out = append(out, pubCheck{set.gpu, fmt.Sprintf("TRT-LLM %s %s %d:%d %s/H100", set.precision, model.name, sh[0], sh[1], set.gpu), (mg / mh) / (g / h)})
			}
		}
	}
	return out
}

// publicProfile is the modelled profile of model on gpu, with the published engine's
// max_num_seqs and per-step token budget where given (0: vLLM's defaults, as generated).
func publicProfile(t *testing.T, gpu, model string, maxSeqs, maxTokens int) Profile {
	t.Helper()
	name, err := ProfileOn(gpu, model)
	if err != nil {
		t.Fatal(err)
	}
	p, err := LoadProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	q := *p
	if maxSeqs > 0 {
		q.MaxBatch = maxSeqs
	}
	if maxTokens > 0 {
		q.MaxBatchedTokens = maxTokens
	}
	return q
}

// closedLoopLatency is closedLoop's median end-to-end latency of a request (ms).
func closedLoopLatency(t *testing.T, p Profile, in, out, c, n int) float64 {
	t.Helper()
	tpot, _ := closedLoop(t, p, in, out, c, n, false)
	// A request's latency is its first token's wait plus out-1 TPOTs; with these short
	// prompts the first token is a fraction of a step.
	return tpot * float64(out)
}

// The model's error against the public measurements, per GPU type, printed and held where
// it stands (2026-11-29: L4 median 4 %, worst 14 %; A100-80GB 11 %, 19 %; H200 4 %, 11 %).
// Reported only: the A10G's rows are TGI 1.0.3's of 2023, a batcher far from vLLM's; the
// L40S is modelled 19–78 % faster against the H100 than TensorRT-LLM's FP8 engines run
// (median 45 %), and the A100 80GB PCIe 5–32 % (median 23 %): the open gaps, both
// power-limited cards (350 W, 300 W) the data sheets' peak rates overstate. Issue 48's goal is a median within 20 % and every row within
// 35 % on five GPU types, held out of the fit.
func TestModelAgainstPublicMeasurements(t *testing.T) {
	if testing.Short() {
		t.Skip("replays some dozens of closed loops")
	}
	checks := publicChecks(t)
	byGPU := map[string][]float64{}
	for _, c := range checks {
		t.Logf("%-10s %-48s model ÷ published %.2f", c.gpu, c.what, c.ratio)
		byGPU[c.gpu] = append(byGPU[c.gpu], c.ratio)
	}
	bound := map[string][2]float64{"l4": {0.10, 0.20}, "a100-80gb": {0.15, 0.25}, "h200": {0.10, 0.15}}
	for _, gpu := range slices.Sorted(maps.Keys(byGPU)) {
		errs := make([]float64, 0, len(byGPU[gpu]))
		for _, r := range byGPU[gpu] {
			errs = append(errs, math.Abs(r-1))
		}
		slices.Sort(errs)
		med, worst := errs[len(errs)/2], errs[len(errs)-1]
		t.Logf("%s: %d rows, median error %.0f %%, worst %.0f %%", gpu, len(errs), 100*med, 100*worst)
		if b, ok := bound[gpu]; ok && (med > b[0] || worst > b[1]) {
			t.Errorf("%s: median error %.0f %%, worst %.0f %%; held at %.0f %% and %.0f %%", gpu, 100*med, 100*worst, 100*b[0], 100*b[1])
		}
	}
	if len(checks) < 30 {
		t.Errorf("%d comparisons: the public rows were not all read", len(checks))
	}
}
