// Command predict measures how well the router's latency predictions match what replicas
// do. It replays a shared request trace (Mooncake's conversations, or Azure's) through the
// real router, over HTTP on loopback, to replicasim replicas of different GPU profiles, at
// several load levels, and compares each streamed request's predicted TTFT and TPOT (the
// router's routing headers: X-Arbiter-Predicted-Ttft-Ms / -Tpot-Ms) with what the client
// saw. It prints, per level and per replica profile, the mean absolute percentage error
// (MAPE), the 90th percentile of the absolute percentage error, and the share of SLO
// verdicts (predicted to meet or miss the TTFT SLO) that were right.
//
// Load levels are fractions of the pool's capacity for the trace, found by running the
// trace's first requests through each profile's engine in virtual time (the same model
// replicasim serves with). Arrivals keep the trace's own pattern, time-scaled to the level's
// rate. Every run is bounded in requests and time.
//
//	go run ./bench/predict -trace mooncake-conversation-30min -levels 0.05,0.5,0.9,1.3
package main

import (
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-serve/arbiter/bench/workload"
	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicasim"
	"github.com/arbiter-serve/arbiter/router"
	"github.com/arbiter-serve/arbiter/traces"
)

const model = "predict-model"

// sample is one streamed request as the client saw it and as the router predicted it.
type sample = workload.Result

type options struct {
	trace       string
	profiles    []string
	levels      []float64
	perLevel    int
	maxDuration time.Duration
	sloTTFT     time.Duration
	maxPrompt   int
	maxOutput   int
	tokenizer   string
	dump        string
	describe    bool
}

func main() {
	var o options
	var profiles, levels string
	flag.StringVar(&o.trace, "trace", "mooncake-conversation-30min", "request trace: "+strings.Join(traces.RequestNames(), ", "))
	flag.StringVar(&profiles, "profiles", "h100-llama-3.1-8b,h200-llama-3.1-8b", "one replica per profile (a mixed pool): "+strings.Join(engine.ProfileNames(), ", "))
	flag.StringVar(&levels, "levels", "0.05,0.5,0.9,1.3", "load levels as fractions of the pool's capacity for the trace")
	flag.IntVar(&o.perLevel, "requests", 300, "requests per level")
	flag.DurationVar(&o.maxDuration, "max-duration", 90*time.Second, "bound on each level's arrivals")
	flag.DurationVar(&o.sloTTFT, "slo-ttft", time.Second, "the TTFT SLO whose verdicts are scored")
	flag.IntVar(&o.maxPrompt, "max-prompt", 16000, "prompts longer than this are cut (tokens)")
	flag.IntVar(&o.maxOutput, "max-output", 400, "outputs longer than this are cut (tokens), to bound the run")
	flag.StringVar(&o.tokenizer, "tokenizer", "approx", "the router's prompt token counter: approx (its default) or bpe (what replicasim counts with)")
	flag.BoolVar(&o.describe, "describe-profiles", true, "tell the router each replica's profile, as the control plane does; false: it predicts from its default profile, calibrated by traffic")
	flag.StringVar(&o.dump, "dump", "", "also write every request (level, replica, tokens, predicted and observed TTFT and TPOT) to this CSV file")
	flag.Parse()
	o.profiles = strings.Split(profiles, ",")
	for _, l := range strings.Split(levels, ",") {
		f, err := strconv.ParseFloat(l, 64)
		if err != nil || f <= 0 {
			fail(fmt.Errorf("-levels %q: want positive fractions", levels))
		}
		o.levels = append(o.levels, f)
	}
	if err := run(o); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "predict:", err)
	os.Exit(1)
}

func run(o options) (err error) {
	reqs, err := workload.Load(o.trace, o.maxPrompt, o.maxOutput)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var set []fleet.Replica
	profileOf := map[string]string{}
	capacity := 0.0
	for i, name := range o.profiles {
		p, err := engine.LoadProfile(name)
		if err != nil {
			return err
		}
		c, err := workload.Capacity(*p, reqs[:min(len(reqs), 200)])
		if err != nil {
			return err
		}
		capacity += c
		addr, err := startReplica(ctx, p)
		if err != nil {
			return err
		}
		id := fmt.Sprintf("r%d-%s", i, name)
		profileOf[id] = name
		rep := fleet.Replica{ID: id, Address: addr, Model: model, Capacity: fleet.OnDemand, PricePerHour: 4}
		if o.describe {
			rep.Profile = name
		}
		set = append(set, rep)
		fmt.Fprintf(os.Stderr, "replica %s at %s: %.2f req/s of this trace at capacity\n", id, addr, c)
	}
	url, pool, err := startRouter(ctx, set, o.sloTTFT, o.tokenizer)
	if err != nil {
		return err
	}
	fmt.Printf("trace %s, replicas %s, TTFT SLO %v, router tokenizer %s, pool capacity %.2f req/s (virtual-time engine replay)\n\n",
		o.trace, strings.Join(o.profiles, " + "), o.sloTTFT, o.tokenizer, capacity)
	fmt.Println("| load (of capacity) | replica profile | requests | observed TTFT p50 / p90 | predicted TTFT p50 / p90 | TTFT MAPE | TTFT APE p90 | TPOT MAPE | SLO verdicts right | before the router sent it p50 / p90 |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	var dump *csv.Writer
	if o.dump != "" {
		var done func() error
		dump, done, err = workload.CreateCSV(o.dump, "level", "start_s", "replica", "prompt_tokens", "output_tokens", "pred_ttft_s", "ttft_s", "pred_tpot_s", "tpot_s", "client_ttft_s", "pred_uncached", "uncached")
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, done()) }()
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}, Timeout: 10 * time.Minute}
	next := 0
	for _, level := range o.levels {
		rate := level * capacity
		batch := reqs[next : next+o.perLevel]
		next += o.perLevel
		var samples []sample
		failed := 0
		for _, res := range workload.Replay(client, url, model, batch, rate, o.maxDuration) {
			if res.Err == nil && (res.Replica == "" || res.SentTTFT == 0) {
				res.Err = fmt.Errorf("no routing headers")
			}
			if res.Err != nil {
				failed++
				fmt.Fprintln(os.Stderr, "request:", res.Err)
				continue
			}
			samples = append(samples, res)
		}
		if dump != nil {
			slices.SortFunc(samples, func(a, b sample) int { return a.Start.Compare(b.Start) })
			for _, s := range samples {
				f := func(x float64) string { return strconv.FormatFloat(x, 'f', 4, 64) }
				_ = dump.Write([]string{f(level), f(s.Start.Sub(samples[0].Start).Seconds()), s.Replica, strconv.Itoa(s.Prompt), strconv.Itoa(s.Output),
					f(s.PredTTFT), f(s.SentTTFT), f(s.PredTPOT), f(s.TPOT), f(s.TTFT), strconv.Itoa(s.PredUncached), strconv.Itoa(s.Prompt - s.Cached)})
			}
		}
		byProfile := map[string][]sample{}
		for _, s := range samples {
			byProfile[profileOf[s.Replica]] = append(byProfile[profileOf[s.Replica]], s)
		}
		names := slices.Sorted(maps.Keys(byProfile))
		for _, name := range append(names, "all") {
			ss := byProfile[name]
			if name == "all" {
				ss = samples
			}
			fmt.Printf("| %.2f (%.2f req/s) | %s | %d%s | %s | %s | %s | %s | %s | %s | %s |\n", level, rate, name, len(ss), failedNote(name, failed),
				pair(ss, func(s sample) float64 { return s.SentTTFT }), pair(ss, func(s sample) float64 { return s.PredTTFT }),
				workload.Pct(mape(ss, func(s sample) (float64, float64) { return s.PredTTFT, s.SentTTFT })),
				workload.Pct(apeQuantile(ss, 0.9, func(s sample) (float64, float64) { return s.PredTTFT, s.SentTTFT })),
				workload.Pct(mape(ss, func(s sample) (float64, float64) { return s.PredTPOT, s.TPOT })),
				workload.Pct(verdicts(ss, o.sloTTFT.Seconds())),
				pair(ss, func(s sample) float64 { return s.TTFT - s.SentTTFT }))
		}
		for _, r := range pool.Snapshot() {
			prof, pf, dc := r.StepScales(time.Now())
			fmt.Fprintf(os.Stderr, "level %.2f: %s predicted with %s, step times x%.2f prefill, x%.2f decode\n", level, r.Info().ID, prof, pf, dc)
		}
		// Let the replicas drain before the next level.
		time.Sleep(2 * time.Second)
	}
	return nil
}

func failedNote(name string, failed int) string {
	if name != "all" || failed == 0 {
		return ""
	}
	return fmt.Sprintf(" (+%d failed)", failed)
}

func startReplica(ctx context.Context, p *engine.Profile) (string, error) {
	srv, err := replicasim.New(replicasim.Config{Model: model, Profile: p, PromptTokensDetails: true, Logger: slog.New(slog.DiscardHandler), Exit: func(int) {}})
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go srv.Run(ctx)
	go func() { _ = srv.Serve(ctx, ln) }()
	return ln.Addr().String(), nil
}

func startRouter(ctx context.Context, set []fleet.Replica, slo time.Duration, tokenizer string) (string, *router.Pool, error) {
	cfg := router.Defaults()
	cfg.Tokenizer = tokenizer
	cfg.SLOs = map[string]router.SLO{"*": {TTFT: slo.Seconds()}}
	cfg.RoutingHeaders = true
	if err := cfg.Validate(); err != nil {
		return "", nil, err
	}
	log := slog.New(slog.DiscardHandler)
	met := router.NewMetrics(prometheus.NewRegistry())
	aff, err := router.NewAffinity(cfg.AffinitySize, 64)
	if err != nil {
		return "", nil, err
	}
	pool := router.NewPool(&cfg, log, met, aff)
	if err := fleet.ValidateSet(set); err != nil {
		return "", nil, err
	}
	pool.SetReplicas(set)
	px, err := router.NewProxy(&cfg, pool, met, log)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := router.NewServer(&cfg, px.Handle, log)
	go func() { _ = srv.Serve(ln) }()
	go pool.Run(ctx)
	go func() { <-ctx.Done(); _ = srv.Shutdown() }()
	// Let the first probes measure every replica's round trip.
	time.Sleep(500 * time.Millisecond)
	return "http://" + ln.Addr().String(), pool, nil
}

func pair(ss []sample, f func(sample) float64) string {
	var xs []float64
	for _, s := range ss {
		xs = append(xs, f(s))
	}
	return fmt.Sprintf("%s / %s", workload.Ms(workload.Quantile(xs, 0.5)), workload.Ms(workload.Quantile(xs, 0.9)))
}

func apes(ss []sample, f func(sample) (pred, obs float64)) []float64 {
	var out []float64
	for _, s := range ss {
		if p, o := f(s); o > 0 {
			out = append(out, math.Abs(p-o)/o)
		}
	}
	return out
}

func mape(ss []sample, f func(sample) (float64, float64)) float64 {
	xs := apes(ss, f)
	if len(xs) == 0 {
		return math.NaN()
	}
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

func apeQuantile(ss []sample, q float64, f func(sample) (float64, float64)) float64 {
	return workload.Quantile(apes(ss, f), q)
}

func verdicts(ss []sample, slo float64) float64 {
	if len(ss) == 0 {
		return math.NaN()
	}
	right := 0
	for _, s := range ss {
		if (s.PredTTFT <= slo) == (s.SentTTFT <= slo) {
			right++
		}
	}
	return float64(right) / float64(len(ss))
}
