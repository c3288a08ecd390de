package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// Cold starts at a real vLLM replica's length. Every replica here runs replicasim's vLLM
// start-up model on the 1B profile: 2.30 GiB of weights at 0.51 GiB/s (4.5 s), 25 s of
// engine start and 17 s of CUDA-graph capture, 46.5 s from process start to serving, with
// its port bound and unanswered throughout as vLLM's is. Each test runs beside the others:
// they wait on timers, not on the CPU.

// coldStart is the replicasim flags of a 46.5 s vLLM start-up.
const coldStart = "-cold-start vllm -load-gib-s 0.51 -engine-start 25s -cuda-graph-capture 17s"

// coldStartMin is what the tests require a cold start to have taken at least.
const coldStartMin = 45 * time.Second

// coldService is a service of replicasim replicas that each take a real cold start.
func coldService(model, policy, extra string) string {
	return `service:
  readiness_probe: {path: /health, initial_delay_seconds: 120, timeout_seconds: 5}
` + policy + `
envs:
  MODEL: ` + model + `
run: exec replicasim -listen 127.0.0.1:$PORT -model $MODEL -profile h100-llama-3.2-1b -log-level info ` + coldStart + ` ` + extra + `
arbiter:
  model: ` + model + `
  scale_to_zero_after_seconds: 300
  autoscaling: {signal: concurrency, target_concurrency_per_replica: 4, stable_window_seconds: 10, panic_window_seconds: 2}
  readiness: {probe_interval_seconds: 1, failure_threshold: 2}
`
}

// A service at zero: the first requests, streamed and not, are held through the whole
// cold start (past the router's 30 s read_timeout) and answered in full; none fails.
func TestColdStartScaleFromZero(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	out := c.up("coldzero", coldService("coldzero-model", `  replica_policy: {min_replicas: 0, max_replicas: 2}`, ""))
	if !strings.Contains(out, "scaled to zero") {
		t.Fatalf("serve up output does not say the service waits at zero:\n%s", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	type answer struct {
		took time.Duration
		err  error
	}
	const n = 6
	answers := make(chan answer, n)
	start := time.Now()
	for i := range n {
		go func() {
			code, body, err := c.chat(ctx, "coldzero-model", i%2 == 0)
			if err == nil && (code != 200 || !strings.Contains(body, `"usage"`) || strings.Contains(body, `"error"`)) {
				err = fmt.Errorf("HTTP %d: %.300s", code, body)
			}
			answers <- answer{time.Since(start), err}
		}()
	}
	var waited []time.Duration
	for range n {
		a := <-answers
		if a.err != nil {
			t.Fatalf("a request sent at zero replicas failed after %v: %v\ndaemon log:\n%s", a.took.Round(time.Millisecond), a.err, c.daemonLog())
		}
		waited = append(waited, a.took)
	}
	slices.Sort(waited)
	t.Logf("%d requests held at zero: all answered, waits %v to %v", n, waited[0].Round(time.Millisecond), waited[n-1].Round(time.Millisecond))
	if waited[0] < coldStartMin {
		t.Fatalf("the first answer came after %v: the replica's cold start should have held it at least %v", waited[0], coldStartMin)
	}
}

// A preemption notice on one of two replicas: the replacement takes a full cold start
// while the other serves; a load running throughout sees no failed request.
func TestColdStartPreemptionReplacement(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.up("coldspot", coldService("coldspot-model", `  replicas: 2`, ""))
	victim := c.status("coldspot").Replicas[0].ID
	l := c.startLoad("coldspot-model", 3, 40, true)
	l2 := c.startLoad("coldspot-model", 2, 40, false)
	time.Sleep(time.Second)
	start := time.Now()
	c.serve("preempt", victim, "--notice", "30s")
	c.waitFor("the replacement ready and the victim gone", 4*time.Minute, func() bool {
		st := c.status("coldspot")
		return st.Ready == 2 && !slices.Contains(replicaIDs(st), victim)
	})
	took := time.Since(start)
	l.finish(t, "streaming load through a preemption with a 46.5 s cold start")
	l2.finish(t, "non-streaming load through a preemption with a 46.5 s cold start")
	t.Logf("replacement ready %v after the notice", took.Round(time.Millisecond))
	if took < coldStartMin {
		t.Fatalf("the replacement was ready %v after the notice; its cold start alone is %v", took, coldStartMin)
	}
}

// A rolling update whose new replica takes a full cold start: the old one serves until the
// new one is ready; a load running throughout sees no failed request.
func TestColdStartRollingUpdate(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.up("coldroll", coldService("coldroll-model", `  replicas: 1`, "-stop-after 32"))
	l := c.startLoad("coldroll-model", 3, 40, true)
	l2 := c.startLoad("coldroll-model", 2, 40, false)
	time.Sleep(time.Second)
	start := time.Now()
	path := c.writeSpec("coldroll-v2", coldService("coldroll-model", `  replicas: 1`, "-stop-after 48"))
	out := c.serve("update", "coldroll", path)
	took := time.Since(start)
	time.Sleep(time.Second)
	l.finish(t, "streaming load through a rolling update with a 46.5 s cold start")
	l2.finish(t, "non-streaming load through a rolling update with a 46.5 s cold start")
	st := c.status("coldroll")
	if st.Version != 2 || st.Ready != 1 {
		t.Fatalf("after update: %+v\n%s", st, out)
	}
	t.Logf("update done %v after it began", took.Round(time.Millisecond))
	if took < coldStartMin {
		t.Fatalf("the update finished %v after it began; the new replica's cold start alone is %v", took, coldStartMin)
	}
}

// A lone replica gets an AWS-length spot notice (2 minutes): it serves on while its
// replacement takes its full cold start, then drains; a load running throughout sees no
// failed request and the service is never without a ready replica. Before, the notice
// drained it at once and every request waited out the replacement's cold start.
func TestColdStartLoneReplicaNotice(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.up("coldlone", coldService("coldlone-model", `  replicas: 1`, ""))
	victim := c.status("coldlone").Replicas[0].ID
	l := c.startLoad("coldlone-model", 2, 40, true)
	l2 := c.startLoad("coldlone-model", 2, 40, false)
	time.Sleep(time.Second)
	start := time.Now()
	c.serve("preempt", victim, "--notice", "2m")
	var gaps int
	c.waitFor("the replacement ready and the victim gone", 4*time.Minute, func() bool {
		st := c.status("coldlone")
		if st.Ready == 0 {
			gaps++
		}
		return st.Ready >= 1 && !slices.Contains(replicaIDs(st), victim)
	})
	took := time.Since(start)
	l.finish(t, "streaming load through a lone replica's 2-minute notice")
	l2.finish(t, "non-streaming load through a lone replica's 2-minute notice")
	t.Logf("replacement ready and victim gone %v after the notice; %d status polls saw nothing ready", took.Round(time.Millisecond), gaps)
	if gaps > 0 {
		t.Errorf("%d status polls saw no replica ready during the notice", gaps)
	}
	if took < coldStartMin {
		t.Fatalf("the victim left %v after the notice; its replacement's cold start alone is %v", took, coldStartMin)
	}
}
