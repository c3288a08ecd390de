package engine

import (
	"fmt"
	"slices"
	"testing"
)

// Tensor parallelism against public measurements (issue 48): TensorRT-LLM 0.14.0's offline
// throughput of Llama 3.1 70B on 4 and 8 H100s (FP16, FP8) and A100-SXM4-80GBs (FP16)
// (engine/public/serving_70b.csv, TRTLLM_PERF_V014), replayed on the modelled profile of
// each machine at the source's request counts, the model's throughput over the published
// one. Absolute, against an engine faster than the calibration's eager kernels (the measured
// H100's 8B profile runs at 0.74–1.03 of TensorRT-LLM's on one GPU). TP 2 is left out: the
// model sizes the KV cache as vLLM does (0.9 of memory, less its sampler's reserve), which
// on two 80 GB cards leaves 70B's bf16 weights almost none (vLLM refuses it at 2,048
// tokens), where TensorRT-LLM ran it. Held where it stands (2026-11-29): each machine's
// median error within 25 % (11–22 %), every row within 50 %; the long answers on 8 GPUs are modelled up
// to 1.5× fast (allreduce latency is not modelled, and it grows with the GPUs).
func TestTensorParallelAgainstTensorRTLLM(t *testing.T) {
	skipUnderRace(t)
	if testing.Short() {
		t.Skip("replays 48 offline batches")
	}
	pub := map[string]float64{}
	for _, r := range loadPublic(t, "serving_70b.csv") {
		if r.source == "TRTLLM_PERF_V014" {
			pub[fmt.Sprintf("%s|%s|%d|%d|%d", r.gpu, r.precision, r.tp, r.in, r.out)] = r.value
		}
	}
	cal, err := bothCards()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, set := range []struct{ label, gpu, precision, suffix string }{
		{"H100-80GB-HBM3", "h100", "FP16", ""}, {"H100-80GB-HBM3", "h100", "FP8", fp8Suffix}, {"A100-SXM4-80GB", "a100-80gb", "FP16", ""},
	} {
		for _, tp := range []int{4, 8} {
			machine := fmt.Sprintf("%sx%d", set.gpu, tp)
			var ratios []float64
			var checks []pubCheck
			for _, sh := range trtShapes {
				v := pub[fmt.Sprintf("%s|%s|%d|%d|%d", set.label, set.precision, tp, sh[0], sh[1])]
				if v == 0 {
					t.Fatalf("TRTLLM_PERF_V014: no %s %s TP %d figure at %d:%d", set.label, set.precision, tp, sh[0], sh[1])
				}
				p := modelProfile(t, cal.c, machine, "llama-3.1-70b"+set.suffix, 1024, 8192)
				r := offline(t, p, sh[0], sh[1], trtRequests[sh]) / v
				ratios = append(ratios, r)
				checks = append(checks, pubCheck{gpu: machine, ratio: r})
			}
			n += len(ratios)
			e := errorsByGPU(checks)[machine]
			med, worst := e[0], e[1]
			t.Logf("%s × %d %s: model ÷ published %.2f–%.2f, median error %.0f %%, worst %.0f %%", set.gpu, tp, set.precision, slices.Min(ratios), slices.Max(ratios), 100*med, 100*worst)
			if med > 0.25 || worst > 0.50 {
				t.Errorf("%s × %d %s: median error %.0f %%, worst %.0f %%; held at 25 %% and 50 %%", set.gpu, tp, set.precision, 100*med, 100*worst)
			}
		}
	}
	if n != 48 {
		t.Errorf("%d comparisons, want 48", n)
	}
}
