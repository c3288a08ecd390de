package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/arbiter-serve/arbiter/bench/procs"
	"github.com/arbiter-serve/arbiter/bench/workload"
	"github.com/arbiter-serve/arbiter/traces"
)

// Prices of the two GPUs, $/hour for one GPU on demand, from the shared catalogs
// (pricing.Embedded, 2026-11): an L4 on GCP in us-central1 ($0.56004/h) with its
// g2-standard-4 host ($0.14679/h), and an H100 as Azure's Standard_NC40ads_H100_v5 in eastus.
const (
	mixL4Price   = 0.70683
	mixH100Price = 6.98
	mixModel     = "mix-model"
	mixSLOTTFT   = time.Second
	mixSLOTPOT   = 100 * time.Millisecond
)

// mixLoad is a trace-shaped load, deterministic: the Azure code trace's two kinds of
// request, a short chat turn (200 prompt tokens, 48 out) four times in five and a long code
// prompt (6,000 tokens, 16 out) the fifth time, one every 300 ms.
func mixLoad() []traces.Request {
	var reqs []traces.Request
	for i := range 40 {
		r := traces.Request{At: time.Duration(i) * 300 * time.Millisecond, InputTokens: 200, OutputTokens: 48}
		if i%5 == 2 {
			r.InputTokens, r.OutputTokens = 6000, 16
		}
		reqs = append(reqs, r)
	}
	return reqs
}

// mixRun is one fleet's run of the load.
type mixRun struct {
	name       string
	costPerHr  float64
	res        []workload.Result
	wall       time.Duration
	goodTokens int // tokens of the requests answered within the SLO
	tokens     int
	good, n    int
	// shortOn and longOn count the short and long requests each replica answered.
	shortOn, longOn map[string]int
	// tpotErr is, per replica, each request's predicted TPOT over the TPOT seen, less 1.
	tpotErr map[string][]float64
}

func (m mixRun) usdPerMGood() float64 {
	return m.costPerHr * m.wall.Hours() / float64(max(m.goodTokens, 1)) * 1e6
}

// runMixFleet starts one replicasim per GPU name (l4 or h100, labelled with its accelerator
// and priced as above) and a router in front of them with the slo_cheapest policy, replays
// the load, and stops them.
func runMixFleet(t *testing.T, name string, gpus ...string) mixRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	var started []*exec.Cmd
	defer func() {
		for _, p := range started {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}()
	start := func(bin string, args ...string) {
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, bin), args...)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", bin, err)
		}
		started = append(started, cmd)
	}
	run := mixRun{name: name, shortOn: map[string]int{}, longOn: map[string]int{}, tpotErr: map[string][]float64{}}
	var set []map[string]any
	for i, g := range gpus {
		addr := procs.MustFreeAddr()
		accel, price := "L4", mixL4Price
		if g == "h100" {
			accel, price = "H100", mixH100Price
		}
		start("replicasim", "-listen", addr, "-model", mixModel, "-profile", g+"-llama-3.1-8b", "-log-level", "warn")
		set = append(set, map[string]any{"id": fmt.Sprintf("%s-%d", g, i), "address": addr, "model": mixModel,
			"capacity": "on_demand", "price_per_hour": price, "accelerator": accel})
		run.costPerHr += price
	}
	cfg := map[string]any{
		"policy":          "slo_cheapest",
		"slos":            map[string]any{mixModel: map[string]float64{"ttft_seconds": mixSLOTTFT.Seconds(), "tpot_seconds": mixSLOTPOT.Seconds()}},
		"routing_headers": true,
	}
	for file, v := range map[string]any{"router.yaml": cfg, "replicas.yaml": map[string]any{"replicas": set}} {
		b, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, file), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range set {
		mixWait(t, 60*time.Second, "replica "+r["id"].(string)+" healthy", func() bool { return httpOK("http://" + r["address"].(string) + "/health") })
	}
	listen, admin := procs.MustFreeAddr(), procs.MustFreeAddr()
	start("router", "-listen", listen, "-admin", admin, "-config", filepath.Join(dir, "router.yaml"),
		"-replicas", filepath.Join(dir, "replicas.yaml"), "-log-level", "warn")
	mixWait(t, 60*time.Second, "every replica available to the router", func() bool { return availableReplicas(admin) == len(set) })

	reqs := mixLoad()
	client := &http.Client{Timeout: 2 * time.Minute}
	run.res = workload.Replay(client, "http://"+listen, mixModel, reqs, float64(len(reqs)-1)/(reqs[len(reqs)-1].At.Seconds()), time.Minute)
	var first, last time.Time
	for i, r := range run.res {
		run.n++
		if r.Err != nil {
			t.Logf("%s: request %d failed: %v", name, i, r.Err)
			continue
		}
		if first.IsZero() || r.Start.Before(first) {
			first = r.Start
		}
		if r.End.After(last) {
			last = r.End
		}
		run.tokens += r.Prompt + r.Output
		if r.TTFT <= mixSLOTTFT.Seconds() && r.TPOT <= mixSLOTPOT.Seconds() {
			run.good++
			run.goodTokens += r.Prompt + r.Output
		}
		if r.TPOT > 0 {
			run.tpotErr[r.Replica] = append(run.tpotErr[r.Replica], r.PredTPOT/r.TPOT-1)
		}
		if r.Prompt >= 1000 {
			run.longOn[r.Replica]++
		} else {
			run.shortOn[r.Replica]++
		}
	}
	run.wall = last.Sub(first)
	return run
}

// A mixed fleet of one L4 and one H100 behind one router, against an L4-only and an
// H100-only fleet of two replicas each, under the same trace-shaped load in the same run:
// on the mix the short requests go mostly to the L4 and the long prompts to the H100, every
// request meets the SLO, and the fleet's dollars per million tokens answered within the SLO
// are below either single type's (the L4s miss the SLO on long prompts; the H100s cost more
// by the hour than the mix for the same tokens).
func TestGPUMixCostsLessPerTokenThanEitherType(t *testing.T) {
	mix := runMixFleet(t, "L4 + H100", "l4", "h100")
	l4 := runMixFleet(t, "2 × L4", "l4", "l4")
	h100 := runMixFleet(t, "2 × H100", "h100", "h100")
	var rows []string
	for _, r := range []mixRun{mix, l4, h100} {
		ttft, tpot := []float64{}, []float64{}
		for _, x := range r.res {
			if x.Err == nil {
				ttft, tpot = append(ttft, x.TTFT), append(tpot, x.TPOT)
			}
		}
		rows = append(rows, fmt.Sprintf("| %s | $%.2f/h | %d/%d | TTFT p90 %s | TPOT p90 %s | %.1f s | %d | $%.3f | short %v long %v |", r.name, r.costPerHr,
			r.good, r.n, workload.Ms(workload.Quantile(ttft, 0.9)), workload.Ms(workload.Quantile(tpot, 0.9)), r.wall.Seconds(), r.goodTokens,
			r.usdPerMGood(), r.shortOn, r.longOn))
	}
	t.Logf("fleet | $/hour | within SLO | TTFT | TPOT | wall | tokens within SLO | $/M tokens within SLO | requests per replica\n%s", strings.Join(rows, "\n"))

	if mix.good != mix.n {
		t.Errorf("the mixed fleet met the SLO for %d of %d requests; want all", mix.good, mix.n)
	}
	short, long := mix.shortOn["l4-0"], mix.longOn["h100-1"]
	totalShort, totalLong := mix.shortOn["l4-0"]+mix.shortOn["h100-1"], mix.longOn["l4-0"]+mix.longOn["h100-1"]
	if 2*short <= totalShort {
		t.Errorf("the L4 answered %d of %d short requests; want most", short, totalShort)
	}
	if long != totalLong || totalLong == 0 {
		t.Errorf("the H100 answered %d of %d long prompts; want all", long, totalLong)
	}
	// Each replica is predicted on its own GPU from its first request: the router's TPOT for
	// the first requests on the L4 is the L4's, not the default H100's (an eighth of it)
	// until traffic corrects it.
	for id, errs := range mix.tpotErr {
		t.Logf("%s: TPOT prediction errors in arrival order %.2f", id, errs)
		first := errs[:min(5, len(errs))]
		mean := 0.0
		for _, e := range first {
			mean += e / float64(len(first))
		}
		if math.Abs(mean) > 0.25 {
			t.Errorf("the router's TPOT predictions for the first %d requests on %s are off by %+.0f %% on average: want within 25 %%", len(first), id, 100*mean)
		}
	}
	for _, single := range []mixRun{l4, h100} {
		if mix.usdPerMGood() >= single.usdPerMGood() {
			t.Errorf("the mix costs $%.3f per million tokens within the SLO, %s $%.3f: want the mix cheaper", mix.usdPerMGood(), single.name, single.usdPerMGood())
		}
	}
}

// mixWait polls cond until it holds, failing the test after timeout.
func mixWait(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func httpOK(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// availableReplicas is how many replicas the router's admin view shows available.
func availableReplicas(admin string) int {
	resp, err := http.Get("http://" + admin + "/replicas")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var view []struct {
		Available bool `json:"available"`
	}
	if json.NewDecoder(resp.Body).Decode(&view) != nil {
		return 0
	}
	n := 0
	for _, v := range view {
		if v.Available {
			n++
		}
	}
	return n
}
