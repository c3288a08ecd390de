// Command lora measures routing by LoRA adapter (issue 51): many adapters of one base model
// on a few replicas with few GPU slots each, the adapter of each request drawn from a Zipf
// distribution (a few hot fine-tunes, a long tail), through the real router in front of
// real replicasim processes serving adapters as vLLM does (--enable-lora, --max-loras,
// adapters loaded at run time through /v1/load_lora_adapter), all over HTTP on loopback.
// Each policy gets fresh replicas (no adapter loaded) and a fresh router, and the same
// requests at the same times, from a request trace's arrivals and lengths.
//
// With -own, some replicas serve the hottest adapter merged into the base weights, as its
// own replicas (issue 51), and the rest the base model with adapters.
//
// Per policy it prints the share of requests answered, SLO attainment, TTFT p50 / p90, TPOT
// p90, the adapter loads the router asked for per minute of the run, and each replica's
// share of the requests.
//
//	go build -o bin/ ./cmd/router ./cmd/replicasim && go run ./bench/lora -bin bin
//
// The adapters are PEFT folders of the size a rank-8 adapter on the attention projections
// of the model has; a replica reads one at the cold start's disk rate plus 20 ms a layer
// (replicasim), and pays it again whenever an adapter evicted from its CPU cache
// (--max-cpu-loras) comes back.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/bench/procs"
	"github.com/arbiter-serve/arbiter/bench/workload"
	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/traces"
)

const model = "lora-base"

type options struct {
	bin, trace, profile, policies string
	adapters, replicas, maxLoRAs  int
	maxCPULoRAs                   int
	own                           string
	zipf, level, rate             float64
	requests                      int
	maxDuration                   time.Duration
	sloTTFT, sloTPOT              time.Duration
	maxOutput                     int
	seed                          uint64
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "folder holding the router and replicasim binaries")
	flag.StringVar(&o.trace, "trace", "azure-conversation", "request trace for arrivals and lengths: "+strings.Join(traces.RequestNames(), ", "))
	flag.StringVar(&o.profile, "profile", "h100-llama-3.1-8b", "the replicas' GPU profile")
	flag.StringVar(&o.policies, "policies", "slo_cheapest,round_robin", "router policies to compare")
	flag.IntVar(&o.adapters, "adapters", 50, "LoRA adapters")
	flag.IntVar(&o.replicas, "replicas", 3, "replicas")
	flag.IntVar(&o.maxLoRAs, "max-loras", 4, "each replica's --max-loras (GPU slots)")
	flag.IntVar(&o.maxCPULoRAs, "max-cpu-loras", 0, "each replica's --max-cpu-loras (adapters kept in CPU memory; 0: -max-loras, vLLM's default)")
	flag.StringVar(&o.own, "own", "0", "comma-separated counts of the -replicas that serve the hottest adapter merged into the base weights, as its own replicas (issue 51): each policy runs with each count")
	flag.Float64Var(&o.zipf, "zipf", 1.1, "Zipf exponent s (> 1) of the adapters' popularity: adapter k is drawn with probability ∝ 1/k^s")
	flag.Float64Var(&o.level, "level", 0.5, "load as a fraction of the base model's capacity on the replicas, for the trace's shapes")
	flag.Float64Var(&o.rate, "rate", 0, "arrivals per second, in place of -level's (to compare fleets of several -replicas at one load)")
	flag.IntVar(&o.requests, "requests", 600, "requests per policy")
	flag.DurationVar(&o.maxDuration, "max-duration", 3*time.Minute, "bound on each run's arrivals")
	flag.DurationVar(&o.sloTTFT, "slo-ttft", 2*time.Second, "TTFT SLO")
	flag.DurationVar(&o.sloTPOT, "slo-tpot", 100*time.Millisecond, "TPOT SLO")
	flag.IntVar(&o.maxOutput, "max-output", 300, "outputs longer than this are cut (tokens), to bound the run")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the adapters' draw")
	flag.Parse()
	if o.zipf <= 1 || o.adapters < 1 || o.replicas < 1 || o.maxLoRAs < 1 {
		fail(errors.New("want -zipf > 1 and -adapters, -replicas, -max-loras ≥ 1"))
	}
	if err := run(o); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "lora:", err)
	os.Exit(1)
}

func run(o options) error {
	reqs, err := workload.Load(o.trace, 8000, o.maxOutput)
	if err != nil {
		return err
	}
	reqs = reqs[:min(o.requests, len(reqs))]
	p, err := engine.LoadProfile(o.profile)
	if err != nil {
		return err
	}
	capacity, err := workload.Capacity(*p, reqs[:min(len(reqs), 200)])
	if err != nil {
		return err
	}
	rate := o.level * capacity * float64(o.replicas)
	if o.rate > 0 {
		rate = o.rate
	}
	// Adapter k (0-based) with probability ∝ 1/(k+1)^s.
	z := rand.NewZipf(rand.New(rand.NewPCG(o.seed, 51)), o.zipf, 1, uint64(o.adapters-1))
	models := make([]string, len(reqs))
	distinct := map[string]bool{}
	for i := range models {
		models[i] = adapterName(int(z.Uint64()))
		distinct[models[i]] = true
	}
	dir, err := os.MkdirTemp("", "lora-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var adapters []fleet.Adapter
	size := adapterBytes(p.Model)
	for k := range o.adapters {
		path := filepath.Join(dir, "adapters", adapterName(k))
		if err := peftFolder(path, size); err != nil {
			return err
		}
		adapters = append(adapters, fleet.Adapter{Name: adapterName(k), Base: model, Path: path})
	}
	fmt.Printf("trace %s, %d requests at %.2f req/s (%.2f of %d replicas' %.2f req/s each on the base model), %d adapters (%d drawn; Zipf s=%.2f: the first takes %.0f %%) of %.0f MiB each, --max-loras %d, --max-cpu-loras %d, SLO TTFT %v TPOT %v, %s\n\n",
		o.trace, len(reqs), rate, o.level, o.replicas, capacity, o.adapters, len(distinct), o.zipf, 100*share(models, adapterName(0)), float64(size)/(1<<20), o.maxLoRAs, max(o.maxCPULoRAs, o.maxLoRAs), o.sloTTFT, o.sloTPOT, o.profile)
	fmt.Println("| policy | answered | SLO attainment | TTFT p50 / p90 | TPOT p90 | adapter loads (per minute) | requests per replica |")
	fmt.Println("|---|---:|---:|---|---:|---:|---|")
	for _, pol := range strings.Split(o.policies, ",") {
		for _, n := range strings.Split(o.own, ",") {
			own, err := strconv.Atoi(strings.TrimSpace(n))
			if err != nil || own < 0 || own >= o.replicas {
				return fmt.Errorf("-own %q: want counts from 0 to -replicas − 1", n)
			}
			line, err := runPolicy(o, pol, own, reqs, models, adapters, rate, dir)
			if err != nil {
				return fmt.Errorf("%s: %w", pol, err)
			}
			fmt.Println(line)
		}
	}
	return nil
}

func adapterName(k int) string { return fmt.Sprintf("tune-%02d", k) }

func share(models []string, m string) float64 {
	n := 0
	for _, x := range models {
		if x == m {
			n++
		}
	}
	return float64(n) / float64(len(models))
}

// adapterBytes is a rank-8 adapter on the q, k, v and o projections of the model, bf16: A
// (8 × hidden) and B (hidden × 8) per projection per layer.
func adapterBytes(modelName string) int64 {
	m, err := engine.LookupModel(modelName)
	if err != nil {
		return 16 << 20
	}
	return int64(4 * 2 * 8 * m.Hidden * 2 * m.Layers)
}

// peftFolder writes an adapter as PEFT saves one: adapter_config.json and the weights (a
// sparse file of size bytes).
func peftFolder(path string, size int64) error {
	if err := os.MkdirAll(path, 0o755); err != nil {
		return err
	}
	conf := `{"peft_type":"LORA","task_type":"CAUSAL_LM","r":8,"lora_alpha":16,"target_modules":["q_proj","k_proj","v_proj","o_proj"]}`
	if err := os.WriteFile(filepath.Join(path, "adapter_config.json"), []byte(conf), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(path, "adapter_model.safetensors"))
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// runPolicy runs the requests through a router of policy pol in front of fresh replicas, own
// of which serve the hottest adapter merged (replicasim serving the base model under the
// adapter's name, without LoRA: vllm serve CHECKPOINT --served-model-name NAME).
func runPolicy(o options, pol string, own int, reqs []traces.Request, models []string, adapters []fleet.Adapter, rate float64, dir string) (string, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := procs.NewGroup(ctx, o.bin)
	defer g.Stop()
	start := g.Start
	var set []fleet.Replica
	for i := range o.replicas {
		addr, err := procs.FreeAddr()
		if err != nil {
			return "", err
		}
		if i < own {
			hot := adapterName(0)
			if err := start(nil, "replicasim", "-listen", addr, "-model", hot, "-profile", o.profile, "-log-level", "warn"); err != nil {
				return "", err
			}
			set = append(set, fleet.Replica{ID: fmt.Sprintf("own%d", i), Address: addr, Model: hot, Adapter: hot, Capacity: fleet.OnDemand, PricePerHour: 1, Profile: o.profile})
			continue
		}
		if err := start([]string{"VLLM_ALLOW_RUNTIME_LORA_UPDATING=true"}, "replicasim", "-listen", addr, "-model", model, "-profile", o.profile,
			"-log-level", "warn", "--enable-lora", "--max-loras", strconv.Itoa(o.maxLoRAs), "--max-cpu-loras", strconv.Itoa(max(o.maxCPULoRAs, o.maxLoRAs))); err != nil {
			return "", err
		}
		set = append(set, fleet.Replica{ID: fmt.Sprintf("r%d", i), Address: addr, Model: model, Capacity: fleet.OnDemand, PricePerHour: 1, Profile: o.profile})
	}
	for _, rep := range set {
		if err := procs.WaitHealthy(rep.Address); err != nil {
			return "", err
		}
	}
	cfg := map[string]any{
		"policy":          pol,
		"slos":            map[string]any{model: map[string]float64{"ttft_seconds": o.sloTTFT.Seconds(), "tpot_seconds": o.sloTPOT.Seconds()}},
		"routing_headers": true,
		"adapters":        adapters,
		"max_loras":       o.maxLoRAs,
	}
	if err := procs.WriteYAML(dir, map[string]any{"router.yaml": cfg, "replicas.yaml": map[string]any{"replicas": set}}); err != nil {
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
	if err := start(nil, "router", "-listen", listen, "-admin", admin, "-config", filepath.Join(dir, "router.yaml"),
		"-replicas", filepath.Join(dir, "replicas.yaml"), "-log-level", "warn"); err != nil {
		return "", err
	}
	if err := procs.WaitHealthy(listen); err != nil {
		return "", err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}, Timeout: 10 * time.Minute}
	res := workload.ReplayModels(client, "http://"+listen, models, reqs, rate, o.maxDuration)
	loads, err := counter(admin, "arbiter_router_adapter_loads_total")
	if err != nil {
		return "", err
	}
	if errs, err := samples(admin, "arbiter_router_errors_total"); err == nil && errs != "" {
		fmt.Fprintf(os.Stderr, "%s: the router's errors:\n%s", pol, errs)
	}
	label := pol
	if own > 0 {
		label += fmt.Sprintf(", %d of %s's own", own, adapterName(0))
	}
	return row(o, label, res, set, loads), nil
}

// counter sums a counter's series on the router's admin /metrics.
func counter(admin, name string) (float64, error) {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	sum := 0.0
	for _, m := range regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(name)+`\{[^}]*result="loaded"[^}]*\} (\S+)$`).FindAllSubmatch(b, -1) {
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		sum += v
	}
	return sum, nil
}

func row(o options, pol string, res []workload.Result, set []fleet.Replica, loads float64) string {
	t := workload.Count(pol, res, o.sloTTFT, o.sloTPOT)
	var shares []string
	for _, rep := range set {
		shares = append(shares, fmt.Sprintf("%s %.0f%%", rep.ID, 100*float64(len(t.PerReplica[rep.ID]))/float64(max(t.OK, 1))))
	}
	n := float64(max(len(res), 1))
	minutes := t.Last.Sub(t.First).Minutes()
	return fmt.Sprintf("| %s | %.1f %% | %.1f %% | %s / %s | %s | %.0f (%.1f) | %s |", pol, 100*float64(t.OK)/n, 100*float64(t.Good)/n,
		workload.Ms(workload.Quantile(t.TTFT, 0.5)), workload.Ms(workload.Quantile(t.TTFT, 0.9)), workload.Ms(workload.Quantile(t.TPOT, 0.9)),
		loads, loads/max(minutes, 1e-9), strings.Join(shares, ", "))
}

// samples returns a family's non-zero samples on the router's admin /metrics, a line each.
func samples(admin, name string) (string, error) {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	var out strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name+"{") && !strings.HasSuffix(line, " 0") {
			out.WriteString("  " + line + "\n")
		}
	}
	return out.String(), nil
}
