package replicas

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/market"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/spec"
	"github.com/arbiter-serve/arbiter/traces"
)

// SimConfig configures the sim provider.
type SimConfig struct {
	// Local is how replica processes run (owner tag, logs, PATH); its Name becomes "sim".
	Local LocalConfig
	// Catalog is the price catalog; nil: the embedded one, loaded at the first quote.
	Catalog *pricing.Catalog
	// ClockPath keeps when each service's market started, so a restarted control plane
	// resumes the same market instead of replaying it from the start.
	ClockPath string
	// Tick is how often capacity drops are looked for; default 1 s.
	Tick time.Duration
	Now  func() time.Time
	Log  *slog.Logger
}

// Sim is a simulated cloud market whose replicas run as local processes. Prices are the
// real catalog's (package pricing) for the service's resources, in one cloud; spot capacity
// follows a real spot trace (package traces) whose zones are mapped onto that cloud's
// zones, played at Speedup trace seconds per wall-clock second from the moment the
// service's market is first quoted (and again from the start when the trace runs out). A
// spot launch into a zone the trace has emptied, or will empty within a notice, is refused
// (ErrNoCapacity); when the trace drops capacity in a zone, the share of spot replicas it
// takes there get the cloud's preemption notice and are reclaimed when the drop comes.
// What it lets run end to end, without a cloud account: placement by price, SpotHedge
// fallback, preemption as a routing event, cost by zone.
type Sim struct {
	*Local // processes: Setup, Terminate, Status, List, Notices, Preempt
	cfg    SimConfig
	// catalog is cfg.Catalog, or the embedded one loaded once when first needed (it takes
	// a tenth of a second, which a daemon without sim services should not pay).
	catalog func() (*pricing.Catalog, error)

	mu      sync.Mutex
	markets map[string]*simMarket // by service
	clocks  map[string]marketClock
	noticed map[string]bool // handles already given a notice
}

// marketClock is a service's market start as persisted: valid while the spec's market
// (Key) is unchanged.
type marketClock struct {
	Key     string `json:"key"`
	StartMS int64  `json:"start_ms"`
}

type simMarket struct {
	key     string // what it was built from; a new spec with other resources rebuilds it
	m       *market.Market
	cloud   string
	speedup float64
	notice  time.Duration // 0: the cloud's own
	start   time.Time     // wall time of market time 0
	// announced is the market time up to which drops have been dealt with.
	announced time.Duration
	// recheck: built by this process, so replicas it finds running may sit in zones the
	// trace emptied while no one was watching; the next announce reclaims those.
	recheck bool
	// quoted is the last quote's wall time: a live service is quoted on every control
	// tick, so a market unquoted for marketIdle belongs to a deleted service.
	quoted time.Time
}

// marketIdle is how long a market goes unquoted before it is dropped from memory. Its
// clock stays on disk: a control loop that stalled that long (or a suspended machine) finds
// its market where it was, rebuilt from the clock at the next quote.
const marketIdle = 10 * time.Minute

// NewSim returns the sim provider; it watches its markets until ctx ends.
func NewSim(ctx context.Context, cfg SimConfig) (*Sim, error) {
	if cfg.ClockPath == "" {
		return nil, errors.New("sim provider: a clock path is required")
	}
	// Every label comes from the quote launched on; a region-level offer has no zone.
	cfg.Local.Name, cfg.Local.Region, cfg.Local.Zone = "sim", "", ""
	local, err := NewLocal(cfg.Local)
	if err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Tick <= 0 {
		cfg.Tick = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	clocks := map[string]marketClock{}
	if b, err := os.ReadFile(cfg.ClockPath); err == nil {
		if err := json.Unmarshal(b, &clocks); err != nil {
			return nil, fmt.Errorf("sim provider: market clocks %s: %w", cfg.ClockPath, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("sim provider: %w", err)
	}
	s := &Sim{Local: local, cfg: cfg, markets: map[string]*simMarket{}, clocks: clocks, noticed: map[string]bool{},
		catalog: sync.OnceValues(pricing.Embedded)}
	if cfg.Catalog != nil {
		s.catalog = func() (*pricing.Catalog, error) { return cfg.Catalog, nil }
	}
	go s.watch(ctx)
	return s, nil
}

// saveClocks persists the market starts. Caller holds s.mu. A failure is logged: the
// market goes on, and only a restart would replay it from the start.
func (s *Sim) saveClocks() {
	b, err := json.Marshal(s.clocks)
	tmp := s.cfg.ClockPath + ".tmp"
	if err == nil {
		err = os.WriteFile(tmp, b, 0o600)
	}
	if err == nil {
		err = os.Rename(tmp, s.cfg.ClockPath)
	}
	if err != nil {
		s.cfg.Log.Error("sim provider: saving market clocks", "err", err)
	}
}

// marketTime is the market clock at wall time w (0 at the market's start).
func (sm *simMarket) marketTime(w time.Time) time.Duration {
	return time.Duration(float64(w.Sub(sm.start)) * sm.speedup)
}

// wallTime is when market time t comes.
func (sm *simMarket) wallTime(t time.Duration) time.Time {
	return sm.start.Add(time.Duration(float64(t) / sm.speedup))
}

// lead is how far ahead, in market time, drops are announced and launches checked.
func (sm *simMarket) lead() time.Duration {
	return time.Duration(float64(cmp.Or(sm.notice, 2*time.Minute)) * sm.speedup)
}

// marketFor returns the service's market, built (or rebuilt) from its spec, its clock
// resumed from the persisted start when the spec's market is the same, and restarted
// when the trace has run out. Caller holds s.mu.
func (s *Sim) marketFor(service string, sp *spec.Service) (*simMarket, error) {
	now := s.cfg.Now()
	key := marketKey(sp)
	sm := s.markets[service]
	if sm == nil || sm.key != key {
		var err error
		if sm, err = s.build(sp, now); err != nil {
			return nil, err
		}
		if c, ok := s.clocks[service]; ok && c.Key == key {
			sm.start = time.UnixMilli(c.StartMS)
		}
		sm.announced, sm.recheck = sm.marketTime(now), true
		s.markets[service] = sm
	}
	if length := sm.m.Length(); sm.marketTime(now) >= length {
		s.cfg.Log.Info("sim provider: the spot trace ran out; replaying it from start_hours", "service", service, "trace_length", length)
		sm.start, sm.announced = now, 0
	}
	if c := (marketClock{Key: key, StartMS: sm.start.UnixMilli()}); s.clocks[service] != c {
		s.clocks[service] = c
		s.saveClocks()
	}
	return sm, nil
}

func marketKey(sp *spec.Service) string { return fmt.Sprintf("%+v|%+v", sp.Resources, sp.Arbiter.Sim) }

// build makes the market a spec describes, its clock starting at now.
func (s *Sim) build(sp *spec.Service, now time.Time) (*simMarket, error) {
	cfg := sp.Arbiter.Sim
	res := sp.Resources
	cloud := cmp.Or(cfg.Cloud, res.Cloud, "gcp")
	if res.Cloud != "" && res.Cloud != cloud {
		return nil, fmt.Errorf("sim provider: resources.cloud is %s but arbiter.sim.cloud is %s; the market is one cloud", res.Cloud, cloud)
	}
	res.Cloud = cloud
	trace, err := traces.NamedSpot(cfg.SpotTrace)
	if err != nil {
		return nil, fmt.Errorf("sim provider: arbiter.sim.spot_trace: %w (known: %s)", err, strings.Join(traces.SpotNames(), ", "))
	}
	at, err := time.Parse(time.DateOnly, cfg.PricesAt)
	if err != nil {
		return nil, fmt.Errorf("sim provider: arbiter.sim.prices_at: %w", err)
	}
	cat, err := s.catalog()
	if err != nil {
		return nil, fmt.Errorf("sim provider: price catalog: %w", err)
	}
	m, err := market.New(market.Config{Catalog: cat, Resources: res, Start: at, Spot: trace,
		Offset: time.Duration(cfg.StartHours * float64(time.Hour))})
	if err != nil {
		return nil, fmt.Errorf("sim provider: %w", err)
	}
	if m.Length() <= 0 {
		return nil, fmt.Errorf("sim provider: arbiter.sim.start_hours %g is past the end of spot trace %s", cfg.StartHours, cfg.SpotTrace)
	}
	return &simMarket{key: marketKey(sp), m: m, cloud: cloud, speedup: cmp.Or(cfg.Speedup, 1),
		notice: time.Duration(cfg.NoticeSeconds * float64(time.Second)), start: now}, nil
}

// CheckSpec builds the market a spec asks for without keeping it, so that a bad
// spot_trace, accelerator, cloud or start is refused when the service is submitted.
func (s *Sim) CheckSpec(sp *spec.Service) error {
	_, err := s.build(sp, s.cfg.Now())
	return err
}

// Quote implements Provider: the market's offers now, named by region and zone within its
// one cloud (the provider of every offer is "sim").
func (s *Sim) Quote(_ context.Context, service string, sp *spec.Service) ([]Quote, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sm, err := s.marketFor(service, sp)
	if err != nil {
		return nil, err
	}
	sm.quoted = s.cfg.Now()
	var out []Quote
	for _, o := range sm.m.Offers(sm.marketTime(s.cfg.Now())) {
		out = append(out, Quote{Provider: s.Name(), Region: o.Region, Zone: o.Zone, Capacity: o.Capacity, PricePerHour: o.PricePerHour,
			InstanceType: o.InstanceType, Accelerator: o.Accelerator, AcceleratorCount: o.AcceleratorCount})
	}
	if len(out) == 0 {
		// A market always offers something; saying "none" would read as "not a market".
		return nil, fmt.Errorf("sim provider: no offers for %s's resources in %s now", service, sm.cloud)
	}
	return out, nil
}

// Launch implements Provider: a spot launch where the trace has no capacity now, or will
// have none within a notice (its drop is already announced), is refused with
// ErrNoCapacity; otherwise a local process labelled with the offer's place and price.
func (s *Sim) Launch(ctx context.Context, ls LaunchSpec) (Instance, error) {
	s.mu.Lock()
	sm := s.markets[ls.Service]
	var refused error
	switch {
	case sm == nil:
		refused = fmt.Errorf("sim provider: launch %s: service %s has not been quoted yet", ls.ReplicaID, ls.Service)
	case ls.PricePerHour == nil:
		refused = fmt.Errorf("sim provider: launch %s: no price: launches must come from a quote", ls.ReplicaID)
	case ls.Capacity == fleet.Spot:
		t, p := sm.marketTime(s.cfg.Now()), market.Place(sm.cloud, ls.Region, ls.Zone)
		if !sm.m.SpotCapacity(p, t) || !sm.m.SpotCapacity(p, t+sm.lead()) {
			refused = fmt.Errorf("launch %s: spot in %s/%s: %w (the spot trace has none there at %s or within a notice of it)",
				ls.ReplicaID, ls.Region, ls.Zone, ErrNoCapacity, t.Round(time.Second))
		}
	}
	s.mu.Unlock()
	if refused != nil {
		return Instance{}, refused
	}
	return s.Local.Launch(ctx, ls)
}

// watch announces the trace's capacity drops as preemption notices, a notice's lead ahead
// of each drop, and reclaims the replicas at the drop.
func (s *Sim) watch(ctx context.Context) {
	t := time.NewTicker(s.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.announce(ctx)
		}
	}
}

// due is one drop to act on, with when it happens in wall-clock time.
type due struct {
	service string
	cloud   string
	places  []string
	share   float64
	at      time.Time
}

func (s *Sim) announce(ctx context.Context) {
	now := s.cfg.Now()
	var dues []due
	s.mu.Lock()
	for service, sm := range s.markets {
		if now.Sub(sm.quoted) >= marketIdle {
			// Its service is gone, most likely; a replica of it still terminating gets no
			// notices from here on.
			delete(s.markets, service)
			continue
		}
		t := sm.marketTime(now)
		if sm.recheck {
			// Whatever runs where the trace has no capacity now goes at once.
			sm.recheck = false
			var empty []string
			for _, o := range sm.m.Offers(t) {
				if p := market.Place(sm.cloud, o.Region, o.Zone); o.Capacity == fleet.Spot && !sm.m.SpotCapacity(p, t) {
					empty = append(empty, p)
				}
			}
			if len(empty) > 0 {
				dues = append(dues, due{service: service, cloud: sm.cloud, places: empty, share: 1, at: now})
			}
		}
		// Look as far ahead as the longest notice (AWS's 2 minutes unless the spec sets
		// one); each drop is announced once, within its own notice.
		horizon := t + sm.lead()
		if horizon <= sm.announced {
			continue
		}
		for _, d := range sm.m.Drops(sm.announced, horizon) {
			at := sm.wallTime(d.At)
			if at.Sub(now) > cmp.Or(sm.notice, d.Notice) {
				horizon = d.At // not within its notice yet: a later tick takes it from here
				break
			}
			dues = append(dues, due{service: service, cloud: sm.cloud, places: d.Places, share: d.Share, at: at})
		}
		sm.announced = horizon
	}
	s.mu.Unlock()
	if len(dues) == 0 {
		return
	}
	insts, err := s.List(ctx)
	if err != nil {
		s.cfg.Log.Error("sim provider: list for a capacity drop", "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range dues {
		var victims []Instance
		for _, in := range insts {
			if in.Capacity == fleet.Spot && !s.noticed[in.Handle] && serviceOf(in.ReplicaID) == d.service &&
				slices.Contains(d.places, market.Place(d.cloud, in.Region, in.Zone)) {
				victims = append(victims, in)
			}
		}
		// The drop's share of the spot replicas there, newest first (as the simulator does).
		slices.SortFunc(victims, func(a, b Instance) int { return cmp.Compare(seqOf(b.ReplicaID), seqOf(a.ReplicaID)) })
		for _, in := range victims[:int(math.Ceil(d.share*float64(len(victims))))] {
			warn := max(d.at.Sub(now), 0)
			s.noticed[in.Handle] = true
			s.cfg.Log.Info("sim provider: spot capacity drop", "replica", in.ReplicaID, "zone", in.Zone, "reclaimed_in", warn)
			s.Preempt(in.ReplicaID, in.Handle, warn)
		}
	}
	// Forget handles that are gone, so the set does not grow with every preemption.
	for h := range s.noticed {
		if !slices.ContainsFunc(insts, func(in Instance) bool { return in.Handle == h }) {
			delete(s.noticed, h)
		}
	}
}

// serviceOf and seqOf split a replica ID of the form <service>-<n>.
func serviceOf(id string) string { return id[:max(strings.LastIndexByte(id, '-'), 0)] }

func seqOf(id string) int {
	n, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
	return n
}
