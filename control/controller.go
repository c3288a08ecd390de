// Package control is Arbiter's control plane: it owns services, decides how many replicas
// each needs (scaling.Decider), launches and terminates them through providers, probes
// their readiness, persists everything in the state file, and publishes the ready set that
// routers follow.
//
// Every replica move goes through transition, which checks the life-cycle edge, writes the
// row and its event, and republishes the ready set when the move changes what routers see.
// Slow work (launch, probe, terminate) runs in goroutines that own their replica (busy)
// until they report back under the controller's lock.
package control

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/spec"
	"github.com/arbiter-serve/arbiter/state"
)

// Config configures a controller.
type Config struct {
	Store     *state.Store
	Providers map[string]replicas.Provider
	// Token protects the API; routers and the CLI send it as a bearer token.
	Token string
	// Tick is how often each service is reconciled (and its decider consulted).
	Tick time.Duration
	// DrainTimeout bounds how long a draining replica waits for its in-flight requests
	// with no progress on them: while routers report its engine generating, the wait goes
	// on (a 20-minute answer is not cut by a rolling update).
	DrainTimeout time.Duration
	// Endpoint is the router URL users call, shown by `serve status`.
	Endpoint string
	Log      *slog.Logger
	Now      func() time.Time
	// Metrics, if set, receives the control plane's Prometheus metrics.
	Metrics prometheus.Registerer
	// AuditEvery is how often providers' instances are compared with the replica rows
	// (arbiter_control_unknown_replicas); default 30 s.
	AuditEvery time.Duration
	// ListWait is how long recovery waits for a provider that cannot list yet (a cluster
	// whose watches are still syncing) before going on without it; default 15 s.
	ListWait time.Duration
	// ZoneCooldown keeps spot out of a zone this long after it preempted a replica or
	// refused a launch; default 10 minutes.
	ZoneCooldown time.Duration
	// MaxReplicas is the most replicas this control plane runs at once, all services
	// together (default DefaultMaxReplicas): a service that asks for more is refused, and
	// no launch takes the fleet past it.
	MaxReplicas int
	// LaunchesPerSecond and LaunchBurst rate-limit launches, all services together
	// (defaults 2 and 10), so a mistake costs seconds of launches, not the machine or a bill.
	LaunchesPerSecond float64
	LaunchBurst       int
	// NoticeMargin is how long before a preemption notice's deadline a replica with no
	// replacement ready drains (default DefaultNoticeMargin; preempt.go says why).
	NoticeMargin time.Duration
	// Lease, when set, makes this one of several control planes sharing one store
	// (lease.go): it launches, terminates and writes only while it holds the lease, and
	// stands by, following the store, while another does. nil: the only control plane.
	Lease Lease
}

// DefaultMaxReplicas is the replica ceiling of a control plane whose operator set none.
const DefaultMaxReplicas = 64

// Controller is the control plane.
type Controller struct {
	cfg     Config
	store   *state.Store
	log     *slog.Logger
	probes  *http.Client
	metrics *metrics

	// launches rate-limits launches over all services (Config.LaunchesPerSecond).
	launches *rate.Limiter

	mu       sync.Mutex
	services map[string]*service
	routers  map[string]routerReport
	// tenants is every tenant's spend (tenants.go).
	tenants tenantBook
	// unswept: providers that could not list at recovery; the next audit that lists them
	// terminates what no row wants.
	unswept map[string]bool
	// pending are state writes that wait for the file, in order (writeback.go).
	pending []pendingWrite
	// suspects: instances (provider/handle) the last audit found with no live row; used
	// only by audit, which runs in Run's goroutine.
	suspects map[string]bool
	revision uint64
	// recoveredAt is when this control plane last recovered (started, or took the lease):
	// routers' reports before it went to another.
	recoveredAt time.Time
	changed     chan struct{} // closed when the ready set changes
	kick        chan struct{}
	wg          sync.WaitGroup // background work on replicas
	// renew renews Config.Lease (a field so that a test can pause it); view is the
	// fingerprint of what a standby last read (lease.go).
	renew func(context.Context) (int64, error)
	view  string
	// fwdMu guards where a standby last found the leader's API (forward.go) and when.
	fwdMu   sync.Mutex
	fwdURL  *url.URL
	fwdInfo state.LeaderInfo
	fwdErr  error
	fwdRead time.Time
	// following (one slot) serializes a standby's reads of the store (follow): its loop's
	// and those its API makes before answering, so that an older read never replaces a
	// newer one; a channel, so that an answer waits for it only as long as its context
	// lets it. Taken before c.mu.
	following chan struct{}
}

type service struct {
	// places are where the service's last quotes offered to run (provider, region, zone,
	// capacity): its spend series exist, at 0, from the moment a place is known.
	places   []place
	name     string
	version  int
	specs    map[int]*spec.Service
	decider  *scaling.Decider
	target   int
	decision scaling.Decision
	deleting bool
	// purge: a replica whose termination fails while the service is deleted is written
	// off rather than retried (serve down --purge).
	purge bool
	// blueGreen: the current version replaces the old one blue-green (serve update --mode
	// blue_green): its replicas serve nothing, and the old ones keep serving, until as many
	// of it are ready as the target, when traffic switches at once (switched).
	blueGreen, switched bool
	learned             []string // model names replicas reported
	// adapters is each declared LoRA adapter's use as routers reported it (countAdapter).
	adapterCounts map[string]*adapterCount
	replicas      map[string]*replica
	setup         map[int]*sync.Mutex // per version: setup runs once, launches wait for it

	// Replicas that failed before ever getting ready, in a row: a broken run: or setup must
	// not relaunch every tick, so launches back off until one gets ready.
	crashLoop  int
	nextLaunch time.Time

	// Load since the last tick, from router reports; shed and shedTokens are the requests
	// the routers' queues refused for want of room, and their tokens.
	requests, tokens float64
	shed, shedTokens float64
	// served is every token the routers reported for the service since this process
	// started (arbiter_control_tokens_total: an ordinary counter, which a restart resets;
	// starting from the stored total instead would dip after a crash lost the unsaved
	// tokens, and a dip reads as a reset that counts the whole total again).
	served float64
	woken  bool
	// mix is the window of the service's request mix the routers reported.
	mix requestMix
	// gmix sizes the service per GPU type (gpumix.go); nil where it is not.
	gmix *gpuMix
	// pools are the merged adapters' replicas of their own (own.go), by adapter; lastTick
	// is when the service was last decided.
	pools    map[string]*ownPool
	lastTick time.Time
	// mixOffSaid: the event saying the GPU mix is off for its adapters' own replicas is
	// written.
	mixOffSaid bool
	// lastRequest is when a router last reported a request; held the requests the
	// routers hold for it now (set each tick).
	lastRequest time.Time
	waiting     float64

	// placer chooses capacity kinds and zones when the service's provider is a market;
	// placement is its last plan's reason.
	placer    *scaling.Placer
	placement string
	// unplaced: the last placement launched nothing while the service's live replicas
	// fell short of its target (no offer could take one: none quoted, all refused or
	// cooling); status says "waiting_for_capacity" while nothing runs.
	unplaced bool
	// quoteErr is the provider's last quote error ("" after a good quote): a failing
	// market is reported when its error changes, not on every tick.
	quoteErr string
	// failed says why the stored spec did not load at start; such a service has no spec
	// and no decider, and nothing reconciles it until an update brings a spec that loads.
	failed string
	// held says why launches wait (the daemon's replica ceiling, the launch rate), so
	// that it is reported when it starts, not on every tick.
	held string
	// unreadySince: since when a preemption notice has left the service with no replica
	// ready (its last ready one drained at the deadline or reclaimed), until one is ready
	// again; zero when not. unreadyCounted is how far that time is counted in
	// arbiter_control_preemption_unready_seconds_total, and unreadyBy the noticed replica.
	unreadySince, unreadyCounted time.Time
	unreadyBy                    string
}

type replica struct {
	row           state.Replica
	busy          bool // a goroutine is launching, probing or terminating it
	nextProbe     time.Time
	fails         int
	passes        int // consecutive passed probes while not ready: as many as failure_threshold bring it back
	notReadySince time.Time
	drainSince    time.Time
	drainProgress time.Time // the last time a router saw its in-flight requests progress while it drained
	// refused: its launch was turned down for want of capacity, which says nothing about
	// the replica's run: (no crash-loop backoff).
	refused bool
	// unansweredSince: when its provider began failing to say whether it runs.
	unansweredSince time.Time
	// terminateAfter: a failed termination is retried from then; terminateWait is the
	// current back-off and terminateErr the last failure logged.
	terminateAfter time.Time
	terminateWait  time.Duration
	terminateErr   string
	// down: taken down by name (serve down --replica-id), drained as soon as nothing else
	// holds it; purge: written off if its termination fails.
	down, purge bool
	// conflict says which models the replica lists that another service owns (and so
	// that it is not routed to for them); "" when none (models.go).
	conflict string
	// notice is the provider's preemption notice, when one came while it served (zero
	// Deadline: none), noticeAt when: it serves on, counted by neither its version's size
	// nor placement, so its replacement launches at once, and drains as followNotice says.
	notice   replicas.Notice
	noticeAt time.Time
	// replacement is the replica launched in its place ("" while none is on its way);
	// noCapacity: a replacement was refused for want of capacity (said once); noticeEnded:
	// it drained or failed after the notice (its outcome counted).
	replacement             string
	noCapacity, noticeEnded bool
}

// drainQuietSince is when a draining replica's requests were last seen progressing, or
// when its drain began.
func (r *replica) drainQuietSince() time.Time {
	if r.drainProgress.After(r.drainSince) {
		return r.drainProgress
	}
	return r.drainSince
}

type routerReport struct {
	at  time.Time
	rep fleet.LoadReport
}

// New opens a controller over its state and recovers: it re-reads services, adopts live
// replicas it recorded, and terminates what it does not recognise. Call Run next.
func New(ctx context.Context, cfg Config) (*Controller, error) {
	if cfg.Store == nil || len(cfg.Providers) == 0 {
		return nil, errors.New("control: a store and at least one provider are required")
	}
	if cfg.Tick <= 0 {
		cfg.Tick = time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 120 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.AuditEvery <= 0 {
		cfg.AuditEvery = 30 * time.Second
	}
	if cfg.ListWait <= 0 {
		cfg.ListWait = 15 * time.Second
	}
	if cfg.ZoneCooldown <= 0 {
		cfg.ZoneCooldown = zoneCooldown
	}
	if cfg.MaxReplicas <= 0 {
		cfg.MaxReplicas = DefaultMaxReplicas
	}
	if cfg.LaunchesPerSecond <= 0 {
		cfg.LaunchesPerSecond = 2
	}
	if cfg.LaunchBurst <= 0 {
		cfg.LaunchBurst = 10
	}
	if cfg.NoticeMargin <= 0 {
		cfg.NoticeMargin = DefaultNoticeMargin
	}
	c := &Controller{cfg: cfg, store: cfg.Store, log: cfg.Log, probes: &http.Client{},
		services: map[string]*service{}, routers: map[string]routerReport{}, unswept: map[string]bool{}, suspects: map[string]bool{}, changed: make(chan struct{}), kick: make(chan struct{}, 1), following: make(chan struct{}, 1)}
	c.launches = rate.NewLimiter(rate.Limit(cfg.LaunchesPerSecond), cfg.LaunchBurst)
	c.metrics = newMetrics(cfg.Metrics, c)
	c.renew = func(ctx context.Context) (int64, error) { return cfg.Lease.Renew(ctx) }
	if cfg.Lease != nil {
		// A standby until Run takes the lease: it reads, and recovers only once it leads.
		if err := c.follow(ctx); err != nil {
			return nil, err
		}
		return c, nil
	}
	if err := c.recover(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Run reconciles every service each tick until ctx ends; then waits for work in flight.
// Replicas keep running when the control plane stops: a restart adopts them. With a lease,
// it does so only while it leads (lease.go).
func (c *Controller) Run(ctx context.Context) {
	if c.cfg.Lease != nil {
		c.runLeased(ctx)
		return
	}
	c.lead(ctx)
}

// lead is the leader's loop: provider notices, audits and ticks until ctx ends or the
// lease is lost; then it waits for work in flight.
func (c *Controller) lead(ctx context.Context) {
	for _, p := range c.cfg.Providers {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.followNotices(ctx, p)
		}()
	}
	t := time.NewTicker(c.cfg.Tick)
	defer t.Stop()
	audit := time.NewTicker(c.cfg.AuditEvery)
	defer audit.Stop()
	c.audit(ctx)
	for {
		if !c.leading() {
			c.wg.Wait()
			return
		}
		c.tick(ctx)
		select {
		case <-ctx.Done():
			c.wg.Wait()
			return
		case <-t.C:
		case <-c.kick:
		case <-audit.C:
			c.audit(ctx)
		}
	}
}

func (c *Controller) kickNow() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// publish marks the ready set changed. Caller holds c.mu.
func (c *Controller) publish() {
	c.revision++
	close(c.changed)
	c.changed = make(chan struct{})
}

// ReadySet returns the current ready set and a channel closed when it changes.
func (c *Controller) ReadySet() (fleet.ReadySet, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	set := fleet.ReadySet{Revision: c.revision, Services: []fleet.Service{}, Replicas: []fleet.Replica{}}
	for _, s := range sortedServices(c.services) {
		svc := fleet.Service{Name: s.name, Models: s.models()}
		if sp := s.spec(); sp != nil {
			a := sp.Arbiter
			svc.Policy = a.RoutingPolicy
			svc.SLO = &fleet.SLO{TTFTSeconds: a.SLO.TTFTSeconds, TPOTSeconds: a.SLO.TPOTSeconds, E2ESeconds: a.SLO.E2ESeconds, Percentile: a.SLO.Percentile}
			svc.Adapters, svc.MaxLoRAs = s.adapters()
			svc.Tenants = a.Tenants
			if q := a.Queue; q.Enabled || q.EnginePriority {
				svc.Queue = &fleet.Queue{Enabled: q.Enabled, MaxWaitSeconds: q.MaxWaitSeconds, SheddableFill: q.SheddableFill, EnginePriority: q.EnginePriority}
			}
		}
		// A failed service's ready replicas keep serving what they served: nothing probes
		// them now, but the routers' own health checks still do.
		set.Services = append(set.Services, svc)
		withhold := s.withholdsNewVersion()
		for _, r := range sortedReplicas(s.replicas) {
			st := replicas.State(r.row.State)
			if !st.Serving() || r.row.Address == "" || r.row.Model == "" || (withhold && r.row.Version == s.version) {
				continue
			}
			rep := fleet.Replica{ID: r.row.ID, Address: r.row.Address, Model: r.row.Model, Service: s.name,
				Provider: r.row.Provider, Region: r.row.Region, Zone: r.row.Zone, Capacity: fleet.Capacity(r.row.Capacity),
				PricePerHour: r.row.PricePerHour, Version: r.row.Version, Draining: st == replicas.Draining}
			rep.Accelerator, rep.Adapter = r.row.Accelerator, r.row.Adapter
			if sp := s.specs[r.row.Version]; sp != nil {
				rep.Profile = replicaProfile(sp.Arbiter.Profile, r.row.Accelerator)
				rep.Tasks = sp.Arbiter.Tasks
			}
			if rep.Profile == "" && rep.Adapter != "" && rep.Accelerator != "" {
				// An adapter's own replica serves the base model's shape under the
				// adapter's name, which routers cannot make a profile of.
				if base := s.baseModel(); base != "" {
					rep.Profile, _ = engine.ProfileOn(rep.Accelerator, base)
				}
			}
			set.Replicas = append(set.Replicas, rep)
		}
	}
	return set, c.changed
}

// replicaProfile is the profile routers predict a replica with: the spec's (the one the
// replica was launched from) moved to the GPU placement launched it on, so that on a fleet
// of several types each replica is predicted on its own card; the spec's as it is where
// the replica's GPU is not known or has no profile. Without a profile in the spec, routers
// take the replica's accelerator and model name themselves (fleet.Replica.Accelerator).
func replicaProfile(specProfile, accelerator string) string {
	if specProfile == "" || accelerator == "" {
		return specProfile
	}
	if name, err := engine.ProfileOn(accelerator, specProfile); err == nil {
		return name
	}
	return specProfile
}

func (s *service) spec() *spec.Service { return s.specs[s.version] }

// withholdsNewVersion reports whether a blue-green update keeps the new version out of
// the routers: before the switch, while an old replica still serves.
func (s *service) withholdsNewVersion() bool {
	if !s.blueGreen || s.switched {
		return false
	}
	for _, r := range s.replicas {
		if r.row.Version != s.version && replicas.State(r.row.State) == replicas.Ready {
			return true
		}
	}
	return false
}

// models is what the service serves: its spec's names, then what replicas reported.
func (s *service) models() []string {
	var out []string
	sp := s.spec()
	if sp != nil {
		out = slices.Clone(sp.Arbiter.Models)
	}
	for _, m := range s.learned {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	if sp != nil {
		for _, a := range sp.Arbiter.Adapters {
			if !slices.Contains(out, a.Name) {
				out = append(out, a.Name)
			}
		}
	}
	return out
}

// baseModel is the model the service's adapters run on: the spec's first, else the first a
// replica listed that is no adapter's name; "" before either is known.
func (s *service) baseModel() string {
	sp := s.spec()
	if sp == nil {
		return ""
	}
	for _, m := range append(slices.Clone(sp.Arbiter.Models), s.learned...) {
		if !sp.Arbiter.HasAdapter(m) {
			return m
		}
	}
	return ""
}

// adapters is what routers need of the service's LoRA adapters: each with the model its
// replicas are routed for (baseModel).
func (s *service) adapters() ([]fleet.Adapter, int) {
	sp := s.spec()
	if sp == nil || len(sp.Arbiter.Adapters) == 0 {
		return nil, 0
	}
	base := s.baseModel()
	out := make([]fleet.Adapter, len(sp.Arbiter.Adapters))
	for i, a := range sp.Arbiter.Adapters {
		out[i] = fleet.Adapter{Name: a.Name, Base: base, Path: a.Path, Parent: cmp.Or(a.Parent, base), Static: a.Static}
	}
	return out, sp.Arbiter.LoRA.MaxLoRAs
}

func sortedServices(m map[string]*service) []*service {
	out := make([]*service, 0, len(m))
	for _, s := range m {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *service) int { return strings.Compare(a.name, b.name) })
	return out
}

func sortedReplicas(m map[string]*replica) []*replica {
	out := make([]*replica, 0, len(m))
	for _, r := range m {
		out = append(out, r)
	}
	// Launch order, then ID: the order scale-down and status read in.
	slices.SortFunc(out, func(a, b *replica) int {
		if d := a.row.LaunchedAt.Compare(b.row.LaunchedAt); d != 0 {
			return d
		}
		return strings.Compare(a.row.ID, b.row.ID)
	})
	return out
}

// transition moves a replica along the life cycle and records why. Caller holds c.mu.
func (c *Controller) transition(ctx context.Context, s *service, r *replica, to replicas.State, reason string) {
	from := replicas.State(r.row.State)
	if from == to {
		return
	}
	if err := replicas.CheckTransition(from, to); err != nil {
		c.log.Error("bug: illegal replica transition", "replica", r.row.ID, "err", err, "reason", reason)
		return
	}
	now := c.cfg.Now()
	r.row.State, r.row.Reason = string(to), reason
	c.metrics.transitions.WithLabelValues(s.name, string(to)).Inc()
	if r.noticed() && from == replicas.Ready {
		c.leftByNotice(s, r, to, now)
	}
	switch to {
	case replicas.Ready:
		c.readyAgain(ctx, s, r, now)
		if r.row.ReadyAt.IsZero() {
			c.metrics.coldStart.WithLabelValues(s.name, r.row.Provider, r.row.Capacity).Observe(now.Sub(r.row.LaunchedAt).Seconds())
		}
		r.row.ReadyAt, r.fails = now, 0
	case replicas.NotReady:
		r.notReadySince = now
	case replicas.Draining:
		r.drainSince, r.drainProgress = now, time.Time{}
	case replicas.Terminated:
		r.row.EndedAt = now
	}
	// The in-memory state moves now; the row reaches the file now or, if it is locked, in
	// order once it frees (writeback.go).
	c.saveReplica(ctx, r.row, string(from), now)
	c.log.Info("replica "+string(to), "service", s.name, "replica", r.row.ID, "from", from, "reason", reason)
	switch {
	case to == replicas.Ready:
		s.crashLoop, s.nextLaunch = 0, time.Time{}
	case to == replicas.Failed && (from == replicas.Provisioning || from == replicas.Starting) && !s.deleting && !r.refused:
		s.crashLoop++
		wait := min(time.Second<<min(s.crashLoop-1, 9), 5*time.Minute)
		s.nextLaunch = now.Add(wait)
		c.event(ctx, s.name, r.row.ID, "backoff", fmt.Sprintf("%d replicas in a row failed before getting ready; next launch in %s", s.crashLoop, wait))
	}
	if from.Serving() || to.Serving() {
		c.publish()
	}
	if to == replicas.Terminated {
		delete(s.replicas, r.row.ID)
	}
}

// serviceFor maps a model name to the service that serves it: by name, else the only
// service that has not said which models it serves.
func (c *Controller) serviceFor(model string) *service {
	sorted := sortedServices(c.services)
	views := make([]fleet.Service, len(sorted))
	for i, s := range sorted {
		views[i] = fleet.Service{Name: s.name, Models: s.models()}
		views[i].Adapters, _ = s.adapters()
	}
	if i := fleet.ServiceFor(views, model); i >= 0 {
		return sorted[i]
	}
	return nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// newService builds a service's runtime from its current version.
func (c *Controller) newService(name string, version int, sp *spec.Service, now time.Time) (*service, error) {
	d, err := scaling.NewDecider(scaling.ConfigFromSpec(sp), now)
	if err != nil {
		return nil, fmt.Errorf("service %s: autoscaling: %w", name, err)
	}
	c.knowService(name)
	return &service{name: name, version: version, specs: map[int]*spec.Service{version: sp}, decider: d,
		replicas: map[string]*replica{}, setup: map[int]*sync.Mutex{}}, nil
}

// replicaByID is the replica of that ID and its service (replica IDs are unique across
// services); nil, nil when there is none. Caller holds c.mu.
func (c *Controller) replicaByID(id string) (*service, *replica) {
	for _, s := range c.services {
		if r := s.replicas[id]; r != nil {
			return s, r
		}
	}
	return nil, nil
}

func (c *Controller) provider(name string) (replicas.Provider, error) {
	p, ok := c.cfg.Providers[name]
	if !ok {
		return nil, fmt.Errorf("provider %q is not configured in this control plane", name)
	}
	return p, nil
}
