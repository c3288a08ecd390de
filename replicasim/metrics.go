package replicasim

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-serve/arbiter/engine"
)

// metrics are vLLM's own names and types (vLLM v1 engine), labelled model_name and engine,
// so anything that scrapes a real vLLM scrapes the simulator unchanged.
type metrics struct {
	ttft, itl, e2e          *prometheus.HistogramVec
	promptTokens, genTokens *prometheus.CounterVec
	requestSuccess          *prometheus.CounterVec
}

// Bucket bounds as vLLM defines them (vllm/v1/metrics/loggers.py).
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets  = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	e2eBuckets  = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// newMetrics registers vLLM's metrics; the engine's gauges and prefix-cache counters are
// read from stats at scrape time so they can never disagree with the engine.
func newMetrics(reg prometheus.Registerer, model string, stats func() engine.Stats) *metrics {
	labels := []string{"model_name", "engine"}
	constLabels := prometheus.Labels{"model_name": model, "engine": "0"}
	gf := func(name, help string, f func(engine.Stats) float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: constLabels},
			func() float64 { return f(stats()) }))
	}
	cf := func(name, help string, f func(engine.Stats) float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: constLabels},
			func() float64 { return f(stats()) }))
	}
	h := func(name, help string, b []float64) *prometheus.HistogramVec {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b}, labels)
		reg.MustRegister(v)
		return v
	}
	c := func(name, help string, extra ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append(labels, extra...))
		reg.MustRegister(v)
		return v
	}
	gf("vllm:num_requests_running", "Number of requests in model execution batches.", func(s engine.Stats) float64 { return float64(s.Running) })
	gf("vllm:num_requests_waiting", "Number of requests waiting to be processed.", func(s engine.Stats) float64 { return float64(s.Waiting) })
	gf("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", func(s engine.Stats) float64 { return s.KVUsage })
	cf("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", func(s engine.Stats) float64 { return float64(s.PrefixQueries) })
	cf("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", func(s engine.Stats) float64 { return float64(s.PrefixHits) })
	cf("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", func(s engine.Stats) float64 { return float64(s.Preemptions) })
	m := &metrics{
		ttft:           h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		itl:            h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets),
		e2e:            h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2eBuckets),
		promptTokens:   c("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		genTokens:      c("vllm:generation_tokens_total", "Number of generation tokens processed."),
		requestSuccess: c("vllm:request_success_total", "Count of successfully processed requests.", "finished_reason"),
	}
	// Pre-create the series so a fresh replica exposes them at zero, as vLLM does.
	m.promptTokens.With(constLabels)
	m.genTokens.With(constLabels)
	return m
}
