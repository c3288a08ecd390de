package sim

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/market"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/router"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/spec"
	"github.com/arbiter-serve/arbiter/traces"
)

// System names one of the compared systems.
type System string

// The systems Run knows.
const (
	Arbiter  System = "arbiter"
	SkyServe System = "skyserve"
	OnDemand System = "ondemand"
	// SkyServeOnDemand is SkyServe's autoscaler, router and fallbacks on on-demand capacity
	// only: the on-demand baseline as a SkyServe user would run it.
	SkyServeOnDemand System = "skyserve-ondemand"
	// SkyServeSpotHedge is SkyServe with SpotHedge switched on as SkyPilot documents it
	// (docs/source/serving/spot-hedge.rst: num_overprovision 1, dynamic_ondemand_fallback,
	// spot_placer dynamic_fallback) and as the SkyServe paper evaluates it (spread over
	// zones, overprovisioned spot, on-demand fallback), whatever the spec says of those keys.
	SkyServeSpotHedge System = "skyserve-spothedge"
	// ArbiterMix is Arbiter sizing its fleet by the GPU mix (scaling.MixPlanner): how many
	// replicas of each GPU type the window's request mix needs within the SLO, from each
	// type's profile, at the least cost, re-decided as the load, the mix and the prices
	// move. Run on one GPU type (Inputs.GPUs) it is that type alone, sized the same way.
	ArbiterMix System = "arbiter-mix"
	// MelangeStatic is Mélange's mix (Griggs et al., arXiv:2404.14527): the same integer
	// program solved once, for the peak hour of the day's requests, and held all day, with
	// Arbiter's router and placement (spot where the spec allows it).
	MelangeStatic System = "melange-static"
)

// Systems lists them in table order.
var Systems = []System{OnDemand, SkyServe, Arbiter}

// Inputs are what every system is run on.
type Inputs struct {
	// Spec is the service.yaml. SkyServe reads only the keys SkyServe has; Arbiter all.
	Spec     *spec.Service
	Requests *traces.RequestTrace
	// Spot is the spot capacity trace; SpotOffset is where in it the simulation starts.
	Spot       *traces.SpotTrace
	SpotOffset time.Duration
	// Reading is how the spot trace's values limit capacity (market.ReadAvailability when
	// empty).
	Reading market.Reading
	Catalog *pricing.Catalog
	Profile engine.Profile
	// Start is the wall-clock time of the simulation's t=0, at which prices are quoted.
	Start    time.Time
	Duration time.Duration
	// ColdStart is launch to ready.
	ColdStart time.Duration
	// ZoneCooldown keeps spot out of a zone this long after it preempted or refused a launch.
	ZoneCooldown time.Duration
	// Warm starts the simulation with min_replicas already ready, as a service that was up
	// before the simulated day began; otherwise it starts at zero.
	Warm bool
	// Trace, if set, receives a line per target change, launch, drain, preemption and wait
	// with no ready replica.
	Trace io.Writer
	// Seed makes tie-breaking random choices repeatable.
	Seed uint64
	// ScanAll, when set, is slo_cheapest's ScanAll: how many candidates a pick predicts
	// every one of before it samples (to compare the sampling pick with a full scan).
	ScanAll int
	// Routers is how many routers the requests go through, a balancer taking them in turn
	// by arrival (0: one). Each has its own view of every replica (its requests, the scrapes
	// every router takes, its prefix memory and affinity) unless SharedView, where each
	// also applies what the others sent at once, as peered routers do (router/peers.go)
	// less the network's milliseconds.
	Routers    int
	SharedView bool
	// PeerDelay is how much later than the sender each other router applies a shared
	// view's event (the gossip's batch window and the network's trip); 0: at once.
	PeerDelay time.Duration
	// Model is the served model's shape (engine.LookupModel: "llama-3.1-8b"): when set,
	// each replica runs its own GPU's profile (engine.ProfileOn) instead of Profile, so a
	// spec offering several GPU types runs a mixed fleet. ArbiterMix and MelangeStatic
	// need it.
	Model string
	// GPUs, when set, keeps only the offers of these accelerators (a single type's run).
	GPUs []string
	// Utilization is the mix planner's (scaling.MixPolicy.Utilization; 0: 0.8).
	Utilization float64
	// LearnHeadroom: the mix planner learns each GPU type's headroom from its replicas'
	// answers (scaling.MixPolicy.Attainment, the SLO's percentile), starting at
	// Utilization, as the control plane's does.
	LearnHeadroom bool
	// HeadroomWindow is the mix planner's (scaling.MixPolicy.HeadroomWindow; 0: its default).
	HeadroomWindow time.Duration
	// PayBack is the mix planner's (0: an hour).
	PayBack time.Duration
	// BurstWindow is the mix planner's (0: the level is the stable window's mean).
	BurstWindow time.Duration
	// LevelWindow, when set, is the mix planner's stable window (else the spec's); PeakWindow
	// its peak window (else its mix window).
	LevelWindow, PeakWindow time.Duration
}

// Published cold start of a vLLM replica with nothing cached (shared/data/README.md).
const DefaultColdStart = 294 * time.Second

func (in *Inputs) validate() error {
	var errs []error
	if in.Spec == nil || in.Requests == nil || in.Spot == nil || in.Catalog == nil {
		errs = append(errs, errors.New("sim: Spec, Requests, Spot and Catalog are required"))
	}
	if in.Duration <= 0 {
		errs = append(errs, fmt.Errorf("sim: Duration %v: must be > 0", in.Duration))
	}
	if in.Routers < 0 {
		errs = append(errs, fmt.Errorf("sim: Routers %d: want ≥ 0 (0: one)", in.Routers))
	}
	if in.ColdStart < 0 || in.ZoneCooldown < 0 || in.SpotOffset < 0 {
		errs = append(errs, errors.New("sim: ColdStart, ZoneCooldown and SpotOffset must be ≥ 0"))
	}
	if err := in.Profile.Validate(); err != nil && in.Model == "" {
		errs = append(errs, fmt.Errorf("sim: %w", err))
	}
	if in.Utilization < 0 || in.Utilization > 1 || in.PayBack < 0 {
		errs = append(errs, fmt.Errorf("sim: utilization %v, payback %v: want a fraction in (0, 1] (0: default) and a payback ≥ 0", in.Utilization, in.PayBack))
	}
	return errors.Join(errs...)
}

// wiring is how one system's control loop and balancer are put together.
type wiring struct {
	routing   string
	scaling   scaling.Config
	decideInt time.Duration
	placement scaling.PlacementPolicy
	slo       router.SLO
	// useNotices: a preemption notice drains the replica and starts its replacement.
	useNotices bool
	// holdAtZero: with no ready replica a request waits (up to holdTimeout) instead of 503.
	holdAtZero  bool
	holdTimeout time.Duration
	// noReadyAfter is how long a 503 for "no ready replica" takes.
	noReadyAfter time.Duration
	// lbSync is how often the balancer learns the ready set (0: at once).
	lbSync time.Duration
	// probeEvery is how often a dead replica is noticed when there was no notice.
	probeEvery time.Duration
	// drainFor is a fixed wait from scale-down to termination (0: until idle).
	drainFor time.Duration
	// retries are the attempts after a connection error, and their backoff.
	retries      int
	retryBackoff func(k int) time.Duration
}

// wire derives a system's wiring from the spec.
func wire(sys System, in *Inputs) (wiring, error) {
	sp := in.Spec
	slo := router.SLO{TTFT: sp.Arbiter.SLO.TTFTSeconds, TPOT: sp.Arbiter.SLO.TPOTSeconds, E2E: sp.Arbiter.SLO.E2ESeconds, Percentile: sp.Arbiter.SLO.Percentile}
	w := wiring{
		routing:      sp.Arbiter.RoutingPolicy,
		scaling:      scaling.ConfigFromSpec(sp),
		decideInt:    time.Duration(sp.Arbiter.Autoscaling.DecisionIntervalSeconds * float64(time.Second)),
		placement:    scaling.PlacementFromSpec(sp, in.ZoneCooldown),
		slo:          slo,
		useNotices:   true,
		holdAtZero:   true,
		holdTimeout:  router.Defaults().RequestTimeout,
		probeEvery:   time.Duration(sp.Arbiter.Readiness.ProbeIntervalSeconds * float64(time.Second)),
		retries:      router.Defaults().MaxAttempts - 1,
		retryBackoff: func(int) time.Duration { return 0 },
	}
	w.placement.ColdStart = in.ColdStart
	switch sys {
	case Arbiter:
	case ArbiterMix, MelangeStatic:
		if in.Model == "" {
			return w, fmt.Errorf("sim: %s needs Inputs.Model (each GPU type's profile)", sys)
		}
	case OnDemand:
		w.placement.UseSpot = false
	case SkyServe, SkyServeOnDemand, SkyServeSpotHedge:
		rp := sp.Service.ReplicaPolicy
		if rp.TargetQPSPerReplica <= 0 && rp.MinReplicas != rp.MaxReplicas {
			return w, errors.New("sim: the SkyServe baseline needs service.replica_policy.target_qps_per_replica")
		}
		w.routing = "least_load"
		w.scaling = scaling.Config{Signal: scaling.SignalQPS, TargetPerReplica: rp.TargetQPSPerReplica,
			MinReplicas: rp.MinReplicas, MaxReplicas: rp.MaxReplicas, NumOverprovision: rp.NumOverprovision,
			StableWindow: 60 * time.Second, UpscaleDelay: 300 * time.Second, DownscaleDelay: 1200 * time.Second,
			ScaleToZeroAfter: 60 * time.Second, AdoptLatest: true}
		if w.scaling.TargetPerReplica <= 0 {
			w.scaling.TargetPerReplica = 1 // fixed size: min = max
		}
		w.decideInt = 20 * time.Second
		// SpotHedge: spot whenever use_spot (no price rule), fallback per the spec, with a
		// stand-in for every spot replica not ready, starting ones included.
		w.placement.MaxSpotPriceRatio = 1
		w.placement.StandInForStarting = true
		w.placement.ZoneRule = scaling.ZoneUnusedThenCheapest
		w.placement.SpotMinZones = 0 // no hedge beyond num_overprovision
		w.placement.Availability = 0 // arbiter.availability is Arbiter's
		// SkyServe drains on a scale-down and swaps stand-ins by its own rules, not by
		// what a relaunch would cost.
		w.placement.RelaunchCosts = false
		// Nor does it move a running spot replica to a cheaper zone.
		w.placement.RebalanceMinSaving, w.placement.RebalanceWhenItPays = 0, false
		w.placement.Reserved = nil
		// A refused launch only cools its zone: SkyServe has no refusal backoff (sky launch
		// fails over across zones within one launch).
		w.placement.RefusalBackoff = 0
		// As shipped, SkyServe's dynamic fallback adds on-demand replicas beyond
		// max_replicas, and a preempted replica's replacement launches beside it.
		w.placement.MaxReplicas = 0
		switch sys {
		case SkyServeOnDemand:
			w.placement.UseSpot = false
		case SkyServeSpotHedge:
			w.scaling.NumOverprovision = max(1, rp.NumOverprovision)
			w.placement.Overprovision = w.scaling.NumOverprovision
			w.placement.DynamicFallback = true
		}
		w.slo = slo
		w.useNotices = false
		w.holdAtZero = false
		w.noReadyAfter = 2600 * time.Millisecond
		w.lbSync = 20 * time.Second
		w.probeEvery = 10 * time.Second
		w.drainFor = 120 * time.Second
		w.retries = 2
		w.retryBackoff = func(k int) time.Duration {
			d := time.Second
			for range k {
				d = d * 16 / 10
			}
			return d
		}
	default:
		return w, fmt.Errorf("sim: unknown system %q: want %s, %s, %s, %s, %s, %s or %s", sys, Arbiter, SkyServe, OnDemand, SkyServeOnDemand, SkyServeSpotHedge, ArbiterMix, MelangeStatic)
	}
	if w.decideInt <= 0 {
		w.decideInt = time.Second
	}
	if w.probeEvery <= 0 {
		w.probeEvery = 10 * time.Second
	}
	if err := w.scaling.Validate(); err != nil {
		return w, fmt.Errorf("sim: %s autoscaling: %w", sys, err)
	}
	if err := w.placement.Validate(); err != nil {
		return w, fmt.Errorf("sim: %s placement: %w", sys, err)
	}
	return w, nil
}
