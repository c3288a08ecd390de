package router

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/oai"
)

// A Handoff is a request routed for a front door that does not forward it itself: a
// Kubernetes gateway asks Arbiter's endpoint picker (package picker) which replica takes
// the request, sends it there, and streams the answer back through the picker. The pick,
// the in-flight counts, the token accounting and the predictor's lessons are the router's
// own, by the same code: one policy behind two front doors.
//
// A Handoff is used by one goroutine at a time: its request's stream of events.
type Handoff struct {
	px  *Proxy
	c   *call // nil: a path the router does not route (see HandoffRequest)
	key *Key
	// picks are the endpoints offered, the first the policy's choice, the rest the order
	// the gateway retries in.
	picks []*Replica
	// r is the replica the request is on as far as the picker knows: the first pick until
	// the gateway says another served it. pred is what r was expected to do with it.
	r     *Replica
	pred  Prediction
	began bool   // r counts the request in flight
	body  []byte // the body to send

	status int
	obs    *streamer // reads a streamed answer (text/event-stream)
	whole  []byte    // a whole answer as it came, up to max_response_body_bytes
	over   bool      // the whole answer was larger than that
	done   bool
}

// HandoffRequest is what a front door knows of a request when it asks for a pick.
type HandoffRequest struct {
	Method, Path, ContentType string
	// Header reads one of the request's headers by name, in any case ("" when absent).
	Header func(name string) []byte
	Body   []byte
	// Subset, when Hinted, are the only endpoints (address "ip:port") that may be picked:
	// the gateway's subset hint. Hinted with none is a hint nothing can satisfy.
	Subset []string
	Hinted bool
	// Endpoints is how many endpoints to return, the pick first and then the gateway's
	// retries in order (0: one).
	Endpoints int
	// HeadersOnly: the body exists but the pick cannot wait for it (a gateway in the
	// STREAMED or NONE body mode routes on the headers' answer). The model comes from
	// ModelHeader (else any model, as in an InferencePool of one model server); the pick
	// is that model's least loaded ready replica, and the answer is not accounted.
	HeadersOnly bool
}

// ModelHeader is where a gateway puts the model of a request whose body it does not hand
// over: GKE Inference Gateway's body-based routing sets it from the body's "model"
// (https://cloud.google.com/kubernetes-engine/docs/how-to/configure-body-based-routing).
const ModelHeader = "X-Gateway-Model-Name"

// Handoff picks the replicas a request goes to, or returns the answer it gets instead. A
// Handoff returned must be closed (Close) once its answer ends or is abandoned.
//
// A path the router routes (POST /v1/chat/completions and the rest) is parsed and picked
// exactly as the router would; any other path (GET /v1/models, a health check through the
// gateway) goes to the least loaded ready replica, unaccounted.
func (px *Proxy) Handoff(in HandoffRequest) (*Handoff, *Refusal) {
	header := in.Header
	if header == nil {
		header = func(string) []byte { return nil }
	}
	kind, routed := kindFor(in.Path)
	key, f := px.keys.Load().lookup(header(fasthttp.HeaderAuthorization))
	if f != nil {
		px.met.fail(f.reason, f.service)
		return nil, f.export()
	}
	if !routed {
		if !passedThrough(in.Path) {
			// As the router answers it: a replica would answer its own 404 (or worse, serve
			// a path Arbiter does not account).
			px.met.fail("unknown_path", "")
			return nil, (&refusal{status: fasthttp.StatusNotFound, errType: oai.NotFound, reason: "unknown_path", msg: unknownPathMsg(in.Method, in.Path)}).export()
		}
		return px.handoffAny(in, "")
	}
	if in.HeadersOnly {
		model := string(header(ModelHeader))
		if a, _, ok := px.adapterFor(model); ok && a.Base != "" {
			// An adapter's replicas are its base model's. Without the body the pick is not
			// accounted, and nothing loads a run-time adapter first (docs/lora.md).
			model = a.Base
		}
		if model != "" && !px.pool.HasModel(model) {
			f := &refusal{status: fasthttp.StatusNotFound, errType: oai.InvalidRequest, reason: "unknown_model", code: "model_not_found",
				msg: px.unknownModelMsg(model, " (the gateway's "+ModelHeader+" header)")}
			px.met.fail(f.reason, "")
			return nil, f.export()
		}
		return px.handoffAny(in, model)
	}
	if in.Method != fasthttp.MethodPost {
		return nil, (&refusal{status: fasthttp.StatusMethodNotAllowed, errType: oai.InvalidRequest, msg: "use POST", reason: "bad_request"}).export()
	}
	if f := key.take(); f != nil {
		px.met.fail(f.reason, f.service)
		px.met.keyRequests.WithLabelValues(key.label(), "", "429").Inc() // refused before its body (and model) is read
		return nil, f.export()
	}
	h, f := px.handoff(in, kind, header, key)
	if f != nil {
		px.keyDone(key, f.service, f.status)
		px.met.fail(f.reason, f.service)
		return nil, f.export()
	}
	h.key = key
	return h, nil
}

func (px *Proxy) handoff(in HandoffRequest, kind oai.Kind, header func(string) []byte, key *Key) (*Handoff, *refusal) {
	c, f := px.parseCall(kind, in.Path, in.ContentType, in.Body, header)
	if f != nil {
		return nil, f
	}
	// The engines' priority, as the router gives it (the picker has no queue of its own).
	if px.queueOf(c).EnginePriority {
		ceiling, keyed, _ := serviceBand(key, c.svcTenants)
		band, _, err := requestBand(ceiling, keyed, header)
		if err != nil {
			return nil, badRequest(err.Error())
		}
		c.band = band
		px.givePriority(c)
	}
	if c.prevResponse != "" {
		if f := px.pinFor(c, c.prevResponse); f != nil {
			return nil, f
		}
	}
	policy, f := px.policyFor(c, header("X-Arbiter-Policy"))
	if f != nil {
		return nil, f
	}
	c.load = px.Load.get(c.model)
	c.load.requests.Add(1)
	c.route.Now = px.Now()
	all := px.callCandidates(c)
	cands := servingCandidates(all, c.api, &c.servingBuf)
	if len(cands) == 0 && len(all) > 0 {
		return nil, notServedRefusal(c, len(all))
	}
	endpoints := in.Endpoints
	if c.pinned != nil {
		// Only the replica that stored the response can continue it: no retry elsewhere.
		cands, endpoints = []*Replica{c.pinned}, 1
	}
	if in.Hinted {
		cands = slices.DeleteFunc(slices.Clone(cands), func(r *Replica) bool { return !slices.Contains(in.Subset, r.Info().Address) })
	}
	if !anyUsable(&c.route, cands) {
		return nil, px.noReplica(c, in)
	}
	rng := px.rngs.Get().(*rand.Rand)
	defer px.rngs.Put(rng)
	r := policy.Pick(&c.route, cands, rng)
	if r == nil {
		return nil, px.noReplica(c, in)
	}
	if f := px.adapterNotLoaded(c, r); f != nil {
		return nil, f
	}
	h := &Handoff{px: px, c: c, r: r, picks: []*Replica{r}, body: c.body}
	h.pred, h.began = r.Begin(&c.route, 3*px.cfg.ScrapeInterval), true
	// The gateway's retries, in the order the router would retry in.
	c.route.fallback = true
	var unloaded []*Replica // without the request's adapter: a retry there would be a 404
	for len(h.picks) < endpoints {
		c.route.Tried = append(slices.Clip(h.picks), unloaded...)
		next := policy.Pick(&c.route, cands, rng)
		if next == nil {
			break
		}
		if c.adapter != nil && !c.adapter.Static && !next.adapterLoaded(c.adapter.Name) {
			unloaded = append(unloaded, next)
			continue
		}
		h.picks = append(h.picks, next)
	}
	c.route.fallback, c.route.Tried, c.route.picked = false, nil, nil
	return h, nil
}

// noReplica is the answer to a request no replica can take now. With a control plane that
// knows its model, the service is woken and the gateway told to retry: unlike the router,
// the picker holds no request while a replica starts, as the gateway bounds each of its
// messages by a timeout of its own (Envoy's ext_proc message_timeout, 200 ms by default).
func (px *Proxy) noReplica(c *call, in HandoffRequest) *refusal {
	if in.Hinted {
		return &refusal{status: fasthttp.StatusServiceUnavailable, errType: oai.Unavailable, reason: "no_replica", service: c.service, retryAfter: noReplicaRetryAfter,
			msg: fmt.Sprintf("no ready replica for model %q among the %d endpoints the gateway allows", c.model, len(in.Subset))}
	}
	if px.ControlPlane != nil && px.ControlPlane.Knows(c.model) {
		px.ControlPlane.Wake(c.model)
		return &refusal{status: fasthttp.StatusServiceUnavailable, errType: oai.Unavailable, reason: "hold_deadline", retryAfter: holdRetryAfter, service: c.service,
			msg: fmt.Sprintf("model %q is starting: no replica is ready yet; retry shortly", c.model)}
	}
	return &refusal{status: fasthttp.StatusServiceUnavailable, errType: oai.Unavailable, reason: "no_replica", service: c.service, retryAfter: noReplicaRetryAfter,
		msg: fmt.Sprintf("no ready replica for model %q", c.model)}
}

// passedThrough says whether a path the router does not route goes to a replica through
// the picker: the ones the router answers itself (the served models, their retrieval, a
// stored response, health), which a replica answers alike.
func passedThrough(path string) bool {
	return path == "/v1/models" || path == "/health" || strings.HasPrefix(path, "/v1/models/") || strings.HasPrefix(path, "/v1/responses/")
}

// noReplicaRetryAfter is the Retry-After, in seconds, of the picker's 503 when no replica is
// ready: a replica taken out by its probes or ejected comes back within seconds (the
// ejection's base backoff, a few probes), one that is starting in 30 s to minutes (the
// control plane's case, holdRetryAfter).
const noReplicaRetryAfter = 5

// BodyTooLarge is the answer to a request whose body passed limit bytes before the picker
// saw its end, counted in the error metrics as the router counts its own.
func (px *Proxy) BodyTooLarge(limit int) *Refusal {
	px.met.fail("body_too_large", "")
	return (&refusal{status: fasthttp.StatusRequestEntityTooLarge, errType: oai.InvalidRequest, reason: "body_too_large",
		msg: fmt.Sprintf("request body too large: more than max_request_body_bytes (%d bytes)", limit)}).export()
}

// handoffAny sends a request on a path the router does not route, or one picked from its
// headers alone, to the least loaded ready replica of model (any model: "").
func (px *Proxy) handoffAny(in HandoffRequest, model string) (*Handoff, *Refusal) {
	req := &Request{Now: px.Now()}
	var cands []*Replica
	for _, m := range px.pool.Models() {
		if model != "" && m != model {
			continue
		}
		for _, r := range px.pool.candidates(m) {
			if !in.Hinted || slices.Contains(in.Subset, r.Info().Address) {
				cands = append(cands, r)
			}
		}
	}
	rng := px.rngs.Get().(*rand.Rand)
	defer px.rngs.Put(rng)
	r := LeastLoad{}.Pick(req, cands, rng)
	if r == nil {
		f := &refusal{status: fasthttp.StatusServiceUnavailable, errType: oai.Unavailable, reason: "no_replica", msg: "no ready replica", retryAfter: noReplicaRetryAfter}
		px.met.fail(f.reason, "")
		return nil, f.export()
	}
	return &Handoff{px: px, r: r, picks: []*Replica{r}, body: in.Body}, nil
}

// Endpoints are the addresses ("ip:port") the request may go to, in order: the pick, then
// the gateway's retries.
func (h *Handoff) Endpoints() []string {
	out := make([]string, len(h.picks))
	for i, r := range h.picks {
		out[i] = r.Info().Address
	}
	return out
}

// Body is the request body to send: the client's, with stream_options.include_usage
// added to a stream that did not ask for its usage (the answer is accounted by it; the
// usage chunk is kept from the client).
func (h *Handoff) Body() []byte { return h.body }

// Served says which endpoint the gateway sent the request to (its response metadata): a
// retry moves the request, and what the first pick was counted for, to the endpoint that
// answered. It reports whether the endpoint is one the picker offered.
func (h *Handoff) Served(addr string) bool {
	if addr == "" || h.done || addr == h.r.Info().Address {
		return addr == "" || addr == h.r.Info().Address
	}
	i := slices.IndexFunc(h.picks, func(r *Replica) bool { return r.Info().Address == addr })
	if i < 0 {
		return false
	}
	px, next := h.px, h.picks[i]
	if h.began {
		// The gateway retried: the replicas before did not take the request.
		h.r.End(h.pred, px.Now())
		h.pred = next.Begin(&h.c.route, 3*px.cfg.ScrapeInterval)
		px.met.retries.WithLabelValues(h.c.service).Inc()
	}
	// Every pick the gateway passed over failed it (refused, reset or 5xx, by its retry
	// policy): each is ejected at once, as one failure of the router's own would count
	// toward, so the next pick does not offer it first until its backoff ends; waiting
	// for the probes offered a dead replica for 2.4 s. Those are the picks from the one the
	// request was on up to the one that served (an earlier retry counted the ones before).
	from := min(max(slices.Index(h.picks, h.r), 0), i)
	for _, r := range h.picks[from:i] {
		px.pickFailed(r)
	}
	h.r = next
	return true
}

// pickFailed ejects a replica the gateway's retry passed over: the gateway saw it fail.
func (px *Proxy) pickFailed(r *Replica) {
	px.met.fail("gateway_retried", r.Info().Service)
	if r.requestFailed(px.Now(), 1, px.cfg.Ejection.BaseBackoff, px.cfg.Ejection.MaxBackoff) {
		px.met.ejections.WithLabelValues(r.Info().ID).Inc()
		px.log.Warn("replica ejected", "replica", r.Info().ID, "reason", "gateway_retried")
	}
}

// Replica is the replica the request is on as far as the picker knows.
func (h *Handoff) Replica() *Replica { return h.r }

// ResponseHeaders says the answer's status and content type arrived; end says the answer
// has no body.
func (h *Handoff) ResponseHeaders(status int, contentType string, end bool) {
	h.status = status
	if h.c != nil && strings.HasPrefix(contentType, "text/event-stream") && !end {
		px := h.px
		h.obs = &streamer{px: px, c: h.c, r: h.r, p: px.parsers.Get(), progress: px.Now(),
			res: result{code: status, sentAt: h.c.route.Now, pred: h.pred, streamed: true}}
	}
	if end {
		h.finish()
	}
}

// ResponseBody takes a piece of the answer as it streams and returns what the client
// should get of it (valid until the next call): a stream's complete events, less the usage
// chunk the router asked for; a whole answer as it is. end says it is the last piece.
func (h *Handoff) ResponseBody(b []byte, end bool) []byte {
	if h.obs != nil && h.obs.finished {
		return nil
	}
	if h.done {
		return b
	}
	if s := h.obs; s != nil {
		s.out = s.out[:0]
		s.consume(b)
		if !s.overlong() && end {
			s.eof()
		}
		if s.finished {
			// The stream ended (or its replica broke it): what follows is not passed on.
			h.finish()
		}
		return s.out
	}
	if h.c != nil && !h.over {
		if len(h.whole)+len(b) > h.px.cfg.MaxResponseBodyBytes {
			h.over, h.whole = true, nil
		} else {
			h.whole = append(h.whole, b...)
		}
	}
	if end {
		h.finish()
	}
	return b
}

// finish accounts an answer the replica ended.
func (h *Handoff) finish() {
	if h.done {
		return
	}
	h.done = true
	px, c, r := h.px, h.c, h.r
	if c == nil {
		return
	}
	now := px.Now()
	defer px.keyDone(h.key, c.service, h.status)
	defer r.End(h.pred, now)
	if s := h.obs; s != nil {
		px.parsers.Put(s.p)
		s.res.endAt = now
		px.account(c, r, s.res)
		return
	}
	status := h.status
	if status >= 500 {
		px.upstreamFailed(r, "status_5xx", nil)
	}
	var usage oai.Usage
	if status == fasthttp.StatusOK && !h.over {
		p := px.parsers.Get()
		usage, _ = oai.ResponseUsage(p, bytes.TrimSpace(h.whole))
		if c.kind == oai.Responses {
			px.responses.remember(responseID(p, h.whole), r.Info().ID)
		}
		px.parsers.Put(p)
	} else if !h.over {
		px.refusesAPI(c, r, status, h.whole) // learns that the replica does not serve the API
	}
	px.account(c, r, result{code: status, usage: usage, sentAt: c.route.Now, firstAt: now, endAt: now, pred: h.pred})
}

// Close ends the handoff. An answer that did not end (the gateway's stream to the picker
// broke: the client left, the gateway or the picker restarted) is counted as a client that
// left: its replica's count is released and nothing is learned from it.
func (h *Handoff) Close() {
	if h.done {
		return
	}
	h.done = true
	px, c, r := h.px, h.c, h.r
	if c == nil {
		return
	}
	if h.obs != nil {
		px.parsers.Put(h.obs.p)
	}
	px.account(c, r, result{code: 499, clientGone: true})
	r.End(h.pred, px.Now())
	px.keyDone(h.key, h.c.service, 499)
}
