// Command simulate replays real request and spot traces through Arbiter's routing,
// autoscaling and placement code and the SkyServe and on-demand baselines (package sim),
// and prints one table row per run.
package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/sim"
	"github.com/arbiter-serve/arbiter/spec"
	"github.com/arbiter-serve/arbiter/traces"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		slog.Error("simulate", "err", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	specPath := fs.String("spec", "bench/sim/h100-gcp.yaml", "service.yaml to simulate")
	reqNames := fs.String("requests", "azure-conversation", "request traces, comma-separated: "+strings.Join(traces.RequestNames(), ", "))
	spotNames := fs.String("spot", "skypilot-preemption-aws-04-22-2023-v100_1", "spot traces, comma-separated (see traces.SpotNames)")
	systems := fs.String("systems", "ondemand,skyserve,arbiter", "systems to run")
	hours := fs.Float64("hours", 24, "simulated hours")
	profile := fs.String("profile", "h100-llama-3.1-8b", "engine profile: "+strings.Join(engine.ProfileNames(), ", "))
	start := fs.String("start", "2026-08-01", "date whose catalog prices are used (UTC)")
	cold := fs.Duration("cold-start", sim.DefaultColdStart, "replica launch to ready")
	cooldown := fs.Duration("zone-cooldown", 10*time.Minute, "how long a zone that preempted is avoided")
	seed := fs.Uint64("seed", 1, "random seed")
	verbose := fs.Bool("v", false, "print every target change to stderr")
	calibrate := fs.Bool("calibrate", true, "set target_qps_per_replica and target_concurrency_per_replica per request trace from a fixed-fleet calibration run (see sim.Calibrate)")
	calMax := fs.Int("calibrate-max", 32, "largest fixed fleet the calibration tries")
	isoSLO := fs.Bool("iso-slo", true, "when SkyServe misses Arbiter's SLO attainment, also show SkyServe with target_qps_per_replica lowered until it does not")
	cold0 := fs.Bool("from-zero", false, "start with no replica instead of min_replicas ready")
	scanAll := fs.Int("scan-all", 0, "slo_cheapest predicts every candidate up to this many, then samples (0: the router's default; a large value compares with a full scan)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	sp, err := spec.Load(*specPath)
	if err != nil {
		return err
	}
	prof, err := engine.LoadProfile(*profile)
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
	fmt.Fprintf(out, "| requests | spot trace | system | $ | $/M tokens | SLO attainment | TTFT p%g | TPOT p%g | availability | preemptions | spot h | on-demand h | launches | peak replicas (max %d) | zero waits (max) | wall |\n",
		sp.Arbiter.SLO.Percentile*100, sp.Arbiter.SLO.Percentile*100, sp.Service.ReplicaPolicy.MaxReplicas)
	fmt.Fprintln(out, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, rn := range strings.Split(*reqNames, ",") {
		rt, err := traces.NamedRequests(rn)
		if err != nil {
			return err
		}
		base := sim.Inputs{Spec: sp, Requests: rt, Catalog: cat, Profile: *prof, Start: at,
			Duration: time.Duration(*hours * float64(time.Hour)), ColdStart: *cold, ZoneCooldown: *cooldown, Seed: *seed, Warm: !*cold0, ScanAll: *scanAll}
		if *verbose {
			base.Trace = os.Stderr
		}
		if *calibrate {
			base.Spot, err = traces.NamedSpot(strings.Split(*spotNames, ",")[0])
			if err != nil {
				return err
			}
			c, err := sim.Calibrate(base, 2*time.Hour, *calMax)
			if err != nil {
				return err
			}
			c.Apply(&base)
			fmt.Fprintf(out, "<!-- %s: %d on-demand replicas reach %.1f%% SLO attainment over 2 h: target_qps_per_replica %.3g, target_concurrency_per_replica %.3g -->\n",
				rn, c.Replicas, 100*c.Attainment, c.QPSPerReplica, c.ConcurrencyPerRep)
		}
		for _, sn := range strings.Split(*spotNames, ",") {
			st, err := traces.NamedSpot(sn)
			if err != nil {
				return err
			}
			in := base
			in.Spot = st
			row := func(label string, r *sim.Result) {
				fmt.Fprintf(out, "| %s | %s | %s | %.2f | %.3f | %.2f%% | %.2fs | %.1fms | %.2f%% | %d | %.1f | %.1f | %d | %d | %d (%.0fs) | %.1fs |\n",
					rn, sn, label, r.Dollars, r.DollarsPerMillionTokens(), 100*r.SLOAttainment(), r.TTFT, 1000*r.TPOT,
					100*r.Availability(), r.Preemptions, capacityHours(r, "spot"), capacityHours(r, "on_demand"),
					r.Launches, r.PeakReplicas, r.ZeroWaits, r.MaxZeroWait.Seconds(), r.Wall.Seconds())
				slog.Info("run", "requests", rn, "spot", sn, "system", label, "failed", r.Failed, "launches", r.Launches,
					"launch_refused", r.LaunchFailures, "peak_replicas", r.PeakReplicas, "events", r.Events)
			}
			got := map[sim.System]*sim.Result{}
			for _, sys := range strings.Split(*systems, ",") {
				r, err := sim.Run(sim.System(sys), in)
				if err != nil {
					return err
				}
				got[sim.System(sys)] = r
				row(sys, r)
			}
			if a, s := got[sim.Arbiter], got[sim.SkyServe]; *isoSLO && a != nil && s != nil && s.SLOAttainment() < a.SLOAttainment() {
				// What a SkyServe user would do to reach Arbiter's SLO attainment: lower
				// target_qps_per_replica until it does (or the factors run out).
				for _, f := range []float64{0.8, 0.65, 0.5, 0.4, 0.3, 0.2} {
					in2 := in
					sp2 := *in.Spec
					sp2.Service.ReplicaPolicy.TargetQPSPerReplica *= f
					in2.Spec = &sp2
					r, err := sim.Run(sim.SkyServe, in2)
					if err != nil {
						return err
					}
					if r.SLOAttainment() >= a.SLOAttainment() || f == 0.2 {
						row(fmt.Sprintf("skyserve, target_qps ×%g", f), r)
						break
					}
				}
			}
		}
	}
	return nil
}

// capacityHours sums replica-hours of one capacity kind over providers.
func capacityHours(r *sim.Result, capacity string) float64 {
	h := 0.0
	for k, v := range r.ReplicaHours {
		if strings.HasPrefix(k, capacity+"/") {
			h += v
		}
	}
	return h
}
