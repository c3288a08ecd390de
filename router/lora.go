package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/oai"
)

// LoRA adapters (issue 51). A request whose model is one of a service's adapters is routed
// among the replicas of the adapter's base model, with what the adapter would add to its
// first token on each (adapterDelay) in the prediction: nothing where the adapter is
// active; where a GPU slot is free, its load if this router has not loaded it there; else
// the wait for a slot. So a busy adapter stays on the replicas that run it and spreads,
// loading itself, where queueing for them would cost more: the Gateway API Inference
// Extension's LoRA affinity (active 1.0, free slot 0.8, waiting 0.6) as times, weighed with
// the rest of the prediction against the SLO.
//
// A replica's adapters are what this router sends it (its own requests in flight, by
// adapter) and what its vLLM says in vllm:lora_requests_info (the newest series: running
// and waiting adapters, max_lora); an adapter is loaded on a replica through vLLM's
// /v1/load_lora_adapter the first time this router sends it there, and counted loaded on an
// answer of 200 or "has already been loaded" (another router was first).

// maxAdapterNames bounds the adapters one vllm:lora_requests_info series may list, and
// fleet.MaxAdapterName a name's bytes: a replica that says more is not believed
// (ReplicaReports).
const maxAdapterNames = 1024

// LoRAInfo is vLLM's vllm:lora_requests_info: the newest series (the largest value, the
// time vLLM set it, as the Gateway API Inference Extension reads it).
type LoRAInfo struct {
	Running, Waiting []string
	MaxLoRA          int
	// At is when the engine last set it (unix seconds): an idle engine sets nothing, so an
	// old reading means its adapters have finished.
	At float64
}

var mLoRAInfo = []byte("vllm:lora_requests_info")

// parseLoRAInfo reads one vllm:lora_requests_info sample (its line, and its value as
// splitSample found it) into g, keeping the newest; it reports why it cannot be believed,
// or "".
func parseLoRAInfo(line, raw []byte, g *EngineGauges) (reason, detail string) {
	open, close := bytes.IndexByte(line, '{'), bytes.LastIndexByte(line, '}')
	if open < 0 || close < open {
		return "", "" // no labels: not vLLM's shape; skipped as any unknown line
	}
	v, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || v < 0 {
		return "not_a_number", fmt.Sprintf("vllm:lora_requests_info value %q", raw)
	}
	if g.LoRA != nil && v <= g.LoRA.At {
		return "", ""
	}
	info := LoRAInfo{At: v}
	labels := line[open+1 : close]
	for len(labels) > 0 {
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return "bad_labels", "vllm:lora_requests_info labels " + string(line[open:close+1])
		}
		key := string(bytes.TrimSpace(labels[:eq]))
		end := eq + 2
		for end < len(labels) && labels[end] != '"' {
			if labels[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(labels) {
			return "bad_labels", "vllm:lora_requests_info labels " + string(line[open:close+1])
		}
		val, err := strconv.Unquote(string(labels[eq+1 : end+1]))
		if err != nil {
			return "bad_labels", "vllm:lora_requests_info label " + key
		}
		labels = bytes.TrimLeft(labels[end+1:], ", ")
		switch key {
		case "max_lora":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 || n > maxAdapterNames {
				return "bad_labels", fmt.Sprintf("vllm:lora_requests_info max_lora %q", val)
			}
			info.MaxLoRA = n
		case "running_lora_adapters", "waiting_lora_adapters":
			var names []string
			if val != "" {
				names = strings.Split(val, ",") // no spaces, as vLLM joins them
			}
			if len(names) > maxAdapterNames || slices.ContainsFunc(names, func(n string) bool { return n == "" || len(n) > fleet.MaxAdapterName }) {
				return "too_large", fmt.Sprintf("vllm:lora_requests_info %s lists %d names (at most %d, each 1 to %d bytes)", key, len(names), maxAdapterNames, fleet.MaxAdapterName)
			}
			if key == "running_lora_adapters" {
				info.Running = names
			} else {
				info.Waiting = names
			}
		}
	}
	g.LoRA = &info
	return "", ""
}

// loraState is one replica's adapters as this router knows them. Guarded by its mu.
type loraState struct {
	mu sync.Mutex
	// inflight counts this router's requests on the replica by adapter.
	inflight map[string]int
	// loaded are the adapters known loaded (this router's loads, or another's it found).
	loaded map[string]bool
	// loading is a load in progress by adapter: its waiters share its result.
	loading map[string]*adapterLoad
	// refused is the replica's last refusal to load an adapter: for refusalMemory, its
	// requests get that answer at once rather than ask again (the files are what they are).
	refused map[string]loadRefusal
	// scraped is the replica's newest vllm:lora_requests_info, and when it was read.
	scraped   *LoRAInfo
	scrapedAt time.Time
}

type adapterLoad struct {
	done chan struct{}
	err  error
}

type loadRefusal struct {
	err *errAdapterLoad
	at  time.Time
}

// refusalMemory is how long a replica's refusal of an adapter answers its requests; a fixed
// bucket or path is tried again after it.
const refusalMemory = 30 * time.Second

// recentRefusal is r's refusal of adapter a within refusalMemory, or nil.
func (r *Replica) recentRefusal(a string, now time.Time) *errAdapterLoad {
	l := r.loraState()
	l.mu.Lock()
	defer l.mu.Unlock()
	if f, ok := l.refused[a]; ok && now.Sub(f.at) < refusalMemory {
		return f.err
	}
	return nil
}

func (r *Replica) loraState() *loraState {
	r.loraOnce.Do(func() {
		r.lora = &loraState{inflight: map[string]int{}, loaded: map[string]bool{}, loading: map[string]*adapterLoad{}, refused: map[string]loadRefusal{}}
	})
	return r.lora
}

// observeLoRA records a scrape's vllm:lora_requests_info.
func (r *Replica) observeLoRA(now time.Time, info *LoRAInfo) {
	l := r.loraState()
	l.mu.Lock()
	l.scraped, l.scrapedAt = info, now
	l.mu.Unlock()
}

// adapterBegan and adapterEnded count this router's requests by adapter.
func (r *Replica) adapterBegan(name string) {
	l := r.loraState()
	l.mu.Lock()
	l.inflight[name]++
	l.mu.Unlock()
}

// adapterInflight calls f with each adapter this router has requests in flight for on r.
func (r *Replica) adapterInflight(f func(a string, n int)) {
	l := r.loraState()
	l.mu.Lock()
	defer l.mu.Unlock()
	for a, n := range l.inflight {
		f(a, n)
	}
}

func (r *Replica) adapterEnded(name string) {
	l := r.loraState()
	l.mu.Lock()
	if l.inflight[name]--; l.inflight[name] <= 0 {
		delete(l.inflight, name)
	}
	l.mu.Unlock()
}

// loraFresh is how old a replica's vllm:lora_requests_info may be and still tell what runs:
// vLLM sets it every engine step, so an older one is an idle engine's last step.
const loraFresh = 2 * time.Second

// adapterDelay is what serving adapter a adds to a request's first token on r (seconds):
// the load, if it is not known loaded there (load, the time expected); and the wait for a
// GPU slot: none where it is active (this router's requests for it, or the replica's
// running list) or where a slot is free (fewer adapters running and waiting than
// max_loras), else half a request's decode (decode: the mean rest of the requests holding
// the slots). maxLoRAs is the service's --max-loras; the replica's max_lora label wins.
func (r *Replica) adapterDelay(a string, static bool, maxLoRAs int, decode, load float64, now time.Time) (loadS, waitS float64) {
	if r.servesMerged(a) {
		return 0, 0
	}
	l := r.loraState()
	l.mu.Lock()
	defer l.mu.Unlock()
	if static || l.loaded[a] {
		load = 0
	}
	if l.inflight[a] > 0 {
		return load, 0
	}
	slots := maxLoRAs
	active := len(l.inflight)
	var waiting []string
	if s := l.scraped; s != nil && now.Sub(time.Unix(0, int64(s.At*1e9))) < loraFresh && now.Sub(l.scrapedAt) < loraFresh {
		if slices.Contains(s.Running, a) {
			return load, 0
		}
		if s.MaxLoRA > 0 {
			slots = s.MaxLoRA
		}
		for _, n := range s.Running {
			if l.inflight[n] == 0 {
				active++
			}
		}
		waiting = s.Waiting
	}
	used := active + len(waiting)
	if slices.Contains(waiting, a) {
		used-- // it waits already: a slot freed is as likely its as another's
	}
	if used < max(slots, 1) {
		return load, 0
	}
	return load, decode / 2
}

// adapterFor returns the adapter a model name is: on the control plane's services, else in
// the router's config; with the replicas' --max-loras.
func (px *Proxy) adapterFor(model string) (fleet.Adapter, int, bool) {
	if px.ControlPlane != nil {
		if a, n, ok := px.ControlPlane.Adapter(model); ok {
			return a, n, true
		}
	}
	for _, a := range px.cfg.Adapters {
		if a.Name == model {
			return a, px.cfg.MaxLoRAs, true
		}
	}
	return fleet.Adapter{}, 0, false
}

// adapterNotLoaded is the picker's answer to a pick on a replica that has not loaded the
// request's adapter: the gateway sends the request on, so the adapter must be there first,
// and a load (about a second) outlasts the gateway's wait for a pick (Envoy's ext_proc
// message_timeout, 200 ms by default). The load starts now, in the background, and the
// client is told to retry when it should be done; the retry's pick finds it loaded. nil
// where nothing is to load.
func (px *Proxy) adapterNotLoaded(c *call, r *Replica) *refusal {
	if c.adapter == nil || c.adapter.Static || r.adapterLoaded(c.adapter.Name) {
		return nil
	}
	if f := r.recentRefusal(c.adapter.Name, time.Now()); f != nil {
		return &refusal{status: fasthttp.StatusBadGateway, errType: oai.ServerError, reason: "adapter_load", service: c.service, code: "adapter_load_failed", msg: f.Error()}
	}
	a := *c.adapter
	px.startAdapterLoad(r, a)
	return &refusal{status: fasthttp.StatusServiceUnavailable, errType: oai.Unavailable, reason: "adapter_loading", service: c.service,
		retryAfter: max(1, int(math.Ceil(px.adapterLoads.expect()))),
		msg:        fmt.Sprintf("adapter %q is being loaded on replica %s; retry shortly", a.Name, r.Info().ID)}
}

// adapterLoaded reports whether this router knows adapter a loaded on r, or r serves it
// merged.
func (r *Replica) adapterLoaded(a string) bool {
	if r.servesMerged(a) {
		return true
	}
	l := r.loraState()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.loaded[a]
}

// servesMerged reports whether r is one of adapter a's own replicas (issue 51): it serves
// a's merged checkpoint under a's name, so the adapter needs no load and no GPU slot there,
// and its steps run at the base model's cost.
func (r *Replica) servesMerged(a string) bool { return r.Info().Adapter == a }

// callCandidates are the replicas that may take c: its model's, and for an adapter its
// base model's with the adapter's own (which the control plane publishes under its name),
// merged into c.ownBuf.
func (px *Proxy) callCandidates(c *call) []*Replica {
	cands := px.pool.candidates(c.pickModel())
	if c.adapter == nil || c.adapter.Base == "" {
		return cands
	}
	own := px.pool.candidates(c.adapter.Name)
	if len(own) == 0 {
		return cands
	}
	// Both are sorted by cost, as a sampling pick needs the union to be.
	out := c.ownBuf[:0]
	i, j := 0, 0
	for i < len(own) || j < len(cands) {
		if j == len(cands) || (i < len(own) && own[i].MarginalCost() <= cands[j].MarginalCost()) {
			out = append(out, own[i])
			i++
		} else {
			out = append(out, cands[j])
			j++
		}
	}
	c.ownBuf = out
	return out
}

// pickModel is the model whose replicas may take the request: its own, or its adapter's
// base once known.
func (c *call) pickModel() string {
	if c.adapter != nil && c.adapter.Base != "" {
		return c.adapter.Base
	}
	return c.model
}

// resolveAdapter looks again for the base of an adapter whose base was not known. A service
// that names no model learns it from its first replica, so until one is ready the request
// is held under the adapter's own name (no replica serves it: it waits, and wakes the
// service); once the control plane publishes the base, the request goes to its replicas.
func (px *Proxy) resolveAdapter(c *call) {
	if c.adapter == nil || c.adapter.Base != "" {
		return
	}
	if a, n, ok := px.adapterFor(c.model); ok {
		c.adapter, c.route.MaxLoRAs = &a, n
	}
}

// errAdapterLoad is a load the replica refused: the adapter cannot be served from there,
// and likely not from its other replicas either (the same path).
type errAdapterLoad struct {
	adapter, replica string
	status           int
	msg              string
}

func (e *errAdapterLoad) Error() string {
	return fmt.Sprintf("The adapter `%s` could not be loaded on replica %s: %s (vLLM's answer to /v1/load_lora_adapter, HTTP %d)", e.adapter, e.replica, e.msg, e.status)
}

// adapterLoadTimeout bounds one load: vLLM reads the adapter, from a Hugging Face download
// at worst, before it answers.
const adapterLoadTimeout = 5 * time.Minute

// errAdapterWait is a request that gave up waiting for its adapter's load at its own
// deadline: no fault of the replica's, whose load goes on for the requests after it.
var errAdapterWait = errors.New("the request's deadline passed while its adapter loaded")

// ensureAdapter loads adapter a on r unless it is known loaded, and waits for the load until
// the request's deadline; concurrent requests share one load. The load runs on its own
// deadline, not the first request's: a client's short deadline must not fail it for the
// others. It returns an *errAdapterLoad where the replica refused, errAdapterWait where the
// request's deadline came first, another error where the replica could not be asked (its
// fault: try another).
func (px *Proxy) ensureAdapter(r *Replica, a fleet.Adapter, deadline time.Time) error {
	if a.Static || r.servesMerged(a.Name) {
		return nil
	}
	if f := r.recentRefusal(a.Name, time.Now()); f != nil {
		return f
	}
	ld := px.startAdapterLoad(r, a)
	if ld == nil {
		return nil
	}
	wait := time.NewTimer(time.Until(deadline))
	defer wait.Stop()
	select {
	case <-ld.done:
		return ld.err
	case <-wait.C:
		return errAdapterWait
	}
}

// startAdapterLoad starts loading a on r unless it is loaded (nil) or loading already (that
// load), and returns the load to wait for.
func (px *Proxy) startAdapterLoad(r *Replica, a fleet.Adapter) *adapterLoad {
	l := r.loraState()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.loaded[a.Name] {
		return nil
	}
	ld := l.loading[a.Name]
	if ld == nil {
		ld = &adapterLoad{done: make(chan struct{})}
		l.loading[a.Name] = ld
		go px.runAdapterLoad(r, a, ld)
	}
	return ld
}

// runAdapterLoad makes one load of a on r, tells its waiters, and logs a failure once.
func (px *Proxy) runAdapterLoad(r *Replica, a fleet.Adapter, ld *adapterLoad) {
	l := r.loraState()
	start := time.Now()
	expect := int64(px.adapterLoads.expect() * 1e9)
	r.loadingNanos.Add(expect)
	ld.err = px.loadAdapter(r, a, start.Add(adapterLoadTimeout))
	r.loadingNanos.Add(-expect)
	result := "loaded"
	var refused *errAdapterLoad
	switch {
	case ld.err == nil:
		px.adapterLoads.observe(time.Since(start).Seconds())
	case errors.As(ld.err, &refused):
		result = "refused"
	default:
		result = "failed"
	}
	px.met.adapterLoads.WithLabelValues(r.Info().Service, result).Inc()
	if ld.err != nil {
		px.log.Warn("LoRA adapter failed to load", "adapter", a.Name, "replica", r.Info().ID, "err", ld.err)
	}
	l.mu.Lock()
	delete(l.loading, a.Name)
	switch {
	case ld.err == nil:
		l.loaded[a.Name] = true
		delete(l.refused, a.Name)
	case refused != nil:
		l.refused[a.Name] = loadRefusal{err: refused, at: time.Now()}
	}
	l.mu.Unlock()
	close(ld.done)
}

// loadAdapter asks r's vLLM to load a (vllm/entrypoints/openai/api_server.py, 0.10–0.11):
// 200 with a plain-text success; 400 InvalidUserInput "… has already been loaded." is a
// success too; a 404 without vLLM's error body is a server without the endpoint (started
// without VLLM_ALLOW_RUNTIME_LORA_UPDATING); other answers are the replica's refusal.
func (px *Proxy) loadAdapter(r *Replica, a fleet.Adapter, deadline time.Time) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + r.Info().Address + "/v1/load_lora_adapter")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	body, _ := json.Marshal(struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}{a.Name, a.Path})
	req.SetBody(body)
	err := px.adminClient.DoDeadline(req, resp, deadline)
	if err != nil && (staleConnError(err) || errors.Is(err, fasthttp.ErrConnectionClosed)) {
		// A pooled connection the replica closed as the request went: the load was not
		// read (a load asked twice is answered "already loaded", a success, anyway).
		err = px.adminClient.DoDeadline(req, resp, deadline)
	}
	if err != nil {
		return fmt.Errorf("load adapter %s on %s: %w", a.Name, r.Info().ID, err)
	}
	status := resp.StatusCode()
	if status == fasthttp.StatusOK {
		px.log.Info("loaded LoRA adapter", "adapter", a.Name, "replica", r.Info().ID, "path", a.Path)
		return nil
	}
	msg := vllmErrorMessage(resp.Body())
	switch {
	case status == fasthttp.StatusBadRequest && strings.Contains(msg, "has already been loaded."):
		return nil // another router loaded it (later vLLMs add a sentence after it)
	case status == fasthttp.StatusNotFound && msg == "":
		msg = "the replica has no /v1/load_lora_adapter: its vLLM was started without VLLM_ALLOW_RUNTIME_LORA_UPDATING=true"
	case msg == "":
		msg = fmt.Sprintf("%.200q", resp.Body())
	}
	return &errAdapterLoad{adapter: a.Name, replica: r.Info().ID, status: status, msg: msg}
}

// vllmErrorMessage is the message of vLLM's error body, nested (0.10.1 on) or flat.
func vllmErrorMessage(b []byte) string {
	v, err := fastjson.ParseBytes(b)
	if err != nil {
		return ""
	}
	if m := v.GetStringBytes("error", "message"); m != nil {
		return string(m)
	}
	return string(v.GetStringBytes("message"))
}

// loadTimes learns how long adapter loads take (seconds), for adapterDelay.
type loadTimes struct {
	mu sync.Mutex
	e  ewma
}

// defaultAdapterLoad is the load expected before any was seen: LoRAX measured 0.5 to over
// 1 s an adapter (predibase/lorax#433); vLLM publishes no figure.
const defaultAdapterLoad = 1.0

func (l *loadTimes) observe(s float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.e.alpha = 0.2
	l.e.observe(s)
}

func (l *loadTimes) expect() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.e.n == 0 {
		return defaultAdapterLoad
	}
	return l.e.v
}

// unloadAdapters asks every replica this router knows an adapter loaded on to unload it
// (vLLM's /v1/unload_lora_adapter), once serve update has taken the adapter out: its CPU
// cache and GPU slot go back to the adapters still served. Each runs in the background; a
// request for it still streaming there finishes (vLLM unloads between steps, and replicasim
// as vLLM does). Several routers may ask: "not found" is a success.
func (px *Proxy) unloadAdapters(removed []fleet.Adapter) {
	for _, r := range px.pool.Snapshot() {
		for _, a := range removed {
			if r.servesMerged(a.Name) || !r.adapterLoaded(a.Name) {
				continue // an adapter's own replica has it merged, not loaded
			}
			go px.unloadAdapter(r, a.Name)
		}
	}
}

// unloadAdapter asks r's vLLM to unload adapter name: 200 with a plain-text success; 404
// "… not found" (another router unloaded it) is one too.
func (px *Proxy) unloadAdapter(r *Replica, name string) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + r.Info().Address + "/v1/unload_lora_adapter")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	body, _ := json.Marshal(struct {
		Name string `json:"lora_name"`
	}{name})
	req.SetBody(body)
	err := px.adminClient.DoTimeout(req, resp, 30*time.Second)
	status := resp.StatusCode()
	if err == nil && (status == fasthttp.StatusOK || status == fasthttp.StatusNotFound) {
		l := r.loraState()
		l.mu.Lock()
		delete(l.loaded, name)
		l.mu.Unlock()
		px.met.adapterLoads.WithLabelValues(r.Info().Service, "unloaded").Inc()
		px.log.Info("unloaded LoRA adapter removed from its service", "adapter", name, "replica", r.Info().ID)
		return
	}
	if err == nil {
		err = fmt.Errorf("HTTP %d: %s", status, vllmErrorMessage(resp.Body()))
	}
	px.met.adapterLoads.WithLabelValues(r.Info().Service, "unload_failed").Inc()
	px.log.Warn("could not unload a LoRA adapter removed from its service; it stays on the replica until it is replaced", "adapter", name, "replica", r.Info().ID, "err", err)
}
