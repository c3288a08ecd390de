package control

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
)

// healthProvider launches each replica at a loopback HTTP server of its own whose /health
// answers what health says, given how many probes that server has had; with health nil,
// at memProvider's 127.0.0.1:1, where nothing listens.
type healthProvider struct {
	memProvider
	health  func(probe int64) int
	servers []*httptest.Server
}

func (p *healthProvider) Launch(ctx context.Context, ls replicas.LaunchSpec) (replicas.Instance, error) {
	in, err := p.memProvider.Launch(ctx, ls)
	if p.health != nil {
		var probes atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/health" { // the readiness probe; /v1/models is asked too
				w.WriteHeader(p.health(probes.Add(1)))
			}
		}))
		p.mu.Lock()
		p.servers = append(p.servers, srv)
		in.Address = srv.Listener.Addr().String()
		p.running[ls.ReplicaID] = in
		p.mu.Unlock()
	}
	return in, err
}

func (p *healthProvider) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.servers {
		s.Close()
	}
}

// readinessRig is a controller on an injected clock over p, with one service of one replica
// probed every second (failure_threshold 3, ready budget 60 s).
func readinessRig(t *testing.T, p replicas.Provider) (step func(), c *Controller, st *state.Store, clock *testClock) {
	t.Helper()
	ctx := context.Background()
	clock = &testClock{t: time.UnixMilli(1_800_000_000_000)}
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c, err = New(ctx, Config{Store: st, Providers: map[string]replicas.Provider{"local": p}, Now: clock.Now,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	spec := strings.Replace(loneSpec, "arbiter: {model: m}", "arbiter: {model: m, readiness: {probe_interval_seconds: 1, failure_threshold: 3, ready_budget_seconds: 60}}", 1)
	if _, _, err := c.Create(ctx, "svc", spec, nil); err != nil {
		t.Fatal(err)
	}
	return func() {
		c.tick(ctx)
		c.wg.Wait()
		clock.Add(time.Second)
	}, c, st, clock
}

// A replica whose /health flaps on every probe, once taken out, stays out: it needs as many
// passes in a row as failures took it out (failure_threshold), so it does not move in and
// out of every router's set on each probe; it is replaced when its not-ready budget ends.
// Before, each single pass brought it back.
func TestFlappingHealthStaysOut(t *testing.T) {
	var mode atomic.Int32 // 0: healthy, 1: failing, 2: flapping
	p := &healthProvider{memProvider: memProvider{running: map[string]replicas.Instance{}}, health: func(n int64) int {
		if m := mode.Load(); m == 1 || m == 2 && n%2 == 0 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}}
	t.Cleanup(p.close)
	step, c, st, _ := readinessRig(t, p)
	inSet := func(id string) bool {
		set, _ := c.ReadySet()
		for _, r := range set.Replicas {
			if r.ID == id {
				return true
			}
		}
		return false
	}
	var id string
	for i := 0; id == "" || !inSet(id); i++ {
		if i > 30 {
			t.Fatal("not ready after 30 s")
		}
		step()
		for rid := range c.services["svc"].replicas {
			id = rid
		}
	}
	mode.Store(1)
	for i := 0; inSet(id); i++ {
		if i > 10 {
			t.Fatal("still ready 10 failed probes later")
		}
		step()
	}
	mode.Store(2)
	ins := 0
	for range 40 {
		step()
		if inSet(id) {
			ins++
		}
	}
	evs, _ := st.Events(context.Background(), "svc", id, 0, 1000)
	var text []string
	for _, e := range evs {
		text = append(text, e.Message)
	}
	if ins != 0 {
		t.Errorf("a replica flapping on every probe was back in the ready set for %d of the next 40 s:\n%s", ins, strings.Join(text, "\n"))
	}
}

// A replica whose server listens on another port than the one it was given is refused on
// every probe; when its ready budget ends it is failed with a message that says so.
func TestReplicaOnAnotherPortIsFailedWithAHint(t *testing.T) {
	p := &healthProvider{memProvider: memProvider{running: map[string]replicas.Instance{}}} // at 127.0.0.1:1
	step, c, st, _ := readinessRig(t, p)
	var id string
	for range 70 {
		step()
		for rid := range c.services["svc"].replicas {
			if id == "" {
				id = rid
			}
		}
	}
	evs, _ := st.Events(context.Background(), "svc", id, 0, 1000)
	var text []string
	for _, e := range evs {
		text = append(text, e.Message)
	}
	all := strings.Join(text, "\n")
	if !strings.Contains(all, "not ready within its 1m0s budget") || !strings.Contains(all, "nothing listens on 127.0.0.1:1") {
		t.Fatalf("events:\n%s\nwant the budget's end, saying nothing listens where the provider told it to", all)
	}
}
