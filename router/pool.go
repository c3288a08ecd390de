package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
)

// Pool is the router's replica set. SetReplicas replaces the set (from a file or the
// control plane); per-replica state survives for IDs that stay. Removed replicas drain:
// they take no new requests and are dropped once their last request ends.
type Pool struct {
	cfg *Config
	log *slog.Logger
	met *Metrics
	aff *Affinity
	// peers, when set, shares what this router sends with its peers (peers.go); set before
	// the first replica is added.
	peers *peerView

	mu     sync.RWMutex // guards byID, list, models; never held while calling out
	byID   map[string]*Replica
	list   []*Replica // sorted by ID: a deterministic order for snapshots and tests
	models map[string]bool
	// byModel is, per model, its listed replicas (ready, not draining) cheapest first,
	// rebuilt whenever the set or a readiness changes. Requests read it without a lock:
	// finding a model's candidates costs the same with one model of four replicas as with a
	// hundred models of forty.
	byModel atomic.Pointer[map[string][]*Replica]
	// changed is closed and replaced whenever the set or a replica's readiness changes:
	// requests held at zero replicas wait on it.
	changed chan struct{}
	// added wakes the probe loop when a replica joins, so its round trip is measured before
	// its first requests rather than up to a probe interval later (a far replica's first
	// answers would otherwise be taken for slow prefill).
	added chan struct{}
	// profiles holds the engine profiles replicas named, fitted once each. Guarded by mu.
	profiles map[string]*engine.Profile

	// srcMu guards sources: each source's replicas, for SetSource.
	srcMu   sync.Mutex
	sources map[string][]fleet.Replica
}

// SourceControl names the control plane's replicas among a pool's sources (SetSource).
const SourceControl = "control"

// SetSource sets the replicas one source gives (the control plane, the endpoint picker's
// InferencePool watch) and the pool to the union of every source's. A replica whose address
// or ID a source earlier in name order gave is that source's: "control" comes before
// "inferencepool", so a pod the control plane placed is priced and modelled as it placed it.
func (p *Pool) SetSource(name string, set []fleet.Replica) {
	p.srcMu.Lock()
	defer p.srcMu.Unlock()
	if p.sources == nil {
		p.sources = map[string][]fleet.Replica{}
	}
	p.sources[name] = set
	names := make([]string, 0, len(p.sources))
	for n := range p.sources {
		names = append(names, n)
	}
	sort.Strings(names)
	var union []fleet.Replica
	addrs, ids := map[string]bool{}, map[string]bool{}
	for _, n := range names {
		start := len(union)
		for _, r := range p.sources[n] {
			if !addrs[r.Address] && !ids[r.ID] {
				union = append(union, r)
			}
		}
		for _, r := range union[start:] {
			addrs[r.Address], ids[r.ID] = true, true
		}
	}
	p.SetReplicas(union)
}

// sharePeers shares what this router sends with its peers from now on.
func (p *Pool) sharePeers(v *peerView) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.peers = v
	for _, r := range p.byID {
		r.out.Store(v)
	}
}

// NewPool returns an empty pool.
func NewPool(cfg *Config, log *slog.Logger, met *Metrics, aff *Affinity) *Pool {
	return &Pool{cfg: cfg, log: log, met: met, aff: aff, byID: map[string]*Replica{}, models: map[string]bool{}, changed: make(chan struct{}), added: make(chan struct{}, 1),
		profiles: map[string]*engine.Profile{}}
}

// Changed returns a channel closed at the next change of the set or of a replica's readiness.
func (p *Pool) Changed() <-chan struct{} {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.changed
}

// notify wakes everything waiting on Changed. Caller holds p.mu for writing.
func (p *Pool) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// SetReplicas installs a new replica set. The caller validates it (fleet.ValidateSet).
func (p *Pool) SetReplicas(set []fleet.Replica) {
	p.mu.Lock()
	next := make(map[string]*Replica, len(set))
	models := map[string]bool{}
	joined := false
	for _, info := range set {
		r := p.byID[info.ID]
		prof := p.profile(info)
		if r == nil || r.Info().Address != info.Address {
			if r != nil {
				p.retire(r) // same ID, new address: a new process; start fresh
			}
			r = newReplica(info, newConnPool(info.Address, p.cfg.ConnectTimeout, p.cfg.UpstreamIdleTimeout, p.cfg.MaxIdleConnsPerReplica), prof)
			r.out.Store(p.peers)
			joined = true
			p.log.Info("replica added", "id", info.ID, "addr", info.Address, "capacity", info.Capacity, "price_per_hour", info.PricePerHour, "profile", prof.Name)
		} else {
			r.setInfo(info, prof)
		}
		next[info.ID] = r
		if info.Adapter == "" {
			// An adapter's own replica's name stays an adapter's (HasModel): its requests
			// may go to the base model's replicas too.
			models[info.Model] = true
		}
	}
	for id, r := range p.byID {
		if next[id] == nil {
			p.retire(r)
			p.log.Info("replica removed", "id", id, "in_flight", r.InFlight())
		}
	}
	p.byID, p.models = next, models
	p.list = p.list[:0]
	for _, r := range next {
		p.list = append(p.list, r)
	}
	sort.Slice(p.list, func(i, j int) bool { return p.list[i].Info().ID < p.list[j].Info().ID })
	p.reindex()
	p.notify()
	p.mu.Unlock()
	p.met.setReplicas(p.Snapshot())
	if joined {
		select {
		case p.added <- struct{}{}:
		default: // a round is already due
		}
	}
}

// profile is the engine profile a replica's model runs with: the one it names, else its
// accelerator's profile of its model (or, for a model name no shape is known for, of the
// default profile's 8B shape: the right GPU at least), else the default. A name the router
// does not know (the set was validated elsewhere, e.g. by a newer control plane) falls
// back to the default, loudly: predictions then rest on calibration alone. Caller holds
// p.mu for writing.
func (p *Pool) profile(info fleet.Replica) *engine.Profile {
	name := cmp.Or(info.Profile, profileOfAccelerator(info), DefaultProfile)
	if prof, ok := p.profiles[name]; ok {
		return prof
	}
	prof, err := LoadProfile(name)
	if err != nil {
		p.log.Warn("replica profile unknown: predicting with the default, corrected by traffic", "replica", info.ID, "err", err)
		if prof, err = LoadProfile(DefaultProfile); err != nil {
			panic(err) // built in: covered by TestDefaultProfileLoads
		}
	}
	p.profiles[name] = prof
	return prof
}

// profileOfAccelerator names the profile of a replica's model on its accelerator, "" when
// it names no accelerator or one no profile can be made for.
func profileOfAccelerator(info fleet.Replica) string {
	if info.Accelerator == "" {
		return ""
	}
	if name, err := engine.ProfileOn(info.Accelerator, info.Model); err == nil {
		return name
	}
	name, _ := engine.ProfileOn(info.Accelerator, DefaultProfile)
	return name
}

// retire marks a replica removed: requests already on it finish (they hold it), new ones
// cannot pick it. Caller holds p.mu.
func (p *Pool) retire(r *Replica) {
	r.removed.Store(true)
	if r.conns != nil {
		r.conns.close()
	}
	p.aff.forget(r)
}

// reindex rebuilds the per-model candidate lists. Caller holds p.mu for writing.
func (p *Pool) reindex() {
	idx := make(map[string][]*Replica, len(p.models))
	for _, r := range p.list {
		if r.listed() {
			m := r.Info().Model
			idx[m] = append(idx[m], r)
		}
	}
	for _, rs := range idx {
		SortByCost(rs)
	}
	p.byModel.Store(&idx)
}

// SortByCost orders replicas as policies expect their candidates: by marginal cost, the
// cheapest first, then by ID.
func SortByCost(rs []*Replica) {
	slices.SortFunc(rs, compareCost)
}

func compareCost(a, b *Replica) int {
	if c := cmp.Compare(a.MarginalCost(), b.MarginalCost()); c != 0 {
		return c
	}
	return strings.Compare(a.Info().ID, b.Info().ID)
}

// HasModel reports whether any replica in the set serves model.
func (p *Pool) HasModel(model string) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.models[model]
}

// Models lists the served model names, sorted.
func (p *Pool) Models() []string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make([]string, 0, len(p.models))
	for m := range p.models {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// Snapshot returns the current replicas.
func (p *Pool) Snapshot() []*Replica {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return append([]*Replica(nil), p.list...)
}

// Get returns a replica by ID.
func (p *Pool) Get(id string) *Replica {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.byID[id]
}

// candidates returns model's listed replicas, cheapest first (SortByCost). The slice is
// shared: callers read it and never change it. Ejected replicas are in it; policies skip
// them (Request.usable).
func (p *Pool) candidates(model string) []*Replica {
	if idx := p.byModel.Load(); idx != nil {
		return (*idx)[model]
	}
	return nil
}

// Run probes readiness and scrapes vLLM metrics for every replica until ctx ends. One
// loop per concern over the whole pool, as a tick fan-out: replicas come and go with the
// set, so there are no per-replica goroutines to start and stop.
func (p *Pool) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.loop(ctx, p.cfg.Probe.Interval, p.added, p.probe) }()
	go func() { defer wg.Done(); p.loop(ctx, p.cfg.ScrapeInterval, nil, p.scrape) }()
	wg.Wait()
}

// loop runs f on every replica at once, now and then every interval or when wake fires.
func (p *Pool) loop(ctx context.Context, every time.Duration, wake <-chan struct{}, f func(context.Context, *Replica, *fasthttp.Client)) {
	client := &fasthttp.Client{
		ReadTimeout: p.cfg.Probe.Timeout, WriteTimeout: p.cfg.Probe.Timeout,
		MaxIdleConnDuration: p.cfg.UpstreamIdleTimeout, NoDefaultUserAgentHeader: true,
		// A replica's /health or /metrics past this is refused, not read into memory.
		MaxResponseBodySize: maxScrapeBytes,
	}
	t := time.NewTicker(every)
	defer t.Stop()
	inProgress := map[*Replica]bool{}
	var mu sync.Mutex
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-wake:
			}
		}
		for _, r := range p.Snapshot() {
			mu.Lock()
			busy := inProgress[r]
			inProgress[r] = true
			mu.Unlock()
			if busy {
				continue // a slow replica's previous probe is still out; do not pile up
			}
			go func() {
				f(ctx, r, client)
				mu.Lock()
				delete(inProgress, r)
				mu.Unlock()
			}()
		}
	}
}

func (p *Pool) probe(_ context.Context, r *Replica, c *fasthttp.Client) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + r.Info().Address + p.cfg.Probe.Path)
	start := time.Now()
	err := c.DoTimeout(req, resp, p.cfg.Probe.Timeout)
	if err == nil && !r.rttKnown() {
		// That probe also opened the connection (a second round trip): the predictor's first
		// round trip, which it takes as is, comes from a probe on the open connection.
		start = time.Now()
		resp.Reset()
		err = c.DoTimeout(req, resp, p.cfg.Probe.Timeout)
	}
	ok := err == nil && resp.StatusCode() == fasthttp.StatusOK
	was := r.Available(start)
	ready := r.probed(ok, time.Since(start), p.cfg.Probe.FailureThreshold)
	if was != ready {
		p.mu.Lock()
		p.reindex()
		p.notify()
		p.mu.Unlock()
	}
	if was != ready || !ok {
		p.log.Debug("probe", "replica", r.Info().ID, "ok", ok, "ready", ready, "err", err)
	}
}

// maxScrapeBytes bounds a replica's /metrics (and /health) body: 8 MiB. vLLM's /metrics
// for one model is some tens of KiB (its histograms' buckets, per engine); even a replica
// serving hundreds of LoRA adapters stays well under this.
const maxScrapeBytes = 8 << 20

func (p *Pool) scrape(_ context.Context, r *Replica, c *fasthttp.Client) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + r.Info().Address + "/metrics")
	err := c.DoTimeout(req, resp, p.cfg.Probe.Timeout)
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		rejectReport(p.met, p.log, r, sourceMetrics, "too_big", fmt.Sprintf("/metrics body over %d bytes", maxScrapeBytes), time.Now())
		return
	}
	if err != nil || resp.StatusCode() != fasthttp.StatusOK {
		return
	}
	g := ParseEngineGauges(resp.Body())
	now := time.Now()
	if g.Invalid != "" {
		// The last good scrape ages out (staleAfter) and the router's own counts stand.
		rejectReport(p.met, p.log, r, sourceMetrics, g.Invalid, g.Detail, now)
		return
	}
	if g.Found {
		r.observeScrape(now, g.Running, g.Waiting, g.KVUsage)
	}
	if g.TokensFound {
		r.observeTokens(now, g.Tokens)
	}
	if g.LoRA != nil {
		r.observeLoRA(now, g.LoRA)
	}
	if g.LoRAInvalid != "" {
		rejectReport(p.met, p.log, r, sourceMetrics, g.LoRAInvalid, g.LoRADetail+" (that series skipped)", now)
	}
}
