package control

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/spec"
	"github.com/arbiter-serve/arbiter/state"
)

// memProvider is an in-memory provider: it lets a unit test place the control plane in
// every crash window deterministically (the e2e tests do the same with real processes,
// where the window hit depends on timing).
type memProvider struct {
	mu        sync.Mutex
	running   map[string]replicas.Instance // replica ID → instance
	terminals []string
}

func (m *memProvider) Name() string { return "local" }
func (m *memProvider) Setup(context.Context, string, int, string, string, map[string]string) error {
	return nil
}
func (m *memProvider) Launch(_ context.Context, s replicas.LaunchSpec) (replicas.Instance, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	in := replicas.Instance{ReplicaID: s.ReplicaID, Handle: "h-" + s.ReplicaID, Address: "127.0.0.1:1", Capacity: fleet.Reserved}
	m.running[s.ReplicaID] = in
	return in, nil
}
func (m *memProvider) Terminate(_ context.Context, handle string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, in := range m.running {
		if in.Handle == handle {
			delete(m.running, id)
			m.terminals = append(m.terminals, id)
		}
	}
	return nil
}
func (m *memProvider) List(context.Context) ([]replicas.Instance, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []replicas.Instance
	for _, in := range m.running {
		out = append(out, in)
	}
	return out, nil
}
func (m *memProvider) Status(_ context.Context, handle string) (replicas.Status, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, in := range m.running {
		if in.Handle == handle {
			return replicas.StatusRunning, "", nil
		}
	}
	return replicas.StatusGone, "not running", nil
}
func (m *memProvider) Notices() <-chan replicas.Notice { return nil }
func (m *memProvider) Quote(context.Context, string, *spec.Service) ([]replicas.Quote, error) {
	return nil, nil
}

const fixedSpec = `service:
  readiness_probe: /health
  replicas: 3
run: x
arbiter: {model: m}
`

// Every crash window, one replica each: the restarted control plane adopts what it
// recorded and finds running, writes off what never launched, finishes what was leaving,
// and terminates what it does not recognise.
func TestRecoveryClassifiesEveryCrashWindow(t *testing.T) {
	ctx := context.Background()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	if _, err := st.PutService(ctx, "svc", fixedSpec, "", now); err != nil {
		t.Fatal(err)
	}
	mem := &memProvider{running: map[string]replicas.Instance{}}
	row := func(state string, running bool) string {
		r, err := st.NewReplica(ctx, stateReplica("svc", state), now)
		if err != nil {
			t.Fatal(err)
		}
		if running {
			mem.running[r.ID] = replicas.Instance{ReplicaID: r.ID, Handle: "h-" + r.ID, Address: "127.0.0.1:1"}
			if state != "pending" && state != "provisioning" { // the handle was recorded
				r.Handle, r.Address = "h-"+r.ID, "127.0.0.1:1"
				if err := st.SaveReplica(ctx, r, state, now); err != nil {
					t.Fatal(err)
				}
			}
		}
		return r.ID
	}
	intentOnly := row("pending", false)             // crashed before the provider heard of it
	launchedUnrecorded := row("provisioning", true) // crashed after launch, before the handle was saved
	ready := row("ready", true)
	leaving := row("draining", true)
	vanished := row("ready", false)
	mem.running["svc-999"] = replicas.Instance{ReplicaID: "svc-999", Handle: "h-stray"} // no row at all

	c, err := New(ctx, Config{Store: st, Providers: map[string]replicas.Provider{"local": mem}, DrainTimeout: time.Minute,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// Recovery ends it in the background (a pod's grace period must not hold up the start).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mem.mu.Lock()
		_, ok := mem.running["svc-999"]
		mem.mu.Unlock()
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the unrecognised instance is still running 10 s after recovery")
		}
	}
	states := func() map[string]string {
		rows, err := st.Replicas(ctx, "svc", true)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, r := range rows {
			out[r.ID] = r.State
		}
		return out
	}
	got := states()
	want := map[string]string{intentOnly: "failed", launchedUnrecorded: "starting", ready: "ready", leaving: "draining", vanished: "failed"}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("after recovery %s is %q; want %q (all: %v)", id, got[id], w, got)
		}
	}
	c.mu.Lock()
	adopted := c.services["svc"].replicas[launchedUnrecorded].row.Handle
	target := c.services["svc"].target
	c.mu.Unlock()
	if adopted != "h-"+launchedUnrecorded {
		t.Errorf("adopted handle %q", adopted)
	}
	if target != 2 { // the two live replicas it resumes with
		t.Errorf("resumed target %d; want 2", target)
	}

	// One tick: failed rows end; the service launches toward its 3 replicas. The draining
	// one waits: routers reported to the control plane before this one, and have not had
	// the time to report here.
	tctx, cancel := context.WithCancel(ctx)
	c.tick(tctx)
	c.wg.Wait()
	if got = states(); got[leaving] != "draining" {
		t.Errorf("on the first tick after recovery %s is %q; want draining until routers had time to report", leaving, got[leaving])
	}
	// One router reports with nothing on it: another may still stream on the replica and
	// not have found this control plane yet (it was talking to the one that died), so the
	// drain still waits a report's lifetime from the recovery.
	// Its report comes a second after the recovery.
	c.mu.Lock()
	c.recoveredAt = c.recoveredAt.Add(-time.Second)
	c.services["svc"].replicas[leaving].drainSince = c.recoveredAt
	c.mu.Unlock()
	c.Report(fleet.LoadReport{Router: "router-2"})
	c.tick(tctx)
	c.wg.Wait()
	if got = states(); got[leaving] != "draining" {
		t.Errorf("after one router of several reported nothing in flight, just after recovery, %s is %q; want draining until every router had time to report", leaving, got[leaving])
	}
	// A report's lifetime later, the reporting router's report gone stale and no router
	// reporting, nothing is left to wait for.
	c.mu.Lock()
	c.recoveredAt = c.recoveredAt.Add(-reportTTL)
	for id, rr := range c.routers {
		rr.at = rr.at.Add(-2 * reportTTL)
		c.routers[id] = rr
	}
	c.mu.Unlock()
	c.tick(tctx)
	c.wg.Wait()
	cancel()
	got = states()
	for _, id := range []string{intentOnly, vanished, leaving} {
		if got[id] != "terminated" {
			t.Errorf("after a tick %s is %q; want terminated", id, got[id])
		}
	}
	if _, ok := mem.running[leaving]; ok {
		t.Error("the draining replica's instance is still running")
	}
	live := 0
	for _, s := range got {
		if s != "terminated" && s != "failed" {
			live++
		}
	}
	if live != 3 {
		t.Errorf("%d live replicas after two ticks; want the spec's 3 (%v)", live, got)
	}
}

func stateReplica(service, st string) state.Replica {
	return state.Replica{Service: service, Version: 1, Provider: "local", State: st, Reason: fmt.Sprintf("test: %s", st)}
}

// An instance that no live row names, found by two audits in a row (a launch whose answer
// was lost, say), is ended; one that appears only once is left for the next audit to judge.
func TestAuditEndsALeakFoundTwice(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	mem := &memProvider{running: map[string]replicas.Instance{}}
	c, err := New(ctx, Config{Store: st, Providers: map[string]replicas.Provider{"local": mem}, AuditEvery: time.Hour,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	mem.mu.Lock()
	mem.running["svc-7"] = replicas.Instance{ReplicaID: "svc-7", Handle: "h-leak"}
	mem.mu.Unlock()
	running := func() bool {
		mem.mu.Lock()
		defer mem.mu.Unlock()
		_, ok := mem.running["svc-7"]
		return ok
	}
	c.audit(ctx)
	c.wg.Wait()
	if !running() {
		t.Fatal("the first audit that saw the instance ended it; it waits for a second sighting")
	}
	c.audit(ctx)
	c.wg.Wait()
	if running() {
		t.Fatal("an instance no row wants, seen by two audits, is still running")
	}
}

// A service whose stored spec no longer loads (here: panic_threshold 1, which this version
// refuses) is marked failed with its reason; the daemon and the other services start, its
// ready replica is left running and keeps serving, and an update with a spec that loads
// brings it back under management. A spec the autoscaler would refuse is never stored.
func TestAStoredSpecThatNoLongerLoadsFailsOnlyItsService(t *testing.T) {
	ctx := context.Background()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	const broken = `service:
  readiness_probe: /health
  replicas: 1
run: x
arbiter:
  model: old
  autoscaling: {panic_threshold: 1}
`
	if _, err := st.PutService(ctx, "old", broken, "", now); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutService(ctx, "svc", fixedSpec, "", now); err != nil {
		t.Fatal(err)
	}
	mem := &memProvider{running: map[string]replicas.Instance{}}
	r, err := st.NewReplica(ctx, stateReplica("old", "ready"), now)
	if err != nil {
		t.Fatal(err)
	}
	r.Handle, r.Address, r.Model = "h-"+r.ID, "127.0.0.1:1", "old"
	if err := st.SaveReplica(ctx, r, "ready", now); err != nil {
		t.Fatal(err)
	}
	mem.running[r.ID] = replicas.Instance{ReplicaID: r.ID, Handle: r.Handle, Address: r.Address}

	c, err := New(ctx, Config{Store: st, Providers: map[string]replicas.Provider{"local": mem}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("one service's stored spec kept the daemon from starting: %v", err)
	}
	for range 3 {
		c.tick(ctx)
		c.wg.Wait()
	}
	sts, err := c.Status(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]ServiceStatus{}
	for _, s := range sts {
		got[s.Name] = s
	}
	if o := got["old"]; o.Status != "failed" || !strings.Contains(o.Failed, "panic_threshold") {
		t.Fatalf("the broken service: status %q, reason %q; want failed, naming panic_threshold", o.Status, o.Failed)
	}
	if s := got["svc"]; s.Target != 3 || s.Live != 3 {
		t.Fatalf("the healthy service did not start: target %d, live %d", s.Target, s.Live)
	}
	set, _ := c.ReadySet()
	if !slices.ContainsFunc(set.Replicas, func(x fleet.Replica) bool { return x.ID == r.ID }) {
		t.Fatal("the failed service's ready replica left the ready set")
	}
	mem.mu.Lock()
	_, running := mem.running[r.ID]
	mem.mu.Unlock()
	if !running {
		t.Fatal("the failed service's replica was terminated")
	}

	// Refused before anything is stored, as the API's 400.
	if _, _, err := c.Update(ctx, "old", broken, nil); err == nil || httpStatus(err) != 400 {
		t.Fatalf("update with a spec the autoscaler refuses: %v; want a 400", err)
	}
	if _, _, err := c.Create(ctx, "new", broken, nil); err == nil || httpStatus(err) != 400 {
		t.Fatalf("create with a spec the autoscaler refuses: %v; want a 400", err)
	}
	if _, err := st.GetVersion(ctx, "new", 1); err == nil {
		t.Fatal("a refused create was stored")
	}
	if _, _, err := c.Update(ctx, "old", strings.Replace(broken, "panic_threshold: 1", "panic_threshold: 2", 1), nil); err != nil {
		t.Fatal(err)
	}
	c.tick(ctx)
	c.wg.Wait()
	sts, err = c.Status(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	if sts[0].Status == "failed" || sts[0].Target != 1 {
		t.Fatalf("after a good update: status %q, target %d; want it managed again with its replica", sts[0].Status, sts[0].Target)
	}
}
