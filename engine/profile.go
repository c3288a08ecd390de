package engine

import (
	"bytes"
	"embed"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Profile is the performance model of one model shape on one GPU: step times as linear
// forms fitted to measurements, and the engine limits vLLM would run with.
//
// prefill ms = PrefillBaseMs + PrefillPerTokenMs·T + PrefillPastKneeMs·max(0, T − PrefillKneeTokens)
//   - PrefillQuadMs·ΣN² + PrefillCachedMs·Σ(N·P) + PrefillReadMs·ΣP + PrefillCachedSeqMs·#(P > 0)
//
// decode ms  = DecodeBaseMs + DecodePerSeqMs·B + DecodePerCtxMs·Σctx + DecodeLogBatchMs·ln B
//
// T is the number of prompt tokens computed in the step, N each request's computed tokens,
// P the tokens already in its KV cache (prefix hit or earlier chunk), B the decode batch and
// Σctx the cached tokens read by that batch. The knee is where a prefill stops being bound by
// reading the weights and becomes bound by compute; #(P > 0) counts the sequences that attend
// to cached tokens (a masked attention path with its own fixed cost); ln B is the decode
// kernels' growing overhead at small batches. Each fitted term keeps every measured row within
// ±10 % (TestEveryMeasuredRowWithinTenPercent).
type Profile struct {
	Name              string  `json:"name"`
	GPU               string  `json:"gpu"`
	Model             string  `json:"model"`
	PrefillBaseMs     float64 `json:"prefill_base_ms"`
	PrefillPerTokenMs float64 `json:"prefill_per_token_ms"`
	PrefillQuadMs     float64 `json:"prefill_quad_ms"`
	PrefillCachedMs   float64 `json:"prefill_cached_ms"`
	// PrefillReadMs is the cost of reading one cached token's KV during a prefill chunk.
	PrefillReadMs float64 `json:"prefill_read_ms"`
	// PrefillKneeTokens and PrefillPastKneeMs: the extra cost per step token beyond the knee.
	PrefillKneeTokens int     `json:"prefill_knee_tokens,omitempty"`
	PrefillPastKneeMs float64 `json:"prefill_past_knee_ms,omitempty"`
	// PrefillCachedSeqMs is the fixed cost of one sequence's chunk that follows cached tokens.
	PrefillCachedSeqMs float64 `json:"prefill_cached_seq_ms,omitempty"`
	DecodeBaseMs       float64 `json:"decode_base_ms"`
	DecodePerSeqMs     float64 `json:"decode_per_seq_ms"`
	DecodePerCtxMs     float64 `json:"decode_per_ctx_ms"`
	DecodeLogBatchMs   float64 `json:"decode_log_batch_ms,omitempty"`
	// KVTokens is the KV-cache capacity in tokens.
	KVTokens int `json:"kv_tokens"`
	// BlockSize is the KV block (and prefix-cache block) size in tokens; vLLM uses 16.
	BlockSize int `json:"block_size"`
	// MaxBatch is vLLM's max_num_seqs (1024 for the built-in H100 and H200 profiles).
	MaxBatch int `json:"max_batch"`
	// MaxBatchedTokens is the per-step token budget (chunked prefill).
	MaxBatchedTokens int `json:"max_batched_tokens"`
	// MaxModelLen is the model's context, vLLM's max_model_len: the most prompt plus output
	// tokens one request may have. 0 means the KV capacity.
	MaxModelLen int `json:"max_model_len,omitempty"`
	// WeightGiB is the model's weights in memory (GiB): what a replica reads from disk or
	// the network before it can serve (replicasim's cold start). 0: unknown.
	WeightGiB float64 `json:"weight_gib,omitempty"`
	// Source says where the numbers came from.
	Source string `json:"source"`
	// MaxFitError is the largest relative error of the fit over the rows it was fitted to;
	// for a modelled profile, the calibration's error (see Modelled).
	MaxFitError float64 `json:"max_fit_error,omitempty"`
	// Modelled: the profile was generated from data sheets and a model's shape (Generate),
	// not fitted to measurements of this card; ModelError is then the model's largest
	// per-row error predicting one measured card from the other (leave-one-out).
	Modelled   bool    `json:"modelled,omitempty"`
	ModelError float64 `json:"model_error,omitempty"`
	// TensorParallel is the number of GPUs the model is split over; 0 or 1: one.
	TensorParallel int `json:"tensor_parallel,omitempty"`
}

// Validate rejects profiles the engine cannot run.
func (p *Profile) Validate() error {
	switch {
	case p.Name == "":
		return errors.New("profile: name: required")
	case p.KVTokens <= 0:
		return fmt.Errorf("profile %s: kv_tokens %d: must be > 0", p.Name, p.KVTokens)
	case p.BlockSize <= 0:
		return fmt.Errorf("profile %s: block_size %d: must be > 0 (vLLM uses 16)", p.Name, p.BlockSize)
	case p.MaxBatch <= 0:
		return fmt.Errorf("profile %s: max_batch %d: must be > 0 (vLLM's default on an H100 is 1024)", p.Name, p.MaxBatch)
	case p.MaxBatchedTokens < p.BlockSize:
		return fmt.Errorf("profile %s: max_batched_tokens %d: must be >= block_size", p.Name, p.MaxBatchedTokens)
	case p.PrefillPerTokenMs <= 0 || p.DecodeBaseMs <= 0:
		return fmt.Errorf("profile %s: prefill_per_token_ms and decode_base_ms must be > 0", p.Name)
	}
	return nil
}

// PrefillMs is the time of a prefill of n new tokens after p cached ones, alone in a step.
func (p *Profile) PrefillMs(n, cached int) float64 {
	seqs := 0
	if cached > 0 {
		seqs = 1
	}
	N, P := float64(n), float64(cached)
	return p.prefillStepMs(N, N*N, N*P, P, seqs)
}

// prefillStepMs is the prefill part of a step that computes T tokens in all, with the sums
// the Profile's form names.
func (p *Profile) prefillStepMs(T, sumN2, sumNP, sumP float64, cachedSeqs int) float64 {
	return p.PrefillBaseMs + p.PrefillPerTokenMs*T + p.PrefillPastKneeMs*max(0, T-float64(p.PrefillKneeTokens)) +
		p.PrefillQuadMs*sumN2 + p.PrefillCachedMs*sumNP + p.PrefillReadMs*sumP + p.PrefillCachedSeqMs*float64(cachedSeqs)
}

// StepShape is what one forward pass computes, in the Profile's terms: T prompt tokens in
// all, the sums over the sequences prefilling (N² and N·P, P), how many of them follow cached
// tokens, and the decode batch with the context it reads.
type StepShape struct {
	Tokens, SumN2, SumNP, SumP float64
	CachedSeqs                 int
	DecodeBatch                int
	DecodeCtx                  float64
}

// StepMs is one step's time, split into its prefill and decode parts (ms). A mixed step
// reads the weights once, so it pays one base cost: the decode part then goes without its
// own. replicasim's engine and the router's model of a replica both price steps here.
func (p *Profile) StepMs(s StepShape) (prefillMs, decodeMs float64) {
	if s.Tokens > 0 {
		prefillMs = p.prefillStepMs(s.Tokens, s.SumN2, s.SumNP, s.SumP, s.CachedSeqs)
	}
	if s.DecodeBatch > 0 {
		decodeMs = p.decodeMs(float64(s.DecodeBatch), s.DecodeCtx)
		if s.Tokens > 0 {
			decodeMs -= min(p.DecodeBaseMs, p.PrefillBaseMs)
		}
	}
	return prefillMs, decodeMs
}

// DecodeMs is the time of one decode step for batch sequences holding ctx tokens in total.
func (p *Profile) DecodeMs(batch, ctx int) float64 { return p.decodeMs(float64(batch), float64(ctx)) }

func (p *Profile) decodeMs(B, ctx float64) float64 {
	return p.DecodeBaseMs + p.DecodePerSeqMs*B + p.DecodePerCtxMs*ctx + p.DecodeLogBatchMs*math.Log(max(B, 1))
}

//go:embed profiles/*.csv profiles/*.json
var measured embed.FS

// measuredCards maps the card names used in profile names to the measurement files copied
// from shared/data/gpu_profiles (measured for this project on 2026-11-23, see its README).
var measuredCards = map[string]string{"h100": "h100-80gb-hbm3", "h200": "h200-141gb"}

// ProfileNames lists the built-in profiles.
func ProfileNames() []string {
	var names []string
	for card := range measuredCards {
		for _, m := range []string{"llama-3.1-8b", "llama-3.2-1b"} {
			names = append(names, card+"-"+m)
		}
	}
	sort.Strings(names)
	return names
}

// LoadProfile returns a built-in profile by name: a measured one (ProfileNames), else one
// generated for any GPU[xN]-MODEL pair of GPUNames and ModelNames (l4-llama-3.1-8b,
// a100-80gb-llama-2-7b, h100x4-llama-3.1-70b; see Generate), the measured winning where
// both exist. When name ends in .json it reads a Profile from that file.
func LoadProfile(name string) (*Profile, error) {
	if strings.HasSuffix(name, ".json") {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("profile file: %w", err)
		}
		var p Profile
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return nil, fmt.Errorf("profile file %s: %w", name, err)
		}
		if err := p.Validate(); err != nil {
			return nil, err
		}
		return &p, nil
	}
	card, model, ok := strings.Cut(name, "-")
	file, known := measuredCards[card]
	if !ok || !known || (model != "llama-3.1-8b" && model != "llama-3.2-1b") {
		return generated(name)
	}
	csvData, err := measured.ReadFile("profiles/" + file + ".csv")
	if err != nil {
		return nil, err
	}
	infoData, err := measured.ReadFile("profiles/" + file + ".info.json")
	if err != nil {
		return nil, err
	}
	var info struct {
		GPU    string  `json:"gpu"`
		MemGiB float64 `json:"mem_gib"`
	}
	if err := json.Unmarshal(infoData, &info); err != nil {
		return nil, fmt.Errorf("profile %s: info: %w", name, err)
	}
	rows, err := parseMeasurements(bytes.NewReader(csvData), model)
	if err != nil {
		return nil, fmt.Errorf("profile %s: %w", name, err)
	}
	p, err := fitProfile(rows)
	if err != nil {
		return nil, fmt.Errorf("profile %s: %w", name, err)
	}
	p.Name, p.GPU, p.Model, p.WeightGiB = name, info.GPU, model, rows[0].weightGiB
	// vLLM's gpu_memory_utilization 0.9, minus weights and ~4 GiB of activations and graphs.
	const gib = 1 << 30
	kvBytes := (0.9*info.MemGiB - rows[0].weightGiB - 4) * gib
	p.KVTokens = int(kvBytes / float64(rows[0].kvBytesPerToken))
	// vLLM 0.11's defaults for the OpenAI server on a GPU of 70 GiB or more other than an
	// A100 (vllm/engine/arg_utils.py, EngineArgs._set_default_args): max_num_seqs 1024,
	// max_num_batched_tokens 8192; block size 16 on CUDA. Both Llama shapes have a
	// 131,072-token context (max_position_embeddings in their config.json).
	p.BlockSize, p.MaxBatch, p.MaxBatchedTokens, p.MaxModelLen = 16, 1024, 8192, 131072
	p.Source = "fitted to shared/data/gpu_profiles/" + file + ".csv (measured on a real " + info.GPU + ", 2026-11-23)"
	return p, p.Validate()
}

type measurement struct {
	phase           string // prefill, decode, or prefill_after
	batch, tokens   int
	cached          int
	ms              float64
	weightGiB       float64
	kvBytesPerToken int
}

func parseMeasurements(r io.Reader, model string) ([]measurement, error) {
	cr := csv.NewReader(r)
	recs, err := cr.ReadAll()
	if err != nil {
		return nil, err
	}
	var out []measurement
	for i, rec := range recs {
		if i == 0 || rec[0] != model {
			continue
		}
		if len(rec) != 9 {
			return nil, fmt.Errorf("row %d: want 9 columns, got %d", i+1, len(rec))
		}
		m := measurement{phase: rec[1]}
		if rest, ok := strings.CutPrefix(rec[1], "prefill_after_"); ok {
			m.phase = "prefill_after"
			if m.cached, err = strconv.Atoi(strings.TrimSuffix(rest, "_cached")); err != nil {
				return nil, fmt.Errorf("row %d: phase %q: %w", i+1, rec[1], err)
			}
		}
		var errs [5]error
		m.batch, errs[0] = strconv.Atoi(rec[2])
		m.tokens, errs[1] = strconv.Atoi(rec[3])
		m.ms, errs[2] = strconv.ParseFloat(rec[4], 64)
		m.weightGiB, errs[3] = strconv.ParseFloat(rec[7], 64)
		m.kvBytesPerToken, errs[4] = strconv.Atoi(rec[8])
		if err := errors.Join(errs[:]...); err != nil {
			return nil, fmt.Errorf("row %d: %w", i+1, err)
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no rows for model %q", model)
	}
	return out, nil
}

// fitProfile fits the forms by least squares on relative error, so short prompts (where the
// step is near the weight-read floor) weigh as much as long ones. The prefill knee is chosen
// by search: the one whose fit has the smallest worst-row error.
func fitProfile(rows []measurement) (*Profile, error) {
	var dx [][]float64
	var dy []float64
	for _, m := range rows {
		if m.phase == "decode" {
			B, N := float64(m.batch), float64(m.tokens)
			dx = append(dx, []float64{1, B, B * N, math.Log(B)})
			dy = append(dy, m.ms)
		}
	}
	dc, err := relativeLeastSquares(dx, dy)
	if err != nil {
		return nil, fmt.Errorf("decode fit: %w", err)
	}
	best := &Profile{MaxFitError: math.Inf(1)}
	for knee := 64; knee <= 4096; knee += 32 {
		var px [][]float64
		var py []float64
		for _, m := range rows {
			if m.phase == "decode" {
				continue
			}
			B, N, P := float64(m.batch), float64(m.tokens), float64(m.cached)
			cachedSeq := 0.0
			if m.cached > 0 {
				cachedSeq = B
			}
			px = append(px, []float64{1, B * N, max(0, B*N-float64(knee)), B * N * N, B * N * P, B * P, cachedSeq})
			py = append(py, m.ms)
		}
		pc, err := relativeLeastSquares(px, py)
		if err != nil {
			return nil, fmt.Errorf("prefill fit: %w", err)
		}
		if pc[1] <= 0 || pc[1]+pc[2] <= 0 {
			continue // a prefill that got cheaper with more tokens would be no model
		}
		worst := 0.0
		for i := range px {
			worst = math.Max(worst, math.Abs(dot(px[i], pc)-py[i])/py[i])
		}
		if worst < best.MaxFitError {
			best = &Profile{
				PrefillBaseMs: pc[0], PrefillPerTokenMs: pc[1], PrefillKneeTokens: knee, PrefillPastKneeMs: pc[2],
				PrefillQuadMs: pc[3], PrefillCachedMs: pc[4], PrefillReadMs: pc[5], PrefillCachedSeqMs: pc[6],
				MaxFitError: worst,
			}
		}
	}
	if math.IsInf(best.MaxFitError, 1) {
		return nil, errors.New("prefill fit: no knee gives a prefill time that grows with its tokens")
	}
	best.DecodeBaseMs, best.DecodePerSeqMs, best.DecodePerCtxMs, best.DecodeLogBatchMs = dc[0], dc[1], dc[2], dc[3]
	for i := range dx {
		best.MaxFitError = math.Max(best.MaxFitError, math.Abs(dot(dx[i], dc)-dy[i])/dy[i])
	}
	return best, nil
}

func dot(a, b []float64) float64 {
	s := 0.0
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// relativeLeastSquares minimises Σ((x·c − y)/y)² through the normal equations.
func relativeLeastSquares(x [][]float64, y []float64) ([]float64, error) {
	w := make([]float64, len(y))
	for i := range y {
		w[i] = 1 / (y[i] * y[i])
	}
	return leastSquares(x, y, w)
}

// leastSquares minimises Σ w·(x·c − y)² through the normal equations.
func leastSquares(x [][]float64, y, wt []float64) ([]float64, error) {
	if len(x) == 0 {
		return nil, errors.New("no rows")
	}
	k := len(x[0])
	if len(x) < k {
		return nil, fmt.Errorf("%d rows for %d coefficients", len(x), k)
	}
	a := make([][]float64, k)
	for i := range a {
		a[i] = make([]float64, k+1)
	}
	for r := range x {
		w := wt[r]
		for i := 0; i < k; i++ {
			for j := 0; j < k; j++ {
				a[i][j] += w * x[r][i] * x[r][j]
			}
			a[i][k] += w * x[r][i] * y[r]
		}
	}
	// Gaussian elimination with partial pivoting.
	for col := 0; col < k; col++ {
		piv := col
		for r := col + 1; r < k; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[piv][col]) {
				piv = r
			}
		}
		if math.Abs(a[piv][col]) < 1e-300 {
			return nil, errors.New("singular system: the rows do not determine every coefficient")
		}
		a[col], a[piv] = a[piv], a[col]
		for r := 0; r < k; r++ {
			if r == col {
				continue
			}
			f := a[r][col] / a[col][col]
			for c := col; c <= k; c++ {
				a[r][c] -= f * a[col][c]
			}
		}
	}
	out := make([]float64, k)
	for i := range out {
		out[i] = a[i][k] / a[i][i]
	}
	return out, nil
}
