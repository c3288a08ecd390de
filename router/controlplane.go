package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// LoadTracker counts each model's requests, tokens, in-flight and held requests for the
// control plane's autoscaler. Only models that passed validation are tracked, so hostile
// model names cannot grow it.
type LoadTracker struct {
	m sync.Map // model → *modelLoad
	// spend is the tenants' spend for their budgets (budgets.go).
	spend spendBook
}

type modelLoad struct {
	requests, tokens, held atomic.Int64
	// shed and shedTokens count the requests the queue refused for want of room (and the
	// tokens they would have had) since the previous report.
	shed, shedTokens atomic.Int64
	// mix counts the generating requests that finished with a usage, by prompt and output
	// length class (fleet.MixClassOf): requests and the tokens they had. Under a lock, so
	// that a report never holds a request's count without its tokens (or the reverse).
	mixMu sync.Mutex
	mix   [mixPrompt][mixOutput]struct{ requests, prompt, output int64 }
}

// The request mix's classes, as fleet counts them.
const (
	mixPrompt = 6
	mixOutput = 5
)

func init() {
	if p, o := fleet.MixClasses(); p != mixPrompt || o != mixOutput {
		panic(fmt.Sprintf("router: fleet has %d×%d mix classes, the load tracker counts %d×%d", p, o, mixPrompt, mixOutput))
	}
}

// served counts one finished generating request of prompt and output tokens in the mix.
func (l *modelLoad) served(prompt, output int) {
	p, o := fleet.MixClassOf(prompt, output)
	l.mixMu.Lock()
	c := &l.mix[p][o]
	c.requests++
	c.prompt += int64(prompt)
	c.output += int64(output)
	l.mixMu.Unlock()
}

// takeMix returns the mix's cells that counted something; the counts restart from zero.
func (l *modelLoad) takeMix() []fleet.MixCell {
	var out []fleet.MixCell
	l.mixMu.Lock()
	defer l.mixMu.Unlock()
	for p := range l.mix {
		for o := range l.mix[p] {
			c := &l.mix[p][o]
			if c.requests == 0 {
				continue
			}
			out = append(out, fleet.MixCell{Prompt: p, Output: o, Requests: float64(c.requests), PromptTokens: float64(c.prompt), OutputTokens: float64(c.output)})
			*c = struct{ requests, prompt, output int64 }{}
		}
	}
	return out
}

func (t *LoadTracker) get(model string) *modelLoad {
	if v, ok := t.m.Load(model); ok {
		return v.(*modelLoad)
	}
	v, _ := t.m.LoadOrStore(model, &modelLoad{})
	return v.(*modelLoad)
}

// report returns every model's load; the counts restart from zero. In-flight requests are
// the replicas' own counters (they follow streams to their end, past the handler), each
// request under the model it asked for: a LoRA adapter's under the adapter's name, not its
// base model's, whose replicas serve it.
func (t *LoadTracker) report(replicas []*Replica) []fleet.ModelLoad {
	inflight := map[string]int64{}
	for _, r := range replicas {
		m := r.Info().Model
		base := r.InFlight()
		r.adapterInflight(func(a string, n int) {
			if a != m { // an adapter's own replica serves it under its name
				inflight[a] += int64(n)
				base -= int64(n)
			}
		})
		inflight[m] += max(base, 0)
	}
	var out []fleet.ModelLoad
	t.m.Range(func(k, v any) bool {
		l := v.(*modelLoad)
		out = append(out, fleet.ModelLoad{Model: k.(string), Requests: float64(l.requests.Swap(0)), Tokens: float64(l.tokens.Swap(0)),
			InFlight: float64(inflight[k.(string)]), Held: float64(l.held.Load()), Mix: l.takeMix(),
			Shed: float64(l.shed.Swap(0)), ShedTokens: float64(l.shedTokens.Swap(0))})
		return true
	})
	slices.SortFunc(out, func(a, b fleet.ModelLoad) int { return strings.Compare(a.Model, b.Model) })
	return out
}

// ControlPlane links a router to Arbiter's control plane: it follows the ready set into
// the pool, reports load, and wakes a service at once when a request arrives for it while
// it has no ready replica. Nothing in the request path waits on it: if the control plane is
// down, the router keeps serving the last set it knew.
//
// With several control planes on one store (one leads, the others stand by), url lists
// them all, comma-separated: the router talks to one at a time and moves on to the next
// when one does not answer or says it does not lead (HTTP 503, as a standby answers a load
// report or a wake), so its reports and wakes reach the leader, whichever it is.
type ControlPlane struct {
	urls            []string
	cur             atomic.Int64 // the index in urls of the control plane talked to
	token, routerID string
	pool            *Pool
	load            *LoadTracker
	log             *slog.Logger
	client          *http.Client
	// ReportEvery is the load report interval.
	ReportEvery time.Duration

	// OnAdaptersRemoved, when set, is told of the LoRA adapters loaded at run time that the
	// latest set no longer has (serve update took them out): the proxy unloads them.
	OnAdaptersRemoved func([]fleet.Adapter)

	mu       sync.RWMutex
	services []fleet.Service
	wakes    map[string]time.Time // model → last wake sent
	revision atomic.Uint64
}

// NewControlPlane returns a link to the control plane at url (http://host:port), or to
// whichever leads of several, comma-separated.
func NewControlPlane(url, token, routerID string, pool *Pool, load *LoadTracker, log *slog.Logger) *ControlPlane {
	var urls []string
	for u := range strings.SplitSeq(url, ",") {
		if u = strings.TrimSuffix(strings.TrimSpace(u), "/"); u != "" {
			urls = append(urls, u)
		}
	}
	return &ControlPlane{urls: urls, token: token, routerID: routerID, pool: pool, load: load, log: log,
		client: &http.Client{}, ReportEvery: time.Second, wakes: map[string]time.Time{}}
}

// elsewhere reports whether another control plane may take what one answered with err: it
// did not answer, or it does not lead.
func elsewhere(err error) bool {
	var ce *cpError
	if errors.As(err, &ce) {
		return ce.code == http.StatusServiceUnavailable
	}
	return err != nil
}

// next moves from the control plane at index k to the next, unless another call moved
// already.
func (cp *ControlPlane) next(k int64) {
	if len(cp.urls) > 1 && cp.cur.CompareAndSwap(k, (k+1)%int64(len(cp.urls))) {
		cp.log.Info("trying another control plane", "from", cp.urls[k], "to", cp.urls[(k+1)%int64(len(cp.urls))])
	}
}

// Run follows the ready set and reports load until ctx ends.
func (cp *ControlPlane) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); cp.follow(ctx) }()
	go func() { defer wg.Done(); cp.report(ctx) }()
	wg.Wait()
}

// Knows reports whether model belongs to a service the control plane runs, ready replica
// or not. A service that has not said which models it serves (no arbiter.model in its
// spec, no replica answered yet) claims unknown models when it is the only service.
func (cp *ControlPlane) Knows(model string) bool {
	cp.mu.RLock()
	defer cp.mu.RUnlock()
	return fleet.ServiceFor(cp.services, model) >= 0
}

// Models lists the models the control plane's services declare, sorted: what a client may
// ask for while a service is at zero replicas.
func (cp *ControlPlane) Models() []string {
	cp.mu.RLock()
	defer cp.mu.RUnlock()
	var out []string
	for _, s := range cp.services {
		for _, m := range s.Models {
			if !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Routing is how the control plane set a service to be routed: empty fields (nil Queue)
// where it set nothing.
type Routing struct {
	Service, Policy string
	SLO             SLO
	Queue           *fleet.Queue
	// Tenants are the service's own bands and weights per tenant (fleet.Service.Tenants).
	Tenants []fleet.TenantBand
}

// Routing returns the service of model and how the control plane set it to be routed; ok
// is false when no service serves model.
func (cp *ControlPlane) Routing(model string) (r Routing, ok bool) {
	cp.mu.RLock()
	defer cp.mu.RUnlock()
	i := fleet.ServiceFor(cp.services, model)
	if i < 0 {
		return Routing{}, false
	}
	s := cp.services[i]
	if s.SLO != nil {
		r.SLO = SLO{TTFT: s.SLO.TTFTSeconds, TPOT: s.SLO.TPOTSeconds, E2E: s.SLO.E2ESeconds, Percentile: s.SLO.Percentile}
	}
	r.Service, r.Policy, r.Queue, r.Tenants = s.Name, s.Policy, s.Queue, s.Tenants
	return r, true
}

// Adapter returns the LoRA adapter a model name is on the control plane's services, with
// its service's --max-loras.
func (cp *ControlPlane) Adapter(model string) (fleet.Adapter, int, bool) {
	cp.mu.RLock()
	defer cp.mu.RUnlock()
	a, s, ok := fleet.AdapterOf(cp.services, model)
	if !ok {
		return a, 0, false
	}
	return a, s.MaxLoRAs, true
}

// Revision is the last ready-set revision applied (0 before the first).
func (cp *ControlPlane) Revision() uint64 { return cp.revision.Load() }

// do makes a call to the control plane talked to, and on to the others in turn while one
// does not answer or does not lead.
func (cp *ControlPlane) do(ctx context.Context, method, path string, body any, out any) error {
	var err error
	for range len(cp.urls) {
		k := cp.cur.Load()
		if err = cp.doAt(ctx, cp.urls[k], method, path, body, out); !elsewhere(err) || ctx.Err() != nil {
			return err
		}
		cp.next(k)
	}
	return err
}

func (cp *ControlPlane) doAt(ctx context.Context, url, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+cp.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := cp.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return &cpError{code: resp.StatusCode, msg: fmt.Sprintf("control plane %s %s: HTTP %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(msg))}
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if raw, ok := out.(*[]byte); ok { // the body as it came, read by the caller
		*raw, err = io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		return err
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out)
}

// cpError is the control plane's answer other than 200.
type cpError struct {
	code int
	msg  string
}

func (e *cpError) Error() string { return e.msg }

// follow long-polls the ready set: the control plane answers at once when the set is newer
// than ours, else when it changes or after its wait. A new replica gets traffic within
// milliseconds of being ready, and a draining one stops getting it as fast.
func (cp *ControlPlane) follow(ctx context.Context) {
	backoff := 100 * time.Millisecond
	from := int64(-1) // the control plane the revision applied is from
	for ctx.Err() == nil {
		var set fleet.ReadySet
		// Any control plane answers the ready set, a standby too (from the store). Each
		// counts revisions of its own: one first asked answers at once (after=0).
		k, after := cp.cur.Load(), uint64(0)
		if k == from {
			after = cp.revision.Load()
		}
		err := cp.doAt(ctx, cp.urls[k], http.MethodGet, fmt.Sprintf("/v1/readyset?after=%d&wait=25s", after), nil, &set)
		if err == nil {
			err = fleet.ValidateSet(set.Replicas)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			cp.log.Warn("control plane unreachable; serving the last known replica set", "err", err, "retry_in", backoff)
			if elsewhere(err) {
				cp.next(k)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if k == from && set.Revision == cp.revision.Load() {
			continue
		}
		from = k
		for i := range set.Services {
			if err := set.Services[i].Queue.Validate(); err != nil {
				// A bug or a version skew: the service routes as the router's config says.
				cp.log.Error("the control plane published a service's queue out of bounds; the router's own queue settings apply to it", "service", set.Services[i].Name, "err", err)
				set.Services[i].Queue = nil
			}
			if err := fleet.CheckTenantBands(set.Services[i].Tenants); err != nil {
				cp.log.Error("the control plane published a service's tenants out of bounds; the keys file's bands apply to it", "service", set.Services[i].Name, "err", err)
				set.Services[i].Tenants = nil
			}
		}
		cp.mu.Lock()
		removed := removedAdapters(cp.services, set.Services)
		cp.services = set.Services
		cp.mu.Unlock()
		if len(removed) > 0 && cp.OnAdaptersRemoved != nil {
			cp.OnAdaptersRemoved(removed)
		}
		for _, sv := range set.Services {
			cp.pool.met.knowService(sv.Name)
		}
		cp.pool.SetSource(SourceControl, ownedReplicas(set.Services, set.Replicas, cp.log))
		cp.revision.Store(set.Revision)
		cp.log.Debug("ready set", "revision", set.Revision, "replicas", len(set.Replicas), "services", len(set.Services))
	}
}

func (cp *ControlPlane) report(ctx context.Context) {
	t := time.NewTicker(cp.ReportEvery)
	defer t.Stop()
	var prevReport time.Time // the last report's time: a replica progressed since then
	for first := true; ; first = false {
		// The first report goes at once: its answer tells a router that has just started
		// what its tenants spent (budgets.go).
		if !first {
			select {
			case <-ctx.Done():
				return // the router sends the last spend once its requests are done (LastReport)
			case <-t.C:
			}
		}
		snap := cp.pool.Snapshot()
		rep := fleet.LoadReport{Router: cp.routerID}
		since := prevReport
		prevReport = time.Now()
		// The control plane refuses a report whole if one number in it is out of bounds: an
		// entry that is (a bug, or a count that slipped past the checks where replicas'
		// numbers are read) is dropped alone, so that every other model keeps its counts.
		for _, m := range cp.load.report(snap) {
			if err := m.Validate(); err != nil && m.Mix != nil {
				// A mix out of bounds costs only the mix: the model's counts still go.
				mix := m.Mix
				m.Mix = nil
				if m.Validate() == nil {
					cp.log.Error("bug: a model's request mix is out of bounds; dropped from the report, its counts sent", "model", m.Model, "err", err, "mix", mix)
				}
			}
			if err := m.Validate(); err != nil {
				cp.log.Error("bug: a model's load entry is out of bounds; dropped from the report, the others sent", "model", m.Model, "err", err)
				continue
			}
			rep.Models = append(rep.Models, m)
		}
		for _, r := range snap {
			l := fleet.Load{ReplicaID: r.Info().ID, InFlight: int(r.InFlight()), Progressing: r.progressedSince(since)}
			l.SLOJudged, l.SLOMisses = r.takeJudged()
			if err := l.Validate(); err != nil {
				cp.log.Error("bug: a replica's load entry is out of bounds; dropped from the report, the others sent", "replica", l.ReplicaID, "err", err)
				continue
			}
			rep.Replicas = append(rep.Replicas, l)
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := cp.sendReport(rctx, rep)
		if err != nil && ctx.Err() == nil {
			// The counts are lost for this window; the autoscaler sees a dip, not a spike.
			// A refusal (HTTP 4xx) is no passing outage: it loses every window until fixed.
			if ce := (*cpError)(nil); errors.As(err, &ce) && ce.code >= 400 && ce.code < 500 {
				cp.log.Warn("load report refused by the control plane; this window's counts are lost", "err", err)
			} else {
				cp.log.Debug("load report failed", "err", err)
			}
		}
		cancel()
	}
}

// sendReport sends one load report with the tenants' spend counted since the last one, and
// learns every tenant's spend from the answer.
func (cp *ControlPlane) sendReport(ctx context.Context, rep fleet.LoadReport) error {
	rep.Tenants = cp.load.spend.take()
	var raw []byte
	err := cp.do(ctx, http.MethodPost, "/v1/load", rep, &raw)
	var ans *fleet.LoadAnswer
	if err == nil && len(bytes.TrimSpace(raw)) > 0 {
		// An answer that does not read (a control plane of an older version answers
		// {"ok":true}) still means the report was taken: its spend is not sent again.
		var a fleet.LoadAnswer
		if jerr := json.Unmarshal(raw, &a); jerr != nil {
			cp.log.Warn("the control plane's answer to a load report does not read; tenants' spend totals not updated", "err", jerr)
		} else {
			ans = &a
		}
	}
	// A report whose answer was lost may have been taken: its spend is sent again, which
	// counts it twice rather than lose it (budgets err on the side of the limit).
	cp.load.spend.sent(rep.Tenants != nil, err == nil, ans)
	return err
}

// LastReport sends, as the router stops (its requests done), the tenants' spend not
// reported yet, so that a restart loses none of it.
func (cp *ControlPlane) LastReport() {
	cp.load.spend.mu.Lock()
	n := len(cp.load.spend.pending)
	cp.load.spend.mu.Unlock()
	if n == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := cp.sendReport(ctx, fleet.LoadReport{Router: cp.routerID}); err != nil {
		cp.log.Error("the tenants' last spend could not be reported as the router stopped; it is lost", "tenants", n, "err", err)
	}
}

// Wake tells the control plane at once that a request waits for model. Repeated wakes for
// one model are sent at most once a second; it never blocks the caller.
func (cp *ControlPlane) Wake(model string) {
	now := time.Now()
	cp.mu.Lock()
	if now.Sub(cp.wakes[model]) < time.Second {
		cp.mu.Unlock()
		return
	}
	cp.wakes[model] = now
	cp.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := cp.do(ctx, http.MethodPost, "/v1/wake", map[string]string{"model": model, "router": cp.routerID}, nil); err != nil {
			cp.log.Warn("wake failed", "model", model, "err", err)
		}
	}()
}

// removedAdapters are the adapters loaded at run time (not static) in before that no
// service of after has under that name.
func removedAdapters(before, after []fleet.Service) []fleet.Adapter {
	kept := map[string]bool{}
	for _, s := range after {
		for _, a := range s.Adapters {
			kept[a.Name] = true
		}
	}
	var out []fleet.Adapter
	for _, s := range before {
		for _, a := range s.Adapters {
			if !a.Static && !kept[a.Name] {
				out = append(out, a)
			}
		}
	}
	return out
}
