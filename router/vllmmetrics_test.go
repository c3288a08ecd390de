package router

import (
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
	if g := ParseEngineGauges([]byte("vllm:num_requests_running NaN\nvllm:num_requests_waiting -1\n")); g.Found {
		t.Fatalf("accepted NaN or negative: %+v", g)
	}
}

func FuzzParseEngineGauges(f *testing.F) {
	f.Add([]byte(vllmSample))
	f.Add([]byte("vllm:num_requests_running{a=\"\\\"}\"} 1\n"))
	f.Fuzz(func(t *testing.T, text []byte) {
		g := ParseEngineGauges(text)
		if g.Running < 0 || g.Waiting < 0 || g.KVUsage < 0 || g.Running != g.Running {
			t.Fatalf("impossible gauges %+v", g)
		}
	})
}
