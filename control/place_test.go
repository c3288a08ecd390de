package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/spec"
	"github.com/arbiter-serve/arbiter/state"
)

// marketMem is an in-memory market provider: fixed offers, and zones whose spot pool is
// empty (launches there are refused with ErrNoCapacity).
type marketMem struct {
	memProvider
	offers []replicas.Quote
	empty  map[string]bool // zone → no spot capacity

	mu       sync.Mutex
	launched []string // zones asked for, in order
	envs     []map[string]string
	quoteErr error // what Quote fails with, when set
}

func (m *marketMem) Name() string { return "sim" }
func (m *marketMem) Quote(context.Context, string, *spec.Service) ([]replicas.Quote, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.quoteErr != nil {
		return nil, m.quoteErr
	}
	return m.offers, nil
}
func (m *marketMem) CheckSpec(*spec.Service) error { return nil }
func (m *marketMem) Launch(ctx context.Context, ls replicas.LaunchSpec) (replicas.Instance, error) {
	m.mu.Lock()
	m.launched = append(m.launched, ls.Zone)
	m.envs = append(m.envs, ls.Envs)
	m.mu.Unlock()
	if ls.Capacity == fleet.Spot && m.empty[ls.Zone] {
		return replicas.Instance{}, fmt.Errorf("launch %s in %s: %w", ls.ReplicaID, ls.Zone, replicas.ErrNoCapacity)
	}
	in, err := m.memProvider.Launch(ctx, ls)
	in.Capacity, in.Region, in.Zone, in.PricePerHour = ls.Capacity, ls.Region, ls.Zone, *ls.PricePerHour
	return in, err
}

// newMarketController is a controller over a real state file whose only provider is the
// market; *now is its clock.
func newMarketController(t *testing.T, mkt *marketMem, now *time.Time) (*Controller, *state.Store) {
	t.Helper()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c, err := New(context.Background(), Config{Store: st, Providers: map[string]replicas.Provider{"sim": mkt}, Now: func() time.Time { return *now },
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Create(context.Background(), "svc", marketSpec, nil); err != nil {
		t.Fatal(err)
	}
	return c, st
}

// threeSpotZones is a market with spot in zones a (empty: launches there are refused), b
// and c, cheapest first, and on-demand in d.
func threeSpotZones() *marketMem {
	q := func(zone string, c fleet.Capacity, price float64) replicas.Quote {
		return replicas.Quote{Provider: "sim", Region: "r", Zone: zone, Capacity: c, PricePerHour: price}
	}
	return &marketMem{memProvider: memProvider{running: map[string]replicas.Instance{}},
		offers: []replicas.Quote{q("a", fleet.Spot, 1), q("b", fleet.Spot, 2), q("c", fleet.Spot, 3), q("d", fleet.OnDemand, 10)},
		empty:  map[string]bool{"a": true}}
}

// ticks runs n control ticks a second apart, each with its background work finished.
// onDemandQuote is the sim market's on-demand offer of one accel GPU in zone at price.
func onDemandQuote(zone, accel string, price float64) replicas.Quote {
	return replicas.Quote{Provider: "sim", Region: "r", Zone: zone, Capacity: fleet.OnDemand, PricePerHour: price, Accelerator: accel, AcceleratorCount: 1}
}

// gpuMarket is a controller on a real SQLite file with a sim market quoting offers, its
// clock at *now (metrics to reg where given).
func gpuMarket(t *testing.T, reg prometheus.Registerer, offers ...replicas.Quote) (*Controller, *state.Store, *time.Time) {
	t.Helper()
	mkt := &marketMem{memProvider: memProvider{running: map[string]replicas.Instance{}}, offers: offers}
	now := time.UnixMilli(1_800_000_000_000)
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c, err := New(context.Background(), Config{Store: st, Providers: map[string]replicas.Provider{"sim": mkt}, Now: func() time.Time { return now },
		Metrics: reg, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return c, st, &now
}

func ticks(c *Controller, now *time.Time, n int) {
	for range n {
		c.tick(context.Background())
		c.wg.Wait()
		*now = now.Add(time.Second)
	}
}

// launchOrder is the zones the market was asked for, tick by tick. Launches of one tick run
// at once in the background, so which reaches the provider first is up to the scheduler:
// within a tick they are sorted.
func launchOrder(c *Controller, now *time.Time, mkt *marketMem, n int) []string {
	var order []string
	for range n {
		mkt.mu.Lock()
		before := len(mkt.launched)
		mkt.mu.Unlock()
		ticks(c, now, 1)
		mkt.mu.Lock()
		order = append(order, slices.Sorted(slices.Values(mkt.launched[before:]))...)
		mkt.mu.Unlock()
	}
	return order
}

const marketSpec = `service:
  readiness_probe: /health
  replicas: 2
resources:
  accelerators: H100:1
  use_spot: true
run: x
arbiter: {model: m, providers: [sim]}
`

// Placement against a market: spot is bought by price and spread over zones; a zone that
// refuses for want of capacity is not asked again while it cools down, its refused launch
// is not billed and is not a crash loop (no launch backoff), and the replicas end up in the
// next cheapest zones.
func TestPlacementAvoidsARefusingZoneWithoutBackoff(t *testing.T) {
	ctx := context.Background()
	mkt := threeSpotZones()
	now := time.UnixMilli(1_800_000_000_000)
	c, st := newMarketController(t, mkt, &now)
	asked := fmt.Sprint(launchOrder(c, &now, mkt, 5))
	if asked != "[a b c]" {
		t.Errorf("zones asked for, in order: %s; want [a b c] (cheapest first, spread, the empty one asked once)", asked)
	}
	c.mu.Lock()
	s := c.services["svc"]
	crashLoop, nextLaunch := s.crashLoop, s.nextLaunch
	c.mu.Unlock()
	if crashLoop != 0 || !nextLaunch.IsZero() {
		t.Errorf("a refusal started a crash-loop backoff (%d in a row, next launch %v)", crashLoop, nextLaunch)
	}
	rows, err := st.Replicas(ctx, "svc", true)
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]float64{}
	for _, r := range rows {
		switch {
		case r.Zone == "a":
			if r.PricePerHour != 0 || r.EndedAt.IsZero() {
				t.Errorf("refused replica %s: $%v/h, ended %v; want unbilled and ended", r.ID, r.PricePerHour, r.EndedAt)
			}
		case r.EndedAt.IsZero():
			live[r.Zone] = r.PricePerHour
		}
	}
	if len(live) != 2 || live["b"] != 2 || live["c"] != 3 {
		t.Errorf("live replicas by zone and price %v; want b at $2 and c at $3", live)
	}
}

// With only two spot zones, cooling the one that refused leaves fewer than two, and the
// placer (as SkyServe) makes every zone active again; the refusal backoff still keeps the
// empty zone from being asked on every tick.
func TestRefusingZoneIsNotAskedEveryTick(t *testing.T) {
	ctx := context.Background()
	mkt := &marketMem{memProvider: memProvider{running: map[string]replicas.Instance{}},
		offers: []replicas.Quote{{Provider: "sim", Region: "r", Zone: "a", Capacity: fleet.Spot, PricePerHour: 1},
			{Provider: "sim", Region: "r", Zone: "b", Capacity: fleet.Spot, PricePerHour: 2},
			{Provider: "sim", Region: "r", Zone: "d", Capacity: fleet.OnDemand, PricePerHour: 10}},
		empty: map[string]bool{"a": true}}
	now := time.UnixMilli(1_800_000_000_000)
	c, _ := newMarketController(t, mkt, &now)
	count := func(zone string) int {
		mkt.mu.Lock()
		defer mkt.mu.Unlock()
		n := 0
		for _, z := range mkt.launched {
			if z == zone {
				n++
			}
		}
		return n
	}
	ticks(c, &now, 20) // a second apart: within one refusal backoff
	if n := count("a"); n != 1 {
		t.Errorf("the empty zone was asked %d times in 20 s; want once per %v", n, scaling.DefaultRefusalBackoff)
	}
	if n := count("b"); n != 2 {
		t.Errorf("zone b was asked %d times; want the 2 spot replicas there", n)
	}
	now = now.Add(scaling.DefaultRefusalBackoff)
	c.tick(ctx)
	c.wg.Wait()
	if n := count("a"); n != 1 {
		t.Errorf("with its 2 replicas running, the service asked the empty zone again (%d)", n)
	}
}

// A rolling update keeps the placer's memory: a zone that refused a launch a minute ago is
// still cooling, and the new version's replicas are not sent to ask it again.
func TestUpdateKeepsCoolingZones(t *testing.T) {
	ctx := context.Background()
	mkt := threeSpotZones()
	now := time.UnixMilli(1_800_000_000_000)
	c, _ := newMarketController(t, mkt, &now)
	order := launchOrder(c, &now, mkt, 3)
	now = now.Add(scaling.DefaultRefusalBackoff) // the refused place is offered again; the placer still cools it
	if _, _, err := c.Update(ctx, "svc", strings.Replace(marketSpec, "replicas: 2", "replicas: 3", 1), nil); err != nil {
		t.Fatal(err)
	}
	asked := fmt.Sprint(append(order, launchOrder(c, &now, mkt, 3)...))
	// a and b, then c in place of the refused a; after the update, the new version's three
	// go to b and c only: the cooling zone a is still avoided.
	if asked != "[a b c b b c]" {
		t.Errorf("zones asked for, tick by tick: %s; want [a b c b b c] (after the update, the cooling zone a is still avoided)", asked)
	}
}

// A market that cannot quote is reported once (log and event), not on every tick, and
// again when it changes or recovers; meanwhile nothing is launched.
func TestFailingQuoteIsReportedOnce(t *testing.T) {
	ctx := context.Background()
	mkt := &marketMem{memProvider: memProvider{running: map[string]replicas.Instance{}},
		offers:   []replicas.Quote{{Provider: "sim", Region: "r", Zone: "a", Capacity: fleet.Spot, PricePerHour: 1}},
		quoteErr: errors.New("catalog unreachable")}
	now := time.UnixMilli(1_800_000_000_000)
	c, st := newMarketController(t, mkt, &now)
	setErr := func(err error) {
		mkt.mu.Lock()
		mkt.quoteErr = err
		mkt.mu.Unlock()
	}
	status := func() string {
		t.Helper()
		sts, err := c.status(ctx, "svc", false)
		if err != nil {
			t.Fatal(err)
		}
		return sts[0].Status
	}
	ticks(c, &now, 5)
	// Nothing could be placed and nothing runs: it waits for capacity, it does not start.
	if got := status(); got != "waiting_for_capacity" {
		t.Errorf("status with no quote: %s; want waiting_for_capacity", got)
	}
	setErr(errors.New("catalog unreachable: timeout"))
	ticks(c, &now, 5)
	setErr(nil)
	ticks(c, &now, 5)
	if got := status(); got == "waiting_for_capacity" {
		t.Errorf("status once the quotes are back: %s", got)
	}
	evs, err := st.Events(ctx, "svc", "", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		if strings.Contains(e.Message, "placement waits") || strings.Contains(e.Message, "quotes are back") {
			got = append(got, e.Message)
		}
	}
	want := []string{"placement waits: catalog unreachable", "placement waits: catalog unreachable: timeout", "quotes are back; placement resumes"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("quote events %q; want %q", got, want)
	}
	mkt.mu.Lock()
	n := len(mkt.launched)
	mkt.mu.Unlock()
	if n != 2 {
		t.Errorf("%d launches; want the 2 replicas, all after the quotes came back", n)
	}
}

// A spec's secrets reach its replicas' environment beside its envs.
func TestSecretsReachReplicas(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	mkt := threeSpotZones()
	c, _ := newMarketController(t, mkt, &now)
	if _, _, err := c.Update(context.Background(), "svc", marketSpec+"envs: {MODEL: m}\nsecrets: {HF_TOKEN: hf_abc}\n", nil); err != nil {
		t.Fatal(err)
	}
	ticks(c, &now, 3)
	mkt.mu.Lock()
	defer mkt.mu.Unlock()
	found := false
	for _, e := range mkt.envs {
		if e["HF_TOKEN"] == "hf_abc" && e["MODEL"] == "m" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no launch carried the secret beside the env: %v", mkt.envs)
	}
}

// A quote left out for want of a price while others place the service is a placement
// note, not an error: `serve logs` must not show the service failing while it serves.
func TestOffersLeftOutAreNotAnError(t *testing.T) {
	ctx := context.Background()
	mkt := &marketMem{memProvider: memProvider{running: map[string]replicas.Instance{}},
		offers: []replicas.Quote{{Provider: "sim", Region: "r", Zone: "a", Capacity: fleet.Spot, PricePerHour: 1},
			{Provider: "sim", Region: "r", Zone: "b", Capacity: fleet.Spot, Unpriced: "node n-b (g9.xlarge) in b: no catalog lists g9.xlarge"}}}
	now := time.UnixMilli(1_800_000_000_000)
	c, st := newMarketController(t, mkt, &now)
	ticks(c, &now, 3)
	evs, err := st.Events(ctx, "svc", "", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs {
		if strings.Contains(e.Message, "g9.xlarge") {
			found = true
			if e.Kind == "error" {
				t.Errorf("event %q is of kind %q while the service places on the priced offers", e.Message, e.Kind)
			}
		}
	}
	if !found {
		t.Fatalf("no event names the offer left out: %v", evs)
	}
	mkt.mu.Lock()
	n := len(mkt.launched)
	mkt.mu.Unlock()
	if n != 2 {
		t.Errorf("%d launches; want the 2 replicas on the priced offer", n)
	}
}

// A launch's event says what, where and at what price; a node with no zone or region
// label (an on-prem machine) names no place rather than "in -" (issue 47).
func TestLaunchNote(t *testing.T) {
	for _, tc := range []struct {
		at   *scaling.Launch
		want string
	}{
		{nil, "launching on local"},
		{&scaling.Launch{Offer: scaling.Offer{Capacity: fleet.Spot, InstanceType: "g6.xlarge", Zone: "us-east-1a", PricePerHour: 0.3, PriceSource: "aws spot"}},
			"launching on local (spot g6.xlarge in us-east-1a at $0.3000/h, priced by aws spot)"},
		{&scaling.Launch{Offer: scaling.Offer{Capacity: fleet.OnDemand, Accelerator: "H100", PricePerHour: 2.5}},
			"launching on local (on_demand H100 at $2.5000/h)"},
		{&scaling.Launch{Offer: scaling.Offer{Capacity: fleet.OnDemand, Region: "eu-west-4", PricePerHour: 1}},
			"launching on local (on_demand capacity in eu-west-4 at $1.0000/h)"},
	} {
		if got := launchNote("local", tc.at); got != tc.want {
			t.Errorf("launchNote = %q; want %q", got, tc.want)
		}
	}
}

// arbiter.availability reaches the placement through the control plane: at 99.9 % a lone
// replica runs on-demand (a spot pair is predicted at 99.91 %, not three times within the
// target), at 99 % on spot in two zones, or on-demand where max_replicas 1 leaves no room
// for the pair; the placement event says what each option predicts and costs.
func TestAvailabilityTargetPlacesAndSaysWhy(t *testing.T) {
	for _, c := range []struct {
		target, replicas, want string
	}{
		{"99.9", "min_replicas: 1, max_replicas: 3, target_qps_per_replica: 5", "[d]"},
		{"99", "min_replicas: 1, max_replicas: 3, target_qps_per_replica: 5", "[b c]"},
		{"99", "replicas: 1", "[d]"},
	} {
		t.Run(c.target+" "+c.replicas, func(t *testing.T) {
			ctx := context.Background()
			mkt := &marketMem{memProvider: memProvider{running: map[string]replicas.Instance{}},
				offers: []replicas.Quote{{Provider: "sim", Region: "r", Zone: "b", Capacity: fleet.Spot, PricePerHour: 2},
					{Provider: "sim", Region: "r", Zone: "c", Capacity: fleet.Spot, PricePerHour: 3},
					{Provider: "sim", Region: "r", Zone: "d", Capacity: fleet.OnDemand, PricePerHour: 10}}}
			now := time.UnixMilli(1_800_000_000_000)
			st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			ctl, err := New(ctx, Config{Store: st, Providers: map[string]replicas.Provider{"sim": mkt}, Now: func() time.Time { return now },
				Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			spec := strings.Replace(marketSpec, "  replicas: 2", "  replica_policy: {"+c.replicas+"}", 1)
			if c.replicas == "replicas: 1" {
				spec = strings.Replace(marketSpec, "replicas: 2", "replicas: 1", 1)
			}
			spec = strings.Replace(spec, "providers: [sim]}", "providers: [sim], availability: "+c.target+"}", 1)
			if _, _, err := ctl.Create(ctx, "svc", spec, nil); err != nil {
				t.Fatal(err)
			}
			if asked := fmt.Sprint(launchOrder(ctl, &now, mkt, 3)); asked != c.want {
				t.Errorf("zones asked for: %s; want %s", asked, c.want)
			}
			evs, err := st.Events(ctx, "svc", "", 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			said := false
			for _, e := range evs {
				if e.Kind == "placement" && strings.Contains(e.Message, "availability target "+c.target) && strings.Contains(e.Message, "/h more") {
					said = true
					t.Logf("event: %s", e.Message)
				}
			}
			if !said {
				t.Errorf("no placement event names the availability target and the hedges' costs: %+v", evs)
			}
		})
	}
}
