package main

import (
	"flag"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/sim"
	"github.com/arbiter-serve/arbiter/spec"
	"github.com/arbiter-serve/arbiter/traces"
)

const routersUsage = `usage: simulate routers [-requests TRACE,…] [-routers 1,3,8] [-minutes 30]

Arbiter's fleet (autoscaled, under -spot) serving each request trace through N routers, a
balancer taking them in turn by arrival, each with its own view of the replicas ("own") or
sharing one ("shared": each applies what the others sent, as routers with -peer-listen and
-peers do, less the network's milliseconds). Each trace's per-replica targets come from a
fixed-fleet calibration over the same minutes (as the main command's -calibrate), and the
fleet starts ready at the calibrated size (min_replicas). Prints a Markdown table: SLO
attainment, $/M tokens, and the TTFT predictions' error (MAPE and APE p90 over every request,
MAPE over those that reached their replica alone).`

// routersCmd is the "simulate routers" subcommand.
func routersCmd(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("simulate routers", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), routersUsage); fs.PrintDefaults() }
	reqNames := fs.String("requests", "mooncake-conversation-30min,azure-conversation", "request traces, comma-separated: "+strings.Join(traces.RequestNames(), ", "))
	counts := fs.String("routers", "1,3,8", "router counts, comma-separated")
	minutes := fs.Float64("minutes", 30, "simulated minutes of each trace")
	spotName := fs.String("spot", "skypilot-preemption-aws-04-22-2023-v100_1", "spot trace")
	specPath := fs.String("spec", "bench/sim/h100-gcp.yaml", "service.yaml")
	parallel := fs.Int("parallel", runtime.GOMAXPROCS(0), "runs at once")
	delays := fs.String("peer-delay", "0s", "with a shared view, how much later the other routers apply each event (the gossip's batch window and the network's trip), comma-separated: a shared row per delay")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var pds []time.Duration
	for _, d := range strings.Split(*delays, ",") {
		pd, err := time.ParseDuration(strings.TrimSpace(d))
		if err != nil || pd < 0 {
			return fmt.Errorf("-peer-delay %q: want durations ≥ 0, comma-separated", *delays)
		}
		pds = append(pds, pd)
	}
	var ns []int
	for _, c := range strings.Split(*counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 {
			return fmt.Errorf("-routers %q: want counts ≥ 1, comma-separated", *counts)
		}
		ns = append(ns, n)
	}
	if *minutes <= 0 || *parallel < 1 {
		return fmt.Errorf("-minutes %g, -parallel %d: want > 0, ≥ 1", *minutes, *parallel)
	}
	sp, err := spec.Load(*specPath)
	if err != nil {
		return err
	}
	st, err := traces.NamedSpot(*spotName)
	if err != nil {
		return err
	}
	cat, err := pricing.Embedded()
	if err != nil {
		return err
	}
	prof, err := engine.LoadProfile("h100-llama-3.1-8b")
	if err != nil {
		return err
	}
	type cell struct {
		trace  string
		n      int
		shared bool
		delay  time.Duration
		res    *sim.Result
		err    error
	}
	d := time.Duration(*minutes * float64(time.Minute))
	var cells []*cell
	base := map[string]sim.Inputs{}
	for _, name := range strings.Split(*reqNames, ",") {
		rt, err := loadRequests(name)
		if err != nil {
			return err
		}
		in := sim.Inputs{Spec: sp, Requests: rt, Spot: st, Catalog: cat, Profile: *prof, Start: time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC),
			Duration: d, ColdStart: sim.DefaultColdStart, ZoneCooldown: 10 * time.Minute, Seed: 1, Warm: true}
		c, err := sim.Calibrate(in, d, 32)
		if err != nil {
			return err
		}
		c.Apply(&in)
		warm := *in.Spec
		warm.Service.ReplicaPolicy.MinReplicas = max(warm.Service.ReplicaPolicy.MinReplicas, c.Replicas)
		in.Spec = &warm
		fmt.Fprintf(out, "<!-- %s: %d on-demand replicas reach %.1f%% SLO attainment over %v: target_qps_per_replica %.3g, target_concurrency_per_replica %.3g, min_replicas %d -->\n",
			name, c.Replicas, 100*c.Attainment, d, c.QPSPerReplica, c.ConcurrencyPerRep, warm.Service.ReplicaPolicy.MinReplicas)
		base[name] = in
		for _, n := range ns {
			cells = append(cells, &cell{trace: name, n: n})
			if n > 1 {
				for _, pd := range pds {
					cells = append(cells, &cell{trace: name, n: n, shared: true, delay: pd})
				}
			}
		}
	}
	sem := make(chan struct{}, *parallel)
	var wg sync.WaitGroup
	for _, c := range cells {
		in := base[c.trace]
		in.Routers, in.SharedView, in.PeerDelay = c.n, c.shared, c.delay
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			c.res, c.err = sim.Run(sim.Arbiter, in)
		}()
	}
	wg.Wait()
	fmt.Fprintf(out, "spot %s, %g minutes of each trace, Arbiter's fleet (%s)\n\n", *spotName, *minutes, *specPath)
	fmt.Fprintln(out, "| requests | routers | view | SLO attainment | $/M tokens | TTFT MAPE | APE p90 | MAPE, lone arrivals |")
	fmt.Fprintln(out, "|---|---:|---|---:|---:|---:|---:|---:|")
	for _, c := range cells {
		if c.err != nil {
			return fmt.Errorf("%s, %d routers: %w", c.trace, c.n, c.err)
		}
		view := "one"
		switch {
		case c.shared:
			view = fmt.Sprintf("shared, %v late", c.delay)
		case c.n > 1:
			view = "own"
		}
		mape, p90, _, _ := c.res.PredictionError()
		lone, _, _, _ := c.res.LoneArrivalPredictionError()
		fmt.Fprintf(out, "| %s | %d | %s | %.2f %% | %.3f | %.1f %% | %.1f %% | %.1f %% |\n", c.trace, c.n, view,
			100*c.res.SLOAttainment(), c.res.DollarsPerMillionTokens(), 100*mape, 100*p90, 100*lone)
	}
	return nil
}
