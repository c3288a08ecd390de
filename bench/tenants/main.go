// Command tenants measures what a flooding tenant costs a quiet one (issue 52): real
// `replicasim` processes, the real `router` in front of them with two API keys, all over HTTP
// on loopback. The quiet, interactive tenant (key app, band critical) replays a request trace
// at a share of the fleet's capacity; the batch tenant (key batch, band sheddable) floods the
// same fleet at a multiple of its capacity with the trace's request shapes, each its own
// document. Each mode gets fresh replicas and a fresh router, and the same requests at the
// same times:
//
//   - alone: the interactive tenant without the flood (its baseline);
//   - none: the flood, every request straight to a replica (no fairness);
//   - static: the flood, the batch key capped at a fixed number of requests in flight
//     (the keys file's max_concurrency, a static per-key limit);
//   - queue: the flood, the router's queue on (queue.enabled): bands and fair shares;
//   - prio: the flood, each request's band given to the engines as vLLM's priority
//     (queue.engine_priority, replicas at --scheduling-policy priority), no router queue;
//   - queue+prio: both.
//
// Per mode it reports the interactive tenant's success, SLO attainment and TTFT/TPOT, and
// what the batch tenant got: requests answered and refused (429), tokens per second, and the
// longest a refused request waited for its answer (no request may wait past its deadline).
//
//	go build -o bin/ ./cmd/router ./cmd/replicasim && go run ./bench/tenants -bin bin
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-serve/arbiter/bench/procs"
	"github.com/arbiter-serve/arbiter/bench/workload"
	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/traces"
)

const (
	model    = "tenants-model"
	appKey   = "sk-bench-app-0123456789abcdef"
	batchKey = "sk-bench-batch-0123456789abcdef"
)

type options struct {
	bin               string
	trace             string
	replicas          int
	profile           string
	level, flood      float64
	duration          time.Duration
	sloTTFT, sloTPOT  time.Duration
	maxPrompt         int
	maxOutput         int
	modes             []string
	staticConcurrency int
	sheddableFill     float64
	maxWait           time.Duration
	// metrics, when set, is a pattern of the router's metric lines printed (to stderr)
	// after each mode, to see why it did what it did.
	metrics string
}

func main() {
	var o options
	var modes string
	flag.StringVar(&o.bin, "bin", "bin", "folder holding the router and replicasim binaries")
	flag.StringVar(&o.trace, "trace", "azure-conversation", "request trace: "+strings.Join(traces.RequestNames(), ", "))
	flag.IntVar(&o.replicas, "replicas", 2, "replicas in the fleet")
	flag.StringVar(&o.profile, "profile", "h100-llama-3.1-8b", "the replicas' profile")
	flag.Float64Var(&o.level, "level", 0.3, "the interactive tenant's load, as a share of the fleet's capacity for the trace")
	flag.Float64Var(&o.flood, "flood", 3, "the batch tenant's load, as a multiple of the fleet's capacity")
	flag.DurationVar(&o.duration, "duration", 60*time.Second, "how long requests arrive, per mode")
	flag.DurationVar(&o.sloTTFT, "slo-ttft", time.Second, "TTFT SLO")
	flag.DurationVar(&o.sloTPOT, "slo-tpot", 100*time.Millisecond, "TPOT SLO")
	flag.IntVar(&o.maxPrompt, "max-prompt", 8000, "prompts longer than this are cut (tokens)")
	flag.IntVar(&o.maxOutput, "max-output", 300, "outputs longer than this are cut (tokens), to bound the run")
	flag.StringVar(&modes, "modes", "alone,none,static,queue", "modes to compare: alone, none, static, queue, prio, queue+prio (queue and queue+prio take @FILL)")
	flag.IntVar(&o.staticConcurrency, "static-concurrency", 0, "the batch key's max_concurrency in mode static (default: 8 per replica, the spec's default target_concurrency_per_replica)")
	flag.Float64Var(&o.sheddableFill, "sheddable-fill", 1, "the queue's sheddable_fill in mode queue")
	flag.DurationVar(&o.maxWait, "max-wait", 30*time.Second, "the queue's max_wait in mode queue (how long a sheddable request waits)")
	flag.StringVar(&o.metrics, "router-metrics", "", "after each mode, print the router's /metrics lines matching this regular expression (to stderr)")
	flag.Parse()
	o.modes = strings.Split(modes, ",")
	for _, m := range o.modes {
		name, fill, err := parseMode(m, o.sheddableFill)
		if err != nil || !slices.Contains([]string{"alone", "none", "static", "queue", "prio", "queue+prio"}, name) || (!queued(name) && fill != o.sheddableFill) {
			fail(fmt.Errorf("-modes: unknown mode %q (want alone, none, static, queue, prio, queue+prio, queue@FILL or queue+prio@FILL)", m))
		}
	}
	if o.staticConcurrency == 0 {
		o.staticConcurrency = 8 * o.replicas
	}
	if o.replicas < 1 || o.level <= 0 || o.flood <= 0 || o.duration <= 0 {
		fail(errors.New("-replicas, -level, -flood and -duration must be positive"))
	}
	if err := run(o); err != nil {
		fail(err)
	}
}

// queued: the mode runs the router's queue; prioritised: the engines' priority.
func queued(mode string) bool      { return mode == "queue" || mode == "queue+prio" }
func prioritised(mode string) bool { return mode == "prio" || mode == "queue+prio" }

// parseMode splits a mode: queue@0.5 is the queue with sheddable_fill 0.5 (def otherwise).
func parseMode(m string, def float64) (name string, fill float64, err error) {
	name, f, ok := strings.Cut(m, "@")
	if !ok {
		return name, def, nil
	}
	fill, err = strconv.ParseFloat(f, 64)
	if err != nil || fill <= 0 || fill > 1 {
		return "", 0, fmt.Errorf("mode %q: want a fill in (0, 1]", m)
	}
	return name, fill, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "tenants:", err)
	os.Exit(1)
}

func run(o options) error {
	all, err := workload.Load(o.trace, o.maxPrompt, o.maxOutput)
	if err != nil {
		return err
	}
	p, err := engine.LoadProfile(o.profile)
	if err != nil {
		return err
	}
	perReplica, err := workload.Capacity(*p, all[:min(len(all), 200)])
	if err != nil {
		return err
	}
	capacity := perReplica * float64(o.replicas)
	// The interactive tenant: whole conversations of the trace, at level × capacity.
	nApp := max(1, int(math.Round(o.level*capacity*o.duration.Seconds())))
	app := workload.Conversations(all[:min(len(all), 20*nApp)], nApp)
	// The batch tenant: the trace's shapes from further on, each its own document (no
	// prefix shared with anything), evenly spaced at flood × capacity.
	nBatch := max(1, int(math.Round(o.flood*capacity*o.duration.Seconds())))
	batch := make([]traces.Request, nBatch)
	for i := range batch {
		r := all[(len(all)/2+i)%len(all)]
		r.PrefixBlocks, r.At = nil, time.Duration(i)*time.Millisecond
		batch[i] = r
	}
	fmt.Printf("trace %s: %d replicas of %s (%.2f req/s for the trace); interactive tenant (critical) %d requests at %.2f req/s (%.2f of capacity), batch tenant (sheddable) %d at %.2f req/s (%.1f×), %v of arrivals; SLO TTFT %v TPOT %v; static limit %d in flight; queue sheddable_fill %v, max_wait %v\n\n",
		o.trace, o.replicas, o.profile, capacity, len(app), o.level*capacity, o.level, len(batch), o.flood*capacity, o.flood, o.duration,
		o.sloTTFT, o.sloTPOT, o.staticConcurrency, o.sheddableFill, o.maxWait)
	fmt.Println("| mode | interactive: succeeded | SLO attainment | TTFT p50 / p90 | TPOT p90 | batch: answered | refused 429 (Retry-After) | other failures | batch tokens/s | longest wait for a 429 | fleet tokens/s |")
	fmt.Println("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, mode := range o.modes {
		line, err := runMode(o, mode, app, batch, o.level*capacity, o.flood*capacity)
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		fmt.Println(line)
	}
	return nil
}

// keyed adds a client key to every request.
type keyed struct {
	next http.RoundTripper
	key  string
}

func (k keyed) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.Header.Set("Authorization", "Bearer "+k.key)
	return k.next.RoundTrip(r)
}

func runMode(o options, mode string, app, batch []traces.Request, appRate, batchRate float64) (string, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "tenants-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	g := procs.NewGroup(ctx, o.bin)
	defer g.Stop()
	start := func(name string, args ...string) error { return g.Start(nil, name, args...) }
	name, fill, err := parseMode(mode, o.sheddableFill)
	if err != nil {
		return "", err
	}
	var set []fleet.Replica
	for i := range o.replicas {
		addr, err := procs.FreeAddr()
		if err != nil {
			return "", err
		}
		args := []string{"-listen", addr, "-model", model, "-profile", o.profile, "-log-level", "warn"}
		if prioritised(name) {
			args = append(args, "-scheduling-policy", "priority")
		}
		if err := start("replicasim", args...); err != nil {
			return "", err
		}
		set = append(set, fleet.Replica{ID: fmt.Sprintf("r%d", i), Address: addr, Model: model, Capacity: fleet.OnDemand, PricePerHour: 1, Profile: o.profile})
	}
	for _, rep := range set {
		if err := procs.WaitHealthy(rep.Address); err != nil {
			return "", err
		}
	}
	mode = name
	batchSpec := map[string]any{"name": "batch", "key": batchKey, "priority": "sheddable"}
	if mode == "static" {
		batchSpec["max_concurrency"] = o.staticConcurrency
	}
	keys := map[string]any{"keys": []any{map[string]any{"name": "app", "key": appKey, "priority": "critical"}, batchSpec}}
	cfg := map[string]any{
		"policy":          "slo_cheapest",
		"slos":            map[string]any{model: map[string]float64{"ttft_seconds": o.sloTTFT.Seconds(), "tpot_seconds": o.sloTPOT.Seconds(), "percentile": 0.9}},
		"routing_headers": true,
		"api_keys_file":   filepath.Join(dir, "keys.yaml"),
	}
	if queued(mode) || prioritised(mode) {
		cfg["queue"] = map[string]any{"enabled": queued(mode), "engine_priority": prioritised(mode), "sheddable_fill": fill, "max_wait": o.maxWait.String(), "max_waiting": 100000}
	}
	if err := procs.WriteYAML(dir, map[string]any{"router.yaml": cfg, "replicas.yaml": map[string]any{"replicas": set}, "keys.yaml": keys}); err != nil {
		return "", err
	}
	listen, err := procs.FreeAddr()
	if err != nil {
		return "", err
	}
	admin, err := procs.FreeAddr()
	if err != nil {
		return "", err
	}
	if err := start("router", "-listen", listen, "-admin", admin, "-config", filepath.Join(dir, "router.yaml"),
		"-replicas", filepath.Join(dir, "replicas.yaml"), "-log-level", "warn"); err != nil {
		return "", err
	}
	if err := procs.WaitHealthy(listen); err != nil {
		return "", err
	}
	base := &http.Transport{MaxIdleConnsPerHost: 4096}
	url := "http://" + listen
	var appRes, batchRes []workload.Result
	var wg sync.WaitGroup
	wg.Go(func() {
		client := &http.Client{Transport: keyed{base, appKey}, Timeout: 10 * time.Minute}
		appRes = workload.ReplaySessions(client, url, model, app, appRate, o.duration)
	})
	if mode != "alone" {
		wg.Go(func() {
			client := &http.Client{Transport: keyed{base, batchKey}, Timeout: 10 * time.Minute}
			batchRes = workload.Replay(client, url, model, batch, batchRate, o.duration)
		})
	}
	wg.Wait()
	if o.metrics != "" {
		if err := printMetrics(admin, o.metrics, mode); err != nil {
			return "", err
		}
	}
	label := mode
	if queued(mode) {
		label = fmt.Sprintf("%s, sheddable_fill %v", mode, fill)
	}
	return row(o, label, appRes, batchRes), nil
}

func row(o options, mode string, app, batch []workload.Result) string {
	a := workload.Count(mode+" interactive", app, o.sloTTFT, o.sloTPOT)
	first, last := a.First, a.Last
	answered, refused, other, tokens := 0, 0, 0, 0
	var longest time.Duration
	for _, r := range batch {
		switch {
		case r.Err == nil:
			answered++
			tokens += r.Prompt + r.Output
		case strings.HasPrefix(r.Err.Error(), "status 429"):
			refused++
			longest = max(longest, r.End.Sub(r.Start))
		default:
			if other++; other <= 3 {
				fmt.Fprintf(os.Stderr, "%s batch: %v\n", mode, r.Err)
			}
		}
		if r.Start.Before(first) {
			first = r.Start
		}
		if r.End.After(last) {
			last = r.End
		}
	}
	secs := last.Sub(first).Seconds()
	batchCells := "— | — | — | — | —"
	if len(batch) > 0 {
		batchCells = fmt.Sprintf("%d | %d | %d | %.0f | %s", answered, refused, other, float64(tokens)/secs, longest.Round(10*time.Millisecond))
	}
	return fmt.Sprintf("| %s | %.1f %% | %.1f %% | %s / %s | %s | %s | %.0f |", mode, 100*float64(a.OK)/float64(max(len(app), 1)), 100*float64(a.Good)/float64(max(len(app), 1)),
		workload.Ms(workload.Quantile(a.TTFT, 0.5)), workload.Ms(workload.Quantile(a.TTFT, 0.9)), workload.Ms(workload.Quantile(a.TPOT, 0.9)),
		batchCells, float64(a.Tokens+tokens)/secs)
}

// printMetrics writes the router's metric lines that match pattern to stderr.
func printMetrics(admin, pattern, mode string) error {
	re, err := regexp.Compile(pattern)
	if err != nil {
		return fmt.Errorf("-router-metrics: %w", err)
	}
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "#") && re.MatchString(line) {
			fmt.Fprintf(os.Stderr, "%s: %s\n", mode, line)
		}
	}
	return nil
}
