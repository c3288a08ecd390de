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
	"github.com/arbiter-serve/arbiter/state/pgtest"
)

// lockStateFile takes the state file's write lock as another process would (an operator's
// sqlite3 shell, a backup); unlock releases it.
func lockStateFile(t *testing.T, path string) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	other, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	return func() {
		if _, err := conn.ExecContext(ctx, `ROLLBACK`); err != nil {
			t.Fatal(err)
		}
	}
}

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
	unlock := lockStateFile(t, path)
	code, body := call(t, srv, http.MethodPost, "/v1/services", "secret", submit("second", strings.Replace(fixedSpec, "model: m}", "model: m2}", 1)))
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

	unlock()
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

// A replica that dies while another process holds the state file's lock is recorded once
// the lock goes, with the times it happened at and in order: ended when it died, so billed
// to then and no further, and the event log says what happened.
func TestDeathDuringALockIsRecordedWhenTheFileFrees(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := state.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	mem := &memProvider{running: map[string]replicas.Instance{}}
	now := time.Unix(1_900_000_000, 0)
	c, err := New(ctx, Config{Store: st, Providers: map[string]replicas.Provider{"local": mem}, Now: func() time.Time { return now },
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	spec := strings.Replace(fixedSpec, "replicas: 3", "replicas: 1", 1) + "  local: {price_per_hour: 3.6, capacity: on_demand}\n"
	spec = strings.Replace(spec, "arbiter: {model: m}\n", "arbiter:\n  model: m\n", 1)
	if _, _, err := c.Create(ctx, "svc", spec, nil); err != nil {
		t.Fatal(err)
	}
	tick := func() {
		c.tick(ctx)
		c.wg.Wait()
		now = now.Add(time.Second)
	}
	tick()
	rows, err := st.Replicas(ctx, "svc", false)
	if err != nil || len(rows) != 1 {
		t.Fatalf("rows %v %v", rows, err)
	}
	id := rows[0].ID

	unlock := lockStateFile(t, path)
	died := now
	mem.mu.Lock()
	delete(mem.running, id) // it dies while the file is locked
	mem.mu.Unlock()
	for range 5 {
		tick()
	}
	now = now.Add(time.Hour) // the lock is held a long time
	unlock()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		tick()
		c.mu.Lock()
		n := len(c.pending)
		c.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d writes still wait 10 s after the lock was released", n)
		}
	}
	all, err := st.Replicas(ctx, "svc", true)
	if err != nil {
		t.Fatal(err)
	}
	var dead state.Replica
	for _, r := range all {
		if r.ID == id {
			dead = r
		}
	}
	if dead.EndedAt.IsZero() || dead.EndedAt.Sub(died) > 10*time.Second {
		t.Fatalf("the dead replica's row: state %s, ended %v; want ended within seconds of its death at %v, not an hour later", dead.State, dead.EndedAt, died)
	}
	billed := 0.0
	for _, r := range all {
		if r.ID == id {
			billed = r.PricePerHour * r.EndedAt.Sub(r.LaunchedAt).Hours()
		}
	}
	if billed > 3.6*15/3600 {
		t.Fatalf("the dead replica is billed $%.4f; want at most its ~15 s alive", billed)
	}
	evs, err := st.Events(ctx, "svc", id, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, e := range evs {
		msgs = append(msgs, e.Message)
	}
	joined := strings.Join(msgs, "\n")
	if !strings.Contains(joined, "→ failed") || !strings.Contains(joined, "→ terminated") || strings.Index(joined, "→ failed") > strings.Index(joined, "→ terminated") {
		t.Fatalf("the dead replica's events, in order:\n%s\nwant its failure, then its termination", joined)
	}
}

// With its PostgreSQL server out of reach the control plane behaves as with a locked state
// file: it launches nothing whose row it could not write, answers submissions with a 503
// that says why, and catches up once the server is back; a control plane started afterwards
// on the same database finds exactly what runs.
func TestStateDatabaseOutOfReachLaunchesNothing(t *testing.T) {
	ctx := context.Background()
	pg := pgtest.Start(t)
	url := pg.NewDatabase(t)
	st, err := state.OpenPostgres(ctx, url, state.Options{WriteTimeout: time.Second})
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
		t.Fatalf("submit before the outage: %d %s", code, body)
	}
	pg.Stop()
	code, body := call(t, srv, http.MethodPost, "/v1/services", "secret", submit("second", strings.Replace(fixedSpec, "model: m}", "model: m2}", 1)))
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "out of reach") {
		t.Fatalf("submit while the database is down: %d %s; want 503 saying it is out of reach", code, body)
	}
	start := time.Now()
	c.tick(ctx)
	c.wg.Wait()
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("a tick with the database down took %v; want it bounded by one write timeout", took)
	}
	if n := len(mem.running); n != 0 {
		t.Fatalf("%d replicas launched while their rows could not be written", n)
	}
	if got := testutil.ToFloat64(c.metrics.stateErrors); got < 3 {
		t.Errorf("state_write_errors_total = %v; want ≥ 3 (one per launch not made)", got)
	}
	if err := pg.Restart(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); len(mem.running) < 3 && time.Now().Before(deadline); {
		c.tick(ctx)
		c.wg.Wait()
		time.Sleep(100 * time.Millisecond)
	}
	if n := len(mem.running); n != 3 {
		t.Fatalf("%d replicas running after the database came back; want the spec's 3", n)
	}
	st2, err := state.OpenPostgres(ctx, url, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	c2, err := New(ctx, Config{Store: st2, Providers: cfg.Providers, Log: cfg.Log})
	if err != nil {
		t.Fatal(err)
	}
	c2.tick(ctx)
	c2.wg.Wait()
	rows, err := st2.Replicas(ctx, "svc", false)
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
}
