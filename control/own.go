package control

import (
	"context"
	"fmt"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/spec"
)

// ownPool is a hot LoRA adapter's replicas of its own (issue 51): replicas that run its
// merged checkpoint (arbiter.adapters[].merged) and serve it under its name at the base
// model's step cost. The routers send the adapter's requests there first; what these do
// not take goes to the service's shared replicas, which load the adapter as before.
type ownPool struct {
	decide *scaling.Own
	target int
	why    string
	placer *scaling.Placer
}

// own is the adapter a replica serves merged, "" for a shared replica.
func (r *replica) own() string { return r.row.Adapter }

// mergedAdapters are the current spec's adapters that may have replicas of their own.
func mergedAdapters(sp *spec.Service) []spec.Adapter {
	if sp == nil {
		return nil
	}
	var out []spec.Adapter
	for _, a := range sp.Arbiter.Adapters {
		if a.MergedPath != "" {
			out = append(out, a)
		}
	}
	return out
}

// ownLoad is one adapter's load this tick as the routers reported it.
type ownLoad struct {
	inflight, onOwn  float64 // its requests in flight, and those on its own replicas
	requests, tokens float64 // since the last tick
}

// decideOwn sets each merged adapter's target of replicas of its own from its load, and
// takes what those replicas serve out of the shared replicas' sample smp: the service's
// decider sizes the shared replicas on the rest. loads is by adapter; interval is the time
// since the last tick. Caller holds c.mu.
func (c *Controller) decideOwn(ctx context.Context, s *service, smp *scaling.Sample, loads map[string]ownLoad, interval time.Duration, now time.Time) {
	sp := s.spec()
	merged := mergedAdapters(sp)
	if len(merged) == 0 {
		s.pools = nil
		return
	}
	cfg := scaling.ConfigFromSpec(sp)
	if s.pools == nil {
		s.pools = map[string]*ownPool{}
	}
	room := max(cfg.MaxReplicas-1, 0) // the shared replicas keep room for one
	for _, a := range merged {
		p := s.pools[a.Name]
		if p == nil {
			p = &ownPool{decide: &scaling.Own{StepCost: engine.DefaultLoRAStepCost, Window: cfg.StableWindow,
				UpscaleDelay: cfg.UpscaleDelay, DownscaleDelay: cfg.DownscaleDelay}}
			// After a restart or a takeover, what runs is the target until the load moves it.
			for _, r := range s.replicas {
				if r.own() == a.Name && r.row.Version == s.version && live(replicas.State(r.row.State)) {
					p.target++
				}
			}
			s.pools[a.Name] = p
		}
		l := loads[a.Name]
		onOwn := min(max(l.onOwn, 0), l.inflight)
		share := 0.0 // of the adapter's traffic its own replicas took
		if l.inflight > 0 {
			share = onOwn / l.inflight
		}
		// Its load in base-model work: requests on shared replicas stay in flight
		// 1 + StepCost times as long as on its own.
		var b float64
		switch cfg.Signal {
		case scaling.SignalQPS:
			b = l.requests / max(interval.Seconds(), 1e-3)
		case scaling.SignalTokens:
			b = l.tokens / max(interval.Seconds(), 1e-3)
		default:
			b = onOwn + (l.inflight-onOwn)/(1+engine.DefaultLoRAStepCost)
		}
		p.decide.Record(scaling.OwnSample{At: now, Load: b})
		smp.InFlight = max(smp.InFlight-onOwn, 0)
		smp.Requests = max(smp.Requests-share*l.requests, 0)
		smp.Tokens = max(smp.Tokens-share*l.tokens, 0)
		target, why := p.decide.Decide(now, cfg.TargetPerReplica, p.target, room)
		if cfg.MinReplicas == cfg.MaxReplicas {
			target, why = 0, "a fixed replica count"
		}
		room -= target
		if target != p.target {
			c.event(ctx, s.name, "", "scale", fmt.Sprintf("adapter %s's own replicas (its merged checkpoint): %d → %d: %s", a.Name, p.target, target, why))
			c.log.Info("scale", "service", s.name, "adapter", a.Name, "from", p.target, "to", target, "reason", why)
			p.target = target
		}
		p.why = why
	}
	for name := range s.pools {
		if sp.Arbiter.MergedPath(name) == "" {
			delete(s.pools, name)
		}
	}
}

// ownTargets is how many replicas of their own the adapters want in all.
func (s *service) ownTargets() int {
	n := 0
	for _, p := range s.pools {
		n += p.target
	}
	return n
}

// ownReady is how many of the adapters' own replicas of the current version are ready:
// what the shared replicas make room for in max_replicas. One still starting does not
// count yet, so that a shared replica serving now is not drained for one that may take
// minutes to start, or never does (a market refusing it): as in a rolling update, the
// fleet passes the bound by the replicas starting.
func (s *service) ownReady() int {
	n := 0
	for _, r := range s.replicas {
		if r.own() != "" && s.pools[r.own()] != nil && r.row.Version == s.version && replicas.State(r.row.State) == replicas.Ready {
			n++
		}
	}
	return min(n, s.ownTargets())
}

// placerOf is the placer that places r: its adapter's pool's for one of an adapter's own.
func (s *service) placerOf(r *replica) *scaling.Placer {
	if a := r.own(); a != "" {
		if p := s.pools[a]; p != nil {
			return p.placer
		}
		return nil
	}
	return s.placerFor(r.row.Accelerator)
}

// poolTarget is the target of r's pool: the service's for a shared replica, its adapter's
// for one of an adapter's own.
func (s *service) poolTarget(r *replica) int {
	if a := r.own(); a != "" {
		if p := s.pools[a]; p != nil {
			return p.target
		}
		return 0
	}
	return s.target
}

// reconcileOwn moves each adapter's replicas of its own toward its target, through the
// placer where the providers quote offers, and drains those no adapter wants any more (one
// taken out of the spec, a merged checkpoint replaced, a version rolled out). Caller holds
// c.mu.
func (c *Controller) reconcileOwn(ctx context.Context, s *service, offers []scaling.Offer, market bool, now time.Time) {
	sp := s.spec()
	cur := map[string][]*replica{}
	for _, r := range sortedReplicas(s.replicas) {
		name := r.own()
		if name == "" || !live(replicas.State(r.row.State)) {
			continue
		}
		p := s.pools[name]
		if p == nil || r.row.Version != s.version {
			// No longer wanted: the shared replicas serve the adapter (and load it).
			if !r.busy { // one launching is drained on a later tick
				c.drainOne(ctx, s, r, fmt.Sprintf("adapter %s has no replicas of its own in version %d", name, s.version))
			}
			continue
		}
		// A replica launching or being probed (busy) counts: it is on its way.
		if !r.noticed() {
			cur[name] = append(cur[name], r)
		}
	}
	for _, a := range mergedAdapters(sp) {
		p := s.pools[a.Name]
		if p == nil {
			continue
		}
		rs := cur[a.Name]
		if market && len(offers) > 0 {
			if c.havePlacer(ctx, s, &p.placer) {
				c.runPlan(ctx, s, p.placer.Plan(now, p.target, placedAll(rs), offers), now, a.Name)
			}
			continue
		}
		if missing := p.target - len(rs); missing > 0 && !now.Before(s.nextLaunch) {
			for range missing {
				c.launch(ctx, s, nil, a.Name)
			}
		}
		if extra := len(rs) - p.target; extra > 0 {
			c.drainSome(ctx, s, rs, extra, fmt.Sprintf("adapter %s's own replicas: %s", a.Name, p.why))
		}
	}
}

// ownRun is the run: command of adapter's own replicas: the service's, with vLLM started on
// its merged checkpoint (spec.MergedRun; validated with the spec).
func ownRun(sp *spec.Service, adapter string) (string, error) {
	path := sp.Arbiter.MergedPath(adapter)
	if path == "" {
		return "", fmt.Errorf("version's spec has no merged checkpoint for it")
	}
	return spec.MergedRun(sp.Run, path, adapter)
}

// ownLoads is each merged adapter's load this tick: its requests in flight (byModel, the
// routers' reports by model name), those on its own replicas (view), and its requests and
// tokens since the last tick. Caller holds c.mu.
func (s *service) ownLoads(byModel map[string]float64, view routerView) map[string]ownLoad {
	merged := mergedAdapters(s.spec())
	if len(merged) == 0 {
		return nil
	}
	out := map[string]ownLoad{}
	for _, a := range merged {
		l := ownLoad{inflight: byModel[a.Name]}
		if n := s.adapterCounts[a.Name]; n != nil {
			l.requests, l.tokens = n.tickRequests, n.tickTokens
			n.tickRequests, n.tickTokens = 0, 0
		}
		out[a.Name] = l
	}
	for id, r := range s.replicas {
		if name := r.own(); name != "" {
			if l, ok := out[name]; ok {
				l.onOwn += float64(view.inflight[id])
				out[name] = l
			}
		}
	}
	return out
}
