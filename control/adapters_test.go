package control

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
)

const loraSpec = `service:
  readiness_probe: /health
  replicas: 1
run: vllm serve m --enable-lora --max-loras 4
arbiter:
  model: m
  adapters:
    - {name: fin, source: /srv/adapters/fin}
`

// An update that adds or removes an adapter rolls no replica: the replica that runs takes
// the new version, in memory and in the state, and routers get the adapters with the set.
// Any other change still rolls.
func TestAdapterUpdateRollsNoReplica(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{t: time.UnixMilli(1_800_000_000_000)}
	p := &launchLog{coldProvider: newColdProvider(t, clock)}
	c, st := coldController(t, clock, p, nil)
	if _, _, err := c.Create(ctx, "svc", loraSpec, nil); err != nil {
		t.Fatal(err)
	}
	step := func() {
		c.tick(ctx)
		c.wg.Wait()
		clock.Add(time.Second)
	}
	var first string
	for i := 0; first == ""; i++ {
		if set, _ := c.ReadySet(); len(set.Replicas) == 1 {
			first = set.Replicas[0].ID
		}
		if i > 120 {
			t.Fatal("the first replica is not ready after 120 s")
		}
		step()
	}
	if envs := p.first().Envs; envs["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] != "true" {
		t.Errorf("replica envs %v: arbiter.adapters need VLLM_ALLOW_RUNTIME_LORA_UPDATING=true", envs)
	}

	added := strings.Replace(loraSpec, "    - {name: fin", "    - {name: sql, source: /srv/adapters/sql}\n    - {name: fin", 1)
	v, changed, err := c.Update(ctx, "svc", added, nil)
	if err != nil || !changed || v != 2 {
		t.Fatalf("update: v%d changed %v err %v", v, changed, err)
	}
	for range 120 {
		step()
	}
	set, _ := c.ReadySet()
	if len(set.Replicas) != 1 || set.Replicas[0].ID != first || set.Replicas[0].Version != 2 || p.count() != 1 {
		t.Fatalf("after an adapters-only update: replicas %+v, %d launched; want %s alone, at version 2, no launch", set.Replicas, p.count(), first)
	}
	if ads := set.Services[0].Adapters; len(ads) != 2 || ads[0].Name != "sql" || ads[0].Base != "m" || ads[0].Path != "/srv/adapters/sql" || set.Services[0].MaxLoRAs != 4 {
		t.Errorf("ready set adapters %+v max_loras %d", ads, set.Services[0].MaxLoRAs)
	}
	rows, err := st.Replicas(ctx, "svc", false)
	if err != nil || len(rows) != 1 || rows[0].Version != 2 {
		t.Errorf("state rows %+v (%v): want the replica at version 2, so a restart does not roll it", rows, err)
	}

	// A retrained fin at a new path rolls: the running replica keeps the old files under
	// that name.
	moved := strings.Replace(added, "/srv/adapters/fin", "/srv/adapters/fin-v2", 1)
	if _, _, err := c.Update(ctx, "svc", moved, nil); err != nil {
		t.Fatal(err)
	}
	for i := 0; p.count() < 2; i++ {
		if i > 120 {
			t.Fatal("a new path for fin launched no replica of the new version")
		}
		step()
	}
	// Mid-roll, an update adding an adapter adopts the new version's replica only: the one
	// of version 2 still reads fin's old path, and goes as the roll goes on.
	v, _, err = c.Update(ctx, "svc", strings.Replace(moved, "    - {name: sql", "    - {name: chat, source: /srv/adapters/chat}\n    - {name: sql", 1), nil)
	if err != nil || v != 4 {
		t.Fatalf("update mid-roll: v%d %v", v, err)
	}
	versions := map[string]int{}
	for _, r := range c.services["svc"].replicas {
		if live(replicas.State(r.row.State)) {
			versions[r.row.ID] = r.row.Version
		}
	}
	if versions[first] != 2 || len(versions) != 2 {
		t.Errorf("replica versions after the mid-roll update %v: want %s at 2, the new one at 4", versions, first)
	}
	for id, ver := range versions {
		if id != first && ver != 4 {
			t.Errorf("the new replica %s is at version %d, want 4", id, ver)
		}
	}

	// A change beyond adapters rolls.
	if _, _, err := c.Update(ctx, "svc", strings.Replace(moved, "--max-loras 4", "--max-loras 8", 1), nil); err != nil {
		t.Fatal(err)
	}
	for i := 0; p.count() < 3; i++ {
		if i > 240 {
			t.Fatal("a change of --max-loras launched no replica of the new version")
		}
		step()
	}
}

// launchLog records what a coldProvider was asked to launch.
type launchLog struct {
	*coldProvider
	lmu      sync.Mutex
	launched []replicas.LaunchSpec
}

func (p *launchLog) Launch(ctx context.Context, ls replicas.LaunchSpec) (replicas.Instance, error) {
	p.lmu.Lock()
	p.launched = append(p.launched, ls)
	p.lmu.Unlock()
	return p.coldProvider.Launch(ctx, ls)
}

func (p *launchLog) count() int {
	p.lmu.Lock()
	defer p.lmu.Unlock()
	return len(p.launched)
}

func (p *launchLog) first() replicas.LaunchSpec {
	p.lmu.Lock()
	defer p.lmu.Unlock()
	return p.launched[0]
}

// Routers' reports of adapters' requests and tokens make each declared adapter's use and
// cost in the service's status; a name the spec does not declare makes no entry.
func TestAdapterUseInStatus(t *testing.T) {
	c := newTestController(t)
	ctx := context.Background()
	spec := strings.Replace(zeroSpec, "run: exec replicasim -listen 127.0.0.1:$PORT", "run: exec replicasim -listen 127.0.0.1:$PORT -enable-lora", 1) +
		"  adapters: [{name: fin, source: /srv/fin}, {name: sql, source: /srv/sql}]\n"
	if _, _, err := c.Create(ctx, "svc", spec, nil); err != nil {
		t.Fatal(err)
	}
	c.Report(fleet.LoadReport{Router: "r1", Models: []fleet.ModelLoad{
		{Model: "fin", Requests: 3, Tokens: 3000}, {Model: "m1", Requests: 1, Tokens: 1000}, {Model: "nope", Requests: 5, Tokens: 5},
	}})
	st, err := c.Status(ctx, "svc")
	if err != nil {
		t.Fatal(err)
	}
	ads := st[0].Adapters
	if len(ads) != 2 || ads[0].Name != "fin" || ads[0].Requests != 3 || ads[0].Tokens != 3000 || ads[1].Name != "sql" || ads[1].Tokens != 0 {
		t.Fatalf("adapters %+v; want fin with 3 requests and 3,000 tokens, sql with none", ads)
	}
	if want := 3000 * st[0].DollarsPerMillionTokens / 1e6; ads[0].Dollars != want {
		t.Errorf("fin's $ %v, want its tokens at the service's $ per token (%v)", ads[0].Dollars, want)
	}
	if st[0].Tokens != 4000 {
		t.Errorf("service tokens %v: the adapter's count toward its service's", st[0].Tokens)
	}

	// A tick writes the counts to the state, where a restarted control plane finds them;
	// what comes after adds to them.
	c.tick(ctx)
	c.wg.Wait()
	stored, err := c.store.AdapterUses(ctx)
	if err != nil || stored["svc"]["fin"].Requests != 3 || stored["svc"]["fin"].Tokens != 3000 || len(stored["svc"]) != 1 {
		t.Fatalf("stored adapter use %+v (%v): want fin's 3 requests and 3,000 tokens", stored, err)
	}
	c.Report(fleet.LoadReport{Router: "r1", Models: []fleet.ModelLoad{{Model: "fin", Requests: 1, Tokens: 500}}})
	if st, _ := c.Status(ctx, "svc"); st[0].Adapters[0].Tokens != 3500 || st[0].Adapters[0].Since.IsZero() {
		t.Errorf("after the write and one more report: %+v; want 3,500 tokens since the first write", st[0].Adapters[0])
	}
	c.tick(ctx)
	c.wg.Wait()
	if stored, _ := c.store.AdapterUses(ctx); stored["svc"]["fin"].Tokens != 3500 {
		t.Errorf("stored after the second tick: %+v", stored["svc"]["fin"])
	}
	if err := c.store.AddAdapterUse(ctx, "svc", []state.AdapterUse{{Adapter: "fin", Tokens: -1}}, time.Now()); err == nil {
		t.Error("a negative count was stored")
	}
}

// newColdProvider is a coldProvider whose replicas are ready 45 s after their launch.
func newColdProvider(t *testing.T, clock *testClock) *coldProvider {
	t.Helper()
	p := &coldProvider{memProvider: memProvider{running: map[string]replicas.Instance{}}, clock: clock, coldStart: 45 * time.Second, reclaim: map[string]time.Time{}}
	t.Cleanup(func() {
		for _, s := range p.servers {
			s.Close()
		}
	})
	return p
}

// coldController is a controller on a state file of its own, its provider p as "local", on
// clock; mod adjusts its config.
func coldController(t *testing.T, clock *testClock, p replicas.Provider, mod func(*Config)) (*Controller, *state.Store) {
	t.Helper()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cfg := Config{Store: st, Providers: map[string]replicas.Provider{"local": p}, Now: clock.Now, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if mod != nil {
		mod(&cfg)
	}
	c, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, st
}

// An adapter's name is a model name: a second service may not take one another's adapter
// has, as it may not take its model.
func TestAdapterNameTakenAcrossServices(t *testing.T) {
	c := newTestController(t)
	ctx := context.Background()
	withAdapter := func(model string) string {
		return strings.Replace(strings.Replace(zeroSpec, "run: exec replicasim -listen 127.0.0.1:$PORT", "run: exec replicasim -listen 127.0.0.1:$PORT -enable-lora", 1), "model: m1", "model: "+model, 1) +
			"  adapters: [{name: fin, source: /srv/fin}]\n"
	}
	if _, _, err := c.Create(ctx, "a", withAdapter("m1"), nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Create(ctx, "b", withAdapter("m2"), nil); err == nil || !strings.Contains(err.Error(), `model "fin" is served by service "a"`) {
		t.Errorf("a second service declaring adapter fin: %v", err)
	}
}

// A service's arbiter.queue goes to the routers with the ready set; one without it leaves
// them their own settings.
func TestQueuePublishedWithTheSet(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{t: time.UnixMilli(1_800_000_000_000)}
	c, _ := coldController(t, clock, &launchLog{coldProvider: newColdProvider(t, clock)}, nil)
	queued := "service:\n  readiness_probe: /health\n  replicas: 1\nrun: vllm serve q\narbiter:\n  model: q\n  queue: {enabled: true, sheddable_fill: 0.8}\n"
	plain := "service:\n  readiness_probe: /health\n  replicas: 1\nrun: vllm serve p\narbiter:\n  model: p\n"
	prio := "service:\n  readiness_probe: /health\n  replicas: 1\nrun: vllm serve r --scheduling-policy priority\narbiter:\n  model: r\n  queue: {engine_priority: true}\n"
	for name, src := range map[string]string{"queued": queued, "plain": plain, "prio": prio} {
		if _, _, err := c.Create(ctx, name, src, nil); err != nil {
			t.Fatal(err)
		}
	}
	set, _ := c.ReadySet()
	got := map[string]*fleet.Queue{}
	for _, s := range set.Services {
		got[s.Name] = s.Queue
	}
	if q := got["queued"]; q == nil || !q.Enabled || q.SheddableFill != 0.8 || q.MaxWaitSeconds != 30 {
		t.Errorf("queued service's queue %+v; want enabled, fill 0.8, the default 30 s wait", q)
	}
	if q, ok := got["plain"]; !ok || q != nil {
		t.Errorf("plain service's queue %+v (listed %v); want none", q, ok)
	}
	// The engine's priority alone, with the routers' queue off.
	if q := got["prio"]; q == nil || q.Enabled || !q.EnginePriority {
		t.Errorf("engine-priority service's queue %+v; want engine_priority without the queue", q)
	}
}

// The requests the routers' queues refused for want of room add up per service over the
// routers' reports, and each tick hands them to the decider and starts again.
func TestShedDemandSummedPerTick(t *testing.T) {
	c := newTestController(t)
	ctx := context.Background()
	if _, _, err := c.Create(ctx, "svc", zeroSpec, nil); err != nil {
		t.Fatal(err)
	}
	c.Report(fleet.LoadReport{Router: "r1", Models: []fleet.ModelLoad{{Model: "m1", Requests: 9, Shed: 4, ShedTokens: 4000}}})
	c.Report(fleet.LoadReport{Router: "r2", Models: []fleet.ModelLoad{{Model: "m1", Requests: 3, Shed: 1, ShedTokens: 700}}})
	shed := func() (float64, float64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		s := c.services["svc"]
		return s.shed, s.shedTokens
	}
	if n, tok := shed(); n != 5 || tok != 4700 {
		t.Fatalf("shed %v requests, %v tokens; want 5 and 4,700 from the two routers", n, tok)
	}
	c.tick(ctx)
	c.wg.Wait()
	if n, tok := shed(); n != 0 || tok != 0 {
		t.Fatalf("after a tick: shed %v, %v; want the counts handed on and restarted", n, tok)
	}
}
