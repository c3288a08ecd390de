package replicas

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/market"
	"github.com/arbiter-serve/arbiter/spec"
)

const simSpec = `service:
  readiness_probe: /health
  replicas: 2
resources:
  accelerators: H100:1
  use_spot: true
run: exec sleep 60
arbiter:
  providers: [sim]
  sim: {spot_trace: skypilot-preemption-aws-04-22-2023-v100_1, speedup: 60, start_hours: 3, notice_seconds: 1}
`

// fakeClock is a settable wall clock for the provider's market time.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

func newTestSim(t *testing.T, clock *fakeClock) *Sim {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := NewSim(ctx, SimConfig{Local: LocalConfig{Owner: "sim-test-" + filepath.Base(dir), LogDir: dir, Grace: time.Second},
		ClockPath: filepath.Join(dir, "clocks.json"), Now: clock.Now, Tick: time.Hour /* the test calls announce */})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		insts, _ := s.List(context.Background())
		for _, in := range insts {
			_ = s.Terminate(context.Background(), in.Handle)
		}
	})
	return s
}

func parseSimSpec(t *testing.T, text string) *spec.Service {
	t.Helper()
	sp, err := spec.Parse("sim.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

// The sim provider quotes the catalog's prices for the service's resources in one cloud,
// refuses spot where the trace has no capacity, and turns the trace's capacity drops into
// preemption notices followed by the reclaim, for the replicas in the zones that dropped.
func TestSimMarketQuotesRefusesAndPreempts(t *testing.T) {
	epoch := time.UnixMilli(1_800_000_000_000)
	clock := &fakeClock{t: epoch}
	s := newTestSim(t, clock)
	sp := parseSimSpec(t, simSpec)
	ctx := context.Background()

	quotes, err := s.Quote(ctx, "svc", sp)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[fleet.Capacity]int{}
	for _, q := range quotes {
		kinds[q.Capacity]++
		if q.Provider != "sim" || q.Region == "" || q.PricePerHour <= 0 {
			t.Fatalf("quote %+v: want provider sim, a region and a price", q)
		}
	}
	if kinds[fleet.Spot] == 0 || kinds[fleet.OnDemand] == 0 {
		t.Fatalf("quotes by kind %v; want spot and on-demand (GCP's H100 catalog has both)", kinds)
	}
	// The service's market started when it was first quoted: wall time w is market time
	// (w − epoch) × 60, which is trace time start_hours (3 h) + that.
	s.mu.Lock()
	sm := s.markets["svc"]
	s.mu.Unlock()
	at := func(marketTime time.Duration) time.Time { return epoch.Add(marketTime / 60) }
	spotQuote := func(ok func(place string) bool) Quote {
		for _, q := range quotes {
			if q.Capacity == fleet.Spot && ok(market.Place(sm.cloud, q.Region, q.Zone)) {
				return q
			}
		}
		t.Fatal("no spot quote fits")
		return Quote{}
	}
	launch := func(id string, q Quote) (Instance, error) {
		price := q.PricePerHour
		return s.Launch(ctx, LaunchSpec{ReplicaID: id, Service: "svc", Run: "exec sleep 60", Capacity: q.Capacity, Region: q.Region, Zone: q.Zone, PricePerHour: &price})
	}

	// A zone the trace has emptied refuses spot.
	empty := spotQuote(func(p string) bool { return !sm.m.SpotCapacity(p, sm.marketTime(clock.Now())) })
	if _, err := launch("svc-1", empty); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("spot launch in %s/%s with no capacity in the trace: %v; want ErrNoCapacity", empty.Region, empty.Zone, err)
	}

	// The first drop after the start in a zone where spot can be had until then.
	var drop market.Drop
	for _, d := range sm.m.Drops(sm.marketTime(clock.Now()), 24*time.Hour) {
		p := d.Places[0]
		if sm.m.SpotCapacity(p, d.At-10*time.Minute) && sm.m.SpotCapacity(p, d.At-time.Minute) {
			drop = d
			break
		}
	}
	if drop.Places == nil {
		t.Fatal("the trace has no usable drop")
	}
	clock.Set(at(drop.At - 10*time.Minute)) // ten trace minutes (ten wall seconds) before it
	victim := spotQuote(func(p string) bool { return p == drop.Places[0] })
	inst, err := launch("svc-2", victim)
	if err != nil {
		t.Fatalf("spot launch in %s before its drop: %v", drop.Places[0], err)
	}
	if inst.Capacity != fleet.Spot || inst.Zone != victim.Zone || inst.PricePerHour != victim.PricePerHour {
		t.Fatalf("instance %+v; want the quote's labels %+v", inst, victim)
	}
	var bystander Instance
	if other := spotQuote(func(p string) bool {
		return p != drop.Places[0] && sm.m.SpotCapacity(p, drop.At-10*time.Minute) && sm.m.SpotCapacity(p, drop.At-9*time.Minute)
	}); true {
		if bystander, err = launch("svc-3", other); err != nil {
			t.Fatal(err)
		}
	}
	od := quotes[slices.IndexFunc(quotes, func(q Quote) bool { return q.Capacity == fleet.OnDemand })]
	if _, err := launch("svc-4", od); err != nil {
		t.Fatalf("on-demand launch: %v", err)
	}

	// A spot launch there within the drop's notice is refused: it would not outlive it.
	clock.Set(at(drop.At - 30*time.Second))
	if _, err := launch("svc-9", victim); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("spot launch into %s half a notice before its drop: %v; want ErrNoCapacity", drop.Places[0], err)
	}
	// Outside the notice (1 s = a trace minute): nothing yet.
	clock.Set(at(drop.At - 2*time.Minute))
	s.announce(ctx)
	select {
	case n := <-s.Notices():
		t.Fatalf("notice %+v a whole notice period early", n)
	case <-time.After(100 * time.Millisecond):
	}
	clock.Set(at(drop.At - 30*time.Second)) // half a notice before the drop
	s.announce(ctx)
	var n Notice
	select {
	case n = <-s.Notices():
	case <-time.After(5 * time.Second):
		t.Fatal("no notice within the drop's notice period")
	}
	if n.ReplicaID != "svc-2" {
		t.Fatalf("notice for %s; want svc-2, the spot replica in %s", n.ReplicaID, drop.Places[0])
	}
	// Reclaimed at the drop (half a second of real time later), the others untouched.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if st, _, _ := s.Status(ctx, inst.Handle); st == StatusGone {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st, _, _ := s.Status(ctx, inst.Handle); st != StatusGone {
		t.Fatal("the preempted replica is still running after its deadline")
	}
	insts, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, in := range insts {
		left = append(left, in.ReplicaID)
	}
	slices.Sort(left)
	if !slices.Equal(left, []string{"svc-3", "svc-4"}) {
		t.Fatalf("running after the drop: %v; want the bystanders svc-3 (spot %s) and svc-4 (on-demand)", left, bystander.Zone)
	}
	s.announce(ctx)
	select {
	case n := <-s.Notices():
		t.Fatalf("a drop announced twice: %+v", n)
	case <-time.After(100 * time.Millisecond):
	}
}

// A service's market clock survives a restart (the clocks file) while its spec's market
// is the same, restarts with a new one, and replays the trace once it has run out.
func TestSimClockSurvivesRestarts(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "clocks.json")
	start := time.UnixMilli(1_800_000_000_000)
	clock := &fakeClock{t: start}
	open := func() *Sim {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		s, err := NewSim(ctx, SimConfig{Local: LocalConfig{Owner: "clock-" + filepath.Base(dir), LogDir: dir}, ClockPath: path, Now: clock.Now, Tick: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	sp := parseSimSpec(t, simSpec)
	startOf := func(s *Sim, sp *spec.Service) time.Time {
		if _, err := s.Quote(context.Background(), "svc", sp); err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.markets["svc"].start
	}
	if got := startOf(open(), sp); !got.Equal(start) {
		t.Fatalf("first market starts at %v; want its first quote, %v", got, start)
	}
	clock.Set(start.Add(time.Minute))
	if got := startOf(open(), sp); !got.Equal(start) {
		t.Fatalf("after a restart the market starts at %v; want the same %v", got, start)
	}
	other := parseSimSpec(t, strings.Replace(simSpec, "speedup: 60", "speedup: 30", 1))
	if got := startOf(open(), other); !got.Equal(clock.Now()) {
		t.Fatalf("a changed market starts at %v; want now, %v", got, clock.Now())
	}
	// Past the trace's end the market replays it rather than going dark.
	s := open()
	startOf(s, sp)
	s.mu.Lock()
	length := s.markets["svc"].m.Length()
	s.mu.Unlock()
	clock.Set(clock.Now().Add(length/60 + time.Second))
	if got := startOf(s, sp); !got.Equal(clock.Now()) {
		t.Fatalf("after the trace ran out the market starts at %v; want now, %v", got, clock.Now())
	}
	if err := os.WriteFile(path, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewSim(context.Background(), SimConfig{Local: LocalConfig{Owner: "x", LogDir: dir}, ClockPath: path}); err == nil {
		t.Fatal("a damaged clocks file was accepted")
	}
}

// The local provider does not list the sim provider's processes, nor the other way round;
// a spec the market cannot serve is refused.
func TestSimProviderTags(t *testing.T) {
	dir := t.TempDir()
	clock := &fakeClock{t: time.Now()}
	s := newTestSim(t, clock)
	local, err := NewLocal(LocalConfig{Owner: s.cfg.Local.Owner, LogDir: dir, Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	price := 1.0
	in, err := local.Launch(context.Background(), LaunchSpec{ReplicaID: "l-1", Run: "exec sleep 60", PricePerHour: &price})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Terminate(context.Background(), in.Handle)
	sp := parseSimSpec(t, simSpec)
	if _, err := s.Quote(context.Background(), "svc", sp); err != nil {
		t.Fatal(err)
	}
	od, _ := s.Quote(context.Background(), "svc", sp)
	q := od[slices.IndexFunc(od, func(q Quote) bool { return q.Capacity == fleet.OnDemand })]
	p := q.PricePerHour
	if _, err := s.Launch(context.Background(), LaunchSpec{ReplicaID: "svc-" + strconv.Itoa(1), Service: "svc", Run: "exec sleep 60",
		Capacity: q.Capacity, Region: q.Region, Zone: q.Zone, PricePerHour: &p}); err != nil {
		t.Fatal(err)
	}
	ids := func(p Provider) []string {
		insts, err := p.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, in := range insts {
			out = append(out, in.ReplicaID)
		}
		return out
	}
	if got := ids(local); !slices.Equal(got, []string{"l-1"}) {
		t.Errorf("local lists %v; want only its own l-1", got)
	}
	if got := ids(s); !slices.Equal(got, []string{"svc-1"}) {
		t.Errorf("sim lists %v; want only its own svc-1", got)
	}
	// A spec the market cannot serve is refused before it is accepted.
	bad := parseSimSpec(t, strings.Replace(simSpec, "skypilot-preemption-aws-04-22-2023-v100_1", "no-such-trace", 1))
	if err := s.CheckSpec(bad); err == nil || !strings.Contains(err.Error(), "known:") {
		t.Errorf("CheckSpec with an unknown trace: %v; want an error listing the known traces", err)
	}
}

// A market left unquoted for marketIdle (its service was deleted) is dropped from memory,
// so a daemon that creates and deletes services does not keep every market; one still
// quoted stays. The clock stays on disk, so a stalled control loop's market resumes where
// it was.
func TestSimForgetsMarketsOfDeletedServices(t *testing.T) {
	start := time.UnixMilli(1_800_000_000_000)
	clock := &fakeClock{t: start}
	s := newTestSim(t, clock)
	sp := parseSimSpec(t, simSpec)
	quote := func(service string) {
		if _, err := s.Quote(context.Background(), service, sp); err != nil {
			t.Fatal(err)
		}
	}
	quote("gone")
	quote("live")
	inMemory := func(service string) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.markets[service] != nil
	}
	clock.Set(start.Add(marketIdle - time.Minute))
	quote("live")
	s.announce(context.Background())
	if !inMemory("gone") {
		t.Fatalf("a market unquoted for less than %v was dropped", marketIdle)
	}
	clock.Set(start.Add(marketIdle))
	s.announce(context.Background())
	if inMemory("gone") || !inMemory("live") {
		t.Fatalf("after %v: gone kept %v, live kept %v; want only live", marketIdle, inMemory("gone"), inMemory("live"))
	}
	quote("gone") // back after a stall: the same market clock
	s.mu.Lock()
	resumed := s.markets["gone"].start
	s.mu.Unlock()
	if !resumed.Equal(start) {
		t.Fatalf("a dropped market came back starting at %v; want its clock, %v", resumed, start)
	}
}
