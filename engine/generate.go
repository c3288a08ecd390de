package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// Calibration is what the data sheets do not say: how much of their bandwidth and FLOPs a
// serving engine's kernels reach, and the fixed costs of a step, per layer. It is fitted
// to measured rows (Calibrate) and carried to any GPU and model shape (Generate): the
// efficiencies scale with the card's data-sheet figures, the fixed costs per layer are
// taken as they are (an assumption the leave-one-out error checks only between the two
// measured cards, which share one SM count and clock).
type Calibration struct {
	// MemEff is the fraction of the data-sheet memory bandwidth that reading the weights
	// and the KV cache reaches.
	MemEff float64 `json:"mem_eff"`
	// DecodeFlopEff is the fraction of the dense BF16 rate a decode step's per-sequence
	// matrix work (every layer and the LM head, per sequence) reaches.
	DecodeFlopEff float64 `json:"decode_flop_eff"`
	// MatmulEff is the fraction of the dense BF16 rate a prefill's matrix work reaches.
	MatmulEff float64 `json:"matmul_eff"`
	// AttnEff is the fraction of the dense BF16 rate prefill attention reaches.
	AttnEff float64 `json:"attn_eff"`
	// DecodeLayerMs and DecodeLogBatchLayerMs: a decode step's fixed cost per layer, and
	// its growth with ln(batch) per layer (kernel launches and small-batch overheads).
	DecodeLayerMs         float64 `json:"decode_layer_ms"`
	DecodeLogBatchLayerMs float64 `json:"decode_log_batch_layer_ms"`
	// PrefillLayerMs is a prefill step's fixed cost per layer.
	PrefillLayerMs float64 `json:"prefill_layer_ms"`
	// ActFLOPs is a prefill's work per token, layer and element of hidden plus FFN width
	// beyond the matrix multiplies (norms, rotary embedding, SwiGLU: unfused kernels), in
	// FLOPs at the card's BF16 rate. The measured pair shows it follows the compute rate,
	// not bandwidth: both cards prefill within 4-6 % of each other, as their matmul rates
	// (747 and 788 TFLOPS measured) do, though the H200 reads 45 % faster.
	ActFLOPs float64 `json:"act_flops"`
	// ReadFLOPs is a prefill chunk's work per byte of cached KV it attends to, beyond
	// reading it (the eager path's mask and grouped-query expansion), in FLOPs at the BF16
	// rate: like ActFLOPs it does not follow bandwidth between the measured cards.
	ReadFLOPs float64 `json:"read_flops"`
	// SerialFrac is the part of a prefill's matrix work that does not overlap reading the
	// weights: below the roofline's knee a prefill costs the weight read plus this part.
	SerialFrac float64 `json:"serial_frac"`
	// DecodeScoreMs is a decode step's cost per layer, attention head and cached token
	// that does not scale with bandwidth (eager attention's score and softmax kernels), on
	// the calibration cards.
	DecodeScoreMs float64 `json:"decode_score_ms"`
	// ScoreRateExp is how DecodeScoreMs carries to a card of another BF16 rate: times
	// (RateTFLOPS / the card's rate)^ScoreRateExp. The calibration cards share one rate,
	// so their rows cannot tell a fixed cost (0) from work at the compute rate (1); the
	// public measurements of other cards chose it (scoreRateExp, held out per GPU type in
	// TestModelAgainstPublicMeasurements).
	ScoreRateExp float64 `json:"score_rate_exp"`
	// RateTFLOPS is the calibration cards' dense BF16 rate (data sheet).
	RateTFLOPS float64 `json:"rate_tflops"`
	// CachedSeqLayerMs is the fixed cost per layer of a prefill chunk that attends to cached
	// tokens (the masked attention path).
	CachedSeqLayerMs float64 `json:"cached_seq_layer_ms"`
	// UsablePerGB is the memory the driver reports (GiB) per data-sheet GB, measured on the
	// calibration cards (torch.cuda.mem_get_info's total in *.info.json).
	UsablePerGB float64 `json:"usable_per_gb"`
	// From names the measurements fitted.
	From string `json:"from"`
	// MaxError is the largest relative error over the rows fitted.
	MaxError float64 `json:"max_error"`
}

// calRow is one measured row with the card and shape it was measured on.
type calRow struct {
	gpu   GPUSpec
	model ModelShape
	m     measurement
}

// predict is the generated profile's time for a measured row, composed as the engine
// composes a step (the same sums TestEveryMeasuredRowWithinTenPercent uses).
func predictRow(p *Profile, m measurement) float64 {
	if m.phase == "decode" {
		return p.DecodeMs(m.batch, m.batch*m.tokens)
	}
	B, N, P := float64(m.batch), float64(m.tokens), float64(m.cached)
	seqs := 0
	if m.cached > 0 {
		seqs = m.batch
	}
	return p.prefillStepMs(B*N, B*N*N, B*N*P, B*P, seqs)
}

// Calibrate fits a Calibration to measured rows: decode by least squares on relative error
// in its four unknowns (fixed and ln-batch cost per layer, memory and decode efficiency);
// prefill with the memory efficiency decode found, the matmul efficiency by search (it
// sits inside the roofline's max) and the rest by least squares for each candidate,
// keeping the candidate with the smallest worst-row error.
func calibrate(rows []calRow, from string) (Calibration, error) {
	// The score cost is stated on the fastest calibration card and carried to the others
	// (and to every generated card) at scoreRateExp.
	rate := 0.0
	for _, r := range rows {
		rate = math.Max(rate, r.gpu.BF16TFLOPS)
	}
	var dx [][]float64
	var dy []float64
	for _, r := range rows {
		if r.m.phase != "decode" {
			continue
		}
		m, g := r.model, r.gpu
		B, ctx := float64(r.m.batch), float64(r.m.batch*r.m.tokens)
		bytesMs := (m.WeightBytes() + ctx*float64(m.KVBytesPerToken())) / (g.MemTBs * 1e9)
		flopMs := B * (m.tokenFLOPs() + m.headFLOPs()) / (g.BF16TFLOPS * 1e9)
		L := float64(m.Layers)
		score := L * float64(m.Heads) * ctx * math.Pow(rate/g.BF16TFLOPS, scoreRateExp)
		dx = append(dx, []float64{L, bytesMs, flopMs, L * math.Log(B), score})
		dy = append(dy, r.m.ms)
	}
	dc, err := relativeLeastSquares(dx, dy)
	if err != nil {
		return Calibration{}, fmt.Errorf("decode calibration: %w", err)
	}
	if dc[1] <= 0 || dc[2] <= 0 {
		return Calibration{}, fmt.Errorf("decode calibration: efficiencies 1/%.3g, 1/%.3g: the rows do not show the costs growing with bytes and FLOPs", dc[1], dc[2])
	}
	c := Calibration{DecodeLayerMs: dc[0], MemEff: 1 / dc[1], DecodeFlopEff: 1 / dc[2], DecodeLogBatchLayerMs: dc[3], DecodeScoreMs: dc[4], From: from,
		ScoreRateExp: scoreRateExp, RateTFLOPS: rate}

	best := Calibration{MaxError: math.Inf(1)}
	// A coarse grid over (matmul efficiency, serial fraction), then a fine one around the
	// best coarse point.
	var grid [][2]float64
	for e := 0.10; e <= 1.0001; e += 0.01 {
		for s := 0.0; s < 0.951; s += 0.05 {
			grid = append(grid, [2]float64{e, s})
		}
	}
	for pass := 0; pass < 2; pass++ {
		if pass == 1 {
			if math.IsInf(best.MaxError, 1) {
				break
			}
			grid = grid[:0]
			for e := best.MatmulEff - 0.01; e <= best.MatmulEff+0.01001; e += 0.001 {
				for s := max(0, best.SerialFrac-0.05); s <= min(0.95, best.SerialFrac+0.05)+1e-9; s += 0.01 {
					grid = append(grid, [2]float64{e, s})
				}
			}
		}
		c.fitPrefill(rows, grid, &best)
	}
	if math.IsInf(best.MaxError, 1) {
		return Calibration{}, errors.New("prefill calibration: no matmul efficiency gives costs that grow with attention")
	}
	c = best
	// The decode rows' error, through the profile a generated card would get.
	for _, r := range rows {
		if r.m.phase != "decode" {
			continue
		}
		p := c.profile(r.gpu, r.model, 1)
		got := predictRow(p, r.m)
		c.MaxError = math.Max(c.MaxError, math.Abs(got-r.m.ms)/r.m.ms)
	}
	return c, nil
}

// fitPrefill tries each (matmul efficiency, serial fraction) of grid and keeps in best the
// calibration whose prefill rows' worst error is smallest.
func (c Calibration) fitPrefill(rows []calRow, grid [][2]float64, best *Calibration) {
	for _, pt := range grid {
		eff, serial := pt[0], pt[1]
		var px [][]float64
		var py []float64
		var known []float64
		for _, r := range rows {
			if r.m.phase == "decode" {
				continue
			}
			m, g := r.model, r.gpu
			bw := c.MemEff * g.MemTBs * 1e9 // bytes per ms
			B, N, P := float64(r.m.batch), float64(r.m.tokens), float64(r.m.cached)
			T := B * N
			L := float64(m.Layers)
			a, f := m.WeightBytes()/bw, m.tokenFLOPs()/(eff*g.BF16TFLOPS*1e9)
			roof := a + serial*f*T + (1-serial)*f*math.Max(0, T-a/((1-serial)*f))
			read := B * P * float64(m.KVBytesPerToken()) / bw
			attn := L * 2 * float64(m.Heads*m.HeadDim) * (B*N*N + 2*B*N*P) / (g.BF16TFLOPS * 1e9)
			cached := 0.0
			if r.m.cached > 0 {
				cached = L * B
			}
			act := L * float64(m.Hidden+m.FFN) * T / (g.BF16TFLOPS * 1e9)
			readWork := B * P * float64(m.KVBytesPerToken()) / (g.BF16TFLOPS * 1e9)
			px = append(px, []float64{L, attn, cached, act, readWork})
			py = append(py, r.m.ms)
			known = append(known, roof+read)
		}
		pc, err := weightedLeastSquares(px, py, known)
		if err != nil {
			continue // a singular system: no fit at this point
		}
		if pc[1] <= 0 || pc[3] < 0 || pc[4] < 0 {
			continue
		}
		cand := c
		cand.MatmulEff, cand.SerialFrac, cand.PrefillLayerMs, cand.AttnEff, cand.CachedSeqLayerMs = eff, serial, pc[0], 1/pc[1], pc[2]
		cand.ActFLOPs, cand.ReadFLOPs = pc[3], pc[4]
		worst := 0.0
		for i := range px {
			worst = math.Max(worst, math.Abs(dot(px[i], pc)+known[i]-py[i])/py[i])
		}
		if worst < best.MaxError {
			cand.MaxError = worst
			*best = cand
		}
	}
}

// weightedLeastSquares minimises Σ((x·c + k − y)/y)²: relative error against y with a
// known part k of each row's time.
func weightedLeastSquares(x [][]float64, y, k []float64) ([]float64, error) {
	// Scale each row by 1/y so the plain normal equations weigh relative error.
	sx := make([][]float64, len(x))
	sy := make([]float64, len(x))
	for i := range x {
		sx[i] = make([]float64, len(x[i]))
		for j := range x[i] {
			sx[i][j] = x[i][j] / y[i]
		}
		sy[i] = (y[i] - k[i]) / y[i]
	}
	ones := make([]float64, len(x))
	for i := range ones {
		ones[i] = 1
	}
	return leastSquares(sx, sy, ones)
}

// profile maps a card's data sheet and a model's shape through the calibration onto the
// Profile's terms, for tp GPUs in tensor parallel. Every term is bytes or FLOPs divided
// by a calibrated rate, or a calibrated fixed cost per layer:
//
//	decode base  = layers·DecodeLayerMs + weights/(MemEff·bandwidth)
//	per sequence = (layer and LM-head FLOPs)/(DecodeFlopEff·BF16 rate) + allreduce
//	per cached token read = KV bytes per token/(MemEff·bandwidth)
//	prefill      = layers·PrefillLayerMs + max(weights/(MemEff·bw), T·FLOPs/(MatmulEff·rate))
//	               + T·activation bytes/(MemEff·bw) + causal attention FLOPs/(AttnEff·rate)
//
// The max is the Profile's knee: below it a prefill is bound by reading the weights.
func (c Calibration) profile(g GPUSpec, m ModelShape, tp int) *Profile {
	T := float64(tp)
	bw := c.MemEff * g.MemTBs * g.memShare() * 1e9 // bytes per ms, per GPU
	rate := g.BF16TFLOPS * g.matmulShare() * 1e9   // FLOPs per ms, per GPU
	// The decoder layers' matrix multiplies: at the FP8 tensor rate for an FP8 checkpoint
	// on a card that has one (the LM head, attention and the rest stay 16-bit).
	mm := rate
	if m.FP8 && g.FP8TFLOPS > 0 {
		mm = g.FP8TFLOPS * g.matmulShare() * 1e9
	}
	L := float64(m.Layers)
	weights := m.WeightBytes() / T
	kv := float64(m.kvBytesPerGPU(tp))
	// Two allreduces per layer (after attention and after the MLP) of one token's hidden
	// state (bf16) each, as a ring does: 2(tp−1)/tp of it over each GPU's link one way.
	allreduce := 0.0
	if tp > 1 {
		linkBytesPerMs := c.MemEff * g.LinkGBs / 2 * 1e6
		allreduce = L * 2 * 2 * (T - 1) / T * float64(m.Hidden) * 2 / linkBytesPerMs
	}
	a := weights / bw
	f := m.tokenFLOPs()/T/(c.MatmulEff*mm) + allreduce
	score := L * float64(m.Heads) / T * c.DecodeScoreMs
	if c.RateTFLOPS > 0 {
		score *= math.Pow(c.RateTFLOPS/g.BF16TFLOPS, c.ScoreRateExp)
	}
	quad := L * 2 * float64(m.Heads*m.HeadDim) / T / (c.AttnEff * rate)
	return &Profile{
		DecodeBaseMs:       L*c.DecodeLayerMs + a,
		DecodePerSeqMs:     (m.tokenFLOPs()/mm+m.headFLOPs()/rate)/T/c.DecodeFlopEff + allreduce,
		DecodePerCtxMs:     kv/bw + score,
		DecodeLogBatchMs:   L * c.DecodeLogBatchLayerMs,
		PrefillBaseMs:      L*c.PrefillLayerMs + a,
		PrefillPerTokenMs:  c.SerialFrac*f + c.ActFLOPs*L*(float64(m.Hidden)+float64(m.FFN)/T)/rate,
		PrefillKneeTokens:  int(math.Round(a / ((1 - c.SerialFrac) * f))),
		PrefillPastKneeMs:  (1 - c.SerialFrac) * f,
		PrefillQuadMs:      quad,
		PrefillCachedMs:    2 * quad,
		PrefillReadMs:      kv/bw + c.ReadFLOPs*kv/rate,
		PrefillCachedSeqMs: L * c.CachedSeqLayerMs,
	}
}

// kvBytesPerGPU is one token's KV on each of tp GPUs: the KV heads split among them, or
// each GPU holding a copy of one where there are fewer heads than GPUs (as vLLM does).
func (m ModelShape) kvBytesPerGPU(tp int) int {
	heads := max(1, (m.KVHeads+tp-1)/tp)
	return 2 * m.Layers * heads * m.HeadDim * m.kvByte()
}

// vLLM's defaults (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults, 0.11): on a GPU
// with 70 GiB or more whose name does not contain "a100", max_num_seqs 1024 and
// max_num_batched_tokens 8192 for the OpenAI server; elsewhere 256 and 2048.
func vllmBatchDefaults(g GPUSpec, usableGiB float64) (maxSeqs, maxTokens int) {
	if usableGiB >= 70 && !strings.HasPrefix(g.Name, "a100") {
		return 1024, 8192
	}
	return 256, 2048
}

// minKVTokens is the least KV cache a generated profile accepts: one step's full token
// budget of the smaller vLLM default (or the model's context, if shorter). A card whose
// cache holds less is no serving engine for the model.
const minKVTokens = 2048

// vllmReserveGiB is what vLLM's start-up profiling keeps from the KV cache on each GPU
// beside the weights (engine/public/vllm_memory.md §1): the activation peak of its dummy
// run, which the sampler sets (fp32 logits over the vocabulary for max_num_seqs sequences,
// and its temporaries: samplerCopies of them), and the memory outside PyTorch (the CUDA
// context; NCCL's buffers too with tensor parallelism).
//
// samplerCopies is fitted on one logged start-up (Llama-3.1-8B-Instruct on an H100, TP 1,
// 1,024 sequences: a 4.76 GiB activation peak, llm-d-benchmark's empirical-vllm-memory-
// results.md) and predicts the others logged there within 2 % (Qwen3-32B 5.64 GiB,
// gpt-oss-120b 7.38, Llama-3.3-70B-FP8 at TP 2 4.84) and vLLM PR #10511's Meta-Llama-3-8B
// at 256 sequences within 6 % (1.26 GiB): TestVLLMReserveAgainstLoggedStartups. The flat
// 4 GiB it replaces (the measured profiles' figure) kept a third of a 24 GB card's cache
// from a 7B model.
func vllmReserveGiB(m ModelShape, maxSeqs, tp int) float64 {
	const samplerCopies = 9.73
	logits := float64(maxSeqs) * float64(m.Vocab) * 4 / (1 << 30)
	nonTorch := 0.15 // GiB: 0.13-0.14 logged at TP 1
	if tp > 1 {
		nonTorch = 0.55 // logged at TP 2
	}
	return samplerCopies*logits + nonTorch
}

// Generate returns the modelled profile of model m on tp GPUs of type g (tp 0: the fewest
// of 1, 2, 4 or 8 whose KV cache holds min(context, 8,192) tokens, or else the fewest that
// hold minKVTokens), with KV capacity from the card's memory less the weights and vLLM's
// reserve at gpu_memory_utilization 0.9. It fails, saying why, where the model fits no such
// machine.
func Generate(g GPUSpec, m ModelShape, tp int, c Calibration) (*Profile, error) {
	usable := c.UsablePerGB * g.MemGB
	maxSeqs, maxTokens := vllmBatchDefaults(g, usable)
	kvTokens := func(tp int) int {
		free := 0.9*usable - m.WeightBytes()/float64(tp)/(1<<30) - vllmReserveGiB(m, maxSeqs, tp)
		return int(free * (1 << 30) / float64(m.kvBytesPerGPU(tp)))
	}
	if tp == 0 {
		for _, want := range []int{min(m.Context, 8192), min(m.Context, minKVTokens)} {
			for _, n := range []int{1, 2, 4, 8} {
				if m.Heads%n == 0 && kvTokens(n) >= want {
					tp = n
					break
				}
			}
			if tp > 0 {
				break
			}
		}
		if tp == 0 {
			return nil, fmt.Errorf("%s (%.1f GiB of %s weights) does not fit 8 × %s (%g GB each): at gpu_memory_utilization 0.9, less the weights and %.1f GiB per GPU for activations, the KV cache would hold %d tokens, fewer than the %d a request needs",
				m.Name, m.WeightBytes()/(1<<30), m.precision(), g.Name, g.MemGB, vllmReserveGiB(m, maxSeqs, 8), max(kvTokens(8), 0), min(m.Context, minKVTokens))
		}
	} else {
		if tp < 1 || m.Heads%tp != 0 {
			return nil, fmt.Errorf("%s on %d × %s: tensor parallelism must divide the %d attention heads", m.Name, tp, g.Name, m.Heads)
		}
		if k := kvTokens(tp); k < min(m.Context, minKVTokens) {
			return nil, fmt.Errorf("%s (%.1f GiB of %s weights) does not fit %d × %s (%g GB each): the KV cache would hold %d tokens, fewer than the %d a request needs",
				m.Name, m.WeightBytes()/(1<<30), m.precision(), tp, g.Name, g.MemGB, max(k, 0), min(m.Context, minKVTokens))
		}
	}
	p := c.profile(g, m, tp)
	p.Name, p.GPU, p.Model = g.Name+"-"+m.Name, g.Name, m.Name
	if tp > 1 {
		p.Name, p.GPU = fmt.Sprintf("%sx%d-%s", g.Name, tp, m.Name), fmt.Sprintf("%d × %s", tp, g.Name)
	}
	p.KVTokens = kvTokens(tp)
	p.BlockSize = 16
	p.MaxBatch, p.MaxBatchedTokens = maxSeqs, maxTokens
	// vLLM refuses a max_model_len the cache cannot hold; a user sets it to what fits.
	p.MaxModelLen = min(m.Context, p.KVTokens/p.BlockSize*p.BlockSize)
	p.WeightGiB = m.WeightBytes() / (1 << 30)
	p.Modelled = true
	p.TensorParallel = tp
	p.Source = fmt.Sprintf("generated (modelled, not measured) from the %s data sheet and %s's config.json with efficiencies calibrated on %s", g.Name, m.Name, c.From)
	if g.MAMFTFLOPS > 0 {
		p.Source += fmt.Sprintf("; matrix multiplies at %.1f %% of the data sheet's rate as measured (%s)", 100*g.MAMFTFLOPS/g.BF16TFLOPS, mamfSource)
	}
	return p, p.Validate()
}

// measuredRows reads the embedded measurements of one card for every model shape in them.
func measuredRows(card string) ([]calRow, float64, error) {
	file := measuredCards[card]
	g, err := LookupGPU(card)
	if err != nil {
		return nil, 0, err
	}
	data, err := measured.ReadFile("profiles/" + file + ".csv")
	if err != nil {
		return nil, 0, err
	}
	infoData, err := measured.ReadFile("profiles/" + file + ".info.json")
	if err != nil {
		return nil, 0, err
	}
	var info struct {
		MemGiB float64 `json:"mem_gib"`
	}
	if err := json.Unmarshal(infoData, &info); err != nil {
		return nil, 0, err
	}
	var out []calRow
	for _, name := range []string{"llama-3.2-1b", "llama-3.1-8b"} {
		m, err := LookupModel(name)
		if err != nil {
			return nil, 0, err
		}
		rows, err := parseMeasurements(bytes.NewReader(data), name)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", file, err)
		}
		for _, r := range rows {
			out = append(out, calRow{gpu: g, model: m, m: r})
		}
	}
	return out, info.MemGiB / g.MemGB, nil
}

// CalibrateOn fits a Calibration to the measured rows of the named cards (h100, h200).
func CalibrateOn(cards ...string) (Calibration, error) {
	var rows []calRow
	var usable float64
	var files []string
	for _, card := range cards {
		if _, ok := measuredCards[card]; !ok {
			return Calibration{}, fmt.Errorf("no measurements of %q: want h100 or h200", card)
		}
		r, u, err := measuredRows(card)
		if err != nil {
			return Calibration{}, err
		}
		rows = append(rows, r...)
		usable += u / float64(len(cards))
		files = append(files, "shared/data/gpu_profiles/"+measuredCards[card]+".csv")
	}
	c, err := calibrate(rows, strings.Join(files, " and "))
	c.UsablePerGB = usable
	return c, err
}

// scoreRateExp is the calibration's ScoreRateExp: eager attention's score cost is work at
// the card's compute rate, as the prefill's non-matmul work (ActFLOPs) is. Chosen on the
// public measurements of other cards (engine/public): with a fixed cost instead (0), the
// L40S is modelled 19–46 % faster relative to the H100 than TensorRT-LLM runs it (median
// 25 %); with 1, 9–30 % (median 19 %), the L4, A100s and H200 within 21 %.
// TestModelAgainstPublicMeasurements chooses it again without each GPU type's rows.
const scoreRateExp = 1.0

// RowError is one measured row against the profile a calibration generates for its card.
type RowError struct {
	GPU, Model, Phase     string
	Batch, Tokens, Cached int
	MeasuredMs, ModelMs   float64
}

// Err is the relative error (model − measured)/measured.
func (r RowError) Err() float64 { return (r.ModelMs - r.MeasuredMs) / r.MeasuredMs }

// LeaveOneOut calibrates on the measured card from and predicts every measured row of card
// to: how far the model carries to a card it was not fitted to.
func LeaveOneOut(from, to string) ([]RowError, error) {
	c, err := CalibrateOn(from)
	if err != nil {
		return nil, err
	}
	rows, _, err := measuredRows(to)
	if err != nil {
		return nil, err
	}
	var out []RowError
	for _, r := range rows {
		p := c.profile(r.gpu, r.model, 1)
		out = append(out, RowError{GPU: to, Model: r.model.Name, Phase: r.m.phase, Batch: r.m.batch, Tokens: r.m.tokens,
			Cached: r.m.cached, MeasuredMs: r.m.ms, ModelMs: predictRow(p, r.m)})
	}
	return out, nil
}

// pairName splits a profile name GPU[xN]-MODEL (l4-llama-3.1-8b, h100x4-llama-3.1-70b).
var tpSuffix = regexp.MustCompile(`^(.+?)x([0-9]+)$`)

func parsePair(name string) (GPUSpec, ModelShape, int, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	n, fp8 := strings.CutSuffix(n, fp8Suffix)
	for _, m := range models {
		gpuPart, ok := strings.CutSuffix(n, "-"+m.Name)
		if !ok || gpuPart == "" {
			continue
		}
		tp := 0
		if sm := tpSuffix.FindStringSubmatch(gpuPart); sm != nil {
			if _, err := LookupGPU(gpuPart); err != nil {
				gpuPart = sm[1]
				tp, _ = strconv.Atoi(sm[2])
				if tp < 1 {
					return GPUSpec{}, ModelShape{}, 0, fmt.Errorf("profile %q: tensor parallelism x%s: want 1 or more", name, sm[2])
				}
			}
		}
		g, err := LookupGPU(gpuPart)
		if err != nil {
			return GPUSpec{}, ModelShape{}, 0, fmt.Errorf("profile %q: %w", name, err)
		}
		if fp8 {
			m = m.fp8()
		}
		return g, m, tp, nil
	}
	return GPUSpec{}, ModelShape{}, 0, fmt.Errorf("profile %q: want GPU-MODEL with a model of %s (e.g. l4-llama-3.1-8b, h100x4-llama-3.1-70b), one of the measured %s, or a .json file",
		name, strings.Join(ModelNames(), ", "), strings.Join(ProfileNames(), ", "))
}

// generated is LoadProfile for a pair that was not measured: the profile Generate gives
// with the calibration fitted to both measured cards, carrying its leave-one-out error.
func generated(name string) (*Profile, error) {
	g, m, tp, err := parsePair(name)
	if err != nil {
		return nil, err
	}
	cal, err := bothCards()
	if err != nil {
		return nil, err
	}
	c, loo := cal.c, cal.loo
	p, err := Generate(g, m, tp, c)
	if err != nil {
		return nil, fmt.Errorf("profile %q: %w", name, err)
	}
	p.Name, p.MaxFitError, p.ModelError = strings.ToLower(strings.TrimSpace(name)), c.MaxError, loo
	p.Source += fmt.Sprintf("; error: at most %.0f %% per measured row fitted, %.0f %% predicting either measured card from the other", 100*c.MaxError, 100*loo)
	return p, nil
}

// bothCards is the calibration fitted to both measured cards and its leave-one-out error,
// fitted once: a fit takes some tenths of a second, and the control plane asks for the
// profile of every GPU it is offered at every placement.
var bothCards = sync.OnceValues(func() (struct {
	c   Calibration
	loo float64
}, error) {
	var out struct {
		c   Calibration
		loo float64
	}
	var err error
	if out.c, err = CalibrateOn("h100", "h200"); err != nil {
		return out, err
	}
	out.loo, err = LeaveOneOutWorst()
	return out, err
})

// LeaveOneOutWorst is the largest per-row error of LeaveOneOut both ways between the
// measured cards.
func LeaveOneOutWorst() (float64, error) {
	worst := 0.0
	for _, pair := range [][2]string{{"h100", "h200"}, {"h200", "h100"}} {
		rows, err := LeaveOneOut(pair[0], pair[1])
		if err != nil {
			return 0, err
		}
		for _, r := range rows {
			worst = math.Max(worst, math.Abs(r.Err()))
		}
	}
	return worst, nil
}

// CheckProfileName reports whether name is a profile a router can run: measured, or a
// pair that Generate can make (a .json file is for replicasim alone, since a replica's
// description reaches routers over the network).
func CheckProfileName(name string) error {
	if strings.HasSuffix(name, ".json") {
		return fmt.Errorf("profile %q: a file is for replicasim only; name a measured profile (%s) or a GPU-MODEL pair such as l4-llama-3.1-8b",
			name, strings.Join(ProfileNames(), ", "))
	}
	_, err := LoadProfile(name)
	return err
}

// ProfileOn names the profile of a model on another GPU: model is a profile name (its
// model is taken: h100-llama-3.1-8b gives llama-3.1-8b), a short model name or a Hugging
// Face id; accelerator a GPU as the catalogs or profiles name it (L4, a100-80gb). The name
// leaves the number of GPUs to Generate (the fewest that hold the model), since a machine
// with several GPUs may run a small model on one. It fails when either is unknown.
func ProfileOn(accelerator, model string) (string, error) {
	g, err := LookupGPU(accelerator)
	if err != nil {
		return "", err
	}
	m, err := LookupModel(model)
	if err != nil {
		_, pm, _, perr := parsePair(model)
		if perr != nil {
			return "", err
		}
		m = pm
	}
	return g.Name + "-" + m.Name, nil
}
