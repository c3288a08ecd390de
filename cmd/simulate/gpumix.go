package main

import (
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/market"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/sim"
	"github.com/arbiter-serve/arbiter/spec"
	"github.com/arbiter-serve/arbiter/traces"
)

// gpumix answers "which GPUs, how many, at what cost" (issue 36 §4): on each day of each
// request trace it runs Arbiter's GPU mix (arbiter-mix over every type the spec offers),
// each type alone with the same planner, Mélange's static mix for the day's peak hour, and
// SkyServe as it ships with the spec's accelerators as any_of (the cheapest per hour), and
// compares them at equal SLO attainment.
func gpumix(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("simulate gpumix", flag.ContinueOnError)
	specPath := fs.String("spec", "bench/sim/gpumix.yaml", "service.yaml offering several GPU types")
	reqNames := fs.String("requests", "azure-code,azure-conversation", "request traces, comma-separated")
	spotName := fs.String("spot", "skypilot-preemption-aws-04-22-2023-v100_1", "spot trace")
	model := fs.String("model", "llama-3.1-8b", "the served model's shape (each GPU's profile is generated for it)")
	days := fs.Int("days", 1, "days per request trace")
	hours := fs.Float64("hours", 24, "simulated hours per day")
	start := fs.String("start", "2026-08-01", "date whose catalog prices are used (UTC)")
	provs := fs.String("providers", strings.Join(pricing.Launchable, ","), "clouds whose catalog prices count, comma-separated: those Arbiter launches on (lambda and vast are catalogs of marketplaces no provider launches on)")
	cold := fs.Duration("cold-start", sim.DefaultColdStart, "replica launch to ready")
	util := fs.Float64("utilization", 0, "the mix planner's utilization (headroom), the same for every mix system; 0: calibrated per request trace (calibrateUtilization)")
	burst := fs.Duration("burst-window", 0, "the mix planner's burst window: it sizes for the highest rate over any such slice of its stable window (0: the window's mean)")
	levelWin := fs.Duration("level-window", scaling.DefaultMixLevelWindow, "the mix planner's level window (0: the spec's stable window)")
	peakWin := fs.Duration("peak-window", scaling.DefaultMixPeakWindow, "the mix planner's peak window for cuts (0: its 15-minute mix window)")
	headWin := fs.Duration("headroom-window", scaling.DefaultHeadroomWindow, "how long each GPU type's answers are judged before its headroom moves (with -learn-headroom)")
	learn := fs.Bool("learn-headroom", true, "the mix planner learns each GPU type's headroom from its replicas' SLO attainment, starting at -utilization (as the control plane's does); false: one utilization for every type")
	within := fs.Float64("iso-slo-within", 0.005, "how far below Arbiter's SLO attainment counts as equal")
	systems := fs.String("systems", "arbiter-mix,single,melange-static,skyserve", "what to run: arbiter-mix, single (each type alone), melange-static, skyserve")
	verbose := fs.Bool("v", false, "print every mix change to stderr")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile here")
	if err := fs.Parse(args); err != nil {
		return err
	}
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	sp, err := spec.Load(*specPath)
	if err != nil {
		return err
	}
	at, err := time.Parse(time.DateOnly, *start)
	if err != nil {
		return fmt.Errorf("-start: %w", err)
	}
	cat, err := pricing.Embedded()
	if err != nil {
		return err
	}
	if cat, err = cat.Only(strings.Split(*provs, ",")...); err != nil {
		return fmt.Errorf("-providers: %w", err)
	}
	st, err := traces.NamedSpot(*spotName)
	if err != nil {
		return err
	}
	if _, err := engine.LookupModel(*model); err != nil {
		return fmt.Errorf("-model: %w", err)
	}
	want := map[string]bool{}
	for _, s := range strings.Split(*systems, ",") {
		want[s] = true
	}
	// One market for the offers every comparison starts from: the spec quoted at -start.
	mkt, err := market.New(market.Config{Catalog: cat, Resources: sp.Resources, Start: at, Spot: st})
	if err != nil {
		return err
	}
	offers := mkt.Offers(0)
	gpus := offeredGPUs(offers, out, *spotName)
	dominated, err := dominatedGPUs(sp, offers, *model, gpus)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "| requests | day | system | $ | $/M tokens | SLO attainment | TTFT p90 | TPOT p90 | availability | GPU hours (spot+on-demand) | preemptions | launches | wall |")
	fmt.Fprintln(out, "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
	var sums []mixSummary
	for _, rn := range strings.Split(*reqNames, ",") {
		rt, err := loadRequests(rn)
		if err != nil {
			return err
		}
		base := sim.Inputs{Spec: sp, Requests: rt, Catalog: cat, Start: at, Spot: st, Duration: time.Duration(*hours * float64(time.Hour)),
			ColdStart: *cold, ZoneCooldown: 10 * time.Minute, Seed: 1, Warm: true, Model: *model, Utilization: *util, BurstWindow: *burst, LevelWindow: *levelWin, PeakWindow: *peakWin, LearnHeadroom: *learn, HeadroomWindow: *headWin}
		if base.Utilization == 0 {
			u, att, err := calibrateUtilization(base)
			if err != nil {
				return err
			}
			base.Utilization = u
			fmt.Fprintf(out, "<!-- %s: the mix planner's utilization %.2f: the largest of %v at which Arbiter's mix reaches the SLO percentile (%.1f%% over the first 2 h: %.1f%%) -->\n",
				rn, u, utilizations, 100*sp.Arbiter.SLO.Percentile, 100*att)
		}
		if *verbose {
			base.Trace = os.Stderr
		}
		var skyIn sim.Inputs
		if want["skyserve"] {
			if skyIn, err = skyServeAnyOf(base, offers, out, rn); err != nil {
				return err
			}
		}
		sum := mixSummary{requests: rn}
		for day := range *days {
			in := base
			in.SpotOffset = time.Duration(day) * 24 * time.Hour
			in.Seed = uint64(day + 1)
			row := func(label string, r *sim.Result) {
				printMixRow(out, rn, day, label, r)
			}
			var mix *sim.Result
			if want["arbiter-mix"] {
				if mix, err = sim.Run(sim.ArbiterMix, in); err != nil {
					return err
				}
				row("arbiter-mix", mix)
				sum.mix = append(sum.mix, mix)
				if *learn {
					fmt.Fprintf(out, "<!-- %s day %d: arbiter-mix's headroom per GPU type at the day's end, learned from %.2f: %s -->\n",
						rn, day, in.Utilization, describeHeadroom(mix.Headroom))
				}
			}
			goal := 0.0
			if mix != nil {
				goal = mix.SLOAttainment() - *within
			}
			if want["single"] {
				best, bestType := math.Inf(1), ""
				for _, g := range gpus {
					if by := dominated[g]; by != "" {
						if day == 0 {
							fmt.Fprintf(out, "<!-- %s alone is not run: %s costs no more per hour and sustains more of every request class within the SLO -->\n", g, by)
						}
						continue
					}
					one := in
					one.GPUs = []string{g}
					r, cost, label, err := atGoal(one, sim.ArbiterMix, goal, 2**within)
					if err != nil {
						return err
					}
					row("alone: "+g+label, r)
					if cost < best {
						best, bestType = cost, g
					}
				}
				sum.single = append(sum.single, best)
				sum.singleType = append(sum.singleType, bestType)
			}
			if want["melange-static"] {
				r, cost, label, err := atGoal(in, sim.MelangeStatic, goal, 2**within)
				if err != nil {
					return err
				}
				row("melange-static "+r.Mix+label, r)
				sum.melange = append(sum.melange, cost)
			}
			if want["skyserve"] {
				s := skyIn
				s.SpotOffset, s.Seed = in.SpotOffset, in.Seed
				r, err := sim.Run(sim.SkyServe, s)
				if err != nil {
					return err
				}
				row("skyserve (any_of, cheapest per hour)", r)
				sum.sky = append(sum.sky, r)
			}
		}
		sums = append(sums, sum)
	}
	printMixSummary(out, sums)
	return nil
}

// utilizations are the settings calibrateUtilization tries, highest first.
var utilizations = []float64{0.8, 0.6, 0.45, 0.35, 0.25, 0.18, 0.12}

// calibrateUtilization is the mix planner's headroom for a request trace: the highest
// utilization at which Arbiter's mix meets the SLO for the spec's percentile of requests
// over the trace's first 2 hours. Each GPU's rate within the SLO is for Poisson arrivals
// of one shape; a real trace is burstier and mixed, by a factor that is the trace's, not
// a GPU's, so every mix system (each type alone and Mélange's included) runs with it, as
// the simulator's SkyServe and Arbiter share one calibrated per-replica target.
func calibrateUtilization(in sim.Inputs) (float64, float64, error) {
	in.Duration = 2 * time.Hour
	last := 0.0
	for _, u := range utilizations {
		in.Utilization = u
		r, err := sim.Run(sim.ArbiterMix, in)
		if err != nil {
			return 0, 0, err
		}
		last = r.SLOAttainment()
		if last >= in.Spec.Arbiter.SLO.Percentile {
			return u, last, nil
		}
	}
	return utilizations[len(utilizations)-1], last, nil
}

// dominatedGPUs names, for each GPU type another one dominates, that other: no dearer per
// hour on demand and sustaining at least as many requests within the SLO at every class's
// middle shape. A dominated type cannot be the best single type, so it is not run alone.
func dominatedGPUs(sp *spec.Service, offers []scaling.Offer, model string, gpus []string) (map[string]string, error) {
	od := map[string]float64{}
	for _, o := range offers {
		if o.Capacity == fleet.OnDemand {
			if p, ok := od[o.Accelerator]; !ok || o.PricePerHour < p {
				od[o.Accelerator] = o.PricePerHour
			}
		}
	}
	tpot := time.Duration(sp.Arbiter.SLO.TPOTSeconds * float64(time.Second))
	ttft := time.Duration(sp.Arbiter.SLO.TTFTSeconds * float64(time.Second))
	shapes := [][2]int{{512, 128}, {2048, 128}, {8192, 128}, {2048, 512}}
	rates := map[string][]float64{}
	for _, g := range gpus {
		name, err := engine.ProfileOn(g, model)
		if err != nil {
			return nil, err
		}
		for _, sh := range shapes {
			r, err := engine.SustainedRate(name, sh[0], sh[1], tpot, ttft)
			if err != nil {
				return nil, err
			}
			rates[g] = append(rates[g], r.RequestsPerSecond)
		}
	}
	out := map[string]string{}
	for _, g := range gpus {
		for _, h := range gpus {
			if g == h || od[h] > od[g] {
				continue
			}
			all := true
			for i := range shapes {
				all = all && rates[h][i] >= rates[g][i]
			}
			if all {
				out[g] = h
				break
			}
		}
	}
	return out, nil
}

// offeredGPUs lists the accelerators the spec's offers name, with each one's cheapest
// on-demand and spot price at start and its spot zones the trace drives.
func offeredGPUs(offers []scaling.Offer, out io.Writer, spotName string) []string {
	type seen struct {
		od, spot  float64
		where     string
		spotZones map[string]bool
	}
	by := map[string]*seen{}
	var gpus []string
	for _, o := range offers {
		s := by[o.Accelerator]
		if s == nil {
			s = &seen{od: math.Inf(1), spot: math.Inf(1), spotZones: map[string]bool{}}
			by[o.Accelerator] = s
			gpus = append(gpus, o.Accelerator)
		}
		if o.Capacity == fleet.Spot {
			s.spot = min(s.spot, o.PricePerHour)
			s.spotZones[market.Place(o.Provider, o.Region, o.Zone)] = true
		} else if o.PricePerHour < s.od {
			s.od, s.where = o.PricePerHour, o.Provider+" "+o.InstanceType
		}
	}
	slices.Sort(gpus)
	for _, g := range gpus {
		s := by[g]
		fmt.Fprintf(out, "<!-- %s: on-demand from $%.3f/h (%s), spot from %s in %d zones %s drives -->\n", g, s.od, s.where, orDash("$%.3f/h", finite(s.spot)), len(s.spotZones), spotName)
	}
	return gpus
}

func finite(x float64) float64 {
	if math.IsInf(x, 0) {
		return 0
	}
	return x
}

// skyServeAnyOf is SkyServe's inputs: any_of the spec's accelerators, each replica on the
// cheapest per hour, target_qps_per_replica calibrated (sim.Calibrate) on that type alone,
// as a SkyServe user would set it.
func skyServeAnyOf(base sim.Inputs, offers []scaling.Offer, out io.Writer, rn string) (sim.Inputs, error) {
	// The cheapest per hour SkyServe would buy: spot too where the spec uses it.
	cheapest, price := "", math.Inf(1)
	for _, o := range offers {
		if (o.Capacity == fleet.OnDemand || base.Spec.Resources.UseSpot) && o.PricePerHour < price {
			cheapest, price = o.Accelerator, o.PricePerHour
		}
	}
	name, err := engine.ProfileOn(cheapest, base.Model)
	if err != nil {
		return base, err
	}
	prof, err := engine.LoadProfile(name)
	if err != nil {
		return base, err
	}
	cal := base
	cal.Model, cal.Profile, cal.GPUs = "", *prof, []string{cheapest}
	c, err := sim.Calibrate(cal, 2*time.Hour, 48)
	if err != nil {
		return base, fmt.Errorf("skyserve's calibration on %s: %w", cheapest, err)
	}
	sky := base
	c.Apply(&sky)
	sky.Profile = *prof
	fmt.Fprintf(out, "<!-- %s: SkyServe's cheapest per hour is %s ($%.3f/h); %d of them reach %.1f%% SLO attainment over 2 h: target_qps_per_replica %.3g -->\n",
		rn, cheapest, price, c.Replicas, 100*c.Attainment, c.QPSPerReplica)
	return sky, nil
}

// atGoal runs sys at Arbiter's SLO attainment goal: below it, the mix planner's utilization
// is lowered (more headroom) until it reaches it; above it by more than band, raised (up to
// 1) until it falls below it. The cost at the goal is interpolated between the two settings
// either side of it (equalSLOCost); where none falls on the other side, the run nearest the
// goal stands and the label says so.
func atGoal(in sim.Inputs, sys sim.System, goal, band float64) (*sim.Result, float64, string, error) {
	r, err := sim.Run(sys, in)
	if err != nil {
		return nil, 0, "", err
	}
	if goal <= 0 {
		return r, r.Dollars, "", nil
	}
	u := in.Utilization
	if u <= 0 {
		u = sim.DefaultUtilization
	}
	run := func(f float64) (*sim.Result, float64, error) {
		in2 := in
		in2.Utilization = min(u*f, 1)
		r2, err := sim.Run(sys, in2)
		return r2, in2.Utilization, err
	}
	switch {
	case r.SLOAttainment() < goal:
		below := r
		for _, f := range []float64{0.8, 0.65, 0.5, 0.35, 0.25} {
			r2, u2, err := run(f)
			if err != nil {
				return nil, 0, "", err
			}
			if r2.SLOAttainment() >= goal {
				cost, _ := equalSLOCost(goal, r2, below)
				return r2, cost, fmt.Sprintf(" (utilization %.2f to reach Arbiter's SLO attainment; at it: $%.2f)", u2, cost), nil
			}
			below = r2
		}
		return below, math.Inf(1), " (misses Arbiter's SLO attainment even at utilization 0.2)", nil
	case r.SLOAttainment() > goal+band:
		above, aboveU := r, u
		for _, f := range []float64{1.25, 1.6, 2, 3, 5} {
			if u*f > 1 && u*f/1.25 >= 1 {
				break
			}
			r2, u2, err := run(f)
			if err != nil {
				return nil, 0, "", err
			}
			if r2.SLOAttainment() < goal {
				cost, _ := equalSLOCost(goal, above, r2)
				return above, cost, fmt.Sprintf(" (utilization %.2f, above Arbiter's SLO attainment; at it, interpolated with utilization %.2f's %.2f%%: $%.2f)", aboveU, u2, 100*r2.SLOAttainment(), cost), nil
			}
			above, aboveU = r2, u2
		}
		return above, above.Dollars, fmt.Sprintf(" (utilization %.2f, above Arbiter's SLO attainment even at utilization 1; as run)", aboveU), nil
	}
	return r, r.Dollars, "", nil
}

func printMixRow(out io.Writer, rn string, day int, label string, r *sim.Result) {
	var hs []string
	keys := make([]string, 0, len(r.GPUHours))
	for k := range r.GPUHours {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		hs = append(hs, fmt.Sprintf("%s %.1f", k, r.GPUHours[k]))
	}
	fmt.Fprintf(out, "| %s | %d | %s | %.2f | %.3f | %s | %.2fs | %.1fms | %s | %s | %d | %d | %.1fs |\n",
		rn, day, label, r.Dollars, r.DollarsPerMillionTokens(), pct(r.SLOAttainment()), r.TTFT, 1000*r.TPOT,
		pct(r.Availability()), strings.Join(hs, ", "), r.Preemptions, r.Launches, r.Wall.Seconds())
}

// mixSummary is one request trace's days.
type mixSummary struct {
	requests   string
	mix, sky   []*sim.Result
	single     []float64 // the best single type's $ at Arbiter's attainment, per day
	singleType []string
	melange    []float64
}

func printMixSummary(out io.Writer, ss []mixSummary) {
	ss = slices.DeleteFunc(slices.Clone(ss), func(s mixSummary) bool { return len(s.mix) == 0 })
	if len(ss) == 0 {
		return // arbiter-mix did not run: nothing to compare it with
	}
	fmt.Fprintln(out, "\n| requests | days | Arbiter's mix $/day | SLO attainment | ÷ best single type (which) | ÷ melange-static | ÷ SkyServe any_of (its SLO attainment) |")
	fmt.Fprintln(out, "|---|---:|---:|---:|---|---|---|")
	for _, s := range ss {
		var cost, att, vsSingle, vsMel, vsSky, skyAtt []float64
		for i, m := range s.mix {
			cost = append(cost, m.Dollars)
			att = append(att, m.SLOAttainment())
			if i < len(s.single) {
				vsSingle = append(vsSingle, m.Dollars/s.single[i])
			}
			if i < len(s.melange) {
				vsMel = append(vsMel, m.Dollars/s.melange[i])
			}
			if i < len(s.sky) {
				vsSky = append(vsSky, m.Dollars/s.sky[i].Dollars)
				skyAtt = append(skyAtt, s.sky[i].SLOAttainment())
			}
		}
		types := map[string]int{}
		for _, t := range s.singleType {
			types[t]++
		}
		var tl []string
		for t, n := range types {
			tl = append(tl, fmt.Sprintf("%s ×%d", t, n))
		}
		slices.Sort(tl)
		fmt.Fprintf(out, "| %s | %d | %s | %s | %s (%s) | %s | %s (%s) |\n", s.requests, len(s.mix), spread(cost), spreadPct(att),
			spreadRatio(vsSingle), strings.Join(tl, ", "), spreadRatio(vsMel), spreadRatio(vsSky), spreadPct(skyAtt))
	}
}

func spreadRatio(xs []float64) string {
	if len(xs) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f× (%.2f–%.2f)", mean(xs), minOf(xs), maxOf(xs))
}

func spreadPct(xs []float64) string {
	if len(xs) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f%% (%.2f–%.2f%%)", 100*mean(xs), 100*minOf(xs), 100*maxOf(xs))
}

func maxOf(xs []float64) float64 {
	m := math.Inf(-1)
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// describeHeadroom is "H100 0.21, L40S 0.15", by name.
func describeHeadroom(h map[string]float64) string {
	names := slices.Sorted(maps.Keys(h))
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %.3g", n, h[n])
	}
	return strings.Join(parts, ", ")
}

// startCPUProfile writes a CPU profile to path until the returned func is called; an empty
// path profiles nothing.
func startCPUProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
