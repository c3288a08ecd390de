package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/state"
)

// The control plane places replicas in a priced market (the sim provider: GCP's H100
// catalog prices and a real SkyPilot preemption trace, played at 120× from its hour 3):
// spot because it costs ≤ 0.6 × on-demand, spread over zones, a zone without spot capacity
// refused and avoided, its launch moved to the next zone rather than to an on-demand
// stand-in (which would start no sooner than the spot replica, and only buy a cold start);
// then the trace's capacity drop in a zone becomes a preemption notice, the replica there
// drains and is replaced in another zone, and a load loop running through it all sees no
// failed request. The target stays at 3 (min_replicas; the load asks for fewer); every
// replica alive counts against max_replicas 6.
func TestPlacementInASimulatedSpotMarket(t *testing.T) {
	c := newCluster(t)
	const name, model = "spot", "spot-model"
	c.up(name, `service:
  readiness_probe: {path: /health, initial_delay_seconds: 30, timeout_seconds: 2}
  replica_policy: {min_replicas: 3, max_replicas: 6, dynamic_ondemand_fallback: true}
resources:
  accelerators: H100:1
  use_spot: true
run: exec replicasim -listen 127.0.0.1:$PORT -model `+model+` -profile h100-llama-3.2-1b -log-level warn -ready-delay 1s
arbiter:
  model: `+model+`
  providers: [sim]
  sim: {spot_trace: skypilot-preemption-aws-04-22-2023-v100_1, speedup: 120, start_hours: 3, notice_seconds: 3}
  autoscaling: {signal: concurrency, target_concurrency_per_replica: 64}
  readiness: {probe_interval_seconds: 0.3, failure_threshold: 2}
`)
	spotReady := func() (zones []string, ok bool) {
		st := c.status(name)
		n := 0
		for _, r := range st.Replicas {
			if r.State == "ready" && r.Capacity == "spot" {
				n++
				if !slices.Contains(zones, r.Zone+r.Region) {
					zones = append(zones, r.Zone+r.Region)
				}
			}
		}
		return zones, n == 3 && len(st.Replicas) == 3
	}
	c.waitFor("3 ready spot replicas and nothing else", 60*time.Second, func() bool { _, ok := spotReady(); return ok })
	zones, _ := spotReady()
	if len(zones) < 2 {
		t.Errorf("spot replicas in %v; want them spread over zones", zones)
	}
	st := c.status(name)
	for _, r := range st.Replicas {
		// GCP a3-highgpu-1g spot in 2026-08 cost $1.13–6.33/h: a catalog price, not a default.
		if r.Provider != "sim" || r.PricePerHour < 1 || r.PricePerHour > 7 {
			t.Errorf("replica %s: provider %s, $%.2f/h; want sim at a GCP H100 spot price", r.ID, r.Provider, r.PricePerHour)
		}
	}
	t.Logf("placement: %s; replicas %v", st.Placement, describe(st.Replicas))
	logs := c.serve("logs", name)
	if !strings.Contains(logs, "no capacity") {
		t.Errorf("the event log does not mention a refusal for want of capacity:\n%s", logs)
	}
	if strings.Contains(logs, "stand-ins for") || strings.Contains(logs, "on_demand") {
		t.Errorf("an on-demand replica was launched while spot could be had in another zone:\n%s", logs)
	}
	if strings.Contains(logs, "backoff") {
		t.Errorf("a launch refused for want of capacity started a crash-loop backoff:\n%s", logs)
	}
	before := replicaIDs(st)

	// The trace's drop in us-east-1f (mapped onto a GCP US zone) comes at trace time
	// 3h58m56s: 29.5 s of wall time after the market's start (its first quote, at
	// submission) at 120×, announced 3 s ahead.
	loadStart := time.Now()
	l := c.startLoad(model, 4, 60, false)
	streams := c.startLoad(model, 2, 60, true)
	c.waitFor("a preemption from the trace", 60*time.Second, func() bool {
		return strings.Contains(c.serve("logs", name), "preemption")
	})
	var replaced []state.Replica
	c.waitFor("the preempted replica replaced by a ready spot replica", 60*time.Second, func() bool {
		zs, ok := spotReady()
		replaced = c.status(name).Replicas
		return ok && len(zs) >= 2
	})
	l.finish(t, "non-streaming load through a trace preemption")
	streams.finish(t, "streaming load through a trace preemption")
	t.Logf("after the preemption: %v", describe(replaced))
	rows, events := c.stateRows(name)
	var victim string
	for _, e := range events {
		if e.Kind == "preemption" {
			victim = e.Replica
			if e.At.Before(loadStart.Truncate(time.Millisecond)) {
				t.Errorf("the preemption came at %v, before the load started at %v: the load did not run through it", e.At, loadStart)
			}
		}
	}
	i := slices.IndexFunc(rows, func(r state.Replica) bool { return r.ID == victim })
	if i < 0 {
		t.Fatalf("no preemption event names a replica: %v", describe(rows))
	}
	if rows[i].Capacity != "spot" || rows[i].EndedAt.IsZero() {
		t.Errorf("preempted replica %v: want a spot replica, ended", describe(rows[i:i+1]))
	}
	for _, r := range replaced {
		if slices.Contains(before, r.ID) {
			continue // a survivor, not a replacement
		}
		if r.Zone == rows[i].Zone && r.Region == rows[i].Region {
			t.Errorf("replacement %s went back to %s/%s, the zone that just preempted", r.ID, r.Region, r.Zone)
		}
	}
}

func describe(rs []state.Replica) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ID+" "+r.State+" "+r.Capacity+" "+r.Region+"/"+r.Zone)
	}
	return out
}

// stateRows reads a service's replica rows, ended ones too, and its event log.
func (c *cluster) stateRows(service string) ([]state.Replica, []state.Event) {
	c.t.Helper()
	st, err := state.Open(control.StatePath(c.home))
	if err != nil {
		c.t.Fatal(err)
	}
	defer st.Close()
	rows, err := st.Replicas(context.Background(), service, true)
	if err != nil {
		c.t.Fatal(err)
	}
	events, err := st.Events(context.Background(), service, "", 0, 100000)
	if err != nil {
		c.t.Fatal(err)
	}
	return rows, events
}
