package control

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
)

const mergedSpec = `service:
  readiness_probe: /health
  replica_policy: {min_replicas: 1, max_replicas: 6, upscale_delay_seconds: 20, downscale_delay_seconds: 60}
run: vllm serve m --port 8000 --enable-lora --max-loras 4
arbiter:
  model: m
  autoscaling: {signal: concurrency, target_concurrency_per_replica: 8, stable_window_seconds: 30}
  adapters:
    - {name: fin, source: /srv/adapters/fin, merged: /srv/merged/fin}
    - {name: sql, source: /srv/adapters/sql}
`

// A hot adapter with a merged checkpoint gets a replica of its own once its load would
// cost more on the shared replicas (issue 51): launched from the run: command pointed at
// the merged checkpoint, published under the adapter's name, its traffic taken out of the
// shared replicas' demand, and drained when the adapter cools. A cold adapter, and one
// without a merged checkpoint however hot, gets none.
func TestHotAdapterGetsAReplicaOfItsOwn(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{t: time.UnixMilli(1_800_000_000_000)}
	p := &launchLog{coldProvider: newColdProvider(t, clock)}
	c, st := coldController(t, clock, p, nil)
	if _, _, err := c.Create(ctx, "svc", mergedSpec, nil); err != nil {
		t.Fatal(err)
	}
	ownID := func() string {
		for _, r := range c.services["svc"].replicas {
			if r.own() == "fin" && live(replicas.State(r.row.State)) {
				return r.row.ID
			}
		}
		return ""
	}
	// load reports: fin's requests in flight (onOwn of them on its own replica), sql's.
	report := func(fin, onOwn, sql int) {
		rep := fleet.LoadReport{Router: "r1", Models: []fleet.ModelLoad{
			{Model: "fin", InFlight: float64(fin), Requests: float64(fin) / 4},
			{Model: "sql", InFlight: float64(sql), Requests: float64(sql) / 4}}}
		if id := ownID(); id != "" {
			rep.Replicas = []fleet.Load{{ReplicaID: id, InFlight: onOwn}}
		}
		c.Report(rep)
	}
	step := func(fin, onOwn, sql int) {
		report(fin, onOwn, sql)
		c.tick(ctx)
		c.wg.Wait()
		clock.Add(time.Second)
	}
	// Warm: sql alone is hot (two replicas' worth), fin cold.
	for range 90 {
		step(1, 0, 16)
	}
	if id := ownID(); id != "" || p.count() == 0 {
		t.Fatalf("sql hot, fin cold: own replica %q, %d launched; want none of fin's own", id, p.count())
	}
	for _, ls := range p.launched {
		if ls.Run != "vllm serve m --port 8000 --enable-lora --max-loras 4\n" && ls.Run != "vllm serve m --port 8000 --enable-lora --max-loras 4" {
			t.Fatalf("a shared replica runs %q", ls.Run)
		}
	}
	shared := c.services["svc"].target

	// fin gets hot: 12 in flight on shared replicas is 12 ÷ 1.51 = 7.9 at the base's
	// speed, a whole replica's worth (8).
	var id string
	for i := 0; id == "" || !ownReady(c, id); i++ {
		if i > 200 {
			t.Fatalf("no replica of fin's own ready after %d s (target %d)", i, c.services["svc"].pools["fin"].target)
		}
		step(12, 0, 16)
		id = ownID()
	}
	var run string
	for _, ls := range p.launched {
		if ls.ReplicaID == id {
			run = ls.Run
		}
	}
	if !strings.Contains(run, "vllm serve /srv/merged/fin --port 8000 --served-model-name fin") || strings.Contains(run, "lora") {
		t.Errorf("fin's own replica runs %q; want vLLM on the merged checkpoint, named fin, without LoRA flags", run)
	}
	set, _ := c.ReadySet()
	found := false
	for _, r := range set.Replicas {
		if r.ID == id {
			found = r.Model == "fin" && r.Service == "svc"
		}
	}
	if !found {
		t.Errorf("ready set %+v: want %s published for model fin", set.Replicas, id)
	}
	rows, err := st.Replicas(ctx, "svc", false)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.ID == id && r.Adapter != "fin" {
			t.Errorf("the state's row of %s: adapter %q", id, r.Adapter)
		}
	}
	// Its own replica takes 8 of fin's 12: the shared replicas are sized on the rest
	// (sql's 16 and fin's 4), not on fin's whole load.
	for range 120 {
		step(12, 8, 16)
	}
	if got := c.services["svc"].target; got > shared {
		t.Errorf("shared target %d with fin's own replica serving it; %d before fin got hot", got, shared)
	}
	if ownID() != id {
		t.Errorf("fin's own replica changed from %s to %s at a steady load", id, ownID())
	}
	// fin cools: its own replica goes after the window and the downscale delay, not before.
	for i := 0; ownID() != ""; i++ {
		if i > 200 {
			t.Fatal("fin's own replica still runs 200 s after fin went cold")
		}
		step(0, 0, 16)
		if i < 60 && ownID() == "" {
			t.Fatalf("drained after %d s, within the downscale delay", i)
		}
	}
}

func ownReady(c *Controller, id string) bool {
	r := c.services["svc"].replicas[id]
	return r != nil && replicas.State(r.row.State) == replicas.Ready
}

// gatedLaunch holds the launches of adapters' own replicas until gate is closed.
type gatedLaunch struct {
	*launchLog
	gate chan struct{}
}

func (p *gatedLaunch) Launch(ctx context.Context, ls replicas.LaunchSpec) (replicas.Instance, error) {
	if !strings.Contains(ls.Run, "--served-model-name") {
		return p.launchLog.Launch(ctx, ls)
	}
	p.lmu.Lock()
	p.launched = append(p.launched, ls)
	p.lmu.Unlock()
	<-p.gate
	return p.coldProvider.Launch(ctx, ls)
}

// A replica of an adapter's own still launching counts as on its way: ticks meanwhile
// launch no more (the review found one launched a tick while the first launch ran).
func TestOwnReplicaLaunchingCounts(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{t: time.UnixMilli(1_800_000_000_000)}
	p := &gatedLaunch{launchLog: &launchLog{coldProvider: newColdProvider(t, clock)}, gate: make(chan struct{})}
	c, _ := coldController(t, clock, p, nil)
	if _, _, err := c.Create(ctx, "svc", mergedSpec, nil); err != nil {
		t.Fatal(err)
	}
	own := func() int {
		p.lmu.Lock()
		defer p.lmu.Unlock()
		n := 0
		for _, ls := range p.launched {
			if strings.Contains(ls.Run, "--served-model-name fin") {
				n++
			}
		}
		return n
	}
	defer func() { close(p.gate); c.wg.Wait() }()
	hot := fleet.LoadReport{Router: "r1", Models: []fleet.ModelLoad{{Model: "fin", InFlight: 12, Requests: 3}}}
	for i := 0; c.services["svc"].pools["fin"] == nil || c.services["svc"].pools["fin"].target == 0; i++ {
		if i > 120 {
			t.Fatal("fin hot for 120 s: no replica of its own wanted")
		}
		c.Report(hot)
		c.tick(ctx)
		clock.Add(time.Second)
	}
	deadline := time.Now().Add(10 * time.Second)
	for own() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // the launch goroutine records it, then waits at the gate
	}
	for range 10 {
		c.Report(hot)
		c.tick(ctx)
		clock.Add(time.Second)
	}
	if n := own(); n != 1 {
		t.Errorf("%d launches of fin's own replica while the first one launched; want 1", n)
	}
}
