// Package router is Arbiter's data plane: an OpenAI-compatible reverse proxy that picks a
// replica per request (by predicted latency and marginal cost), forwards the request over
// pooled connections, streams the answer back event by event, and accounts for tokens.
//
// The data path reads top to bottom: proxy.go (request in, pick, retry loop), attempt.go
// (one try on one replica), stream.go (SSE pass-through), account.go (metrics, learning).
package router

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
	"golang.org/x/sync/semaphore"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/internal/conn/connwatch"
	"github.com/arbiter-serve/arbiter/internal/text/tokens"
	"github.com/arbiter-serve/arbiter/oai"
)

// Proxy is the OpenAI-compatible front end. Its exported fields are hooks; nil means the
// documented default.
type Proxy struct {
	cfg      *Config
	pool     *Pool
	met      *Metrics
	log      *slog.Logger
	counter  tokens.Counter
	policies map[string]Policy
	// stripHeaders are the client's credentials, not forwarded to replicas (less those
	// the config's pass_headers lets through).
	stripHeaders []string
	// Now is the clock (default time.Now).
	Now func() time.Time
	// ControlPlane, when set, lets requests for a service with no ready replica wait for
	// one (scale from zero) instead of being refused.
	ControlPlane *ControlPlane
	// Load counts per-model load for the control plane's autoscaler.
	Load *LoadTracker
	// keys, when set, are required of every /v1 request (Authorization: Bearer KEY).
	keys atomic.Pointer[Keys]
	held atomic.Int64
	// queuePoll is how long a queued request goes without looking for room unless told
	// (0: holdPoll); a test lengthens it to show that room is told, not polled for.
	queuePoll time.Duration
	// responses remembers which replica produced each Responses API answer (responses.go).
	responses responseOwners
	watcher   clientWatcher

	parsers fastjson.ParserPool
	// largeBodies budgets the bytes of large bodies parsed at once (max_parse_bytes).
	largeBodies *semaphore.Weighted
	largeBudget int64
	// bodies budgets the bytes of large request bodies held at once (max_body_buffer_bytes).
	bodies *semaphore.Weighted
	// bodyBufs holds buffers for bodies that came whole with their headers.
	bodyBufs sync.Pool
	rngs     sync.Pool
	// adminClient calls replicas' management endpoints (vLLM's /v1/load_lora_adapter);
	// adapterLoads learns how long a load takes.
	adminClient  *fasthttp.Client
	adapterLoads loadTimes
	// queues hold the requests a saturated fleet has no room for (queue.go).
	queues queues
}

// NewProxy wires a proxy over a pool.
func NewProxy(cfg *Config, pool *Pool, met *Metrics, log *slog.Logger) (*Proxy, error) {
	counter, err := tokens.New(cfg.Tokenizer)
	if err != nil {
		return nil, err
	}
	px := &Proxy{cfg: cfg, pool: pool, met: met, log: log, counter: counter, Now: time.Now, policies: map[string]Policy{}, Load: &LoadTracker{},
		largeBudget: parseBudget(cfg), responses: newResponseOwners(),
		// Idle connections go before a replica's own keep-alive closes them (vLLM's 5 s).
		adminClient: &fasthttp.Client{NoDefaultUserAgentHeader: true, MaxResponseBodySize: 1 << 20, MaxIdleConnDuration: cfg.UpstreamIdleTimeout}}
	px.largeBodies = semaphore.NewWeighted(px.largeBudget)
	px.bodies = semaphore.NewWeighted(int64(cfg.MaxBodyBufferBytes))
	for _, h := range []string{"Authorization", "Proxy-Authorization", "Cookie"} {
		if !slices.ContainsFunc(cfg.PassHeaders, func(p string) bool { return strings.EqualFold(p, h) }) {
			px.stripHeaders = append(px.stripHeaders, h)
		}
	}
	for _, name := range []string{"slo_cheapest", "least_load", "round_robin"} {
		p, err := NewPolicy(name, pool.aff, 3*cfg.ScrapeInterval)
		if err != nil {
			return nil, err
		}
		if sc, ok := p.(*SLOCheapest); ok {
			sc.ResampleEvery = cfg.ResampleEvery
			if sc.ResampleEvery == 0 {
				sc.ResampleEvery = -1 // off
			}
			sc.OnPick = func(r *Replica, reason string) { met.picks.WithLabelValues(r.Info().Model, reason).Inc() }
		}
		px.policies[name] = p
	}
	px.bodyBufs.New = func() any { b := make([]byte, prefetchedBody); return &b }
	// New runs concurrently from every handler that finds the pool empty.
	var seed atomic.Uint64
	px.rngs.New = func() any {
		return rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), seed.Add(1)))
	}
	met.budgets.px.Store(px)
	return px, nil
}

// Handle is the fasthttp handler for the client-facing port.
func (px *Proxy) Handle(ctx *fasthttp.RequestCtx) {
	defer func() {
		if v := recover(); v != nil {
			// A bug must cost one request, not the router; in-flight counts are released by
			// the attempt's own defers.
			px.recovered(ctx, v)
		}
	}()
	if px.refuseFraming(ctx) {
		return
	}
	path := string(ctx.Path())
	kind, routed := kindFor(path)
	var key *Key
	if routed || strings.HasPrefix(path, "/v1/") {
		// vLLM's paths outside /v1 (rerank, score, pooling, tokenize…) run models too.
		var ok bool
		if key, ok = px.keys.Load().authenticate(ctx); !ok {
			px.met.fail("unauthenticated", "")
			return
		}
	}
	switch {
	case routed:
		px.forward(ctx, kind, key)
	case path == "/v1/models":
		px.models(ctx)
	case path == "/health":
		ctx.SetStatusCode(fasthttp.StatusOK)
	case strings.HasPrefix(path, "/v1/models/"):
		px.model(ctx, path)
	case strings.HasPrefix(path, "/v1/responses/"):
		px.storedResponse(ctx, path)
	default:
		px.unknownPath(ctx, path)
	}
}

// keyDone ends one admitted request of a key (nil: no authentication) for service ("": not
// known): its concurrency slot and its count by status code.
func (px *Proxy) keyDone(k *Key, service string, code int) {
	if k == nil {
		return
	}
	k.done()
	px.met.keyRequests.WithLabelValues(k.Name, service, strconv.Itoa(code)).Inc()
}

// SetKeys replaces the client API keys (nil: no authentication); requests already in
// flight keep counting against their key's concurrency limit.
func (px *Proxy) SetKeys(ks *Keys) {
	ks.carryOver(px.keys.Load())
	px.keys.Store(ks)
}

// ErrorHandler answers errors fasthttp raises before the handler (oversized or malformed
// requests) in OpenAI's error shape.
func ErrorHandler(ctx *fasthttp.RequestCtx, err error) {
	status := fasthttp.StatusBadRequest
	msg := "malformed HTTP request: " + err.Error()
	var ne net.Error
	if _, nothingRead := err.(*net.OpError); nothingRead && errors.As(err, &ne) && ne.Timeout() {
		// A connection that sent nothing before read_timeout: fasthttp would answer it,
		// but an idle client is owed no response, least of all an unsolicited 400 its
		// next request would read. Close it; the response written after goes nowhere.
		_ = ctx.Conn().Close()
		return
	}
	if errors.As(err, &ne) && ne.Timeout() {
		status, msg = fasthttp.StatusRequestTimeout, "request not received within read_timeout"
	} else if _, ok := err.(*fasthttp.ErrSmallBuffer); ok {
		status, msg = fasthttp.StatusRequestHeaderFieldsTooLarge, "request headers too large"
	} else if err == fasthttp.ErrBodyTooLarge {
		status, msg = fasthttp.StatusRequestEntityTooLarge, "request body too large"
	}
	oai.WriteError(ctx, status, oai.InvalidRequest, msg)
}

// servedModels is what the endpoint serves: the models of ready replicas and, with a
// control plane, those its services declare (a service at zero replicas still serves its
// model: a request for it is held while a replica starts).
func (px *Proxy) servedModels() []string {
	models := px.pool.Models()
	for _, a := range px.cfg.Adapters {
		if slices.Contains(models, a.Base) && !slices.Contains(models, a.Name) {
			models = append(models, a.Name)
		}
	}
	if px.ControlPlane != nil {
		for _, m := range px.ControlPlane.Models() {
			if !slices.Contains(models, m) {
				models = append(models, m)
			}
		}
		slices.Sort(models)
	}
	return models
}

func (px *Proxy) models(ctx *fasthttp.RequestCtx) {
	b := []byte(`{"object":"list","data":[`)
	for i, m := range px.servedModels() {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = strconv.AppendQuote(b, m)
		b = append(b, `,"object":"model","owned_by":"arbiter"`...)
		if a, _, ok := px.adapterFor(m); ok {
			// As vLLM lists an adapter: its base model as parent.
			b = append(b, `,"parent":`...)
			b = strconv.AppendQuote(b, cmp.Or(a.Parent, a.Base))
		}
		b = append(b, '}')
	}
	b = append(b, "]}"...)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// call is one client request's state across attempts. It outlives the handler when the
// response streams, so it holds copies, never the RequestCtx.
type call struct {
	kind  oai.Kind
	model string
	// adapter is the LoRA adapter model names (nil: none).
	adapter    *fleet.Adapter
	stream     bool
	stripUsage bool // we added include_usage; the client must not see the usage chunk
	body       []byte
	route      Request
	slo        SLO
	policy     string // the service's routing policy; "" = the router's default
	start      time.Time
	// deadline bounds the wait for a replica to take the request: held through a cold
	// start, tried and retried (request_timeout, or the client's X-Arbiter-Deadline-Ms).
	// Once a replica has it, progress bounds it instead (first byte, stream idle).
	deadline time.Time
	// clientDeadline is the client's own X-Arbiter-Deadline-Ms (zero: none), which bounds
	// the whole answer, streamed or not, however it progresses.
	clientDeadline time.Time
	tried          []*Replica
	key            *Key          // nil without authentication
	streaming      bool          // a stream writer owns the rest of the call
	outBounded     bool          // the client set max_tokens: the generation's length is bounded
	firstByte      time.Duration // this attempt's wait for the response header
	lastUpstream   int           // status of the last 502/503 kept as the answer of last resort
	load           *modelLoad    // the model's load counters for the autoscaler
	watch          clientWatch
	triedBuf       [4]*Replica
	// pinned is the only replica that may take the request: the one that stored the
	// response it continues (prevResponse, its previous_response_id); nil: any.
	pinned       *Replica
	prevResponse string
	// service serves model (for metrics; "" when no service is known to).
	service string
	// path is the request's path; api what its replica's model must serve ("": any).
	path string
	api  string
	// notServed: replicas of the model are ready, but none serves the API.
	notServed  bool
	servingBuf []*Replica
	// ownBuf holds an adapter's own replicas and its base model's (callCandidates).
	ownBuf []*Replica
	// band is the request's priority band (capped: lower than its headers asked for),
	// tenant and weight its key's (queue.go).
	band   Band
	capped bool
	tenant string
	weight float64
	// queue is the service queue that charged the request's tenant (charge: how much,
	// expected), until its answer settles it; onBegin runs once the request has begun on
	// a replica (the queue's next head then tries).
	queue   *serviceQueue
	charge  float64
	onBegin func()
	// endKick is the queue settle kicked, to kick again once the replica's End has run.
	endKick *serviceQueue
	// overGate: the queue sent c past the gate, for room lower bands held (overLower).
	overGate bool
	// svcTenants are the service's own bands and weights per tenant (arbiter.tenants).
	svcTenants []fleet.TenantBand
	// queueCfg is the service's queue as the control plane set it (nil: the router's).
	queueCfg *QueueConfig
	// queued is how long the request waited in the router's queue: the client waited it
	// too, so its SLO is judged with it (the replica's model learns without it).
	queued time.Duration
}

func (px *Proxy) forward(ctx *fasthttp.RequestCtx, kind oai.Kind, key *Key) {
	if !ctx.IsPost() {
		oai.WriteError(ctx, fasthttp.StatusMethodNotAllowed, oai.InvalidRequest, "use POST")
		return
	}
	if !key.admit(ctx) {
		px.met.fail("key_limited", "")
		px.met.keyRequests.WithLabelValues(key.label(), "", "429").Inc() // refused before its body (and model) is read
		return
	}
	var c *call
	defer func() {
		// A stream's end is counted by its writer (CloseWithError), which outlives this.
		if c == nil {
			px.keyDone(key, "", ctx.Response.StatusCode())
		} else if !c.streaming {
			px.keyDone(key, c.service, ctx.Response.StatusCode())
			c.settle(0, 0) // answered without an account (a failed send): the charge stands
		}
	}()
	body, ok := px.readBody(ctx)
	if !ok {
		return
	}
	defer func() {
		// Retries are over once the handler returns (the replica has had the request): a
		// streaming call keeps no body.
		if c != nil {
			c.body = nil
		}
		px.releaseBody(body)
	}()
	c, ok = px.newCall(ctx, kind, body.b)
	if !ok {
		return
	}
	c.key = key
	ceiling, keyed, weight := serviceBand(key, c.svcTenants)
	band, capped, err := requestBand(ceiling, keyed, ctx.Request.Header.Peek)
	if err != nil {
		badRequest(err.Error()).writeTo(ctx)
		return
	}
	c.band, c.capped, c.tenant, c.weight = band, capped, tenantOf(key), weight
	px.givePriority(c)
	if px.overBudget(ctx, c) {
		return
	}
	if c.prevResponse != "" && !px.pin(ctx, c, c.prevResponse) {
		return
	}
	policy, f := px.policyFor(c, ctx.Request.Header.Peek("X-Arbiter-Policy"))
	if f != nil {
		f.writeTo(ctx)
		return
	}
	rng := px.rngs.Get().(*rand.Rand)
	defer px.rngs.Put(rng)
	load := px.Load.get(c.model)
	c.load = load
	load.requests.Add(1)
	var heldFor time.Duration // how long it waited for a replica to be ready
	for attempt := 0; attempt < px.cfg.MaxAttempts; attempt++ {
		now := px.Now()
		if !now.Before(c.deadline) {
			break
		}
		c.route.Now, c.route.Tried = now, c.tried
		px.resolveAdapter(c)
		cands := px.callCandidates(c)
		if len(c.tried) == 0 && !anyUsable(&c.route, cands) && px.ControlPlane != nil && px.ControlPlane.Knows(c.model) {
			heldFrom := px.Now()
			if !px.hold(ctx, c, load) {
				return
			}
			c.route.Now = px.Now()
			heldFor = c.route.Now.Sub(heldFrom)
			c.route.Late = HeldLate(c.route.SLO, heldFor) && !px.queueing(c, policy)
			cands = px.callCandidates(c)
		}
		if c.adapter != nil {
			c.route.AdapterLoad = px.adapterLoads.expect()
		}
		all := cands
		if cands = servingCandidates(cands, c.api, &c.servingBuf); len(cands) == 0 && len(all) > 0 {
			c.notServed = true
			break
		}
		var r *Replica
		if attempt == 0 && len(cands) > 0 && px.queueing(c, policy) {
			if r = px.admitQueued(ctx, c, policy, rng); r == nil {
				return // answered: 429, or the client left
			}
		} else if c.route.Late {
			var ok bool
			if r, ok = px.awaitRoom(ctx, c, policy, rng, load, heldFor); !ok {
				return // answered: its deadline, or the client left
			}
		} else {
			r = policy.Pick(&c.route, cands, rng)
		}
		c.route.Late = false // a retry goes wherever it can
		if c.pinned != nil {
			// Only the replica that stored the response can continue it.
			r = nil
			if attempt == 0 && c.pinned.Available(now) {
				r = c.pinned
			}
		}
		if r == nil {
			break
		}
		c.tried = append(c.tried, r)
		c.route.Tried = c.tried
		if attempt > 0 {
			px.met.retries.WithLabelValues(c.service).Inc()
		}
		// A replica's 502/503 is hidden only when another replica can still be tried.
		mayRetry := attempt+1 < px.cfg.MaxAttempts && anyUsable(&c.route, cands) && c.pinned == nil
		if px.attempt(ctx, c, r, mayRetry) {
			return
		}
	}
	if !c.notServed && c.api != "" && len(c.tried) > 0 {
		// The replicas tried may have refused the API: none left that serves it.
		all := px.pool.candidates(c.pickModel())
		c.notServed = len(all) > 0 && len(servingCandidates(all, c.api, &c.servingBuf)) == 0
	}
	switch {
	case c.notServed:
		px.notServed(ctx, c, len(px.pool.candidates(c.pickModel())))
	case c.lastUpstream != 0:
		// The replica's own 502/503 is already in the response: pass it through.
		px.met.request(c.pickModel(), c.tried[len(c.tried)-1], c.lastUpstream)
	case !px.Now().Before(c.deadline):
		px.met.fail("deadline", c.service)
		oai.WriteError(ctx, fasthttp.StatusGatewayTimeout, oai.Timeout, "request deadline exceeded before a replica answered")
	case len(c.tried) > 0:
		px.met.fail("all_attempts_failed", c.service)
		oai.WriteError(ctx, fasthttp.StatusBadGateway, oai.ServerError, fmt.Sprintf("all %d attempts failed before a response", len(c.tried)))
	default:
		px.met.fail("no_replica", c.service)
		oai.WriteError(ctx, fasthttp.StatusServiceUnavailable, oai.Unavailable, fmt.Sprintf("no ready replica for model %q", c.model))
	}
}

// policyFor is the policy that routes c: the service's, or the router's default, unless the
// request names one (X-Arbiter-Policy, for experiments).
func (px *Proxy) policyFor(c *call, named []byte) (Policy, *refusal) {
	policy := px.policies[px.cfg.Policy]
	if c.policy != "" {
		policy = px.policies[c.policy]
	}
	if len(named) > 0 {
		p, ok := px.policies[string(named)]
		if !ok {
			return nil, badRequest(fmt.Sprintf("X-Arbiter-Policy %q: want slo_cheapest, least_load or round_robin", named))
		}
		policy = p
	}
	return policy, nil
}

// holdRetryAfter is the Retry-After, in seconds, of a request whose hold ran out: a vLLM
// replica takes 30 s to minutes to start, so a retry sooner would most likely be held again.
const holdRetryAfter = 15

// holdPoll bounds how long a held request goes without re-checking its client and the
// pool (an ejected replica's re-admission does not signal Changed).
const holdPoll = 250 * time.Millisecond

// hold keeps a request while its service has no ready replica: it wakes the control plane
// and waits for a replica, the request's deadline, or the client leaving. It returns false
// when it has answered the client itself.
func (px *Proxy) hold(ctx *fasthttp.RequestCtx, c *call, load *modelLoad) bool {
	if px.held.Add(1) > int64(px.cfg.MaxHeld) {
		px.held.Add(-1)
		px.met.fail("hold_queue_full", c.service)
		oai.WriteError(ctx, fasthttp.StatusServiceUnavailable, oai.Unavailable,
			fmt.Sprintf("model %q is starting and %d requests already wait for it; retry shortly", c.model, px.cfg.MaxHeld))
		return false
	}
	load.held.Add(1)
	px.met.held.WithLabelValues(c.service).Inc()
	start := px.Now()
	defer func() {
		px.held.Add(-1)
		load.held.Add(-1)
		px.met.held.WithLabelValues(c.service).Dec()
		px.met.holdWait.WithLabelValues(c.pickModel(), c.service).Observe(px.Now().Sub(start).Seconds())
	}()
	for {
		px.ControlPlane.Wake(c.model)
		changed := px.pool.Changed()
		now := px.Now()
		px.resolveAdapter(c)
		if anyUsable(&Request{Now: now}, px.callCandidates(c)) {
			return true
		}
		if !px.ControlPlane.Knows(c.model) {
			// Its service was deleted while the request waited.
			px.met.fail("no_replica", c.service)
			oai.WriteError(ctx, fasthttp.StatusServiceUnavailable, oai.Unavailable, fmt.Sprintf("the service of model %q was removed", c.model))
			return false
		}
		if !now.Before(c.deadline) {
			// The service is still starting: a 503 with Retry-After is what clients retry
			// (the OpenAI SDKs do, honouring the header); a 504 reads as a server fault.
			px.met.fail("hold_deadline", c.service)
			oai.WriteError(ctx, fasthttp.StatusServiceUnavailable, oai.Unavailable,
				fmt.Sprintf("model %q is starting: no replica became ready within the %s this request could wait; retry shortly", c.model, now.Sub(start).Round(time.Second)))
			ctx.Response.Header.Set("Retry-After", strconv.Itoa(holdRetryAfter))
			return false
		}
		if connwatch.PeerClosed(ctx.Conn()) {
			px.met.fail("client_gone", c.service)
			ctx.SetConnectionClose()
			return false
		}
		t := time.NewTimer(min(holdPoll, c.deadline.Sub(now)))
		select {
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}

// HeldLate reports whether a request held for heldFor has passed its SLO's TTFT target
// (Request.Late). The simulator models the router's holds by it.
func HeldLate(slo SLO, heldFor time.Duration) bool {
	return slo.TTFT > 0 && heldFor.Seconds() >= slo.TTFT
}

// LateWait is how long a late request held for heldFor waits for room, with toDeadline
// left before its deadline: no longer than it was held, nor than half that time, so that
// sent then it is served late, not refused at its deadline for want of room.
func LateWait(heldFor, toDeadline time.Duration) time.Duration {
	return min(heldFor, toDeadline/2)
}

// awaitRoom picks a replica with room for a late request (Request.Late), held for heldFor,
// waiting in the router while none has, counted as held: fresh requests go first, and the
// backlog a hold leaves follows as room comes. After heldFor more (or half the time to its
// deadline, if less) it is picked as any request is (nil when no replica is usable: the
// caller answers as it would have). ok is false when it has answered the client (its
// deadline passed, or the client left).
func (px *Proxy) awaitRoom(ctx *fasthttp.RequestCtx, c *call, policy Policy, rng *rand.Rand, load *modelLoad, heldFor time.Duration) (r *Replica, ok bool) {
	start := px.Now()
	limit := LateWait(heldFor, c.deadline.Sub(start))
	px.held.Add(1)
	load.held.Add(1)
	px.met.held.WithLabelValues(c.service).Inc()
	defer func() {
		px.held.Add(-1)
		load.held.Add(-1)
		px.met.held.WithLabelValues(c.service).Dec()
	}()
	for {
		changed := px.pool.Changed()
		now := px.Now()
		c.route.Now = now
		px.resolveAdapter(c)
		cands := servingCandidates(px.callCandidates(c), c.api, &c.servingBuf)
		if now.Sub(start) >= limit {
			c.route.Late = false
			return policy.Pick(&c.route, cands, rng), true
		}
		if len(cands) > 0 {
			if r := policy.Pick(&c.route, cands, rng); r != nil {
				return r, true
			}
		}
		if !now.Before(c.deadline) {
			px.met.fail("hold_deadline", c.service)
			oai.WriteError(ctx, fasthttp.StatusServiceUnavailable, oai.Unavailable,
				fmt.Sprintf("model %q was starting: this request, held past its TTFT target, waited %s more for a replica with room; retry shortly", c.model, now.Sub(start).Round(time.Second)))
			ctx.Response.Header.Set("Retry-After", strconv.Itoa(holdRetryAfter))
			return nil, false
		}
		if connwatch.PeerClosed(ctx.Conn()) {
			px.met.fail("client_gone", c.service)
			ctx.SetConnectionClose()
			return nil, false
		}
		px.ControlPlane.Wake(c.model)
		t := time.NewTimer(min(holdPoll, max(limit-now.Sub(start), time.Millisecond)))
		select {
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}

// newCall parses and validates the request; on failure it has answered the client.
func (px *Proxy) newCall(ctx *fasthttp.RequestCtx, kind oai.Kind, body []byte) (*call, bool) {
	c, f := px.parseCall(kind, string(ctx.Path()), string(ctx.Request.Header.ContentType()), body, ctx.Request.Header.Peek)
	if f != nil {
		px.refuse(ctx, f)
		return nil, false
	}
	return c, true
}

// parseCall parses and validates a request of kind at path, whichever front door it came
// through: header reads one of its headers by name ("" when absent). On failure it returns
// the answer the request gets instead.
func (px *Proxy) parseCall(kind oai.Kind, path, contentType string, body []byte, header func(string) []byte) (*call, *refusal) {
	var req oai.Request
	var audio oai.AudioRequest
	var err error
	values, cost := 0, int64(0)
	if kind == oai.Transcription {
		// multipart/form-data: the file is scanned in place, not parsed into a tree.
		if audio, err = oai.ParseAudioRequest(body, contentType); err == nil {
			req = oai.Request{Kind: kind, Model: audio.Model, Stream: audio.Stream, Prompt: audio.Prompt}
		}
	} else {
		values, err = oai.Scan(body, oai.MaxDepth, oai.MaxValues)
		cost = oai.ParseCost(len(body), values) // what parsing it takes in memory
	}
	switch {
	case kind == oai.Transcription:
	case err != nil:
	case cost <= largeParse:
		p := px.parsers.Get()
		req, err = oai.Parse(p, body, kind)
		px.parsers.Put(p)
	default:
		// A parse tree can be a hundred times its body: large parses run a budget's worth
		// at a time, each with a parser of its own that is dropped after, so that neither a
		// flood of them nor the pooled parsers' caches hold that memory.
		if !px.largeBodies.TryAcquire(cost) {
			return nil, &refusal{status: fasthttp.StatusServiceUnavailable, errType: oai.Unavailable, reason: "large_bodies_busy", retryAfter: 1,
				msg: fmt.Sprintf("too many large requests are being parsed at once (max_parse_bytes %d MiB); retry shortly", px.largeBudget>>20)}
		}
		req, err = oai.Parse(&fastjson.Parser{}, body, kind)
		px.largeBodies.Release(cost)
	}
	if err != nil {
		return nil, badRequest(err.Error())
	}
	if req.Model == "" {
		// vLLM serves its only model to a request that names none; so does a router of one.
		models := px.servedModels()
		if len(models) != 1 {
			return nil, badRequest(fmt.Sprintf("'model' is required: this endpoint serves %v", models))
		}
		req.Model = models[0]
	}
	// A model replicas serve is no adapter: only another name is looked for among them
	// (an adapter's own replicas do not count: Pool.HasModel).
	hasModel := px.pool.HasModel(req.Model)
	var adapter fleet.Adapter
	var maxLoRAs int
	isAdapter := false
	if !hasModel {
		adapter, maxLoRAs, isAdapter = px.adapterFor(req.Model)
	}
	if !isAdapter && !hasModel && (px.ControlPlane == nil || !px.ControlPlane.Knows(req.Model)) {
		// Without replicas a standalone router cannot tell an unknown model from one whose
		// replicas are not up yet; with a control plane it can, once it has its services.
		if len(px.pool.Models()) == 0 && (px.ControlPlane == nil || px.ControlPlane.Revision() == 0) {
			return nil, &refusal{status: fasthttp.StatusServiceUnavailable, errType: oai.Unavailable, reason: "no_replica", msg: "no replicas are serving yet"}
		}
		return nil, &refusal{status: fasthttp.StatusNotFound, errType: oai.InvalidRequest, reason: "unknown_model", code: "model_not_found",
			msg: px.unknownModelMsg(req.Model, "")}
	}
	now := px.Now()
	c := &call{kind: kind, model: req.Model, stream: req.Stream, body: body, start: now, slo: px.cfg.SLOFor(req.Model),
		path: path, api: apiOf(kind)}
	c.tried = c.triedBuf[:0]
	if px.ControlPlane != nil {
		// The service's spec, as the control plane published it, outranks the router's config.
		if rt, ok := px.ControlPlane.Routing(req.Model); ok {
			c.service = rt.Service
			if _, known := px.policies[rt.Policy]; known {
				c.policy = rt.Policy
			}
			if rt.SLO != (SLO{}) {
				c.slo = rt.SLO
			}
			c.svcTenants = rt.Tenants
			if q := rt.Queue; q != nil {
				c.queueCfg = &QueueConfig{Enabled: q.Enabled, MaxWait: time.Duration(q.MaxWaitSeconds * float64(time.Second)), SheddableFill: q.SheddableFill, EnginePriority: q.EnginePriority}
			}
		}
	}
	if c.service == "" {
		c.service = px.serviceOfReplicas(req.Model)
	}
	for _, h := range []struct {
		name   string
		target *float64
	}{{"X-Slo-Ttft-Ms", &c.slo.TTFT}, {"X-Slo-Tpot-Ms", &c.slo.TPOT}} {
		if err := tightenSLO(h.target, header(h.name)); err != nil {
			return nil, badRequest(fmt.Sprintf("%s: %v", h.name, err))
		}
	}
	c.deadline = now.Add(px.cfg.RequestTimeout)
	if h := header("X-Arbiter-Deadline-Ms"); len(h) > 0 {
		if ms, err := strconv.Atoi(string(h)); err == nil && ms > 0 {
			c.clientDeadline = now.Add(time.Duration(ms) * time.Millisecond)
			c.deadline = minTime(c.deadline, c.clientDeadline)
		}
	}
	c.prevResponse = req.PreviousResponseID
	// A Responses stream always ends with its usage (response.completed).
	if req.Stream && !req.IncludeUsage && (kind == oai.Chat || kind == oai.Completion) {
		// Ask for the usage chunk so every stream is accounted; hide it from the client.
		c.body, c.stripUsage = withIncludeUsage(c.body, req.HasStreamOptions), true
	}
	out := req.MaxTokens
	c.outBounded = req.MaxTokensSet && out > 0
	if out == 0 {
		out = px.cfg.DefaultOutputTokens
	}
	if !kind.Generates() {
		out = 0
	}
	key := promptKey(req)
	prompt := px.counter.Count(req.Prompt) + len(req.TokenIDs) + 5*req.Messages + 5
	if req.Pairs > 1 && req.SharedText != "" {
		// A rerank's query (a score's one text_1) is prefilled with each document.
		prompt += (req.Pairs - 1) * px.counter.Count(req.SharedText)
	}
	if kind == oai.Transcription {
		// Whisper's encoder reads 1,500 positions per 30 s window (50 a second); its
		// decoder writes about 3 tokens a second of speech.
		prompt += int(math.Ceil(audio.Seconds * 50))
		out = int(math.Ceil(audio.Seconds * 3))
	}
	seedName := ""
	if isAdapter {
		seedName = adapter.Name
	}
	c.route = Request{Model: req.Model, PromptTokens: prompt,
		OutTokens: out, Prefix: prefixBlocks(key, prefixSeed(seedName, req.CacheSalt)), SLO: c.slo, Streamed: req.Stream}
	if isAdapter {
		c.adapter = &adapter
		c.route.Adapter, c.route.AdapterStatic, c.route.MaxLoRAs = adapter.Name, adapter.Static, maxLoRAs
	}
	if len(key) > 0 {
		// How many tokens a matched block stands for in this prompt: a cache hit is worth
		// its tokens, and bytes per token vary with the text (and are 4 for token ids).
		c.route.BlockTokens = float64(c.route.PromptTokens) * prefixBlockBytes / float64(len(key))
	}
	return c, nil
}

func badRequest(msg string) *refusal {
	return &refusal{status: fasthttp.StatusBadRequest, errType: oai.InvalidRequest, reason: "bad_request", msg: msg}
}

// tightenSLO applies a client's per-request target (llm-d's x-slo-ttft-ms and
// x-slo-tpot-ms: milliseconds) to one of the service's SLO targets in seconds. A client may
// tighten its own request's target, never loosen the service's: the SLO is what the
// operator pays to meet, and a looser one would let the request onto cheaper replicas at
// other clients' expense.
func tightenSLO(target *float64, h []byte) error {
	if len(h) == 0 {
		return nil
	}
	ms, err := strconv.ParseFloat(string(h), 64)
	if err != nil || !(ms > 0) || math.IsInf(ms, 0) {
		return fmt.Errorf("%q: want a positive number of milliseconds", h)
	}
	if s := ms / 1000; *target <= 0 || s < *target {
		*target = s
	}
	return nil
}

// parseBudget is the memory large parses may take at once: max_parse_bytes, or more if the
// largest body allowed would not fit in it.
func parseBudget(cfg *Config) int64 {
	return max(int64(cfg.MaxParseBytes), oai.ParseCost(cfg.MaxRequestBodyBytes, oai.MaxValues))
}

// largeParse is the estimated parse memory past which a body takes from the large-body
// budget (max_parse_bytes).
const largeParse = 1 << 20

// prefixBlockBytes is the prefix-affinity block: about 64 tokens of text.
const prefixBlockBytes = 256

// maxPrefixBlocks bounds the hashing work per request (128 KiB of prompt, about 32k
// tokens: hashing it takes microseconds, and a conversation's turns share that much).
const maxPrefixBlocks = 512

// promptKey is what prefix affinity hashes: the prompt's text, or its token ids as bytes
// (four per id, so a block of ids covers about as many tokens as a block of text).
func promptKey(req oai.Request) string {
	if len(req.TokenIDs) == 0 {
		return req.Prompt
	}
	n := min(len(req.TokenIDs), maxPrefixBlocks*prefixBlockBytes/4)
	b := make([]byte, 0, 4*n)
	for _, id := range req.TokenIDs[:n] {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	return string(b)
}

// prefixSeed keys a prompt's prefix hashes as vLLM keys its KV blocks: a LoRA adapter's
// KV is its own (the adapter's id is in every block's hash: vllm/v1/core/kv_cache_utils.py
// _gen_lora_extra_hash_keys) and a request's cache_salt is in its first block's, so the
// chain (generate_block_hash_extra_keys). 0, the base model's unsalted prompts, keeps their
// hashes as they were.
func prefixSeed(adapter, salt string) uint64 {
	if adapter == "" && salt == "" {
		return 0
	}
	d := xxhash.New()
	_, _ = d.WriteString(adapter)
	_, _ = d.Write([]byte{0})
	_, _ = d.WriteString(salt)
	return d.Sum64() | 1
}

// prefixBlocks returns chained hashes of the prompt's full leading blocks, the chain
// started from seed (prefixSeed).
func prefixBlocks(prompt string, seed uint64) []uint64 {
	n := min(len(prompt)/prefixBlockBytes, maxPrefixBlocks)
	if n == 0 {
		return nil
	}
	out := make([]uint64, n)
	prev := seed
	for i := range n {
		blk := prompt[i*prefixBlockBytes : (i+1)*prefixBlockBytes]
		prev = xxhash.Sum64String(blk) ^ mix(prev+uint64(i))
		out[i] = prev
	}
	return out
}

// withIncludeUsage returns body with stream_options.include_usage set to true. Without a
// stream_options object it splices one in after the opening brace (no re-encoding);
// otherwise it re-encodes the object with the field set.
func withIncludeUsage(body []byte, hasStreamOptions bool) []byte {
	if !hasStreamOptions {
		for i, ch := range body {
			if ch == '{' {
				out := make([]byte, 0, len(body)+40)
				out = append(out, body[:i+1]...)
				out = append(out, `"stream_options":{"include_usage":true},`...)
				rest := body[i+1:]
				// An empty object would leave a trailing comma: "{}" cannot be a valid
				// request (it has no model), but keep the JSON valid regardless.
				for _, r := range rest {
					if r == ' ' || r == '\n' || r == '\t' || r == '\r' {
						continue
					}
					if r == '}' {
						out = out[:len(out)-1]
					}
					break
				}
				return append(out, rest...)
			}
		}
		return body
	}
	var p fastjson.Parser
	v, err := p.ParseBytes(body)
	if err != nil {
		return body
	}
	so := v.Get("stream_options")
	so.Set("include_usage", fastjson.MustParse("true"))
	return v.MarshalTo(nil)
}

// givePriority gives a generating request its band as vLLM's priority field where its
// service (or the router) asks for the engines' priority (queue.engine_priority).
func (px *Proxy) givePriority(c *call) {
	if px.queueOf(c).EnginePriority && c.kind.Generates() {
		c.body = withPriority(c.body, c.band)
	}
}

// withPriority returns body with vLLM's priority field set to the request's band (critical
// 0, standard 1, sheddable 2: lower is served first under --scheduling-policy priority),
// outranking any the client sent: a client may lower its band by header, never raise it,
// and a priority of its own in the body would do just that in the engine. The field is
// spliced in as the object's last key, without parsing the body again (it was parsed,
// within the large-body budget, as the request came in): JSON readers that keep duplicate
// keys keep the last one (Python's json, which vLLM's server reads bodies with; replicasim
// reads it the same way), so the client's own, wherever it stands, is overruled.
func withPriority(body []byte, b Band) []byte {
	const space = " \t\r\n"
	end := len(bytes.TrimRight(body, space)) - 1 // the closing brace
	if end < 1 || body[end] != '}' {
		return body // not an object: parsed once already, a replica will say what is wrong
	}
	out := make([]byte, 0, len(body)+16)
	out = append(out, body[:end]...)
	if inner := bytes.TrimRight(body[:end], space); len(inner) > 0 && inner[len(inner)-1] != '{' {
		out = append(out, ',')
	}
	out = append(out, `"priority":`...)
	out = strconv.AppendInt(out, int64(b), 10)
	return append(out, body[end:]...)
}

// serviceOfReplicas is the service of model's replicas, for metrics where no control plane
// names it (a router with a replicas file); "" when none says.
func (px *Proxy) serviceOfReplicas(model string) string {
	for _, r := range px.pool.candidates(model) {
		if s := r.Info().Service; s != "" {
			return s
		}
	}
	return ""
}
