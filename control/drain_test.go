package control

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
)

// A rolling update drains the old replica while a 20-minute answer still streams from it.
// The drain timeout (2 minutes) counts from the last time a router saw its requests make
// progress, not from the drain's start: the answer runs to its end, and only once its
// requests stall does the timeout end the replica. Before, the drain cut it at 2 minutes.
func TestDrainWaitsForARequestThatProgresses(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{t: time.UnixMilli(1_800_000_000_000)}
	p := newColdProvider(t, clock)
	c, st := coldController(t, clock, p, func(cfg *Config) { cfg.DrainTimeout = 2 * time.Minute })
	if _, _, err := c.Create(ctx, "svc", loneSpec, nil); err != nil {
		t.Fatal(err)
	}
	// report is one router's report: a request in flight on the old replica, its engine
	// progressing or not.
	var old string
	progressing := false
	report := func(progressing bool) {
		c.Report(fleet.LoadReport{Router: "r1", Replicas: []fleet.Load{{ReplicaID: old, InFlight: 1, Progressing: progressing}}})
	}
	state := func(id string) string {
		for _, r := range c.services["svc"].replicas {
			if r.row.ID == id {
				return r.row.State
			}
		}
		return "gone"
	}
	step := func() {
		if old != "" {
			report(progressing)
		}
		c.tick(ctx)
		c.wg.Wait()
		clock.Add(time.Second)
	}
	for i := 0; ; i++ {
		set, _ := c.ReadySet()
		if len(set.Replicas) == 1 {
			old = set.Replicas[0].ID
			break
		}
		if i > 120 {
			t.Fatal("the first replica is not ready after 120 s")
		}
		step()
	}
	progressing = true
	if _, _, err := c.Update(ctx, "svc", strings.Replace(loneSpec, "run: x", "run: y", 1), nil); err != nil {
		t.Fatal(err)
	}
	drainAt := time.Time{}
	for i := 0; i < 25*60; i++ { // 20 minutes of an answer streaming from the draining replica
		step()
		if drainAt.IsZero() && state(old) == string(replicas.Draining) {
			drainAt = clock.Now()
		}
		if !drainAt.IsZero() && clock.Now().Sub(drainAt) >= 20*time.Minute {
			break
		}
		if s := state(old); !drainAt.IsZero() && s != string(replicas.Draining) {
			t.Fatalf("the old replica went %s %s into its drain while its request progressed", s, clock.Now().Sub(drainAt))
		}
	}
	if drainAt.IsZero() {
		t.Fatal("the old replica never drained")
	}
	// The request stalls: the drain timeout runs from now.
	progressing = false
	stalled := clock.Now()
	for state(old) == string(replicas.Draining) {
		if clock.Now().Sub(stalled) > 3*time.Minute {
			t.Fatalf("the old replica still drains 3 minutes after its request stalled")
		}
		step()
	}
	if took := clock.Now().Sub(stalled); took < 2*time.Minute-2*time.Second {
		t.Fatalf("ended %s after its request stalled; want the 2-minute drain timeout", took)
	}
	evs, _ := st.Events(ctx, "svc", old, 0, 1000)
	var text []string
	for _, e := range evs {
		text = append(text, e.Message)
	}
	if !strings.Contains(strings.Join(text, "\n"), "no progress on them for 2m0s") {
		t.Errorf("events do not say the drain timed out for want of progress:\n%s", strings.Join(text, "\n"))
	}
}
