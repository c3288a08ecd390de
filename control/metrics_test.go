package control

import (
	"context"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
)

// gathered indexes a registry's samples by metric name and one label's value.
func gathered(t *testing.T, reg *prometheus.Registry, name, label string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					key = lp.GetValue()
				}
			}
			out[key] += value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return math.NaN()
}

// Dollars and replica-seconds come from the same rows `serve status` bills from: price ×
// launch-to-end for ended replicas, price × launch-to-now for live ones (ready or not); a
// replica that ended long ago stops being exported.
func TestMetricsBillFromTheStateRows(t *testing.T) {
	ctx := context.Background()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	now := t0
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	if _, err := st.PutService(ctx, "svc", fixedSpec, "", t0); err != nil {
		t.Fatal(err)
	}
	mem := &memProvider{running: map[string]replicas.Instance{}}
	add := func(state string, price float64, launched, ended time.Time) string {
		r := stateReplica("svc", state)
		r.PricePerHour, r.Capacity, r.Region, r.Zone = price, "spot", "us-central1", "us-central1-a"
		r, err := st.NewReplica(ctx, r, launched)
		if err != nil {
			t.Fatal(err)
		}
		if state != "pending" {
			r.Handle, r.Address, r.EndedAt = "h-"+r.ID, "127.0.0.1:1", ended
			if err := st.SaveReplica(ctx, r, "pending", launched); err != nil {
				t.Fatal(err)
			}
		}
		if ended.IsZero() {
			mem.running[r.ID] = replicas.Instance{ReplicaID: r.ID, Handle: "h-" + r.ID, Address: "127.0.0.1:1"}
		}
		return r.ID
	}
	ended := add("terminated", 2, t0.Add(-150*time.Minute), t0.Add(-30*time.Minute)) // 2 h × $2
	old := add("terminated", 5, t0.Add(-5*time.Hour), t0.Add(-2*time.Hour))          // ended beyond retention
	starting := add("starting", 1.5, t0.Add(-30*time.Minute), time.Time{})           // billed while loading
	ready := add("ready", 3, t0.Add(-10*time.Minute), time.Time{})                   // 10 min × $3 so far
	_ = old

	reg := prometheus.NewRegistry()
	c, err := New(ctx, Config{Store: st, Providers: map[string]replicas.Provider{"local": mem}, Now: clock, Metrics: reg,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	dollars := gathered(t, reg, "arbiter_control_dollars_total", "replica")
	want := map[string]float64{ended: 4, starting: 0.75, ready: 0.5}
	if len(dollars) != len(want) {
		t.Errorf("dollar series for %v; want exactly %v (the replica that ended 2 h ago is dropped)", dollars, want)
	}
	for id, w := range want {
		if math.Abs(dollars[id]-w) > 1e-9 {
			t.Errorf("dollars[%s] = %v; want %v", id, dollars[id], w)
		}
	}
	// The place's spend counts every replica there, the one ended beyond retention too
	// ($15), so its series never loses what departed replicas cost.
	spend := gathered(t, reg, "arbiter_control_spend_dollars_total", "zone")
	if math.Abs(spend["us-central1-a"]-(15+4+0.75+0.5)) > 1e-9 {
		t.Errorf("spend by zone %v; want 20.25 in us-central1-a", spend)
	}
	secs := gathered(t, reg, "arbiter_control_replica_seconds_total", "replica")
	if secs[starting] != 1800 || secs[ended] != 7200 {
		t.Errorf("replica seconds %v; want 1800 for the starting one and 7200 for the ended one", secs)
	}
	prices := gathered(t, reg, "arbiter_control_replica_price_dollars_per_hour", "replica")
	if len(prices) != 2 || prices[starting] != 1.5 || prices[ready] != 3 {
		t.Errorf("price gauges %v; want only the two live replicas", prices)
	}

	// Time passes: the live replicas' counters grow by price × elapsed; the ended one
	// stays at 4 until it has been over for the retention, then goes.
	for _, step := range []struct {
		by          time.Duration
		ready       float64
		endedListed bool
	}{{20 * time.Minute, 1.5, true}, {20 * time.Minute, 2.5, false}} {
		mu.Lock()
		now = now.Add(step.by)
		mu.Unlock()
		later := gathered(t, reg, "arbiter_control_dollars_total", "replica")
		v, listed := later[ended]
		if math.Abs(later[ready]-step.ready) > 1e-9 || listed != step.endedListed || (listed && v != 4) {
			t.Errorf("at %s: %v; want the ready replica at %v and the ended one listed=%v at 4", now.Sub(t0), later, step.ready, step.endedListed)
		}
	}

	// Leak audit: an instance under our tag with no row is counted, and only it.
	mem.running["svc-stray"] = replicas.Instance{ReplicaID: "svc-stray", Handle: "h-stray"}
	c.audit(ctx)
	if u := gathered(t, reg, "arbiter_control_unknown_replicas", "provider"); u["local"] != 1 {
		t.Errorf("unknown replicas %v; want local=1", u)
	}
	delete(mem.running, "svc-stray")
	c.audit(ctx)
	if u := gathered(t, reg, "arbiter_control_unknown_replicas", "provider"); u["local"] != 0 {
		t.Errorf("unknown replicas %v after the stray went; want 0", u)
	}
	byState := gathered(t, reg, "arbiter_control_replicas", "state")
	if byState["ready"] != 1 || byState["starting"] != 1 {
		t.Errorf("replicas by state %v; want one ready and one starting", byState)
	}
}

func TestScaleCause(t *testing.T) {
	for _, tc := range []struct {
		from, to  int
		panic     bool
		dir, want string
	}{
		{0, 1, false, "up", "wake"}, {3, 0, false, "down", "idle"}, {2, 6, true, "up", "panic"},
		{2, 3, false, "up", "load"}, {4, 2, false, "down", "load"},
	} {
		if d, c := scaleCause(tc.from, tc.to, tc.panic); d != tc.dir || c != tc.want {
			t.Errorf("scaleCause(%d→%d, panic %v) = %s/%s; want %s/%s", tc.from, tc.to, tc.panic, d, c, tc.dir, tc.want)
		}
	}
}

// A place the service's quotes offer has its spend series at 0 before any replica runs
// there, so the first dollar spent there is an increase Prometheus sees, not a series
// born above 0.
func TestSpendSeriesStartAtZeroWhereQuoted(t *testing.T) {
	c := newTestController(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(&billCollector{c: c})
	c.mu.Lock()
	c.services["svc"] = &service{name: "svc", replicas: map[string]*replica{}}
	c.knowPlace(c.services["svc"], place{"aws", "us-east-1", "use1-az4", "spot", ""})
	c.knowPlace(c.services["svc"], place{"aws", "us-east-1", "use1-az4", "spot", ""})
	c.knowPlace(c.services["svc"], place{"aws", "us-east-1", "use1-az4", "on_demand", ""})
	c.mu.Unlock()
	spend := gathered(t, reg, "arbiter_control_spend_dollars_total", "capacity")
	if v, ok := spend["spot"]; !ok || v != 0 || len(spend) != 2 {
		t.Fatalf("spend %v; want a series at 0 for each quoted place", spend)
	}
	// A spot place's preemption count exists at 0 too (in the controller's own registry).
	var m dto.Metric
	if err := c.metrics.preemptions.WithLabelValues("svc", "aws", "us-east-1", "use1-az4", "spot").Write(&m); err != nil || m.Counter.GetValue() != 0 {
		t.Fatalf("preemptions: %v %v", &m, err)
	}
	if n := testutil.CollectAndCount(c.metrics.preemptions); n != 1 {
		t.Fatalf("%d preemption series; want the spot place's only", n)
	}
}

// A scrape while the state store is out of reach (issue 46 §3): the series read from the
// store are left out and arbiter_control_state_up says why; the rest of the scrape (the
// leader gauge, the write errors, the per-service series kept in memory) is served, HTTP
// 200, so the alert on the store's reachability can fire during the outage.
func TestMetricsScrapeStandsWhenTheStoreIsUnreachable(t *testing.T) {
	ctx := context.Background()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutService(ctx, "svc", fixedSpec, "", time.Now()); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := New(ctx, Config{Store: st, Providers: map[string]replicas.Provider{"local": &memProvider{running: map[string]replicas.Instance{}}},
		Metrics: reg, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	_ = c
	srv := httptest.NewServer(metricsHandler(reg, log))
	defer srv.Close()
	scrape := func() (int, string) {
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := scrape()
	if code != 200 || !strings.Contains(body, "\narbiter_control_state_up 1\n") {
		t.Fatalf("with the store: HTTP %d, state_up 1 present %v", code, strings.Contains(body, "arbiter_control_state_up 1"))
	}
	st.Close() // every read now fails, as a stopped PostgreSQL's do
	code, body = scrape()
	if code != 200 {
		t.Fatalf("without the store: HTTP %d; want 200 with the series that need no store:\n%s", code, body)
	}
	for _, want := range []string{"\narbiter_control_state_up 0\n", "\narbiter_control_leader 1\n", "\narbiter_control_state_write_errors_total 0\n",
		"\narbiter_control_state_read_errors_total 1\n", `arbiter_control_target_replicas{service="svc"} 0`} {
		if !strings.Contains(body, want) {
			t.Errorf("without the store, the scrape lacks %q", strings.TrimSpace(want))
		}
	}
	for _, gone := range []string{"arbiter_control_dollars_total{", "arbiter_control_spend_dollars_total{"} {
		if strings.Contains(body, gone) {
			t.Errorf("without the store, the scrape has %s series (read from no rows)", gone)
		}
	}
}
