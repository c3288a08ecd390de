package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/state"
)

// simService is a service running replicasim through the local provider, with delays short
// enough for a test.
func simService(model, policy, extra string) string {
	return `service:
  readiness_probe: {path: /health, initial_delay_seconds: 30, timeout_seconds: 2}
` + policy + `
envs:
  MODEL: ` + model + `
run: exec replicasim -listen 127.0.0.1:$PORT -model $MODEL -profile h100-llama-3.1-8b -log-level warn ` + extra + `
arbiter:
  model: ` + model + `
  scale_to_zero_after_seconds: 6
  autoscaling: {signal: concurrency, target_concurrency_per_replica: 1, stable_window_seconds: 3, panic_window_seconds: 1}
  readiness: {probe_interval_seconds: 0.3, failure_threshold: 2}
`
}

// 0 → 1 → several → 0 with no failed request, including those that arrived at zero.
func TestScaleFromZeroRampAndBackToZero(t *testing.T) {
	c := newCluster(t)
	out := c.up("ramp", simService("ramp-model", `  replica_policy: {min_replicas: 0, max_replicas: 3, upscale_delay_seconds: 1, downscale_delay_seconds: 3}`, "-ready-delay 500ms"))
	if !strings.Contains(out, "scaled to zero") {
		t.Fatalf("serve up output does not say the service waits at zero:\n%s", out)
	}
	if st := c.status("ramp"); st.Live != 0 || st.Status != "scaled_to_zero" {
		t.Fatalf("before any request: %+v; want nothing running", st)
	}
	if left := c.owned(); len(left) != 0 {
		t.Fatalf("processes before any request: %v", left)
	}

	// The first requests find no replica: they are held, not refused.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	if err := c.requestsOK(ctx, "ramp-model", 3); err != nil {
		t.Fatalf("request sent at zero replicas: %v", err)
	}
	t.Logf("requests held at zero answered after %v", time.Since(start).Round(time.Millisecond))

	l := c.startLoad("ramp-model", 1, 150, true)
	time.Sleep(2 * time.Second)
	l2 := c.startLoad("ramp-model", 5, 150, false)
	c.waitFor("at least 2 ready replicas under load", 90*time.Second, func() bool { return c.status("ramp").Ready >= 2 })
	peak := c.status("ramp")
	l.finish(t, "streaming load")
	l2.finish(t, "non-streaming load")
	t.Logf("peak: target %d, ready %d (%s)", peak.Target, peak.Ready, peak.Decision)

	c.waitFor("scale back to zero after idle", 90*time.Second, func() bool {
		st := c.status("ramp")
		return st.Live == 0 && len(st.Replicas) == 0 && len(c.owned()) == 0
	})
}

type httpErr struct {
	code int
	body string
}

func (e *httpErr) Error() string { return e.body }

// serve update under a running load loop: no failed request; the old version drained and gone.
func TestRollingUpdateUnderLoad(t *testing.T) {
	c := newCluster(t)
	c.up("roll", simService("roll-model", `  replicas: 2`, "-default-max-tokens 32"))
	if st := c.status("roll"); st.Ready != 2 {
		t.Fatalf("after up: %d ready; want 2", st.Ready)
	}
	l := c.startLoad("roll-model", 3, 60, true)
	l2 := c.startLoad("roll-model", 2, 60, false)
	time.Sleep(time.Second)
	path := c.writeSpec("roll-v2", simService("roll-model", `  replicas: 2`, "-default-max-tokens 48"))
	out := c.serve("update", "roll", path)
	time.Sleep(time.Second)
	l.finish(t, "streaming load during update")
	l2.finish(t, "non-streaming load during update")
	st := c.status("roll")
	if st.Version != 2 || st.Ready != 2 || len(st.Replicas) != 2 {
		t.Fatalf("after update: %+v\n%s", st, out)
	}
	for _, r := range st.Replicas {
		if r.Version != 2 {
			t.Fatalf("replica %s of version %d still there after the update", r.ID, r.Version)
		}
	}
	if ids := keys(c.owned()); !slices.Equal(ids, replicaIDs(st)) {
		t.Fatalf("processes %v; want exactly the new replicas %v", ids, replicaIDs(st))
	}
	// Tokens reach the control plane through the router's load reports: the cost per
	// million tokens has something to divide by.
	c.waitFor("tokens counted", 10*time.Second, func() bool { return c.status("roll").Tokens > 0 })
	c.serve("down", "roll")
	if left := c.owned(); len(left) != 0 {
		t.Fatalf("serve down left processes: %v", left)
	}
}

// kill -9 of the control plane in the middle of scaling up, and again of scaling down:
// after each restart, every replica process is one the state knows, and the service
// converges to its target.
func TestKill9DuringScalingLeaksNothing(t *testing.T) {
	c := newCluster(t)
	c.up("crash", simService("crash-model", `  replica_policy: {min_replicas: 1, max_replicas: 3, upscale_delay_seconds: 1, downscale_delay_seconds: 2}`,
		"-listen-delay 1s -ready-delay 2s"))

	l := c.startLoad("crash-model", 4, 400, true)
	c.waitFor("scale-up in progress", 60*time.Second, func() bool {
		st := c.status("crash")
		return st.Live >= 3 && st.Ready < st.Live
	})
	c.kill9()
	close(l.stop) // TestDataPlaneOutlivesTheDaemon counts requests through a daemon's kill
	l.wg.Wait()
	c.checkAccounted("after kill -9 during scale-up")
	c.startDaemon()
	c.waitConverged("crash")

	l = c.startLoad("crash-model", 4, 400, true)
	c.waitFor("3 ready replicas", 90*time.Second, func() bool { return c.status("crash").Ready == 3 })
	close(l.stop)
	l.wg.Wait()
	// A replica drains for well under a second once nothing is in flight on it: watch the
	// API, not the CLI, or the drain can come and go between two looks.
	deadline := time.Now().Add(60 * time.Second)
	for draining := false; !draining; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no replica seen draining within 60 s\nstatus:\n%s\ndaemon log:\n%s", c.serve("status"), c.daemonLog())
		}
		st, _ := c.apiStatus("crash")
		for _, r := range st.Replicas {
			draining = draining || r.State == "draining"
		}
	}
	c.kill9()
	c.checkAccounted("after kill -9 during scale-down")
	c.startDaemon()
	c.waitConverged("crash")
}

func (c *cluster) kill9() {
	c.t.Helper()
	pid := c.daemonPID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		c.t.Fatal(err)
	}
	for range 100 {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("daemon %d survived SIGKILL", pid)
}

// checkAccounted compares the OS process table with the state file: every replica process
// must have a live row (one the restarted control plane will adopt or terminate).
func (c *cluster) checkAccounted(when string) {
	c.t.Helper()
	st, err := state.Open(control.StatePath(c.home))
	if err != nil {
		c.t.Fatal(err)
	}
	defer st.Close()
	rows, err := st.Replicas(context.Background(), "", false)
	if err != nil {
		c.t.Fatal(err)
	}
	live := map[string]bool{}
	for _, r := range rows {
		live[r.ID] = true
	}
	procs := c.owned()
	for id := range procs {
		if !live[id] {
			c.t.Fatalf("%s: replica process %s (pids %v) has no live row in the state file", when, id, procs[id])
		}
	}
	c.t.Logf("%s: %d replica processes, %d live rows", when, len(procs), len(rows))
}

// waitConverged waits until the service runs exactly its target, all ready, and the
// process table holds exactly its replicas.
func (c *cluster) waitConverged(name string) {
	c.t.Helper()
	c.waitFor("convergence after restart", 90*time.Second, func() bool {
		st := c.status(name)
		if st.Target == 0 || st.Ready != st.Target || len(st.Replicas) != st.Target {
			return false
		}
		return slices.Equal(keys(c.owned()), replicaIDs(st))
	})
	st := c.status(name)
	c.t.Logf("converged: target %d, replicas %v", st.Target, replicaIDs(st))
}

func keys(m map[string][]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func replicaIDs(st control.ServiceStatus) []string {
	var out []string
	for _, r := range st.Replicas {
		out = append(out, r.ID)
	}
	slices.Sort(out)
	return out
}

var _ = filepath.Join

// A preemption notice is a routing event: the replica drains at once, its replacement
// starts, and a load loop running through it all sees no failed request.
func TestPreemptionNoticeDrainsAndReplaces(t *testing.T) {
	c := newCluster(t)
	c.up("spot", simService("spot-model", `  replicas: 2`, ""))
	victim := c.status("spot").Replicas[0].ID
	l := c.startLoad("spot-model", 3, 40, true)
	time.Sleep(500 * time.Millisecond)
	c.serve("preempt", victim, "--notice", "3s")
	c.waitFor("the replacement ready and the victim gone", 60*time.Second, func() bool {
		st := c.status("spot")
		if st.Ready != 2 {
			return false
		}
		for _, r := range st.Replicas {
			if r.ID == victim {
				return false
			}
		}
		return true
	})
	time.Sleep(500 * time.Millisecond)
	l.finish(t, "load through a preemption")
	if ev := c.serve("logs", "spot"); !strings.Contains(ev, "preemption notice") {
		t.Fatalf("no preemption event in the log:\n%s", ev)
	}
	if ids := keys(c.owned()); !slices.Equal(ids, replicaIDs(c.status("spot"))) {
		t.Fatalf("processes %v after the preemption", ids)
	}
}

// A replica that vanishes without notice (kill -9) is failed and replaced; requests it held
// that had sent no byte are retried on another replica, so a non-streaming load sees none fail.
func TestReplicaKilledWithoutNoticeIsReplaced(t *testing.T) {
	c := newCluster(t)
	c.up("vanish", simService("vanish-model", `  replicas: 2`, ""))
	victim := c.status("vanish").Replicas[0].ID
	l := c.startLoad("vanish-model", 4, 60, false)
	time.Sleep(time.Second)
	for _, pid := range c.owned()[victim] {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	c.waitFor("a replacement ready", 60*time.Second, func() bool {
		st := c.status("vanish")
		return st.Ready == 2 && !slices.Contains(replicaIDs(st), victim)
	})
	l.finish(t, "non-streaming load through a replica's death")
	if ev := c.serve("logs", "vanish"); !strings.Contains(ev, "exited") {
		t.Fatalf("no failure event in the log:\n%s", ev)
	}
}
