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
	"sync"
	"testing"
	"time"
)

// The GPU model against measurements of real engines (issue 48), each GPU type held out of
// the one parameter they fit (TestModelAgainstPublicMeasurements): the rows of
// public/serving_7b.csv whose GPU, model, shape and load are all stated and that
// the engine simulator can replay. Each is replayed on the modelled profile of its GPU and
// model, with the source's own settings where it states them (max_num_seqs), and the
// model's figure divided by the published one. Where the published engine is not vLLM, or
// its absolute speed is not the question, a GPU's figure is compared as a ratio to another
// GPU's in the same source and shape (the TensorRT-LLM tables).

// pubRow is one published figure.
type pubRow struct {
	source, gpu, model, engine, precision, metric, notes string
	requestRate                                          string
	in, out, conc, tp                                    int
	value                                                float64
}

// loadPublic reads one of engine/public's files (serving_7b.csv, serving_70b.csv).
func loadPublic(t testing.TB, file string) []pubRow {
	t.Helper()
	f, err := os.Open("public/" + file)
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
			t.Fatalf("public/%s: value %q: %v", file, r[col["value"]], err)
		}
		tp := 1
		if i, ok := col["tp"]; ok {
			tp = atoi(r[i])
		}
		out = append(out, pubRow{source: r[col["source_id"]], gpu: r[col["gpu"]], model: r[col["model"]], engine: r[col["engine"]],
			precision: r[col["precision"]], metric: r[col["metric"]], notes: r[col["notes"]], requestRate: r[col["request_rate"]],
			in: atoi(r[col["input_tokens"]]), out: atoi(r[col["output_tokens"]]), conc: atoi(r[col["concurrency_or_batch"]]), tp: tp, value: v})
	}
	return out
}

// closedLoop replays c clients that each send a request of in:out tokens as soon as their
// last one is answered, until n are done, and returns the median time per output token
// (ms) and the output tokens per second of the answers after the first c (warm-up). With
// samePrompt every request sends one prompt, which vLLM's prefix cache then holds once.
func closedLoop(t testing.TB, p Profile, in, out, c, n int, samePrompt bool) (tpotMs, outPerS float64) {
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
func offline(t testing.TB, p Profile, in, out, n int) float64 {
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

// pubTput is one GPU's throughput in a set of GPUs measured alike (one source, engine,
// precision, model, shape and load): the published figure and the model's.
type pubTput struct {
	set, gpu         string
	model, published float64
}

// modelProfile is the profile cal gives model on gpu, with the published engine's
// max_num_seqs and per-step token budget where given (0: vLLM's defaults, as generated):
// a measured profile where cal was fitted on that card's rows, else generated with cal.
func modelProfile(t testing.TB, cal Calibration, gpu, model string, maxSeqs, maxTokens int) Profile {
	t.Helper()
	return shapeProfile(t, cal, gpu, model, nil, maxSeqs, maxTokens)
}

// shapeProfile is modelProfile with the model's shape changed by edit (nil: as named).
func shapeProfile(t testing.TB, cal Calibration, gpu, model string, edit func(*ModelShape), maxSeqs, maxTokens int) Profile {
	t.Helper()
	// gpu may name a tensor-parallel machine (h100x4), as profile names do.
	name := gpu + "-" + model
	g, m, tp, err := parsePair(name)
	if err != nil {
		t.Fatal(err)
	}
	var p *Profile
	if file, ok := measuredCards[g.Name]; ok && edit == nil && slices.Contains(ProfileNames(), name) && strings.Contains(cal.From, file) {
		p, err = LoadProfile(name)
	} else {
		if edit != nil {
			edit(&m)
		}
		p, err = Generate(g, m, tp, cal)
	}
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

// h100Offline memoises the H100's offline throughputs, the reference of every
// TensorRT-LLM ratio: a calibration fitted on the H100's rows gives it the same profile
// whatever else it varies (the score cost's exponent scales from the H100's own rate).
var h100Offline sync.Map

// publicChecks replays on cal's profiles every usable published row of the GPUs in only
// (all where nil).
func publicChecks(t testing.TB, cal Calibration, only map[string]bool) ([]pubCheck, []pubTput) {
	t.Helper()
	rows := loadPublic(t, "serving_7b.csv")
	want := func(gpu string) bool { return only == nil || only[gpu] }
	profile := func(gpu, model string, maxSeqs int) Profile { return modelProfile(t, cal, gpu, model, maxSeqs, 0) }
	var out []pubCheck
	var tputs []pubTput
	// vLLM 0.8.5 serving Qwen2.5-7B-Instruct in FP16 with --max-num-seqs 64 on an L4 and an
	// A100 40GB (INFBENCH; its README says 80 GB, its script asks Modal for an "A100", which
	// Modal gives as 40 GB: engine/public/README.md): closed loops of 1 to 64 clients, ~200:128 ("short") and
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
		gpu := map[string]string{"L4": "l4", "A100 40GB": "a100"}[r.gpu]
		if gpu == "" || !want(gpu) {
			continue
		}
		switch r.metric {
		case "tpot_p50":
			tpot, _ := closedLoop(t, profile(gpu, "qwen2.5-7b", 64), sh[0], sh[1], r.conc, 4*r.conc+8, regime == "long")
			out = append(out, pubCheck{gpu, fmt.Sprintf("INFBENCH vLLM %s ×%d TPOT", regime, r.conc), tpot / (r.value * 1000)})
		case "output_tok_per_s":
			_, tps := closedLoop(t, profile(gpu, "qwen2.5-7b", 64), sh[0], sh[1], r.conc, 4*r.conc+8, regime == "long")
			what := fmt.Sprintf("INFBENCH vLLM %s ×%d output tok/s", regime, r.conc)
			out = append(out, pubCheck{gpu, what, tps / r.value})
			tputs = append(tputs, pubTput{strings.Replace(what, " output tok/s", "", 1), gpu, tps, r.value})
		}
	}
	// vLLM (version not stated; its requirements pin the torch-2.4-era flash-attention of
	// vLLM 0.6) in fp16 on one A100 and one H100 (ARGONNE_LIB): one static batch of 1 to 64
	// requests of L:L tokens, L from 128 to 2,048, all present at once (benchmark_throughput
	// and benchmark_latency as Argonne modified them; ignore_eos); the batch's latency. The
	// A100's memory is not stated: its job scripts run under PBS on ALCF's Grand and Eagle
	// file systems, Polaris's, whose A100s ALCF documents with 40 GB: replayed as the 40 GB
	// A100 (a100), an inference the README states. V0 without chunked prefill, as vLLM 0.6
	// ran these models: a step's token budget is max(max_model_len, 2,048) (SchedulerConfig),
	// so a preempted request recomputes in one chunk. The H100's rows, on the card the
	// calibration measured, enter only the A100-against-H100 sets of the ranking.
	argonne := map[string]struct {
		model  string
		maxLen int
	}{
		"meta-llama/Llama-2-7b-hf":   {"llama-2-7b", 4096},
		"meta-llama/Meta-Llama-3-8B": {"llama-3.1-8b", 8192},
		"mistralai/Mistral-7B-v0.1":  {"mistral-7b", 32768},
	}
	argonneH100 := map[string]float64{}
	for _, r := range rows {
		if r.source == "ARGONNE_LIB" && r.metric == "batch_e2e_latency_s" && strings.HasPrefix(r.gpu, "H100") {
			argonneH100[fmt.Sprintf("%s|%d|%d", r.model, r.in, r.conc)] = r.value
		}
	}
	for _, r := range rows {
		if r.source != "ARGONNE_LIB" || r.metric != "batch_e2e_latency_s" || !strings.HasPrefix(r.gpu, "A100") || !want("a100") {
			continue
		}
		m, ok := argonne[r.model]
		if !ok {
			t.Fatalf("ARGONNE_LIB: model %q not known", r.model)
		}
		budget := max(m.maxLen, 2048)
		lat := float64(r.conc*r.out) / offline(t, modelProfile(t, cal, "a100", m.model, 256, budget), r.in, r.out, r.conc)
		what := fmt.Sprintf("vLLM static batch %s %d:%d ×%d", m.model, r.in, r.out, r.conc)
		out = append(out, pubCheck{"a100", what + " latency", lat / r.value})
		if h := argonneH100[fmt.Sprintf("%s|%d|%d", r.model, r.in, r.conc)]; h > 0 {
			mh := float64(r.conc*r.out) / offline(t, modelProfile(t, cal, "h100", m.model, 256, budget), r.in, r.out, r.conc)
			tok := float64(r.conc * r.out)
			tputs = append(tputs, pubTput{what, "a100", tok / lat, tok / r.value}, pubTput{what, "h100", tok / mh, tok / h})
		}
	}
	// vLLM 0.2.5 serving Mistral-7B and LLaMA-7B (huggyllama/llama-7b: Llama-2-7B's shapes,
	// a 2,048-token context) on one "A100 40G" (ZJUICI_A100_40G): requests sent one by one
	// at L:L' tokens (ignore_eos), each's latency over its output tokens. Its throughputs
	// (399 requests at once) are not compared: vLLM before 0.6 was bound by its host's
	// overheads at large batches (its v0.6.0 post), and the model is 1.2–2.6× them where it
	// is within 15 % of Argonne's vLLM 0.6 static batches on the same card; see
	// engine/public/README.md. V0's token budget.
	for _, r := range rows {
		if r.source != "ZJUICI_A100_40G" || r.metric != "e2e_ms_per_output_token" || !want("a100") {
			continue
		}
		model, maxLen := "mistral-7b", 32768
		if r.model == "huggyllama/llama-7b" {
			model, maxLen = "llama-2-7b", 2048
			if r.in+r.out > maxLen {
				continue // past LLaMA-7B's context: what the source ran is not known
			}
		}
		p := modelProfile(t, cal, "a100", model, 256, max(maxLen, 2048))
		ms := 1000 * float64(r.out) / offline(t, p, r.in, r.out, 1)
		out = append(out, pubCheck{"a100", fmt.Sprintf("vLLM 0.2.5 %s %d:%d one at a time, latency per output token", model, r.in, r.out), ms / float64(r.out) / r.value})
	}
	// vLLM 0.5.5 serving Llama-3.1-8B-Instruct (bf16) and its FP8-dynamic checkpoint on one
	// L40S (CRUSOE_L40S): benchmark_serving's Poisson arrivals at 1 to 9 requests/s, 120 s
	// of them, ~509:150 tokens, chunked prefill on (vLLM 0.5's step budget with it: 512
	// tokens; 256 sequences); the median TPOT. The FP8-dynamic checkpoint quantizes no KV
	// cache: replayed with a 16-bit one (at 9 requests/s the cache is a third of a step's
	// reads).
	for _, r := range rows {
		if r.source != "CRUSOE_L40S" || r.metric != "tpot_ms_p50" || !want("l40s") {
			continue
		}
		rate, err := strconv.ParseFloat(r.requestRate, 64)
		if err != nil {
			t.Fatalf("CRUSOE_L40S: request rate %q: %v", r.requestRate, err)
		}
		model, edit := "llama-3.1-8b", (func(*ModelShape))(nil)
		if strings.Contains(r.model, "FP8") {
			model, edit = model+fp8Suffix, func(m *ModelShape) { m.kv16 = true }
		}
		tpot := openLoopTPOT(t, shapeProfile(t, cal, "l40s", model, edit, 256, 512), r.in, r.out, rate, int(120*rate))
		out = append(out, pubCheck{"l40s", fmt.Sprintf("vLLM 0.5.5 %s %g req/s TPOT", model, rate), tpot / r.value})
	}
	// vLLM (version not stated) serving Meta-Llama-3-8B-Instruct (fp16; Llama 3.1 8B's
	// shapes) on one A10G (LLMCOMPRESSOR_A10G): an offline batch of 1,000 requests (its
	// prompts' and answers' means, 256 sequences) and a Poisson 1 request/s of 100 (its
	// means; the median TPOT), each at vLLM's defaults otherwise.
	for _, r := range rows {
		if r.source != "LLMCOMPRESSOR_A10G" || !want("a10g") {
			continue
		}
		p := profile("a10g", "llama-3.1-8b", 256)
		switch r.metric {
		case "output_tok_per_s":
			out = append(out, pubCheck{"a10g", fmt.Sprintf("vLLM offline %d:%d ×%d output tok/s", r.in, r.out, r.conc), offline(t, p, r.in, r.out, r.conc) / r.value})
		case "tpot_ms_p50":
			rate, err := strconv.ParseFloat(r.requestRate, 64)
			if err != nil {
				t.Fatalf("LLMCOMPRESSOR_A10G: request rate %q: %v", r.requestRate, err)
			}
			out = append(out, pubCheck{"a10g", fmt.Sprintf("vLLM %d:%d %g req/s TPOT", r.in, r.out, rate), openLoopTPOT(t, p, r.in, r.out, rate, 100) / r.value})
		}
	}
	// TGI 1.0.3 serving Llama-2-7B (fp16) on one A10G (HF_TGI_SM): 1 to 20 clients, 50 new
	// tokens each; the prompt length is not stated, taken as short (64 tokens, a few % of
	// the latency either way).
	for _, r := range rows {
		if r.source == "HF_TGI_SM" && r.metric == "latency_ms_per_token_p50" && want("a10g") {
			p := profile("a10g", "llama-2-7b", 0)
			e2e := closedLoopLatency(t, p, 64, r.out, r.conc, 4*r.conc+8)
			out = append(out, pubCheck{"a10g", fmt.Sprintf("TGI ×%d latency per token", r.conc), e2e / float64(r.out) / r.value})
		}
	}
	// TensorRT-LLM's offline throughput of Llama 3.1 8B and Mistral 7B on one GPU, each
	// GPU's over the H100's, per shape, with the number of requests the source ran. Its
	// in-flight batcher is not held to vLLM's smaller defaults on the A100 (256 sequences,
	// 2,048 tokens a step): every card replays with the H100's (1,024 and 8,192).
	//
	// 0.14.0 (TRTLLM_V014) ran each precision on the H100: the A100s in FP16 against the
	// H100 in FP16, the L40S and H200 in FP8 (weights and KV cache: the model's FP8
	// checkpoint of each) against the H100 in FP8. 0.17 (TRTLLM_V017) ran the H100, H200
	// and L40S in FP8 and the A100-SXM4-80GB in FP16 (it has no FP8 tensor cores), all
	// against the H100 in FP8: what each card serves at its best precision.
	type trtCard struct{ precision, label, gpu, suffix string }
	trtSources := []struct {
		id, name string
		cards    []trtCard
		// ref is the H100 the cards are compared with; nil: each card against the H100 in
		// the card's own precision, a set per precision.
		ref *trtCard
	}{
		{"TRTLLM_V014", "TRT-LLM", []trtCard{{"FP16", "A100-SXM4-80GB", "a100-80gb", ""}, {"FP16", "A100-PCIE-80GB", "a100-80gb-pcie", ""},
			{"FP8", "L40S", "l40s", fp8Suffix}, {"FP8", "H200 141GB HBM3", "h200", fp8Suffix}}, nil},
		{"TRTLLM_V017", "TRT-LLM 0.17", []trtCard{{"FP16", "A100-SXM4-80GB", "a100-80gb", ""},
			{"FP8", "L40S", "l40s", fp8Suffix}, {"FP8", "H200 141GB HBM3", "h200", fp8Suffix}}, &trtCard{"FP8", "H100 80GB HBM3", "h100", fp8Suffix}},
	}
	byKey := map[string]float64{}
	for _, r := range rows {
		if r.source == "TRTLLM_V014" || r.source == "TRTLLM_V017" {
			byKey[r.source+"|"+r.precision+"|"+r.gpu+"|"+r.model+"|"+strconv.Itoa(r.in)+"|"+strconv.Itoa(r.out)] = r.value
		}
	}
	// Both versions ask the model the same questions: each replay is run once.
	replayed := map[string]float64{}
	offlineOn := func(gpu, model string, sh [2]int) float64 {
		k := fmt.Sprintf("%s|%s|%v", gpu, model, sh)
		if v, ok := replayed[k]; ok {
			return v
		}
		v := offline(t, modelProfile(t, cal, gpu, model, 1024, 8192), sh[0], sh[1], trtRequests[sh])
		replayed[k] = v
		return v
	}
	for _, src := range trtSources {
		for _, set := range src.cards {
			if !want(set.gpu) {
				continue
			}
			ref := trtCard{set.precision, "H100 80GB HBM3", "h100", set.suffix}
			if src.ref != nil {
				ref = *src.ref
			}
			for _, model := range []struct{ label, name string }{{"LLaMA v3.1 8B", "llama-3.1-8b"}, {"Mistral 7B", "mistral-7b"}} {
				for _, sh := range trtShapes {
					k := "|" + model.label + "|" + strconv.Itoa(sh[0]) + "|" + strconv.Itoa(sh[1])
					g, h := byKey[src.id+"|"+set.precision+"|"+set.label+k], byKey[src.id+"|"+ref.precision+"|"+ref.label+k]
					if g == 0 || h == 0 {
						t.Fatalf("%s: no %s %s figure for %s at %d:%d, or no %s one for the H100", src.id, set.precision, model.label, set.label, sh[0], sh[1], ref.precision)
					}
					mg := offlineOn(set.gpu, model.name+set.suffix, sh)
					hk := fmt.Sprintf("%s|%s|%s|%v", cal.From, ref.gpu, model.name+ref.suffix, sh)
					mh, ok := h100Offline.Load(hk)
					if !ok {
						mh, _ = h100Offline.LoadOrStore(hk, offlineOn(ref.gpu, model.name+ref.suffix, sh))
					}
					out = append(out, pubCheck{set.gpu, fmt.Sprintf("%s %s %s %d:%d %s/H100 %s", src.name, set.precision, model.name, sh[0], sh[1], set.gpu, ref.precision), (mg / mh.(float64)) / (g / h)})
					// A set is the GPUs compared with one H100: per precision, or all at once.
					name := fmt.Sprintf("%s %s %d:%d", src.name, model.name, sh[0], sh[1])
					if src.ref == nil {
						name = fmt.Sprintf("%s %s %s %d:%d", src.name, set.precision, model.name, sh[0], sh[1])
					}
					if !slices.ContainsFunc(tputs, func(p pubTput) bool { return p.set == name && p.gpu == ref.gpu }) {
						tputs = append(tputs, pubTput{name, ref.gpu, mh.(float64), h})
					}
					tputs = append(tputs, pubTput{name, set.gpu, mg, g})
				}
			}
		}
	}
	return out, tputs
}

// atFit is publicChecks on the calibration every generated profile gets, replayed once
// for every test that reads it.
var atFit struct {
	once   sync.Once
	checks []pubCheck
	tputs  []pubTput
}

func publicAtFit(t testing.TB) ([]pubCheck, []pubTput) {
	t.Helper()
	atFit.once.Do(func() {
		all, err := bothCards()
		if err != nil {
			t.Fatal(err)
		}
		atFit.checks, atFit.tputs = publicChecks(t, all.c, nil)
	})
	return atFit.checks, atFit.tputs
}

// trtShapes are TensorRT-LLM's shapes (input:output tokens) that the replay covers: all
// but 20,000:2,000, longer than the models' profiles are checked at.
var trtShapes = [][2]int{{128, 128}, {128, 2048}, {128, 4096}, {500, 2000}, {1000, 1000}, {2048, 128}, {2048, 2048}, {5000, 500}}

// trtRequests is the number of requests TensorRT-LLM's performance overview ran per shape
// ("$num_requests", the table under "Preparing a Dataset", same commit as the figures):
// enough for its batch to reach a steady state, which a replay with fewer never reaches on
// the long shapes (their batch stays below what the KV cache holds; with 64 to 1,024
// requests, until 2026-11-29, the L40S was modelled 19–78 % faster against the H100, not
// 9–30 %).
var trtRequests = map[[2]int]int{
	{128, 128}: 30000, {128, 2048}: 3000, {128, 4096}: 1500, {2048, 128}: 3000, {2048, 2048}: 1500,
	{5000, 500}: 1500, {1000, 1000}: 3000, {500, 2000}: 3000, {20000, 2000}: 1000,
}

// openLoopTPOT replays n requests of in:out tokens arriving as a Poisson process at rate
// per second (seed 1) and returns the median TPOT (ms) of their answers.
func openLoopTPOT(t testing.TB, p Profile, in, out int, rate float64, n int) float64 {
	t.Helper()
	r, ok, err := runPoisson(p, in, out, rate, n, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("%d:%d tokens at %g requests/s: the queue outgrew an hour past the last arrival", in, out, rate)
	}
	tpots := slices.Sorted(slices.Values(r.tpot))
	return tpots[len(tpots)/2]
}

// closedLoopLatency is closedLoop's median end-to-end latency of a request (ms).
func closedLoopLatency(t testing.TB, p Profile, in, out, c, n int) float64 {
	t.Helper()
	tpot, _ := closedLoop(t, p, in, out, c, n, false)
	// A request's latency is its first token's wait plus out-1 TPOTs; with these short
	// prompts the first token is a fraction of a step.
	return tpot * float64(out)
}

// errorsByGPU is each GPU type's median and worst |model ÷ published − 1|.
func errorsByGPU(checks []pubCheck) map[string][2]float64 {
	by := map[string][]float64{}
	for _, c := range checks {
		by[c.gpu] = append(by[c.gpu], math.Abs(c.ratio-1))
	}
	out := map[string][2]float64{}
	for gpu, errs := range by {
		slices.Sort(errs)
		out[gpu] = [2]float64{errs[len(errs)/2], errs[len(errs)-1]}
	}
	return out
}

// heldOut are the GPU types held to issue 48's goal out of the fit: within 20 % median and
// 35 % worst. Not there yet: the A10G, whose rows are mostly TGI 1.0.3's of 2023 (a batcher
// far from vLLM's: 0.59 of its latency at 20 clients); its two vLLM rows (2026-11-30) are
// within 5 and 11 %. The 40 GB A100 joined on 2026-11-30 (vLLM 0.6's static batches and
// vLLM 0.2.5's one-at-a-time latencies: median 5 %, worst 15 %), and the L40S with each
// card's measured bandwidth share (GPUSpec.MemShare; before it, held out: median 18 %,
// worst 42 %).
var heldOut = []string{"a100", "a100-80gb", "a100-80gb-pcie", "h200", "l4", "l40s"}

// heldAt is each GPU type's held-out median and worst error as they stand (2026-11-30; the
// A100-80GB's worst 25 → 20 % on 2026-12-01, when INFBENCH's A100 rows moved to the 40 GB card;
// with TensorRT-LLM 0.17's rows the same day, the A100-80GB 8 % / 15 %, the H200 3 % / 18 %,
// the L40S 13 % / 31 %),
// with some room: a change that loses ground on any type fails, goal met or not.
var heldAt = map[string][2]float64{
	"l4": {0.15, 0.30}, "a100": {0.10, 0.20}, "a100-80gb": {0.10, 0.20}, "a100-80gb-pcie": {0.15, 0.25}, "h200": {0.05, 0.20},
	"l40s": {0.20, 0.35}, "a10g": {0.20, 0.45},
}

// publicRows is how many comparisons each GPU type has: every usable row read.
var publicRows = map[string]int{"a100": 88, "l4": 16, "a100-80gb": 32, "a100-80gb-pcie": 16, "h200": 32, "l40s": 42, "a10g": 6}

// family is the GPUs one chip makes (the A100 SXM and PCIe: one BF16 rate, one source): a
// type is held out with its family, since the one fitted parameter scales by that rate and
// would carry from one to the other.
func family(gpu string) string {
	if strings.HasPrefix(gpu, "a100") {
		return "a100"
	}
	return gpu
}

// scoreRateExps are the exponents the fit chooses among (Calibration.ScoreRateExp).
var scoreRateExps = []float64{0, 0.25, 0.5, 0.75, 1}

// The GPU model against measurements of real engines, every GPU type held out of the fit
// (issue 48): the one parameter the public rows choose, how eager attention's score cost
// carries to a card of another compute rate, is chosen on the other types' rows (least
// squares of the log of model ÷ published over them); the measured H200 rows leave the
// calibration when the
// H200 is held out, and the A100 SXM and PCIe leave together (one chip). Then each type's
// rows are predicted: every type is held where it stands (heldAt), and the six that meet
// issue 48's goal to it (median 20 %, worst 35 %). Run 2026-11-29: bench/docs/gpu-model.md.
func TestModelAgainstPublicMeasurements(t *testing.T) {
	skipUnderRace(t)
	if testing.Short() {
		t.Skip("replays some dozens of closed loops and offline batches")
	}
	all, err := bothCards()
	if err != nil {
		t.Fatal(err)
	}
	h100Only, err := CalibrateOn("h100")
	if err != nil {
		t.Fatal(err)
	}
	// Every candidate exponent's checks, in parallel (each replay is independent).
	var mu sync.Mutex
	byExp := map[float64][]pubCheck{}
	var h200Held []pubCheck
	t.Run("replay", func(t *testing.T) {
		for _, exp := range scoreRateExps {
			t.Run(fmt.Sprint(exp), func(t *testing.T) {
				t.Parallel()
				c := all.c
				c.ScoreRateExp = exp
				var checks []pubCheck
				if exp == scoreRateExp {
					checks, _ = publicAtFit(t)
				} else {
					checks, _ = publicChecks(t, c, nil)
				}
				mu.Lock()
				byExp[exp] = checks
				mu.Unlock()
			})
		}
		t.Run("h200 held out", func(t *testing.T) {
			t.Parallel()
			checks, _ := publicChecks(t, h100Only, map[string]bool{"h200": true})
			mu.Lock()
			h200Held = checks
			mu.Unlock()
		})
	})
	if t.Failed() {
		return
	}
	// fit chooses the exponent on every type but skip's family ("": on all).
	fit := func(skip string) float64 {
		best, bestScore := 0.0, math.Inf(1)
		for _, exp := range scoreRateExps {
			score := 0.0
			for _, c := range byExp[exp] {
				if skip == "" || family(c.gpu) != family(skip) {
					score += math.Log(c.ratio) * math.Log(c.ratio)
				}
			}
			if score < bestScore-1e-9 {
				best, bestScore = exp, score
			}
		}
		return best
	}
	if got := fit(""); got != scoreRateExp {
		t.Errorf("fitted on every GPU type the score exponent is %g; scoreRateExp is %g", got, scoreRateExp)
	}
	for _, c := range byExp[scoreRateExp] {
		t.Logf("%-14s %-52s model ÷ published %.2f", c.gpu, c.what, c.ratio)
	}
	fitted := errorsByGPU(byExp[scoreRateExp])
	for _, gpu := range slices.Sorted(maps.Keys(publicRows)) {
		exp := fit(gpu)
		checks, how := byExp[exp], fmt.Sprintf("exponent %g", exp)
		if gpu == "h200" {
			// Its rate is the H100's: the exponent does not reach it; its measured rows leave
			// the calibration instead.
			checks, how = h200Held, "calibrated on the H100 alone"
		}
		var mine []pubCheck
		for _, c := range checks {
			if c.gpu == gpu {
				mine = append(mine, c)
			}
		}
		if len(mine) != publicRows[gpu] {
			t.Errorf("%s: %d comparisons, want %d: the public rows were not all read", gpu, len(mine), publicRows[gpu])
			continue
		}
		held := errorsByGPU(mine)[gpu]
		t.Logf("%-14s %2d rows: fitted on all, median error %2.0f %%, worst %2.0f %%; held out (%s), median %2.0f %%, worst %2.0f %%",
			gpu, len(mine), 100*fitted[gpu][0], 100*fitted[gpu][1], how, 100*held[0], 100*held[1])
		if b := heldAt[gpu]; held[0] > b[0] || held[1] > b[1] {
			t.Errorf("%s held out: median error %.0f %%, worst %.0f %%; held at %.0f %% and %.0f %%", gpu, 100*held[0], 100*held[1], 100*b[0], 100*b[1])
		}
		if slices.Contains(heldOut, gpu) && (held[0] > 0.20 || held[1] > 0.35) {
			t.Errorf("%s held out: median error %.0f %%, worst %.0f %%; the goal is 20 %% and 35 %%", gpu, 100*held[0], 100*held[1])
		}
	}
	if n, want := len(byExp[scoreRateExp]), 232; n != want {
		t.Errorf("%d comparisons, want %d: the public rows were not all read", n, want)
	}
}
