package replicas

import (
	"cmp"
	"context"
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
	// EpochPath keeps the wall-clock moment at which every market's trace clock started,
	// so a restarted control plane resumes the same market instead of replaying it.
	EpochPath string
	// Tick is how often capacity drops are looked for; default 1 s.
	Tick time.Duration
	Now  func() time.Time
	Log  *slog.Logger
}

// Sim is a simulated cloud market whose replicas run as local processes. Prices are the
// real catalog's (package pricing) for the service's resources, in one cloud; spot capacity
// follows a real spot trace (package traces) whose zones are mapped onto that cloud's
// zones, played at Speedup trace seconds per wall-clock second. A spot launch in a zone the
// trace has emptied is refused (ErrNoCapacity); when the trace drops capacity in a zone,
// the share of spot replicas it takes there get the cloud's preemption notice and are
// reclaimed when the drop comes. What it lets run end to end, without a cloud account:
// placement by price, SpotHedge fallback, preemption as a routing event, cost by zone.
type Sim struct {
	*Local // processes: Setup, Terminate, Status, List, Notices, Preempt
	cfg    SimConfig
	epoch  time.Time
	// catalog is cfg.Catalog, or the embedded one loaded once when first needed (it takes
	// a tenth of a second, which a daemon without sim services should not pay).
	catalog func() (*pricing.Catalog, error)

	mu      sync.Mutex
	markets map[string]*simMarket // by service
}

type simMarket struct {
	key     string // what it was built from; a new spec with other resources rebuilds it
	m       *market.Market
	cloud   string
	speedup float64
	notice  time.Duration // 0: the cloud's own
	// announced is the market time up to which drops have been dealt with.
	announced time.Duration
}

// NewSim returns the sim provider; it watches its markets until ctx ends.
func NewSim(ctx context.Context, cfg SimConfig) (*Sim, error) {
	if cfg.EpochPath == "" {
		return nil, errors.New("sim provider: an epoch path is required")
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
	epoch, err := loadEpoch(cfg.EpochPath, cfg.Now())
	if err != nil {
		return nil, err
	}
	s := &Sim{Local: local, cfg: cfg, epoch: epoch, markets: map[string]*simMarket{}, catalog: sync.OnceValues(pricing.Embedded)}
	if cfg.Catalog != nil {
		s.catalog = func() (*pricing.Catalog, error) { return cfg.Catalog, nil }
	}
	go s.watch(ctx)
	return s, nil
}

// loadEpoch reads the epoch file, creating it with now when missing.
func loadEpoch(path string, now time.Time) (time.Time, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		ms, perr := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if perr != nil {
			return time.Time{}, fmt.Errorf("sim provider: epoch file %s: %w", path, perr)
		}
		return time.UnixMilli(ms), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return time.Time{}, fmt.Errorf("sim provider: %w", err)
	}
	if err := os.WriteFile(path, []byte(strconv.FormatInt(now.UnixMilli(), 10)+"\n"), 0o600); err != nil {
		return time.Time{}, fmt.Errorf("sim provider: %w", err)
	}
	return time.UnixMilli(now.UnixMilli()), nil
}

// marketTime is the market clock at wall time w (0 at the epoch).
func (sm *simMarket) marketTime(epoch, w time.Time) time.Duration {
	return time.Duration(float64(w.Sub(epoch)) * sm.speedup)
}

// wallTime is when market time t comes.
func (sm *simMarket) wallTime(epoch time.Time, t time.Duration) time.Time {
	return epoch.Add(time.Duration(float64(t) / sm.speedup))
}

// marketFor returns the service's market, built (or rebuilt) from its spec. Caller holds s.mu.
func (s *Sim) marketFor(service string, sp *spec.Service) (*simMarket, error) {
	if sm := s.markets[service]; sm != nil && sm.key == marketKey(sp) {
		return sm, nil
	}
	sm, err := s.build(sp)
	if err != nil {
		return nil, err
	}
	s.markets[service] = sm
	return sm, nil
}

func marketKey(sp *spec.Service) string { return fmt.Sprintf("%+v|%+v", sp.Resources, sp.Arbiter.Sim) }

// build makes the market a spec describes, its clock at now.
func (s *Sim) build(sp *spec.Service) (*simMarket, error) {
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
	sm := &simMarket{key: marketKey(sp), m: m, cloud: cloud, speedup: cmp.Or(cfg.Speedup, 1),
		notice: time.Duration(cfg.NoticeSeconds * float64(time.Second))}
	sm.announced = sm.marketTime(s.epoch, s.cfg.Now())
	return sm, nil
}

// CheckSpec builds the market a spec asks for without keeping it, so that a bad
// spot_trace, accelerator or cloud is refused when the service is submitted.
func (s *Sim) CheckSpec(sp *spec.Service) error {
	_, err := s.build(sp)
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
	var out []Quote
	for _, o := range sm.m.Offers(sm.marketTime(s.epoch, s.cfg.Now())) {
		out = append(out, Quote{Provider: s.Name(), Region: o.Region, Zone: o.Zone, Capacity: o.Capacity, PricePerHour: o.PricePerHour})
	}
	return out, nil
}

// Launch implements Provider: a spot launch where the trace has no capacity now is refused
// with ErrNoCapacity; otherwise a local process labelled with the offer's place and price.
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
		t := sm.marketTime(s.epoch, s.cfg.Now())
		if !sm.m.SpotCapacity(market.Place(sm.cloud, ls.Region, ls.Zone), t) {
			refused = fmt.Errorf("launch %s: spot in %s/%s: %w (the spot trace has none there at %s)",
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
	drop    market.Drop
	at      time.Time
}

func (s *Sim) announce(ctx context.Context) {
	now := s.cfg.Now()
	var dues []due
	s.mu.Lock()
	for service, sm := range s.markets {
		// Look as far ahead as the longest notice (AWS's 2 minutes unless the spec sets one);
		// each drop is announced once within its own notice.
		lead := cmp.Or(sm.notice, 2*time.Minute)
		horizon := sm.marketTime(s.epoch, now.Add(lead))
		if horizon <= sm.announced {
			continue
		}
		for _, d := range sm.m.Drops(sm.announced, horizon) {
			notice := cmp.Or(sm.notice, d.Notice)
			at := sm.wallTime(s.epoch, d.At)
			if at.Sub(now) > notice {
				horizon = d.At // not within its notice yet: a later tick takes it from here
				break
			}
			dues = append(dues, due{service: service, cloud: sm.cloud, drop: d, at: at})
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
	for _, d := range dues {
		var victims []Instance
		for _, in := range insts {
			if in.Capacity == fleet.Spot && serviceOf(in.ReplicaID) == d.service && slices.Contains(d.drop.Places, market.Place(d.cloud, in.Region, in.Zone)) {
				victims = append(victims, in)
			}
		}
		// The drop's share of the spot replicas there, newest first (as the simulator does).
		slices.SortFunc(victims, func(a, b Instance) int { return cmp.Compare(seqOf(b.ReplicaID), seqOf(a.ReplicaID)) })
		n := int(math.Ceil(d.drop.Share * float64(len(victims))))
		for _, in := range victims[:n] {
			warn := max(d.at.Sub(now), 0)
			s.cfg.Log.Info("sim provider: spot capacity drop", "replica", in.ReplicaID, "zone", in.Zone, "trace_zone", d.drop.Zone, "reclaimed_in", warn)
			s.Preempt(in.ReplicaID, in.Handle, warn)
		}
		insts = slices.DeleteFunc(insts, func(in Instance) bool {
			return slices.ContainsFunc(victims[:n], func(v Instance) bool { return v.Handle == in.Handle })
		})
	}
}

// serviceOf and seqOf split a replica ID of the form <service>-<n>.
func serviceOf(id string) string { return id[:max(strings.LastIndexByte(id, '-'), 0)] }

func seqOf(id string) int {
	n, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
	return n
}
