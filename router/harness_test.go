package router

import (
	"bufio"
	"cmp"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/internal/conn/linger"
	"github.com/arbiter-serve/arbiter/replicasim"
)

const testModel = "test-model"

// sim is a real replicasim on a loopback port.
type sim struct {
	srv    *replicasim.Server
	addr   string
	cancel context.CancelFunc
}

type simOpts struct {
	echo     bool
	interval time.Duration // echo-mode token pacing
	profile  string
	addr     string // listen here (default: a free loopback port)
	store    bool   // keep Responses API answers (VLLM_ENABLE_RESPONSES_API_STORE)
	task     string // what the model serves (replicasim.TaskNames; default generate)
	priority bool   // --scheduling-policy priority
	model    string // the served model name (default testModel)
	lora     *replicasim.LoRAConfig
}

func startSim(t *testing.T, o simOpts) *sim {
	t.Helper()
	cfg := replicasim.Config{Model: cmp.Or(o.model, testModel), LoRA: o.lora, Echo: o.echo, EchoTokenInterval: o.interval, StopAfter: 8,
		Logger: slog.New(slog.DiscardHandler), Exit: func(int) {}, StoreResponses: o.store, Task: o.task, PriorityScheduling: o.priority}
	if !o.echo {
		name := o.profile
		if name == "" {
			name = "h100-llama-3.1-8b"
		}
		p, err := engine.LoadProfile(name)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Profile = p
	}
	srv, err := replicasim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	addr := o.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go srv.Run(ctx)
	go func() { _ = srv.Serve(ctx, ln) }()
	s := &sim{srv: srv, addr: ln.Addr().String(), cancel: cancel}
	t.Cleanup(cancel)
	return s
}

// rig is a router in front of sims, served on loopback.
type rig struct {
	url  string
	px   *Proxy
	pool *Pool
	reg  *prometheus.Registry
	cfg  *Config
}

func startRouter(t *testing.T, mod func(*Config), replicas ...fleet.Replica) *rig {
	t.Helper()
	return startRouterWith(t, mod, nil, replicas...)
}

// startRouterWith also lets setup wire the proxy before it serves.
func startRouterWith(t *testing.T, mod func(*Config), setup func(*Proxy, *Pool), replicas ...fleet.Replica) *rig {
	t.Helper()
	cfg := Defaults()
	cfg.Probe.Interval = 50 * time.Millisecond
	cfg.ScrapeInterval = 50 * time.Millisecond
	if mod != nil {
		mod(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	reg := prometheus.NewRegistry()
	met := NewMetrics(reg)
	aff, err := NewAffinity(1000, 64)
	if err != nil {
		t.Fatal(err)
	}
	pool := NewPool(&cfg, log, met, aff)
	if err := fleet.ValidateSet(replicas); err != nil {
		t.Fatal(err)
	}
	pool.SetReplicas(replicas)
	px, err := NewProxy(&cfg, pool, met, log)
	if err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(px, pool)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(&cfg, px.Handle, log)
	// As App serves: a refused request's answer is read, not reset (internal/conn/linger).
	go func() { _ = srv.Serve(linger.Listener(ln, 250*time.Millisecond, 5*time.Second, 64)) }()
	ctx, cancel := context.WithCancel(context.Background())
	go pool.Run(ctx)
	t.Cleanup(func() {
		cancel()
		_ = srv.Shutdown()
	})
	return &rig{url: "http://" + ln.Addr().String(), px: px, pool: pool, reg: reg, cfg: &cfg}
}

func replica(id string, s *sim, capacity fleet.Capacity, price float64) fleet.Replica {
	return fleet.Replica{ID: id, Address: s.addr, Model: testModel, Provider: "local", Region: "lo", Capacity: capacity, PricePerHour: price}
}

func chatBody(stream bool, extra string) string {
	b := `{"model":"` + testModel + `","messages":[{"role":"user","content":"hello"}],"max_tokens":5`
	if stream {
		b += `,"stream":true`
	}
	return b + extra + "}"
}

func post(t *testing.T, url, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return do(t, req)
}

// do sends req and reads its whole answer.
func do(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return resp, string(b)
}

// waitFor polls cond until it holds or the bounded wait ends.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitWithin(t, 5*time.Second, what, cond)
}

// waitWithin polls cond until it holds or d has passed.
func waitWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *rig) counter(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	// A histogram's sum is asked for by its series' name, NAME_sum.
	family, sum := name, false
	if f, ok := strings.CutSuffix(name, "_sum"); ok {
		family, sum = f, true
	}
	for _, mf := range mfs {
		if mf.GetName() != name && !(sum && mf.GetName() == family) {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			if c := m.GetCounter(); c != nil {
				total += c.GetValue()
			}
			if g := m.GetGauge(); g != nil {
				total += g.GetValue()
			}
			if h := m.GetHistogram(); h != nil && sum {
				total += h.GetSampleSum()
			}
		}
	}
	return total
}

func (r *rig) inflight(id string) int64 { return r.pool.Get(id).InFlight() }

// readEvents reads SSE events from a streaming response, with the time each arrived.
func readEvents(t *testing.T, body io.Reader) (events []string, at []time.Time) {
	t.Helper()
	br := bufio.NewReader(body)
	var cur strings.Builder
	for {
		line, err := br.ReadString('\n')
		cur.WriteString(line)
		if line == "\n" {
			events = append(events, cur.String())
			at = append(at, time.Now())
			cur.Reset()
		}
		if err != nil {
			return events, at
		}
	}
}

// settled reports whether nothing of this router's is left on the replica: no request in
// flight and nothing left in its model of the replica.
func (r *rig) settled(id string) bool {
	rep := r.pool.Get(id)
	rep.mu.Lock()
	queued := len(rep.twin.queue) > 0 || rep.twin.nDec > 0
	rep.mu.Unlock()
	return rep.InFlight() == 0 && !queued
}

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return do(t, req)
}
