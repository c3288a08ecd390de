package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/state"
)

// The control plane is kill -9'd at a random moment of each of 12 scale-up/scale-down
// cycles (while replicas launch, get ready, drain or terminate) and restarted, as a
// supervisor would. After every kill each replica process has a live row; after every
// cycle the service converges and the process table equals the state; at the end the
// state file passes SQLite's integrity check and nothing is left running.
// ARBITER_KILL_SEED replays a run; ARBITER_KILL_CYCLES changes the count. Each run draws
// new kill points (the seed is logged), so CI's runs add up to many more than 12; a cycle
// takes about 13 s, and CI's whole run must stay within 30 minutes on 2 cores.
func TestKill9AtRandomPointsOfScaleCycles(t *testing.T) {
	// Mostly waiting on the control plane, with its own home, ports and processes: it runs
	// beside the kubernetes tests, which mostly wait too.
	t.Parallel()
	cycles := 12
	if v, err := strconv.Atoi(os.Getenv("ARBITER_KILL_CYCLES")); err == nil && v > 0 {
		cycles = v
	}
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("ARBITER_KILL_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (ARBITER_KILL_SEED=%d replays the kill points)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 1))

	c := newCluster(t)
	const name, model = "cycle", "cycle-model"
	c.up(name, `service:
  readiness_probe: {path: /health, initial_delay_seconds: 30, timeout_seconds: 2}
  replica_policy: {min_replicas: 1, max_replicas: 3, upscale_delay_seconds: 0, downscale_delay_seconds: 0.5}
run: exec replicasim -listen 127.0.0.1:$PORT -model `+model+` -profile h100-llama-3.1-8b -log-level warn -listen-delay 200ms -ready-delay 300ms
arbiter:
  model: `+model+`
  autoscaling: {signal: concurrency, target_concurrency_per_replica: 1, stable_window_seconds: 1, panic_window_seconds: 0.5}
  readiness: {probe_interval_seconds: 0.3, failure_threshold: 2}
`)
	sizeIs := func(n int) func() bool {
		return func() bool {
			st := c.status(name)
			return st.Target == n && st.Ready == n && len(st.Replicas) == n && slices.Equal(keys(c.owned()), replicaIDs(st))
		}
	}
	crash := func(when string) {
		c.kill9()
		c.checkAccounted(when)
		c.startDaemon()
	}
	// Each cycle kills once: just after a replica is seen launching (under load) or
	// draining (after it), plus a random delay of up to 600 ms, so kills land at every step
	// of a launch (row written, process started, probe, ready) or of a drain (draining,
	// terminating, terminated).
	kills := map[string]int{}
	for i := 1; i <= cycles; i++ {
		during := []string{"launching", "draining"}[rng.IntN(2)]
		delay := time.Duration(rng.Int64N(int64(600 * time.Millisecond)))
		killAt := func() {
			// A phase can be shorter than one poll on a loaded machine: if it is not seen
			// within 30 s, kill anyway, wherever the service is.
			seen := during
			for deadline := time.Now().Add(30 * time.Second); c.phase(name) != during; {
				if time.Now().After(deadline) {
					seen = "missed " + during
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(delay)
			kills[seen]++
			crash(fmt.Sprintf("cycle %d: kill -9 %v after a replica was seen %s", i, delay.Round(time.Millisecond), seen))
		}
		l := c.startLoad(model, 4, 200, true)
		if during == "launching" {
			killAt()
		}
		c.waitFor("3 ready replicas under load", 90*time.Second, sizeIs(3))
		close(l.stop)
		l.wg.Wait()
		if during == "draining" {
			killAt()
		}
		c.waitFor("back to 1 replica", 90*time.Second, sizeIs(1))
	}
	t.Logf("%d kills: %v", cycles, kills)

	st, err := state.Open(control.StatePath(c.home))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Check(context.Background()); err != nil {
		t.Fatalf("state file after %d kills: %v", cycles, err)
	}
}

// phase names what a service is doing, for the log of where kills landed.
func (c *cluster) phase(name string) string {
	st, ok := c.apiStatus(name) // a drain can be shorter than one `serve status`
	if !ok {
		return "unknown"
	}
	states := map[string]bool{}
	for _, r := range st.Replicas {
		states[r.State] = true
	}
	switch {
	case states["pending"] || states["provisioning"] || states["starting"]:
		return "launching"
	case states["draining"]:
		return "draining"
	case st.Target != st.Ready:
		return "deciding"
	}
	return "steady"
}
