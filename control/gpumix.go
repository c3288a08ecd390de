package control

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/spec"
)

// The GPU mix (issue 36 §2): an autoscaled service offered several GPU types whose
// profiles are known (a known model shape and a TPOT target) is sized per type by
// scaling.MixPlanner, the code the simulator's arbiter-mix runs: how many replicas of each
// type serve the routers' observed request mix within the SLO at the least cost, with the
// decider's delays and a payback rule for a change of type. Placement (spot, zones,
// fallback, max_replicas) then runs per type, and a type being cut keeps its replicas
// until the new ones are ready. A fixed-size service (min = max) keeps one placer and the
// offers ranked by $ per token.

// gpuMix is a service's per-type sizing.
type gpuMix struct {
	planner   *scaling.MixPlanner
	gpus      []string // lower-case accelerators, sorted
	placers   map[string]*scaling.Placer
	counts    []int
	decidedAt time.Time
	reason    string
}

// mixEvery is how often the mix is decided again (placement runs at every tick): it moves
// over minutes, and each decision solves a small integer program.
const mixEvery = 30 * time.Second

// mixPayBack is how soon a change of type must pay for the cold starts it costs.
const mixPayBack = time.Hour

// mixUtilization is the planner's headroom over each GPU's rate for Poisson arrivals at
// the start; each type's is then learned from its replicas' SLO attainment.
const mixUtilization = 0.6

// sloPercentile is the share of requests the service's SLO must hold for (0.9 where the
// spec leaves it out): each GPU type's headroom is learned toward it.
func sloPercentile(sp *spec.Service) float64 {
	switch p := sp.Arbiter.SLO.Percentile; {
	case p >= 1:
		return 0.999 // every request: learned toward all but one in a thousand
	case p > 0:
		return p
	}
	return 0.9
}

// mixLevelWindow is the window the mix's level is the mean over: the spec's stable window,
// at least scaling.DefaultMixLevelWindow.
func mixLevelWindow(sp *spec.Service) time.Duration {
	return max(scaling.ConfigFromSpec(sp).StableWindow, scaling.DefaultMixLevelWindow)
}

// mixGPUs lists the GPU types s is sized over, or nil where it is not sized per type.
func mixGPUs(sp *spec.Service, offers []scaling.Offer) []string {
	rp := sp.Service.ReplicaPolicy
	if rp.MinReplicas == rp.MaxReplicas || sp.Arbiter.SLO.TPOTSeconds <= 0 || serviceModel(sp) == "" {
		return nil
	}
	var gpus []string
	for _, o := range offers {
		if !o.Sustains.Known || o.Accelerator == "" {
			return nil // some offer cannot be compared per token
		}
		if g := strings.ToLower(o.Accelerator); !slices.Contains(gpus, g) {
			gpus = append(gpus, g)
		}
	}
	if len(gpus) < 2 {
		return nil
	}
	slices.Sort(gpus)
	return gpus
}

// placerFor is the placer that places replicas of accelerator acc.
func (s *service) placerFor(acc string) *scaling.Placer {
	if s.gmix != nil {
		if pl, ok := s.gmix.placers[strings.ToLower(acc)]; ok {
			return pl
		}
	}
	return s.placer
}

// newGPUMix builds a service's planner and per-type placers.
func (c *Controller) newGPUMix(sp *spec.Service, gpus []string) (*gpuMix, error) {
	cfg := scaling.ConfigFromSpec(sp)
	pol := scaling.MixPolicy{MinReplicas: cfg.MinReplicas, MaxReplicas: cfg.MaxReplicas, StableWindow: mixLevelWindow(sp),
		MixWindow: max(mixLevelWindow(sp), mixWindow), PeakWindow: scaling.DefaultMixPeakWindow, UpscaleDelay: cfg.UpscaleDelay,
		DownscaleDelay: cfg.DownscaleDelay, ScaleToZeroAfter: cfg.ScaleToZeroAfter, ColdStart: scaling.DefaultColdStart,
		PayBack: mixPayBack, Utilization: mixUtilization, Attainment: sloPercentile(sp)}
	pl, err := scaling.NewMixPlanner(pol)
	if err != nil {
		return nil, err
	}
	m := &gpuMix{planner: pl, gpus: gpus, placers: map[string]*scaling.Placer{}}
	for _, g := range gpus {
		p, err := scaling.NewPlacer(scaling.PlacementFromSpec(sp, c.cfg.ZoneCooldown))
		if err != nil {
			return nil, err
		}
		m.placers[g] = p
	}
	return m, nil
}

// mixClasses is the load the planner sizes for at now: the routers' observed mix over its
// window (or, before there is one, the spec's arbiter.workload or the default shape),
// scaled to the requests of the last stable window.
func (s *service) mixClasses(sp *spec.Service, now time.Time, stable time.Duration) []scaling.MixClass {
	observed, n := s.mix.classes(now)
	shape, _ := sizingMix(sp, observed, n)
	level := s.mix.recent(now, stable)
	total := 0.0
	for _, c := range shape {
		total += c.Rate
	}
	out := make([]scaling.MixClass, len(shape))
	for i, c := range shape {
		out[i] = c
		out[i].Rate = 0
		if total > 0 {
			out[i].Rate = level * c.Rate / total
		}
	}
	return out
}

// mixTypes prices each GPU type and says what one replica sustains within the SLO for each
// class (scaling.MixTypes).
func mixTypes(sp *spec.Service, m *gpuMix, classes []scaling.MixClass, offers []scaling.Offer, now time.Time) []scaling.MixType {
	model := serviceModel(sp)
	tpot, ttft := sloTargets(sp)
	return scaling.MixTypes(m.gpus, offers, scaling.PlacementFromSpec(sp, 0), classes,
		func(gpu string, os []scaling.Offer) []scaling.Offer { return m.placers[gpu].Offered(now, os) },
		func(gpu string, in, out int) float64 {
			prof, err := engine.ProfileOn(gpu, model)
			if err != nil {
				return 0
			}
			r, err := engine.SustainedRate(prof, in, out, tpot, ttft)
			if err != nil {
				return 0
			}
			return r.RequestsPerSecond
		})
}

// judged gives each GPU-mixed service's planner its replicas' answers judged against the
// SLO, by the replica's GPU type: the planner learns each type's headroom from them.
// Caller holds c.mu.
func (c *Controller) judged(loads []fleet.Load) {
	now := c.cfg.Now()
	for _, l := range loads {
		if l.SLOJudged <= 0 {
			continue
		}
		if s, r := c.replicaByID(l.ReplicaID); r != nil && s.gmix != nil && r.row.Accelerator != "" {
			s.gmix.planner.Outcome(now, strings.ToUpper(r.row.Accelerator), l.SLOJudged, l.SLOJudged-l.SLOMisses)
		}
	}
}

// placeMix sizes s per GPU type and places each type toward its count. Caller holds c.mu.
func (c *Controller) placeMix(ctx context.Context, s *service, cur []*replica, offers []scaling.Offer, gpus []string, now time.Time) {
	sp := s.spec()
	if s.gmix == nil || !slices.Equal(s.gmix.gpus, gpus) {
		m, err := c.newGPUMix(sp, gpus)
		if err != nil {
			c.event(ctx, s.name, "", "error", "GPU mix: "+err.Error())
			return
		}
		s.gmix = m
	}
	m := s.gmix
	alive, ready := make([]int, len(gpus)), make([]int, len(gpus))
	existing := make([][]scaling.Placed, len(gpus))
	add := func(r *replica, counted bool) {
		g := slices.Index(gpus, strings.ToLower(r.row.Accelerator))
		if g < 0 {
			return
		}
		st := replicas.State(r.row.State)
		existing[g] = append(existing[g], r.placed())
		if counted && st != replicas.Draining {
			alive[g]++
			if st == replicas.Ready {
				ready[g]++
			}
		}
	}
	for _, r := range cur {
		add(r, true)
	}
	for _, r := range sortedReplicas(s.replicas) {
		if r.row.Version == s.version && r.own() == "" && replicas.State(r.row.State) == replicas.Draining {
			add(r, false)
		}
	}
	if m.counts == nil {
		m.counts = slices.Clone(alive) // a restart, or a service that became mixed: what runs
	}
	if !s.lastRequest.IsZero() {
		m.planner.Active(s.lastRequest)
	}
	stable := mixLevelWindow(sp)
	total := 0
	for _, n := range m.counts {
		total += n
	}
	if now.Sub(m.decidedAt) >= mixEvery || (total == 0 && s.waiting > 0) {
		m.decidedAt = now
		classes := s.mixClasses(sp, now, stable)
		types := mixTypes(sp, m, classes, offers, now)
		d := m.planner.Decide(now, classes, types, m.counts, int(math.Ceil(s.waiting)))
		if len(d.Learned) > 0 {
			c.event(ctx, s.name, "", "scale", "GPU mix: "+strings.Join(d.Learned, "; "))
		}
		if !slices.Equal(d.Counts, m.counts) {
			c.event(ctx, s.name, "", "scale", "GPU mix: "+d.Reason)
			c.log.Info("scale", "service", s.name, "mix", scaling.DescribeMix(types, d.Counts), "reason", d.Reason)
			m.counts = d.Counts
		}
		m.reason = d.Reason
	}
	total = 0
	for _, n := range m.counts {
		total += n
	}
	s.target = total
	targets := scaling.PlacementTargets(m.counts, alive, ready)
	for g, gpu := range gpus {
		var mine []scaling.Offer
		for _, o := range offers {
			if strings.EqualFold(o.Accelerator, gpu) {
				mine = append(mine, o)
			}
		}
		pol := scaling.MixTypePolicy(scaling.PlacementFromSpec(sp, c.cfg.ZoneCooldown), total)
		pol.MaxReplicas = 0 // bounded by the mix over every type
		if err := m.placers[gpu].Reconfigure(pol); err != nil {
			c.event(ctx, s.name, "", "error", "placement: "+err.Error())
			return
		}
		plan := m.placers[gpu].Plan(now, targets[g], existing[g], mine)
		if plan.Reason != "" {
			plan.Reason = fmt.Sprintf("%s: %s", strings.ToUpper(gpu), plan.Reason)
		}
		c.applyPlan(ctx, s, plan, now)
	}
}
