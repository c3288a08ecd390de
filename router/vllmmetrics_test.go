package router

import (
	"math"
	"strings"
	"testing"
)

const vllmSample = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="weird}name"} 0.42
vllm:kv_cache_usage_perc{engine="1",model_name="x"} 0.2 1700000000000
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m"} 5
python_gc_objects_collected_total{generation="0"} 1.0
`

func TestParseEngineGauges(t *testing.T) {
	g := ParseEngineGauges([]byte(vllmSample))
	if !g.Found || g.Running != 15 || g.Waiting != 4 || g.KVUsage != 0.42 {
		t.Fatalf("got %+v", g)
	}
	if g := ParseEngineGauges([]byte("# nothing\nfoo 1\n")); g.Found {
		t.Fatalf("found gauges in non-vLLM text: %+v", g)
	}
	// An unrelated metric may say anything: vLLM's own histograms carry NaN quantiles.
	if g := ParseEngineGauges([]byte("vllm:some_summary{quantile=\"0.5\"} NaN\nvllm:num_requests_running 2\n")); g.Invalid != "" || g.Running != 2 {
		t.Fatalf("an unrelated NaN refused the scrape: %+v", g)
	}
}

// A /metrics that lies about the gauges the router reads (issue 35) is refused whole, with
// the reason and the sample that said it.
func TestParseEngineGaugesRefusesLies(t *testing.T) {
	for _, tc := range []struct{ text, reason, detail string }{
		{"vllm:num_requests_running{engine=\"0\"} -3.0\n", "negative", "vllm:num_requests_running -3.0 is negative"},
		{"vllm:num_requests_running 1\nvllm:kv_cache_usage_perc NaN\n", "not_a_number", "vllm:kv_cache_usage_perc NaN"},
		{"vllm:kv_cache_usage_perc +Inf\n", "not_a_number", "+Inf"},
		{"vllm:gpu_cache_usage_perc 42\n", "too_large", "over 1"},
		{"vllm:num_requests_waiting 2.5\n", "fractional", "2.5"},
		{"vllm:num_requests_waiting 1e300\n", "too_large", "1e300"},
		{"vllm:num_requests_running{engine=\"0\"} 1000000\nvllm:num_requests_running{engine=\"1\"} 1000000\n", "too_large", "summed"},
		{"vllm:num_requests_running lots\n", "not_a_number", "lots"},
	} {
		g := ParseEngineGauges([]byte(vllmSample + tc.text))
		if g.Invalid != tc.reason || !strings.Contains(g.Detail, tc.detail) || g.Found || g.Running != 0 || g.KVUsage != 0 {
			t.Errorf("ParseEngineGauges(...%q) = %+v; want it refused as %s naming %q", tc.text, g, tc.reason, tc.detail)
		}
	}
}

func FuzzParseEngineGauges(f *testing.F) {
	f.Add([]byte(vllmSample))
	f.Add([]byte("vllm:num_requests_running{a=\"\\\"}\"} 1\n"))
	f.Fuzz(func(t *testing.T, text []byte) {
		g := ParseEngineGauges(text)
		if g.Running < 0 || g.Waiting < 0 || g.KVUsage < 0 || g.KVUsage > 1 || g.Running > maxEngineRequests || g.Waiting > maxEngineRequests ||
			g.Running != math.Trunc(g.Running) || g.Waiting != math.Trunc(g.Waiting) || g.KVUsage != g.KVUsage || (g.Invalid != "" && g.Found) {
			t.Fatalf("impossible gauges %+v", g)
		}
	})
}
