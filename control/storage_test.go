package control

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
)

// While another process holds the state file's write lock, the control plane launches
// nothing (a replica whose row could not be written would be a leak after a crash), answers
// submissions with a 503 that says why, keeps serving reads, and catches up once the lock
// is released; a control plane restarted afterwards finds exactly what runs.
func TestStateFileLockedLaunchesNothing(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := state.Open(path) // the daemon's busy timeout
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	mem := &memProvider{running: map[string]replicas.Instance{}}
	reg := prometheus.NewRegistry()
	cfg := Config{Store: st, Providers: map[string]replicas.Provider{"local": mem}, Token: "secret", Metrics: reg,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	if code, body := call(t, srv, http.MethodPost, "/v1/services", "secret", submit("svc", fixedSpec)); code != http.StatusCreated {
		t.Fatalf("submit before the lock: %d %s", code, body)
	}

	// Another process takes the write lock.
	other, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	code, body := call(t, srv, http.MethodPost, "/v1/services", "secret", submit("second", fixedSpec))
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "locked by another process") {
		t.Fatalf("submit while the state file is locked: %d %s; want 503 saying it is locked", code, body)
	}
	// One write waits out the busy timeout; the rest fail at once, so the control loop
	// (which writes under the lock routers and the CLI need too) is not stalled per write.
	start := time.Now()
	c.tick(ctx)
	c.wg.Wait()
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("a tick with a locked state file took %v; want it bounded by one busy timeout", took)
	}
	if n := len(mem.running); n != 0 {
		t.Fatalf("%d replicas launched while their rows could not be written", n)
	}
	if got := testutil.ToFloat64(c.metrics.stateErrors); got < 3 {
		t.Errorf("state_write_errors_total = %v; want ≥ 3 (one per launch not made)", got)
	}
	if code, body := call(t, srv, http.MethodGet, "/v1/services/svc", "secret", ""); code != http.StatusOK {
		t.Fatalf("status while the file is locked: %d %s; reads must go on", code, body)
	}

	if _, err := conn.ExecContext(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	// Writes resume once the fail-fast spell after the last busy error is over.
	for deadline := time.Now().Add(5 * time.Second); len(mem.running) < 3 && time.Now().Before(deadline); {
		c.tick(ctx)
		c.wg.Wait()
		time.Sleep(100 * time.Millisecond)
	}
	if n := len(mem.running); n != 3 {
		t.Fatalf("%d replicas running after the lock was released; want the spec's 3", n)
	}

	// A fresh control plane over the same file (a restart) finds exactly those three.
	c2, err := New(ctx, Config{Store: st, Providers: cfg.Providers, Log: cfg.Log})
	if err != nil {
		t.Fatal(err)
	}
	c2.tick(ctx)
	c2.wg.Wait()
	rows, err := st.Replicas(ctx, "svc", false)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || len(mem.running) != 3 {
		t.Fatalf("after a restart: %d live rows, %d instances; want 3 and 3", len(rows), len(mem.running))
	}
	for _, r := range rows {
		if _, ok := mem.running[r.ID]; !ok {
			t.Errorf("row %s (%s) has no instance", r.ID, r.State)
		}
	}
	if err := st.Check(ctx); err != nil {
		t.Fatal(err)
	}
}
