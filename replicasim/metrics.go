package replicasim

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-serve/arbiter/engine"
)

// metrics are vLLM's own families (vLLM 0.11, vllm/v1/metrics/loggers.py,
// PrometheusStatLogger): the same names, types, label names and buckets, so anything that
// scrapes a real vLLM scrapes the simulator unchanged. The families 0.11 hides by default
// (vllm:gpu_cache_usage_perc, vllm:gpu_prefix_cache_*, vllm:time_per_output_token_seconds)
// are left out, as a default vLLM leaves them out.
type metrics struct {
	ttft, itl, e2e                    prometheus.Observer
	queue, prefill, decode, inference prometheus.Observer
	reqTPOT                           prometheus.Observer
	reqPrompt, reqGen, reqMaxGen      prometheus.Observer
	paramsN, paramsMaxTokens, iterTok prometheus.Observer
	promptTokens, genTokens           prometheus.Counter
	requestSuccess                    *prometheus.CounterVec
	model                             string
}

// Bucket bounds as vLLM defines them (vllm/v1/metrics/loggers.py).
var (
	ttftBuckets    = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets     = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	latencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	nBuckets       = []float64{1, 2, 5, 10, 20}
	iterBuckets    = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}
)

// buckets125 is vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, … up to max.
func buckets125(max int) []float64 {
	var b []float64
	for exp := 1.0; ; exp *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if m*exp > float64(max) {
				return b
			}
			b = append(b, m*exp)
		}
	}
}

// finishReasons are vLLM's FinishReason values, whose request_success series exist from start.
var finishReasons = []string{"stop", "length", "abort"}

// newMetrics registers vLLM's metrics; the engine's gauges and prefix-cache counters are
// read from stats at scrape time, so they are current at every scrape (vLLM sets them every
// step) and can never disagree with the engine.
func newMetrics(reg prometheus.Registerer, model string, maxModelLen int, cache map[string]string, stats func() engine.Stats) *metrics {
	constLabels := prometheus.Labels{"model_name": model, "engine": "0"}
	gf := func(name, help string, f func(engine.Stats) float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: constLabels},
			func() float64 { return f(stats()) }))
	}
	cf := func(name, help string, f func(engine.Stats) float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: constLabels},
			func() float64 { return f(stats()) }))
	}
	h := func(name, help string, b []float64) prometheus.Observer {
		v := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b, ConstLabels: constLabels})
		reg.MustRegister(v)
		return v
	}
	c := func(name, help string) prometheus.Counter {
		v := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: constLabels})
		reg.MustRegister(v)
		return v
	}
	gf("vllm:num_requests_running", "Number of requests in model execution batches.", func(s engine.Stats) float64 { return float64(s.Running) })
	gf("vllm:num_requests_waiting", "Number of requests waiting to be processed.", func(s engine.Stats) float64 { return float64(s.Waiting) })
	gf("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", func(s engine.Stats) float64 { return s.KVUsage })
	cf("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", func(s engine.Stats) float64 { return float64(s.PrefixQueries) })
	cf("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", func(s engine.Stats) float64 { return float64(s.PrefixHits) })
	cf("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", func(s engine.Stats) float64 { return float64(s.Preemptions) })
	info := prometheus.Labels{"engine": "0"}
	for k, v := range cache {
		info[k] = v
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig", ConstLabels: info},
		func() float64 { return 1 }))
	tokBuckets := buckets125(maxModelLen)
	m := &metrics{
		model:           model,
		ttft:            h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		itl:             h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets),
		reqTPOT:         h("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", itlBuckets),
		e2e:             h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", latencyBuckets),
		queue:           h("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", latencyBuckets),
		prefill:         h("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", latencyBuckets),
		decode:          h("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", latencyBuckets),
		inference:       h("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", latencyBuckets),
		reqPrompt:       h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokBuckets),
		reqGen:          h("vllm:request_generation_tokens", "Number of generation tokens processed.", tokBuckets),
		reqMaxGen:       h("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.", tokBuckets),
		paramsMaxTokens: h("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokBuckets),
		paramsN:         h("vllm:request_params_n", "Histogram of the n request parameter.", nBuckets),
		iterTok:         h("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", iterBuckets),
		promptTokens:    c("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		genTokens:       c("vllm:generation_tokens_total", "Number of generation tokens processed."),
	}
	m.requestSuccess = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: constLabels}, []string{"finished_reason"})
	reg.MustRegister(m.requestSuccess)
	for _, r := range finishReasons {
		m.requestSuccess.WithLabelValues(r) // exist at zero from start, as vLLM's do
	}
	return m
}

// cacheInfo is the simulated engine's CacheConfig as vllm:cache_config_info labels it.
func cacheInfo(p *engine.Profile) map[string]string {
	info := map[string]string{"cache_dtype": "auto", "enable_prefix_caching": "True", "gpu_memory_utilization": "0.9"}
	if p != nil {
		info["block_size"] = strconv.Itoa(p.BlockSize)
		info["num_gpu_blocks"] = strconv.Itoa(p.KVTokens / p.BlockSize)
	}
	return info
}

// requestTimes are one engine request's moments, for vLLM's per-phase histograms.
type requestTimes struct {
	arrival, scheduled, first, last time.Time
}

// finished records one engine request at its end, as vLLM records each finished request
// (loggers.py record(): finished_requests). request_max_num_generation_tokens is the
// client request's, once for its n engine requests: see generation.record.
func (m *metrics) finished(t requestTimes, prompt, generated, maxTokens int, maxTokensSet bool, reason string, now time.Time) {
	m.requestSuccess.WithLabelValues(reason).Inc()
	m.e2e.Observe(now.Sub(t.arrival).Seconds())
	if !t.scheduled.IsZero() {
		m.queue.Observe(t.scheduled.Sub(t.arrival).Seconds())
		end := t.last
		if end.IsZero() {
			end = now
		}
		m.inference.Observe(end.Sub(t.scheduled).Seconds())
		if !t.first.IsZero() {
			m.prefill.Observe(t.first.Sub(t.scheduled).Seconds())
			m.decode.Observe(end.Sub(t.first).Seconds())
		}
	}
	// A request's mean time per output token, its decode time over the tokens after the
	// first (vllm/v1/metrics/stats.py update_from_finished_request: 0 for one token or none).
	tpot := 0.0
	if generated > 1 && !t.first.IsZero() && !t.last.IsZero() {
		tpot = t.last.Sub(t.first).Seconds() / float64(generated-1)
	}
	m.reqTPOT.Observe(tpot)
	m.reqPrompt.Observe(float64(prompt))
	m.reqGen.Observe(float64(generated))
	if maxTokensSet {
		m.paramsMaxTokens.Observe(float64(maxTokens))
	}
}
