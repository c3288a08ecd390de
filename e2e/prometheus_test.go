package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/router"
	"github.com/arbiter-serve/arbiter/state"
)

// needTool finds a Prometheus binary. CI installs Debian's prometheus package and sets
// ARBITER_REQUIRE_PROMETHEUS=1, so a missing binary fails there instead of skipping.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("ARBITER_REQUIRE_PROMETHEUS") != "" {
			t.Fatalf("%s not found and ARBITER_REQUIRE_PROMETHEUS is set (apt-get install prometheus)", name)
		}
		t.Skipf("%s not installed (apt-get install prometheus)", name)
	}
	return p
}

// The rule files are valid and their unit tests (known series → known answers) pass.
func TestMonitoringRules(t *testing.T) {
	promtool := needTool(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", "../monitoring/rules.yml", "../monitoring/alerts.yml"},
		{"check", "config", "../monitoring/prometheus.yml"},
		{"test", "rules", "../monitoring/rules_test.yml"},
	} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// prom is a real Prometheus scraping one target every second with the repository's rules.
type prom struct {
	t    *testing.T
	base string
}

func startPrometheus(t *testing.T, target string) *prom {
	t.Helper()
	return startPrometheusOn(t, []string{target}, target)
}

// startPrometheusOn is a real Prometheus scraping targets (job arbiter) every second with
// the repository's rules, and the replicas a router's service discovery at sd lists ("":
// none).
func startPrometheusOn(t *testing.T, targets []string, sd string) *prom {
	t.Helper()
	bin := needTool(t, "prometheus")
	dir := t.TempDir()
	abs := func(p string) string { a, _ := filepath.Abs(p); return a }
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = fmt.Sprintf("%q", tg)
	}
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q, %q]
scrape_configs:
  - job_name: arbiter
    static_configs: [{targets: [%s]}]
`, abs("../monitoring/rules.yml"), abs("../monitoring/alerts.yml"), strings.Join(quoted, ", "))
	if sd != "" {
		cfg += fmt.Sprintf(`  - job_name: arbiter-replicas
    http_sd_configs: [{url: "http://%s/sd/replicas", refresh_interval: 1s}]
`, sd)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus output:\n%s", logs.String())
		}
	})
	p := &prom{t: t, base: "http://" + addr}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := http.Get(p.base + "/-/ready"); err == nil {
			resp.Body.Close()
			// Ready is not yet scraping: Prometheus applies its targets a few seconds
			// later (its scrape manager reloads every 5 s). A counter whose first sample
			// is already past 0 loses what came before to increase() and rate().
			if resp.StatusCode == 200 && len(p.query(`up{job="arbiter"}`)) > 0 {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready in 30 s:\n%s", logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query runs an instant query now and returns its vector.
func (p *prom) query(q string) []promSample {
	p.t.Helper()
	return p.queryAt(q, "")
}

// queryAt runs an instant query at a time (Unix seconds, as Prometheus writes them; ""
// for now).
func (p *prom) queryAt(q, at string) []promSample {
	p.t.Helper()
	u := p.base + "/api/v1/query?query=" + url.QueryEscape(q)
	if at != "" {
		u += "&time=" + at
	}
	resp, err := http.Get(u)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string       `json:"resultType"`
			Result     []promSample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Status != "success" {
		p.t.Fatalf("query %s: %v %s", q, err, out.Error)
	}
	return out.Data.Result
}

// scalar is the single value of a query that must return exactly one sample.
func (p *prom) scalar(q string) float64 {
	p.t.Helper()
	return p.sum(q, "", 1)
}

// sum adds the values of a query at a time; want is how many samples it must return
// (0: any number but none).
func (p *prom) sum(q, at string, want int) float64 {
	p.t.Helper()
	r := p.queryAt(q, at)
	if want == 0 && len(r) == 0 {
		p.t.Fatalf("query %s: no samples", q)
	}
	total := 0.0
	for _, s := range r {
		var v float64
		if str, ok := s.Value[1].(string); !ok {
			p.t.Fatalf("query %s: value %v", q, s.Value)
		} else if _, err := fmt.Sscan(str, &v); err != nil {
			p.t.Fatal(err)
		}
		total += v
	}
	if want > 0 && len(r) != want {
		p.t.Fatalf("query %s: %d samples; want %d: %v", q, len(r), want, r)
	}
	return total
}

// tokenCount is what the test's own client saw in responses' usage.
type tokenCount struct{ prompt, completion atomic.Int64 }

// Prometheus scrapes a running `serve up` (control plane + router) while a short load with
// streaming and non-streaming requests, a preemption drill and scale to zero happen: every
// dashboard panel's query returns data, every recording rule evaluates, and the $ per
// million tokens Prometheus computes agrees within 1 % with the client's token count and
// replica-seconds × price from the state file.
func TestPrometheusDashboardAndCostAgree(t *testing.T) {
	testStart := time.Now()
	c := newCluster(t)
	keysFile := filepath.Join(c.home, "keys.yaml")
	const key = "sk-e2e-prometheus-0123456789"
	// A second tenant whose hard budget is spent by its first request: the second is
	// refused (the tenant panels' 429s), as a budget is kept by the control plane.
	const tinyKey = "sk-e2e-prometheus-tiny-0123456789"
	if err := os.WriteFile(keysFile, []byte("keys:\n  - {name: e2e, sha256: "+router.HashKey(key)+"}\n  - {name: tiny, sha256: "+router.HashKey(tinyKey)+"}\n"+
		"tenants:\n  - {name: e2e, budget: {period: month, soft_dollars: 1000, hard_dollars: 2000}}\n  - {name: tiny, budget: {period: day, hard_dollars: 0.000001}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.extraDaemonFlags = []string{"--api-keys", keysFile}
	p := startPrometheus(t, c.admin)
	const price = 7.2 // $/h: $0.002 a second, so seconds of replica time are visible
	// One worker calls a LoRA adapter of the model (its chargeback panels), a PEFT folder.
	adapter := filepath.Join(c.home, "adapters", "paid-fin")
	if err := os.MkdirAll(adapter, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(adapter, "adapter_config.json"), []byte(`{"peft_type":"LORA","r":8,"lora_alpha":16}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(adapter, "adapter_model.safetensors"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	c.up("paid", `service:
  readiness_probe: {path: /health, initial_delay_seconds: 30, timeout_seconds: 2}
  replica_policy: {min_replicas: 0, max_replicas: 2}
envs: {MODEL: paid-model}
run: exec replicasim -listen 127.0.0.1:$PORT -model $MODEL -profile h100-llama-3.1-8b -log-level warn -enable-lora -max-loras 2
arbiter:
  model: paid-model
  adapters: [{name: paid-fin, source: `+adapter+`}]
  queue: {enabled: true}
  scale_to_zero_after_seconds: 4
  autoscaling: {signal: concurrency, target_concurrency_per_replica: 2, stable_window_seconds: 3, panic_window_seconds: 1}
  readiness: {probe_interval_seconds: 0.3, failure_threshold: 2}
  local: {capacity: spot, price_per_hour: `+fmt.Sprint(price)+`}
`)

	// The service's scale-decision and cold-start series exist at 0 from its creation and
	// its first placement; a counter Prometheus first sees past 0 loses its first step to
	// increase(), so the load (and with it the wake) waits until both have been scraped.
	c.waitFor("the service's counters scraped at 0", 30*time.Second, func() bool {
		return len(p.query(`arbiter_control_scale_decisions_total{service="paid"}`)) > 0 &&
			len(p.query(`arbiter_control_cold_start_seconds_count{service="paid"}`)) > 0
	})

	var counted tokenCount
	var failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 60 * time.Second}
	sendAs := func(body, withKey string) (int, []byte) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+c.listen+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if withKey != "" {
			req.Header.Set("Authorization", "Bearer "+withKey)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, []byte(err.Error())
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	send := func(body string, withKey bool) (int, []byte) {
		if withKey {
			return sendAs(body, key)
		}
		return sendAs(body, "")
	}
	deadline := time.Now().Add(90 * time.Second)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream := w%2 == 0
			model := "paid-model"
			if w == 3 {
				model = "paid-fin"
			}
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Price a GPU hour, worker %d."}],"max_tokens":24,"stream":%v%s}`,
				model, w, stream, map[bool]string{true: `,"stream_options":{"include_usage":true}`}[stream])
			for n := 0; n < 2000 && time.Now().Before(deadline); n++ {
				select {
				case <-stop:
					return
				default:
				}
				code, b := send(body, true)
				if code != 200 {
					failed.Add(1)
					continue
				}
				countUsage(t, b, stream, &counted)
			}
		}()
	}
	c.waitFor("a ready replica", 60*time.Second, func() bool { return c.status("paid").Ready >= 1 })
	time.Sleep(3 * time.Second)
	c.serve("preempt", c.status("paid").Replicas[0].ID, "--notice", "2s")
	if code, b := sendAs(`{"model":"paid-model","messages":[{"role":"user","content":"x"}],"max_tokens":4}`, tinyKey); code != 200 {
		t.Errorf("the tiny tenant's first request: %d %s; want 200 (nothing spent yet)", code, b)
	}
	c.waitFor("the tiny tenant's budget spent", 30*time.Second, func() bool {
		code, b := sendAs(`{"model":"paid-model","messages":[{"role":"user","content":"x"}],"max_tokens":4}`, tinyKey)
		return code == 429 && strings.Contains(string(b), "budget_exceeded")
	})
	if code, _ := send(`{"model":"no-such-model","messages":[{"role":"user","content":"x"}]}`, true); code != 404 {
		t.Errorf("unknown model: %d; want 404", code)
	}
	if code, _ := send(`{"model":"paid-model","messages":[{"role":"user","content":"x"}]}`, false); code != 401 {
		t.Errorf("no API key: %d; want 401", code)
	}
	c.waitFor("the preempted replica replaced", 60*time.Second, func() bool {
		st := c.status("paid")
		return st.Ready >= 1 && len(p.query(`arbiter_control_preemptions_total`)) > 0
	})
	// The replicas' own metrics, found through the daemon's service discovery, carry the
	// labels that join them to Arbiter's: the engine's running requests by service.
	c.waitFor("replica metrics scraped through /sd/replicas", 30*time.Second, func() bool {
		for _, s := range p.query(`vllm:num_requests_running{job="arbiter-replicas"}`) {
			if s.Metric["service"] == "paid" && s.Metric["capacity"] == "spot" && s.Metric["provider"] == "local" && s.Metric["replica"] != "" {
				return true
			}
		}
		return false
	})
	time.Sleep(4 * time.Second) // a few more scrapes under load
	close(stop)
	wg.Wait()
	if failed.Load() > 0 {
		t.Errorf("%d requests failed under load (with a preemption notice, none should)", failed.Load())
	}

	// Every panel's query (with Grafana's variables filled in) and every recording rule.
	time.Sleep(2 * time.Second)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	b, err := os.ReadFile("../monitoring/grafana/arbiter.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$__rate_interval", "1m", "$__range", "5m", "$service", ".*")
	checked := 0
	for _, panel := range dash.Panels {
		for _, tg := range panel.Targets {
			q := vars.Replace(tg.Expr)
			if strings.Contains(q, "$") {
				t.Errorf("panel %q: unreplaced variable in %s", panel.Title, q)
				continue
			}
			if len(p.query(q)) == 0 {
				t.Errorf("panel %q returns no data: %s", panel.Title, q)
			}
			checked++
		}
	}
	rules, err := os.ReadFile("../monitoring/rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`record: (\S+)`).FindAllStringSubmatch(string(rules), -1) {
		if strings.Contains(m[1], "rate1h") || strings.Contains(m[1], "rate6h") || strings.Contains(m[1], "rate30m") {
			continue // same expression as rate5m over a longer window
		}
		if len(p.query(m[1])) == 0 {
			t.Errorf("recording rule %s has no data", m[1])
		}
		checked++
	}
	t.Logf("%d panel queries and recording rules returned data", checked)

	// Back to zero: the bill stops growing, so Prometheus' last scrape and the state file
	// describe the same totals.
	c.waitFor("scale to zero", 60*time.Second, func() bool { return len(c.status("paid").Replicas) == 0 })
	time.Sleep(3 * time.Second)
	st, err := state.Open(control.StatePath(c.home))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rows, err := st.Replicas(context.Background(), "paid", true)
	if err != nil {
		t.Fatal(err)
	}
	stateDollars, secs := 0.0, 0.0
	for _, r := range rows {
		if r.EndedAt.IsZero() {
			t.Fatalf("replica %s still billed after scale to zero", r.ID)
		}
		secs += r.EndedAt.Sub(r.LaunchedAt).Seconds()
		stateDollars += r.PricePerHour * r.EndedAt.Sub(r.LaunchedAt).Hours()
	}
	clientTokens := float64(counted.prompt.Load() + counted.completion.Load())
	promDollars := p.scalar(`sum(arbiter_control_dollars_total{service="paid"})`)
	promTokens := p.scalar(`sum(arbiter_router_tokens_total{service="paid"})`)
	promPerM := p.scalar(`sum(arbiter_control_dollars_total{service="paid"}) / sum(arbiter_router_tokens_total{service="paid"}) * 1e6`)
	wantPerM := stateDollars / clientTokens * 1e6
	t.Logf("%d replicas, %.1f replica-seconds, $%.5f in the state file, $%.5f in Prometheus; %v tokens counted by the client, %v by Prometheus; $/M %.4f (Prometheus) vs %.4f",
		len(rows), secs, stateDollars, promDollars, clientTokens, promTokens, promPerM, wantPerM)
	if len(rows) < 2 || clientTokens == 0 || stateDollars == 0 {
		t.Fatalf("the test did not exercise a preemption and load (%d replicas, %v tokens)", len(rows), clientTokens)
	}
	if math.Abs(promPerM-wantPerM)/wantPerM > 0.01 {
		t.Errorf("$ per million tokens: Prometheus %.5f, client tokens and state bill %.5f: off by more than 1 %%", promPerM, wantPerM)
	}
	// The dashboard's own queries, with $service the test's and a range that holds the whole
	// test, evaluated at the last scrape (nothing extrapolated past it): each panel that
	// shows a bill or a count shows the one the state file and the client have.
	at := fmt.Sprintf("%.3f", p.scalar(`max(timestamp(arbiter_control_spend_dollars_total{service="paid"}))`))
	readied := 0
	for _, r := range rows {
		if !r.ReadyAt.IsZero() {
			readied++
		}
	}
	events, err := st.Events(context.Background(), "paid", "", 0, 10000)
	if err != nil {
		t.Fatal(err)
	}
	decisions := 0
	for _, e := range events {
		if e.Kind == "scale" {
			decisions++
		}
	}
	panelVars := strings.NewReplacer("$__rate_interval", "1m", "$__range", fmt.Sprintf("%ds", int(time.Since(testStart).Seconds())+60), "$service", "paid")
	truth := []struct {
		title, exprHas string
		want           float64
		of             string
	}{
		{"$ per million tokens over the time range picked", "", wantPerM, "the state file's bill over the client's tokens"},
		{"$ spent (range)", "", stateDollars, "the state file's bill"},
		{"Preemptions", "", 1, "the one preemption drill"},
		{"Cold starts: launch to ready (p90)", "_count", float64(readied), "the replicas that got ready, from the state file"},
		{"Scale decisions", "", float64(decisions), "the scale decisions in the event log"},
	}
	for _, tr := range truth {
		found := false
		for _, panel := range dash.Panels {
			if panel.Title != tr.title {
				continue
			}
			for _, tg := range panel.Targets {
				if !strings.Contains(tg.Expr, tr.exprHas) {
					continue
				}
				found = true
				got := p.sum(panelVars.Replace(tg.Expr), at, 0)
				t.Logf("panel %q: %.6g; %s: %.6g", tr.title, got, tr.of, tr.want)
				if math.Abs(got-tr.want) > 0.01*tr.want {
					t.Errorf("panel %q shows %.6g; %s is %.6g: off by more than 1 %%", tr.title, got, tr.of, tr.want)
				}
			}
		}
		if !found {
			t.Errorf("no panel %q with a query on %q", tr.title, tr.exprHas)
		}
	}
	// The per-place spend the dashboard and the rules sum carries the same dollars.
	if promSpend := p.scalar(`sum(arbiter_control_spend_dollars_total{service="paid"})`); math.Abs(promSpend-stateDollars)/stateDollars > 0.01 {
		t.Errorf("spend by place %v vs the state file's %v: off by more than 1 %%", promSpend, stateDollars)
	}
	if math.Abs(promDollars-stateDollars)/stateDollars > 0.01 || math.Abs(promTokens-clientTokens)/clientTokens > 0.01 {
		t.Errorf("dollars %v vs %v, tokens %v vs %v: off by more than 1 %%", promDollars, stateDollars, promTokens, clientTokens)
	}
}

// countUsage adds one response's usage (a JSON body, or a stream's usage chunk).
func countUsage(t *testing.T, body []byte, stream bool, n *tokenCount) {
	var u struct {
		Usage *struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	add := func(b []byte) {
		if err := json.Unmarshal(b, &u); err == nil && u.Usage != nil {
			n.prompt.Add(u.Usage.Prompt)
			n.completion.Add(u.Usage.Completion)
		}
	}
	if !stream {
		add(body)
		return
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if ok && line != "[DONE]" {
			u.Usage = nil
			add([]byte(line))
		}
	}
}
