package sim

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/scaling"
)

// A mixed fleet: each replica runs its own GPU's profile; ArbiterMix sizes the fleet per
// GPU type with scaling.MixPlanner and MelangeStatic holds one mix all day. Placement
// (spot, zones, fallback) runs per type, each type with a placer of its own.

// mixFleet is a simulation's GPU types and what it keeps per type.
type mixFleet struct {
	gpus     []string // accelerators offered, sorted
	profiles map[string]*engine.Profile
	names    map[string]string // accelerator → profile name
	placers  map[string]*scaling.Placer
	planner  *scaling.MixPlanner
	static   []int // MelangeStatic's counts
	tpot     time.Duration
	ttft     time.Duration
	// counts is the mix in force, per gpus, decided at decidedAt.
	counts    []int
	decidedAt time.Duration
}

// mixEvery is how often the mix is decided again (placement still runs at every decision
// interval, so a lost replica is replaced at once): the mix moves over minutes, and each
// decision solves an integer program.
const mixEvery = 30 * time.Second

// DefaultUtilization is the mix planner's headroom in the simulator unless Inputs says.
const DefaultUtilization = 0.8

// profileFor is the profile a replica on o runs.
func (s *simulation) profileFor(o scaling.Offer) engine.Profile {
	if s.mix != nil {
		if p, ok := s.mix.profiles[strings.ToLower(o.Accelerator)]; ok {
			return *p
		}
	}
	return s.in.Profile
}

// offers is the market's offers at now, less the accelerators Inputs.GPUs leaves out.
func (s *simulation) offers() []scaling.Offer {
	all := s.mkt.Offers(s.now)
	if len(s.in.GPUs) == 0 {
		return all
	}
	out := make([]scaling.Offer, 0, len(all))
	for _, o := range all {
		if slices.ContainsFunc(s.in.GPUs, func(g string) bool { return strings.EqualFold(g, o.Accelerator) }) {
			out = append(out, o)
		}
	}
	return out
}

// placerFor is the placer of a replica's type.
func (s *simulation) placerFor(o scaling.Offer) *scaling.Placer {
	if s.mix != nil && s.mix.placers != nil {
		if pl, ok := s.mix.placers[strings.ToLower(o.Accelerator)]; ok {
			return pl
		}
	}
	return s.placer
}

// setupMix builds the mixed fleet's profiles (whenever Inputs.Model is set) and, for
// ArbiterMix and MelangeStatic, the per-type placers and the planner or the static mix.
func (s *simulation) setupMix() error {
	if s.in.Model == "" {
		return nil
	}
	m := &mixFleet{profiles: map[string]*engine.Profile{}, names: map[string]string{}}
	for _, o := range s.offers() {
		g := strings.ToLower(o.Accelerator)
		if g == "" || m.profiles[g] != nil {
			continue
		}
		name, err := engine.ProfileOn(g, s.in.Model)
		if err != nil {
			return fmt.Errorf("sim: %s: %w", o.Accelerator, err)
		}
		p, err := engine.LoadProfile(name)
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		m.gpus = append(m.gpus, g)
		m.profiles[g], m.names[g] = p, name
	}
	if len(m.gpus) == 0 {
		return fmt.Errorf("sim: no offer for %v", s.in.GPUs)
	}
	slices.Sort(m.gpus)
	s.mix = m
	if s.sys != ArbiterMix && s.sys != MelangeStatic {
		return nil
	}
	m.tpot = time.Duration(s.w.slo.TPOT * float64(time.Second))
	m.ttft = time.Duration(s.w.slo.TTFT * float64(time.Second))
	if m.tpot <= 0 {
		return fmt.Errorf("sim: %s needs arbiter.slo.tpot_seconds (the rate each GPU sustains is computed for it)", s.sys)
	}
	m.placers = map[string]*scaling.Placer{}
	for _, g := range m.gpus {
		pl, err := scaling.NewPlacer(s.w.placement)
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		m.placers[g] = pl
	}
	m.counts = make([]int, len(m.gpus))
	sc := s.w.scaling
	pol := scaling.MixPolicy{MinReplicas: sc.MinReplicas, MaxReplicas: sc.MaxReplicas,
		StableWindow: sc.StableWindow, MixWindow: max(sc.StableWindow, 15*time.Minute),
		UpscaleDelay: sc.UpscaleDelay, DownscaleDelay: sc.DownscaleDelay, ScaleToZeroAfter: sc.ScaleToZeroAfter,
		ColdStart: s.in.ColdStart, PayBack: s.in.PayBack, Utilization: s.in.Utilization, BurstWindow: s.in.BurstWindow,
		PeakWindow: s.in.PeakWindow}
	if s.in.LevelWindow > 0 {
		pol.StableWindow = s.in.LevelWindow
		pol.MixWindow = max(pol.MixWindow, pol.StableWindow)
	}
	if pol.PayBack <= 0 {
		pol.PayBack = time.Hour
	}
	if pol.Utilization <= 0 {
		pol.Utilization = DefaultUtilization
	}
	if s.in.LearnHeadroom && s.sys == ArbiterMix {
		pol.Attainment = s.res.Percentile
		pol.HeadroomWindow = s.in.HeadroomWindow
	}
	var err error
	if m.planner, err = scaling.NewMixPlanner(pol); err != nil {
		return fmt.Errorf("sim: mix policy: %w", err)
	}
	if s.sys == MelangeStatic {
		m.static, err = s.peakMix(pol)
		if err != nil {
			return err
		}
	}
	return nil
}

// peakMix is Mélange's mix for the day: each hour's request mix solved, the dearest kept
// (it covers every hour's load, the peak's included), at the prices of t=0.
func (s *simulation) peakMix(pol scaling.MixPolicy) ([]int, error) {
	var best []int
	bestCost := -1.0
	var why string
	for from := time.Duration(0); from < s.in.Duration; from += time.Hour {
		pl, _ := scaling.NewMixPlanner(scaling.MixPolicy{StableWindow: time.Hour, MixWindow: time.Hour, PayBack: time.Hour, Utilization: pol.Utilization})
		n := 0
		for _, r := range s.reqs {
			if r.At >= from && r.At < from+time.Hour {
				pl.Record(s.in.Start.Add(r.At), max(r.InputTokens, 1), max(r.OutputTokens, 2))
				n++
			}
		}
		if n == 0 {
			continue
		}
		classes := pl.Classes(s.in.Start.Add(from + time.Hour))
		types := s.mixTypes(classes)
		// At max_replicas where the peak needs more, as the planner does.
		sol, err := scaling.SolveMixWithin(scaling.ScaleClasses(classes, 1/pol.Utilization), types, pol.MaxReplicas)
		if err != nil {
			return nil, fmt.Errorf("sim: melange-static: hour %v: %w", from, err)
		}
		if sol.Cost > bestCost {
			best, bestCost = sol.Counts, sol.Cost
			why = fmt.Sprintf("hour %d: %s", int(from.Hours()), scaling.DescribeMix(types, sol.Counts))
		}
	}
	if best == nil {
		best = make([]int, len(s.mix.gpus))
	}
	if s.in.Trace != nil {
		fmt.Fprintf(s.in.Trace, "melange-static: the peak mix, %s\n", why)
	}
	s.res.Mix = why
	return best, nil
}

// pow2 is n rounded to the nearest power of two (in log terms).
func pow2(n int) int {
	if n <= 1 {
		return 1
	}
	return 1 << int(math.Round(math.Log2(float64(n))))
}

// mixTypes prices each GPU type and says what one replica sustains within the SLO for each
// class (scaling.MixTypes), the classes' shapes on a grid of powers of two: a class's mean
// shape drifts, and each new shape is a bisection of simulated minutes.
func (s *simulation) mixTypes(classes []scaling.MixClass) []scaling.MixType {
	m := s.mix
	return scaling.MixTypes(m.gpus, s.offers(), s.w.placement, classes,
		func(gpu string, os []scaling.Offer) []scaling.Offer {
			if pl := m.placers[gpu]; pl != nil {
				return pl.Offered(s.clock(), os)
			}
			return os
		},
		func(gpu string, in, out int) float64 {
			r, err := engine.SustainedRate(m.names[gpu], pow2(in), max(2, pow2(out)), m.tpot, m.ttft)
			if err != nil {
				return 0
			}
			return r.RequestsPerSecond
		})
}

// decideMix is decide for ArbiterMix and MelangeStatic: the mix, then each type's
// placement toward its count.
func (s *simulation) decideMix() {
	m := s.mix
	current := make([]int, len(m.gpus))
	ready := make([]int, len(m.gpus))
	placed := make([][]scaling.Placed, len(m.gpus))
	for _, r := range s.live {
		g := slices.Index(m.gpus, strings.ToLower(r.offer.Accelerator))
		if g < 0 {
			continue
		}
		leaving := r.draining || r.known
		if !leaving {
			current[g]++
			if r.ready {
				ready[g]++
			}
		}
		placed[g] = append(placed[g], r.placed(s.in.Start, leaving))
	}
	want := m.static
	if s.sys == ArbiterMix && (s.now-m.decidedAt >= mixEvery || s.now == 0 || (len(s.held) > 0 && s.target == 0)) {
		m.decidedAt = s.now
		classes := m.planner.Classes(s.clock())
		types := s.mixTypes(classes)
		// Hold the mix in force (what was decided, not what happens to run now) so that a
		// preempted replica is replaced, not re-decided.
		d := m.planner.Decide(s.clock(), classes, types, m.counts, len(s.held))
		if s.in.Trace != nil && !slices.Equal(d.Counts, m.counts) {
			fmt.Fprintf(s.in.Trace, "%8.0fs mix %v → %v: %s\n", s.now.Seconds(), m.counts, d.Counts, d.Reason)
		}
		want = d.Counts
	} else if s.sys == ArbiterMix {
		want = m.counts
	}
	m.counts = slices.Clone(want)
	targets := scaling.PlacementTargets(want, current, ready)
	total := 0
	for _, n := range want {
		total += n
	}
	s.target = total
	offers := s.offers()
	for g, gpu := range m.gpus {
		pol := scaling.MixTypePolicy(s.w.placement, total)
		pl := m.placers[gpu]
		if err := pl.Reconfigure(pol); err != nil {
			panic(err) // validated in wire
		}
		var mine []scaling.Offer
		for _, o := range offers {
			if strings.EqualFold(o.Accelerator, gpu) {
				mine = append(mine, o)
			}
		}
		plan := pl.Plan(s.clock(), targets[g], placed[g], mine)
		for _, l := range plan.Launch {
			if s.in.Trace != nil {
				fmt.Fprintf(s.in.Trace, "%8.0fs launch %s: %s\n", s.now.Seconds(), gpu, l.Reason)
			}
			s.launch(l.Offer)
		}
		for _, dr := range plan.Drain {
			for _, r := range s.live {
				if r.id == dr.ID {
					s.drain(r)
					break
				}
			}
		}
	}
}
