package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
	"github.com/arbiter-serve/arbiter/state/pgtest"
)

// syncBuffer is a log both a controller's goroutines and the test use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// countingProvider counts launches by replica ID: a launch made twice shows.
type countingProvider struct {
	*healthProvider
	mu       sync.Mutex
	launched map[string]int
}

func (p *countingProvider) Launch(ctx context.Context, ls replicas.LaunchSpec) (replicas.Instance, error) {
	p.mu.Lock()
	p.launched[ls.ReplicaID]++
	p.mu.Unlock()
	return p.healthProvider.Launch(ctx, ls)
}

// freezable is a clock that reads the real time until frozen: a paused process's idea of
// the time, which does not move while it is paused.
type freezable struct {
	mu     sync.Mutex
	frozen time.Time
}

func (f *freezable) now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.frozen.IsZero() {
		return f.frozen
	}
	return time.Now()
}

func (f *freezable) freeze() { f.mu.Lock(); f.frozen = time.Now(); f.mu.Unlock() }

func waitFor(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
	}
}

// Two control planes on one PostgreSQL database: exactly one leads and launches; the other
// stands by, refuses writes and serves the same ready set. The leader's renewals stop (a
// pause its own clock does not see): the standby takes over within the lease and adopts
// what runs, launching nothing twice; the old leader's next write is refused as fenced, and
// it steps down and stays a standby once its renewals resume.
func TestTwoControlPlanesOneLeaderFenced(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := pgtest.DSN(t)
	open := func() *state.Store {
		st, err := state.OpenPostgres(ctx, url, state.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	stA, stB := open(), open()
	const ttl = 2 * time.Second
	clockA := &freezable{}
	lA, err := stA.NewLease("cp-a", ttl, clockA.now)
	if err != nil {
		t.Fatal(err)
	}
	lB, err := stB.NewLease("cp-b", ttl, nil)
	if err != nil {
		t.Fatal(err)
	}
	prov := &countingProvider{healthProvider: &healthProvider{memProvider: memProvider{running: map[string]replicas.Instance{}},
		health: func(int64) int { return 200 }}, launched: map[string]int{}}
	defer prov.close()
	logA := &syncBuffer{}
	cfg := func(st *state.Store, l *state.Lease, log *slog.Logger) Config {
		return Config{Store: st, Lease: l, Providers: map[string]replicas.Provider{"local": prov}, Tick: 100 * time.Millisecond,
			DrainTimeout: time.Minute, Log: log, Token: "secret"}
	}
	a, err := New(ctx, cfg(stA, lA, slog.New(slog.NewTextHandler(logA, nil))))
	if err != nil {
		t.Fatal(err)
	}
	// cp-a's renewals stop while paused, as a stopped process's would.
	var paused atomic.Bool
	renewA := a.renew
	a.renew = func(ctx context.Context) (int64, error) {
		for paused.Load() {
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
		return renewA(ctx)
	}
	var runs sync.WaitGroup
	ctxA, stopA := context.WithCancel(ctx)
	defer stopA()
	runs.Go(func() { a.Run(ctxA) })
	waitFor(t, "cp-a leads", 10*time.Second, func() bool { return lA.Leading() != 0 })
	if _, _, err := a.Create(ctx, "svc", fixedSpec, nil); err != nil {
		t.Fatal(err)
	}

	b, err := New(ctx, cfg(stB, lB, slog.New(slog.NewTextHandler(&syncBuffer{}, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ctxB, stopB := context.WithCancel(ctx)
	defer stopB()
	runs.Go(func() { b.Run(ctxB) })
	defer runs.Wait()
	defer stopA()
	defer stopB()

	ready := func(c *Controller) int {
		set, _ := c.ReadySet()
		return len(set.Replicas)
	}
	waitFor(t, "3 replicas ready, as the standby sees them too", 30*time.Second, func() bool { return ready(a) == 3 && ready(b) == 3 })
	if lB.Leading() != 0 {
		t.Fatal("both control planes lead")
	}
	if la, lb := testutil.ToFloat64(a.metrics.leader), testutil.ToFloat64(b.metrics.leader); la != 1 || lb != 0 {
		t.Errorf("arbiter_control_leader: cp-a %v, cp-b %v; want 1 and 0", la, lb)
	}
	if _, _, err := b.Create(ctx, "other", strings.Replace(fixedSpec, "model: m}", "model: m2}", 1), nil); !errors.Is(err, state.ErrNotLeader) {
		t.Fatalf("a service created through the standby: %v; want ErrNotLeader", err)
	}
	// Through the standby's API: reads answered, writes refused as worth retrying (with the
	// leader).
	srvB := httptest.NewServer(b.Handler())
	defer srvB.Close()
	if code, body := call(t, srvB, "GET", "/v1/services", "secret", ""); code != http.StatusOK || !strings.Contains(body, `"svc"`) {
		t.Errorf("GET /v1/services from the standby: %d %s; want 200 naming svc", code, body)
	}
	other := submit("other", strings.Replace(fixedSpec, "model: m}", "model: m2}", 1))
	if code, body := call(t, srvB, "POST", "/v1/services", "secret", other); code != http.StatusServiceUnavailable || !strings.Contains(body, "does not hold the lease") {
		t.Errorf("POST /v1/services to the standby: %d %s; want 503 saying it does not hold the lease", code, body)
	}
	// A router's load report and wake, taken by a standby, would be lost: refused, so that
	// the router sends them to the leader.
	for _, w := range []struct{ path, body string }{
		{"/v1/load", `{"router":"r1","models":[{"model":"m","requests":1}]}`},
		{"/v1/wake", `{"model":"m"}`},
	} {
		if code, body := call(t, srvB, "POST", w.path, "secret", w.body); code != http.StatusServiceUnavailable || !strings.Contains(body, "does not hold the lease") {
			t.Errorf("POST %s to the standby: %d %s; want 503 saying it does not hold the lease", w.path, code, body)
		}
	}

	// cp-a pauses: no renewals, its clock still.
	clockA.freeze()
	paused.Store(true)
	pausedAt := time.Now()
	waitFor(t, "cp-b takes over", 4*ttl, func() bool { return lB.Leading() != 0 })
	took := time.Since(pausedAt)
	t.Logf("cp-b took the lease %v after cp-a's renewals stopped (lease %v)", took.Round(time.Millisecond), ttl)
	if took > ttl+ttl/3+time.Second {
		t.Errorf("the takeover took %v; want within the lease (%v) plus one renewal period", took, ttl)
	}
	if term := lB.Leading(); term != 2 {
		t.Errorf("cp-b leads term %d; want 2", term)
	}

	// cp-a, still believing it leads, has a write to make: tokens a router reported.
	if lA.Leading() == 0 {
		t.Fatal("cp-a's frozen clock should still say it leads")
	}
	a.Report(fleet.LoadReport{Router: "r1", Models: []fleet.ModelLoad{{Model: "m", Requests: 1, Tokens: 10}}})
	waitFor(t, "cp-a's write refused as fenced", 10*time.Second, func() bool {
		return strings.Contains(logA.String(), "fenced: this control plane led term 1, but cp-b leads term 2 now")
	})
	waitFor(t, "cp-a steps down", 10*time.Second, func() bool { return lA.Leading() == 0 })
	paused.Store(false)

	// cp-b adopted the three replicas: nothing launched twice, nothing more launched.
	waitFor(t, "cp-b serves the 3 replicas", 30*time.Second, func() bool { return ready(b) == 3 })
	for range 3 * int(ttl/(100*time.Millisecond)) / 2 { // three lease periods of cp-b's ticks
		time.Sleep(100 * time.Millisecond)
		if lA.Leading() != 0 {
			t.Fatal("cp-a leads again while cp-b renews")
		}
	}
	prov.mu.Lock()
	launched := len(prov.launched)
	for id, n := range prov.launched {
		if n != 1 {
			t.Errorf("replica %s launched %d times", id, n)
		}
	}
	prov.mu.Unlock()
	if launched != 3 {
		t.Errorf("%d replicas launched; want the 3 cp-a launched, adopted by cp-b", launched)
	}
	if rows, err := stB.Replicas(ctx, "svc", false); err != nil || len(rows) != 3 {
		t.Errorf("live rows %d (%v); want 3", len(rows), err)
	}
}

// A standby forwards the writes it is sent to the leader, whose API address the lease's row
// holds: a service created and a router's load report sent through the standby reach the
// leader; a request already forwarded once is not forwarded again (no ping-pong between two
// standbys); reads stay the standby's own, and see what the leader wrote at once, not a
// third of the lease later (issue 46 §1). A write retried with its Idempotency-Key lands
// once and is answered as the first time (§2); while the leader does not answer, a write
// is refused with a failover's Retry-After and says so.
func TestStandbyForwardsWritesToTheLeader(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := pgtest.DSN(t)
	open := func() *state.Store {
		st, err := state.OpenPostgres(ctx, url, state.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	stA, stB := open(), open()
	// Long: the standby reads the store on its own only every 10 s, so a read that sees
	// the leader's write at once is one the API brought up to date.
	const ttl = 30 * time.Second
	lA, err := stA.NewLease("cp-a", ttl, nil)
	if err != nil {
		t.Fatal(err)
	}
	lB, err := stB.NewLease("cp-b", ttl, nil)
	if err != nil {
		t.Fatal(err)
	}
	prov := &healthProvider{memProvider: memProvider{running: map[string]replicas.Instance{}}, health: func(int64) int { return 200 }}
	defer prov.close()
	newCP := func(st *state.Store, l *state.Lease) *Controller {
		c, err := New(ctx, Config{Store: st, Lease: l, Providers: map[string]replicas.Provider{"local": prov}, Tick: 100 * time.Millisecond,
			DrainTimeout: time.Minute, Log: slog.New(slog.DiscardHandler), Token: "secret"})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := newCP(stA, lA)
	srvA := httptest.NewServer(a.Handler())
	defer srvA.Close()
	stA.Advertise(srvA.URL)
	var runs sync.WaitGroup
	defer runs.Wait()
	defer cancel()
	runs.Go(func() { a.Run(ctx) })
	waitFor(t, "cp-a leads", 10*time.Second, func() bool { return lA.Leading() != 0 })
	b := newCP(stB, lB)
	srvB := httptest.NewServer(b.Handler())
	defer srvB.Close()
	runs.Go(func() { b.Run(ctx) })

	if code, body := call(t, srvB, "POST", "/v1/services", "secret", submit("svc", fixedSpec)); code/100 != 2 {
		t.Fatalf("POST /v1/services through the standby: %d %s; want it created by the leader", code, body)
	}
	if _, err := stA.GetService(ctx, "svc"); err != nil {
		t.Fatalf("the service created through the standby: %v", err)
	}
	for _, path := range []string{"/v1/services/svc", "/v1/services"} {
		if code, body := call(t, srvB, "GET", path, "secret", ""); code != http.StatusOK || !strings.Contains(body, `"name":"svc"`) {
			t.Fatalf("GET %s through the standby right after the write: %d %s; want the service", path, code, body)
		}
	}
	// The leader's replicas ready: a router that moves to the standby (its leader gone)
	// is given them at once, not the set of the standby's last periodic read.
	waitFor(t, "the leader's 3 replicas of svc ready", 20*time.Second, func() bool {
		rows, err := stA.Replicas(ctx, "svc", false)
		n := 0
		for _, r := range rows {
			if r.State == string(replicas.Ready) {
				n++
			}
		}
		return err == nil && n == 3
	})
	code, body := call(t, srvB, "GET", "/v1/readyset?after=0", "secret", "")
	var set fleet.ReadySet
	if err := json.Unmarshal([]byte(body), &set); code != http.StatusOK || err != nil || len(set.Replicas) != 3 {
		t.Fatalf("the standby's ready set right after the leader's replicas got ready: %d %s; want the 3", code, body)
	}
	// Retried writes: each answered as the first time, none stored twice.
	keyed := func(method, path, key, body string) (int, SubmitResponse) {
		t.Helper()
		req, _ := http.NewRequest(method, srvB.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer secret")
		req.Header.Set(idempotencyHeader, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out SubmitResponse
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	spec2 := strings.Replace(fixedSpec, "model: m}", "model: m2}", 1)
	for try := range 2 {
		if code, res := keyed("POST", "/v1/services", "create-k", submit("svc2", spec2)); code != http.StatusCreated || res.Version != 1 || res.Unchanged {
			t.Fatalf("create with a key, try %d: %d %+v; want 201 version 1 both times", try+1, code, res)
		}
	}
	updated := strings.Replace(spec2, "replicas: 3", "replicas: 2", 1)
	if updated == spec2 || spec2 == fixedSpec {
		t.Fatal("fixedSpec has no replicas: 3 or model: m to change")
	}
	b2, _ := json.Marshal(SubmitRequest{Spec: updated})
	for try := range 2 {
		if code, res := keyed("PUT", "/v1/services/svc2", "update-k", string(b2)); code != http.StatusOK || res.Version != 2 || res.Unchanged {
			t.Fatalf("update with a key, try %d: %d %+v; want version 2, changed, both times", try+1, code, res)
		}
	}
	if code, _ := keyed("PUT", "/v1/services/svc", "update-k", string(b2)); code != http.StatusBadRequest {
		t.Errorf("a key reused for another service: %d; want 400", code)
	}
	if sv, err := stA.GetService(ctx, "svc2"); err != nil || sv.Version != 2 {
		t.Fatalf("svc2 after two creates and two updates with their keys: version %d, %v; want 2", sv.Version, err)
	}
	if code, body := call(t, srvB, "POST", "/v1/load", "secret", `{"router":"r-via-b","models":[{"model":"m","requests":1}]}`); code != http.StatusOK {
		t.Fatalf("a load report through the standby: %d %s", code, body)
	}
	a.mu.Lock()
	_, got := a.routers["r-via-b"]
	a.mu.Unlock()
	if !got {
		t.Error("the load report sent through the standby did not reach the leader")
	}
	if code, body := call(t, srvB, "POST", "/v1/load", "wrong", `{"router":"x","models":[]}`); code != http.StatusUnauthorized {
		t.Errorf("a forwarded report with a wrong token: %d %s; want the leader's 401", code, body)
	}
	// Already forwarded once: the standby answers itself (503), never forwards again.
	req, _ := http.NewRequest("POST", srvB.URL+"/v1/load", strings.NewReader(`{"router":"r2","models":[]}`))
	req.Header.Set("Authorization", "Bearer secret")
	req.Header.Set(forwardedHeader, "cp-c")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a request forwarded to a standby: %d; want 503, not forwarded again", resp.StatusCode)
	}
	// The leader's API stops answering (its process is gone; its lease runs on): a write
	// through the standby is refused as a failover, with when to retry.
	srvA.Close()
	b.forgetLeader()
	req, _ = http.NewRequest("DELETE", srvB.URL+"/v1/services/svc", nil)
	req.Header.Set("Authorization", "Bearer secret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusServiceUnavailable || ra < 1 || ra > int((ttl+ttl/3)/time.Second)+1 ||
		!strings.Contains(string(msg), "a failover is under way: the leader cp-a") || !strings.Contains(string(msg), "nothing was written") {
		t.Errorf("a write while the leader does not answer: %d, Retry-After %q, %s; want 503, a retry within the lease and a renewal, and a failover's message",
			resp.StatusCode, resp.Header.Get("Retry-After"), msg)
	}
	if sv, err := stA.GetService(ctx, "svc"); err != nil || sv.Status == "deleting" {
		t.Errorf("svc after the refused delete: %+v %v; want it untouched", sv, err)
	}
}
