package router

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-serve/arbiter/fleet"
)

// Metrics are the router's Prometheus metrics (namespace arbiter, subsystem router).
type Metrics struct {
	requests *prometheus.CounterVec // model, service, replica, code
	errors   *prometheus.CounterVec // reason, service
	retries  *prometheus.CounterVec // service
	// firstByteExtended: waits for a whole response extended because the replica's
	// engine was still making progress when the first-byte timeout ran out.
	firstByteExtended prometheus.Counter
	ejections         *prometheus.CounterVec   // replica
	rejected          *prometheus.CounterVec   // replica, source, reason
	tokens            *prometheus.CounterVec   // model, service, replica, provider, region, capacity, accelerator, type
	audioSeconds      *prometheus.CounterVec   // model, service, replica
	slo               *prometheus.CounterVec   // model, service, result
	ttft              *prometheus.HistogramVec // model
	itl               *prometheus.HistogramVec // model
	e2e               *prometheus.HistogramVec // model
	predicted         *prometheus.HistogramVec // model: predicted TTFT
	predErr           *prometheus.HistogramVec // model: measured − predicted TTFT
	picks             *prometheus.CounterVec   // model, reason
	adapterLoads      *prometheus.CounterVec   // service, result
	adapterRequests   *prometheus.CounterVec   // service, adapter, code
	adapterTokens     *prometheus.CounterVec   // service, adapter, type
	keyRequests       *prometheus.CounterVec   // key, service, code
	keyTokens         *prometheus.CounterVec   // key, service, type
	held              *prometheus.GaugeVec     // service
	queueWaiting      *prometheus.GaugeVec     // service, band
	queueWait         *prometheus.HistogramVec // service, tenant, band
	queueRejected     *prometheus.CounterVec   // service, tenant, band, reason
	tenantTokens      *prometheus.CounterVec   // service, tenant, band, type
	tenantDollars     *prometheus.CounterVec   // service, tenant
	holdWait          *prometheus.HistogramVec // model, service
	replicaInfo       *replicaCollector
	budgets           *budgetCollector
	// gone: replicas that left the set, and when (forgetGone).
	goneMu sync.Mutex
	gone   map[string]time.Time
	models sync.Map // model → *modelSeries, for the service it is served under
	// modelsByService holds a model's series under any other service (model\x00service).
	modelsByService sync.Map
}

var latencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120}

// NewMetrics registers the router's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	ns, sub := "arbiter", "router"
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, labels)
		reg.MustRegister(v)
		return v
	}
	hv := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help, Buckets: buckets}, labels)
		reg.MustRegister(v)
		return v
	}
	m := &Metrics{
		requests:  cv("requests_total", "Requests answered, by model, service, replica and HTTP status code.", "model", "service", "replica", "code"),
		errors:    cv("errors_total", "Requests that failed in the router, by reason and service (empty where the router failed the request before it knew its service: an unauthenticated or malformed request, a model no service serves).", "reason", "service"),
		ejections: cv("ejections_total", "Passive ejections of a replica after consecutive failures.", "replica"),
		rejected: cv("replica_reports_rejected_total", "Numbers a replica reported that the router refused and dropped, by replica, source (usage: a response's token counts; metrics: a /metrics scrape) and reason (negative, fractional, too_large, not_a_number, not_an_object, inconsistent; for metrics also too_big, the body over its limit).",
			"replica", "source", "reason"),
		tokens: cv("tokens_total", "Tokens served, from each response's usage; accelerator is the replica's GPU type (its placement, or its replicas-file label; one per replica).",
			"model", "service", "replica", "provider", "region", "capacity", "accelerator", "type"),
		audioSeconds:    cv("audio_seconds_total", "Seconds of audio transcribed or translated, from each response's usage (vLLM's TranscriptionUsageAudio, which counts no tokens).", "model", "service", "replica"),
		keyRequests:     cv("key_requests_total", "Requests per client API key (its name, never the key), by service and HTTP status code.", "key", "service", "code"),
		keyTokens:       cv("key_tokens_total", "Tokens served per client API key and service, from each response's usage.", "key", "service", "type"),
		slo:             cv("slo_requests_total", "Requests by whether they met their model's latency SLO.", "model", "service", "result"),
		ttft:            hv("time_to_first_token_seconds", "Time to first token as the router saw it.", latencyBuckets, "model", "service"),
		itl:             hv("inter_token_latency_seconds", "Mean gap between streamed tokens of a request.", latencyBuckets, "model", "service"),
		e2e:             hv("e2e_request_latency_seconds", "Request latency as the router saw it.", latencyBuckets, "model", "service"),
		adapterRequests: cv("adapter_requests_total", "Requests answered per LoRA adapter (its service's declared adapters only: the series are bounded by the spec), by HTTP status code.", "service", "adapter", "code"),
		adapterTokens:   cv("adapter_tokens_total", "Tokens served per LoRA adapter, from each response's usage: with the service's spend, the chargeback per fine-tune (arbiter:adapter_dollars).", "service", "adapter", "type"),
		adapterLoads:    cv("adapter_loads_total", "LoRA adapters this router asked replicas to load (vLLM's /v1/load_lora_adapter) by result: loaded (or found loaded), refused (the replica's error: the adapter's files), failed (the replica could not be asked); and those it asked to unload (/v1/unload_lora_adapter) once serve update took them out: unloaded, unload_failed.", "service", "result"),
		picks:           cv("picks_total", "slo_cheapest's picks by reason: cheapest (predicted to meet the SLO and to start the request at once), queued (every replica predicted to meet it has prompts queued: the least loaded), fastest (none predicted to meet it), resample (a cheaper replica predicted to miss, tried again).", "model", "reason"),
		predicted:       hv("predicted_ttft_seconds", "TTFT predicted for streamed requests, on the replica that served them (compare with ttft_seconds).", latencyBuckets, "model", "service"),
		predErr: hv("ttft_prediction_error_seconds", "Measured minus predicted TTFT of streamed requests.",
			[]float64{-5, -1, -0.5, -0.2, -0.1, -0.05, -0.02, 0, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 5}, "model", "service"),
	}
	m.held = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "held_requests", Help: "Requests waiting because their service has no ready replica (scale from zero), by service."}, []string{"service"})
	reg.MustRegister(m.held)
	m.holdWait = hv("hold_wait_seconds", "How long requests waited for a replica of a service scaled to zero.", latencyBuckets, "model", "service")
	m.queueWaiting = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "queue_waiting_requests", Help: "Requests waiting in the router's queue because no replica has room for them (queue.enabled), by service and priority band."}, []string{"service", "band"})
	reg.MustRegister(m.queueWaiting)
	m.queueWait = hv("queue_wait_seconds", "How long requests waited in the router's queue (queue.enabled) before a replica took them, 0 for those a replica took at once, by service, tenant and priority band.", latencyBuckets, "service", "tenant", "band")
	m.queueRejected = cv("queue_rejected_total", "Requests the router's queue answered 429 (or that left), by service, tenant, priority band and reason: timeout (waited to its SLO's TTFT target, queue.max_wait or its deadline), shed (a more urgent request took its place), full (queue.max_waiting), client_gone.", "service", "tenant", "band", "reason")
	m.tenantTokens = cv("tenant_tokens_total", "Tokens served per tenant (an API key, or the keys that name one tenant) and priority band, from each response's usage.", "service", "tenant", "band", "type")
	m.tenantDollars = cv("tenant_dollars_total", "Dollars tenants spent through this router: each answer's tokens at its replica's price per token (hourly price over throughput).", "service", "tenant")
	m.retries = cv("retries_total", "Attempts retried on another replica before the first response byte, by service.", "service")
	m.firstByteExtended = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "first_byte_extensions_total",
		Help: "Waits for a replica's response header extended by another first-byte timeout because the replica's engine was still progressing (its token counters moved): long non-streamed generations."})
	reg.MustRegister(m.firstByteExtended)
	m.budgets = &budgetCollector{
		spend: prometheus.NewDesc("arbiter_router_tenant_spend_dollars", "A tenant's spend in its budget's period (a UTC day or calendar month), fleet-wide as the control plane last answered plus what this router counted since; only tenants with a budget.", []string{"tenant", "period"}, nil),
		limit: prometheus.NewDesc("arbiter_router_tenant_budget_dollars", "A tenant's budget for its period: soft (an alert) and hard (its new requests refused with 429).", []string{"tenant", "period", "limit"}, nil),
	}
	reg.MustRegister(m.budgets)
	m.replicaInfo = &replicaCollector{
		inflight: prometheus.NewDesc("arbiter_router_in_flight_requests", "Requests this router has open on a replica.", []string{"service", "replica"}, nil),
		load:     prometheus.NewDesc("arbiter_router_predicted_load", "Predicted requests in the replica's engine (running + waiting).", []string{"service", "replica"}, nil),
		calib: prometheus.NewDesc("arbiter_router_replica_step_scale", "What the router's model of the replica multiplies its profile's step times by, learned from the replica's answers (1: as profiled), by part: prefill or decode.",
			[]string{"replica", "profile", "part"}, nil),
		avail: prometheus.NewDesc("arbiter_router_replica_available", "1 if the replica takes new requests (ready, not ejected, not draining).", []string{"replica", "provider", "region", "capacity"}, nil),
	}
	reg.MustRegister(m.replicaInfo)
	return m
}

func (m *Metrics) setReplicas(rs []*Replica) {
	m.replicaInfo.mu.Lock()
	prev := m.replicaInfo.replicas
	m.replicaInfo.replicas = rs
	m.replicaInfo.mu.Unlock()
	// A replica's token and request series exist at 0 from the moment it joins, so that
	// its first answer counts in increase() and rate() (a series first seen at its first
	// answer's tokens shows none).
	for _, r := range rs {
		m.replica(r)
		m.knowService(r.Info().Service)
	}
	m.forgetGone(prev, rs, time.Now())
}

// knowService makes a service's held and retried series exist at 0, so that its panels
// show 0 rather than no data, and a first retry counts in rate().
func (m *Metrics) knowService(service string) {
	m.held.WithLabelValues(service)
	m.retries.WithLabelValues(service)
	for b := range numBands {
		m.queueWaiting.WithLabelValues(service, b.String())
	}
}

// goneRetention is how long a removed replica's counters stay exported: long enough for
// every scrape to see their last value (its last requests' tokens), short enough that
// churn does not grow the series without bound.
const goneRetention = 10 * time.Minute

// forgetGone notes the replicas of prev that rs no longer holds, and deletes the
// per-replica series of those that left more than goneRetention ago; one that comes back
// is kept.
func (m *Metrics) forgetGone(prev, rs []*Replica, now time.Time) {
	m.goneMu.Lock()
	defer m.goneMu.Unlock()
	if m.gone == nil {
		m.gone = map[string]time.Time{}
	}
	present := make(map[string]bool, len(rs))
	for _, r := range rs {
		id := r.Info().ID
		present[id] = true
		delete(m.gone, id)
	}
	for _, r := range prev {
		if id := r.Info().ID; !present[id] {
			m.gone[id] = now
		}
	}
	for id, at := range m.gone {
		if now.Sub(at) < goneRetention {
			continue
		}
		for _, v := range []*prometheus.CounterVec{m.requests, m.tokens, m.audioSeconds, m.ejections, m.rejected} {
			v.DeletePartialMatch(prometheus.Labels{"replica": id})
		}
		delete(m.gone, id)
	}
}

// replicaCollector reports per-replica gauges for the current set at scrape time, so a
// removed replica's series disappear with it.
type replicaCollector struct {
	inflight, load, avail, calib *prometheus.Desc
	mu                           sync.Mutex
	replicas                     []*Replica
}

func (c *replicaCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.inflight
	ch <- c.load
	ch <- c.avail
	ch <- c.calib
}

func (c *replicaCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	rs := c.replicas
	c.mu.Unlock()
	now := time.Now()
	for _, r := range rs {
		info := r.Info()
		ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, float64(r.InFlight()), info.Service, info.ID)
		ch <- prometheus.MustNewConstMetric(c.load, prometheus.GaugeValue, r.Load(now, time.Second), info.Service, info.ID)
		a := 0.0
		if r.Available(now) {
			a = 1
		}
		ch <- prometheus.MustNewConstMetric(c.avail, prometheus.GaugeValue, a, info.ID, info.Provider, info.Region, string(info.Capacity))
		prof, prefill, decode := r.StepScales(now)
		ch <- prometheus.MustNewConstMetric(c.calib, prometheus.GaugeValue, prefill, info.ID, prof, "prefill")
		ch <- prometheus.MustNewConstMetric(c.calib, prometheus.GaugeValue, decode, info.ID, prof, "decode")
	}
}

// modelSeries are one model's metric children. Resolving a child hashes its label values
// under the vector's lock; a proxy does that several times per request, so the children are
// resolved once per model (and per replica description, below) and kept.
type modelSeries struct {
	service                            string
	e2e, ttft, itl, predicted, predErr prometheus.Observer
	sloMet, sloMissed                  prometheus.Counter
}

func (m *Metrics) model(name, service string) *modelSeries {
	v, ok := m.models.Load(name)
	if !ok {
		v, _ = m.models.LoadOrStore(name, m.newModelSeries(name, service))
	}
	if s := v.(*modelSeries); s.service == service {
		return s
	}
	// A model served under two service names (a standalone router's replicas, or a model
	// that moved): rare, so its key may cost an allocation.
	key := name + "\x00" + service
	if v, ok := m.modelsByService.Load(key); ok {
		return v.(*modelSeries)
	}
	v, _ = m.modelsByService.LoadOrStore(key, m.newModelSeries(name, service))
	return v.(*modelSeries)
}

func (m *Metrics) newModelSeries(name, service string) *modelSeries {
	return &modelSeries{service: service,
		e2e: m.e2e.WithLabelValues(name, service), ttft: m.ttft.WithLabelValues(name, service), itl: m.itl.WithLabelValues(name, service),
		predicted: m.predicted.WithLabelValues(name, service), predErr: m.predErr.WithLabelValues(name, service),
		sloMet: m.slo.WithLabelValues(name, service, "met"), sloMissed: m.slo.WithLabelValues(name, service, "missed"),
	}
}

// replicaSeries are a replica's metric children for the description they were resolved
// for (its labels: provider, region, capacity…); a new description resolves them again.
type replicaSeries struct {
	info               *fleet.Replica
	ok                 prometheus.Counter // requests answered 200
	prompt, completion prometheus.Counter
}

func (m *Metrics) replica(r *Replica) *replicaSeries {
	info := r.Info()
	if s := r.series.Load(); s != nil && s.info == info {
		return s
	}
	tok := func(typ string) prometheus.Counter {
		return m.tokens.WithLabelValues(info.Model, info.Service, info.ID, info.Provider, info.Region, string(info.Capacity), info.Accelerator, typ)
	}
	s := &replicaSeries{info: info, ok: m.requests.WithLabelValues(info.Model, info.Service, info.ID, "200"), prompt: tok("prompt"), completion: tok("completion")}
	r.series.Store(s)
	return s
}

// request counts one answered request.
func (m *Metrics) request(model string, r *Replica, code int) {
	if s := m.replica(r); code == 200 && s.info.Model == model {
		s.ok.Inc()
		return
	}
	m.requests.WithLabelValues(model, r.Info().Service, r.Info().ID, strconv.Itoa(code)).Inc()
}

// fail counts a request the router failed for reason, under its service ("" where it is not
// known: before the request's model was read, or a model no service serves; never the
// client's own string, which would let a client make series without bound).
func (m *Metrics) fail(reason, service string) { m.errors.WithLabelValues(reason, service).Inc() }
