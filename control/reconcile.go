package control

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/spec"
	"github.com/arbiter-serve/arbiter/state"
)

// reportTTL is how long a router's last report counts: a router that stopped reporting
// (crashed, partitioned) must not keep a service scaled up, nor keep a drain waiting.
const reportTTL = 5 * time.Second

func (c *Controller) tick(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.leading() {
		return // a standby, or a leader that lost its lease: another one decides
	}
	c.flushPending(ctx)
	now := c.cfg.Now()
	c.flushTenants(ctx, now)
	inflight, held, byModel, view := c.levels(now)
	for _, s := range sortedServices(c.services) {
		c.countUnready(s, now)
		if s.deleting {
			c.tearDown(ctx, s)
			continue
		}
		if s.failed != "" {
			continue
		}
		smp := scaling.Sample{At: now, Requests: s.requests, Tokens: s.tokens, InFlight: inflight[s.name], Waiting: held[s.name],
			Shed: s.shed, ShedTokens: s.shedTokens}
		if s.woken && smp.Waiting == 0 {
			smp.Waiting = 1 // a wake raced ahead of the router's next report
		}
		tokens := s.tokens
		if tokens > 0 {
			if err := c.store.AddTokens(ctx, s.name, tokens); err != nil {
				c.log.Error("token count not saved; kept for the next tick", "service", s.name, "err", err)
			} else {
				tokens = 0
			}
		}
		s.requests, s.tokens, s.woken, s.shed, s.shedTokens = 0, tokens, false, 0, 0
		c.decideOwn(ctx, s, &smp, s.ownLoads(byModel, view), now.Sub(s.lastTick), now)
		s.lastTick = now
		c.flushAdapterUse(ctx, s, now)
		s.decider.Record(smp)
		d := s.decider.Decide(now, s.count(s.version, replicas.Ready), s.target)
		if own := s.ownReady(); own > 0 && d.Target > 0 {
			// Replicas of the adapters' own count toward max_replicas once ready.
			most := scaling.ConfigFromSpec(s.spec()).MaxReplicas
			if room := max(1, most-own); d.Target > room {
				d.Target, d.Reason = room, d.Reason+fmt.Sprintf("; %d of max_replicas are adapters' own → %d", own, room)
			}
		}
		s.waiting = smp.Waiting
		if s.gmix != nil {
			d.Target = s.target // sized per GPU type in placement (placeMix)
		}
		if d.Target != s.target {
			c.event(ctx, s.name, "", "scale", fmt.Sprintf("target %d → %d: %s", s.target, d.Target, d.Reason))
			c.log.Info("scale", "service", s.name, "from", s.target, "to", d.Target, "reason", d.Reason)
			dir, cause := scaleCause(s.target, d.Target, d.Panic)
			c.metrics.decisions.WithLabelValues(s.name, dir, cause).Inc()
			s.target = d.Target
		}
		s.decision = d
		c.reconcile(ctx, s, view, now)
	}
}

// routerView is what the live routers last said about replicas: their in-flight requests,
// which made progress (their engine's token counters moved), and the time of the oldest
// report (zero when no router reports).
type routerView struct {
	inflight    map[string]int
	progressing map[string]bool
	oldest      time.Time
}

// drained reports whether every live router has reported since the drain began (so saw
// the replica leave its set) and none has a request on it.
func (v routerView) drained(id string, drainSince time.Time) bool {
	if v.inflight[id] > 0 {
		return false
	}
	// A report taken within moments of the drain may predate the router's seeing it.
	return v.oldest.IsZero() || v.oldest.After(drainSince.Add(300*time.Millisecond))
}

// levels sums the routers' current in-flight and held requests per service, and what they
// say per replica, over reports fresher than reportTTL.
func (c *Controller) levels(now time.Time) (inflight, held, byModel map[string]float64, view routerView) {
	inflight, held, byModel = map[string]float64{}, map[string]float64{}, map[string]float64{}
	view = routerView{inflight: map[string]int{}, progressing: map[string]bool{}}
	for id, rr := range c.routers {
		if now.Sub(rr.at) > reportTTL {
			delete(c.routers, id)
			continue
		}
		if view.oldest.IsZero() || rr.at.Before(view.oldest) {
			view.oldest = rr.at
		}
		for _, m := range rr.rep.Models {
			if s := c.serviceFor(m.Model); s != nil {
				inflight[s.name] += m.InFlight
				held[s.name] += m.Held
				byModel[m.Model] += m.InFlight
			}
		}
		for _, l := range rr.rep.Replicas {
			view.inflight[l.ReplicaID] += l.InFlight
			if l.Progressing && l.InFlight > 0 {
				view.progressing[l.ReplicaID] = true
			}
		}
	}
	return inflight, held, byModel, view
}

// Report takes one router's load report.
func (c *Controller) Report(rep fleet.LoadReport) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.routers[rep.Router] = routerReport{at: c.cfg.Now(), rep: rep}
	c.judged(rep.Replicas)
	c.reportTenants(rep.Tenants)
	for _, m := range rep.Models {
		if s := c.serviceFor(m.Model); s != nil {
			s.requests += m.Requests
			s.tokens += m.Tokens
			s.shed += m.Shed
			s.shedTokens += m.ShedTokens
			s.served += m.Tokens
			s.countAdapter(m)
			s.mix.add(c.cfg.Now(), m.Mix)
			if m.Requests > 0 || m.InFlight > 0 || m.Held > 0 {
				s.lastRequest = c.cfg.Now()
			}
		}
	}
}

// Wake is a router's signal that a request waits for model with no replica ready.
func (c *Controller) Wake(model string) error {
	c.mu.Lock()
	s := c.serviceFor(model)
	if s != nil {
		s.woken = true
	}
	c.mu.Unlock()
	if s == nil {
		return fmt.Errorf("no service serves model %q", model)
	}
	c.kickNow()
	return nil
}

// live reports whether a replica counts toward its version's size.
func live(st replicas.State) bool {
	switch st {
	case replicas.Pending, replicas.Provisioning, replicas.Starting, replicas.Ready, replicas.NotReady:
		return true
	}
	return false
}

// liveOf counts a version's shared replicas (not the adapters' own) that run or are being
// started.
func (s *service) liveOf(version int) int {
	n := 0
	for _, r := range s.replicas {
		if r.row.Version == version && r.own() == "" && live(replicas.State(r.row.State)) {
			n++
		}
	}
	return n
}

func (s *service) count(version int, st replicas.State) int {
	n := 0
	for _, r := range s.replicas {
		if r.row.Version == version && r.own() == "" && replicas.State(r.row.State) == st {
			n++
		}
	}
	return n
}

// reconcile moves a service toward its target: launches what is missing, drains what is
// extra (rolling old versions out as new replicas get ready), finishes drains and cleans up
// failures. Caller holds c.mu.
func (c *Controller) reconcile(ctx context.Context, s *service, routers routerView, now time.Time) {
	var cur, old []*replica
	for _, r := range sortedReplicas(s.replicas) {
		c.followNotice(ctx, s, r, now)
		st := replicas.State(r.row.State)
		switch {
		case r.own() != "":
			// An adapter's own: reconcileOwn's.
		case r.noticed():
			// Serving on until followNotice drains it, but no longer counted: its
			// replacement launches now, and placement sees neither it nor its zone's room.
		case live(st) && r.row.Version == s.version:
			cur = append(cur, r)
		case live(st):
			old = append(old, r)
		}
	}
	offers, market := c.offers(ctx, s)
	c.reconcileOwn(ctx, s, offers, market, now)
	if market {
		c.place(ctx, s, cur, offers, now)
	} else {
		if missing := s.target - len(cur); missing > 0 && !now.Before(s.nextLaunch) {
			for range missing {
				c.launch(ctx, s, nil, "")
			}
		}
		if extra := len(cur) - s.target; extra > 0 {
			c.drainSome(ctx, s, cur, extra, "scale down: "+s.decision.Reason)
		}
	}
	// Rolling update: old replicas leave as new ones become ready, never before, so the
	// service always has as many ready replicas as its target allows.
	newReady := s.count(s.version, replicas.Ready)
	keep := max(0, s.target-newReady)
	oldReady := 0
	for _, r := range old {
		if replicas.State(r.row.State) == replicas.Ready {
			oldReady++
		}
	}
	if s.blueGreen && !s.switched {
		// Blue-green: the old version keeps all the traffic until the new one could take
		// it all, then both change at once (the routers get one ready set with the new
		// replicas in and the old ones draining).
		if newReady >= max(s.target, 1) || oldReady == 0 {
			s.switched = true
			c.event(ctx, s.name, "", "update", fmt.Sprintf("blue-green: %d of version %d ready (target %d): traffic switches to it; %d old replicas drain", newReady, s.version, s.target, len(old)))
			c.publish()
		} else {
			keep = oldReady
		}
	}
	if n := len(old) - min(keep, oldReady); n > 0 {
		c.drainSome(ctx, s, old, n, fmt.Sprintf("replaced by version %d", s.version))
	}
	for _, r := range s.replicas {
		if r.busy {
			continue
		}
		if r.down && live(replicas.State(r.row.State)) {
			c.drainOne(ctx, s, r, "taken down by serve down --replica-id")
		}
		switch replicas.State(r.row.State) {
		case replicas.Draining:
			switch {
			case routers.drained(r.row.ID, r.drainSince) && now.Sub(c.recoveredAt) >= reportTTL:
				// "Drained" is judged only once every router had time to report to this
				// control plane: just after a restart or a takeover they were reporting to
				// the one before, and one router's report of nothing in flight says nothing
				// of another still streaming on the replica that has not found this one yet.
				c.terminate(ctx, s, r, "drained: no request left on it")
			case routers.progressing[r.row.ID]:
				// Its requests are still generating (a long answer streams for many
				// minutes): the drain timeout counts from the last progress, so only a
				// replica whose requests stalled is cut.
				r.drainProgress = now
			case now.Sub(r.drainQuietSince()) >= c.cfg.DrainTimeout:
				c.terminate(ctx, s, r, fmt.Sprintf("drain timeout: %d requests still in flight and no progress on them for %s", routers.inflight[r.row.ID], c.cfg.DrainTimeout))
			}
		case replicas.Failed, replicas.Preempted:
			c.terminate(ctx, s, r, "cleaning up after "+r.row.State)
		case replicas.Starting, replicas.Ready, replicas.NotReady:
			if !now.Before(r.nextProbe) {
				c.check(ctx, s, r)
			}
		}
	}
}

// drainSome drains n of rs, the least useful first: not yet ready (newest first), then
// not ready, then ready (newest first, keeping the warmest caches).
func (c *Controller) drainSome(ctx context.Context, s *service, rs []*replica, n int, reason string) {
	rank := func(r *replica) int {
		switch replicas.State(r.row.State) {
		case replicas.Pending, replicas.Provisioning, replicas.Starting:
			return 0
		case replicas.NotReady:
			return 1
		}
		return 2
	}
	order := slices.Clone(rs)
	slices.SortStableFunc(order, func(a, b *replica) int {
		if d := rank(a) - rank(b); d != 0 {
			return d
		}
		return b.row.LaunchedAt.Compare(a.row.LaunchedAt)
	})
	for _, r := range order {
		if n == 0 {
			return
		}
		if r.busy {
			continue // launching: it is counted, and drained on a later tick if still extra
		}
		c.drainOne(ctx, s, r, reason)
		n--
	}
}

// drainOne takes a replica out of service: one not launched yet never will be, one
// running drains (no new requests; those in flight finish). Caller holds c.mu.
func (c *Controller) drainOne(ctx context.Context, s *service, r *replica, reason string) {
	if replicas.State(r.row.State) == replicas.Pending {
		c.transition(ctx, s, r, replicas.Failed, "not needed any more before launch: "+reason)
		return
	}
	c.transition(ctx, s, r, replicas.Draining, reason)
}

// zoneCooldown is how long placement keeps spot out of a zone that preempted a replica or
// refused a launch (the simulator's default too).
const zoneCooldown = 10 * time.Minute

// offers asks every provider the service may use for the offers placement chooses from;
// ok is false when none is a market (the local machine quotes nothing: replicas take
// arbiter.local's labels). A market that cannot quote now (a cluster that does not
// answer) is skipped and the others' offers used; with none left, placement waits rather
// than guesses. An offer with no known price is left out, never taken as free. Each such
// problem is logged and recorded as an event once, and again when it changes, and shown
// by `serve status` while it lasts.
func (c *Controller) offers(ctx context.Context, s *service) ([]scaling.Offer, bool) {
	sp := s.spec()
	ps := c.providersFor(sp)
	quotes, market, problems := quoteAll(ctx, ps, s.name, sp)
	if !market {
		// Replicas take arbiter.local's labels: that is the one place they bill in.
		if len(ps) > 0 {
			c.knowPlace(s, place{ps[0].Name(), sp.Arbiter.Local.Region, sp.Arbiter.Local.Zone, sp.Arbiter.Local.Capacity, ""})
		}
		return nil, false
	}
	offers, problems := offersOf(sp, quotes, problems)
	observed, n := s.mix.classes(c.cfg.Now())
	mix, what := sizingMix(sp, observed, n)
	sustain(sp, mix, what, offers)
	for _, o := range offers {
		c.knowPlace(s, place{o.Provider, o.Region, o.Zone, string(o.Capacity), o.Accelerator})
	}
	if msg := strings.Join(problems, "; "); msg != s.quoteErr {
		s.quoteErr = msg
		switch {
		case msg == "":
			c.log.Info("quotes are back; placement resumes", "service", s.name)
			c.event(ctx, s.name, "", "placement", "quotes are back; placement resumes")
		case len(offers) == 0:
			c.log.Error("no offers; placement waits", "service", s.name, "err", msg)
			c.event(ctx, s.name, "", "error", "placement waits: "+msg)
		default:
			// The service places (and serves) on the offers it has: a note for placement,
			// not an error in `serve logs`.
			c.log.Warn("some offers are missing; placing on the others", "service", s.name, "err", msg)
			c.event(ctx, s.name, "", "placement", "placing on the offers left: "+msg)
		}
	}
	return offers, true
}

// providersFor lists the providers a spec names, "kubernetes" standing for every
// configured cluster (kubernetes:<name>), in the spec's order.
func (c *Controller) providersFor(sp *spec.Service) []replicas.Provider {
	var out []replicas.Provider
	for _, name := range c.expandProviders(sp.Arbiter.Providers) {
		if p, ok := c.cfg.Providers[name]; ok {
			out = append(out, p)
		}
	}
	return out
}

// expandProviders maps the spec's provider names onto configured ones: "kubernetes"
// stands for every kubernetes:<name>.
func (c *Controller) expandProviders(names []string) []string {
	var out []string
	for _, n := range names {
		if n != kubernetesPrefix {
			out = append(out, n)
			continue
		}
		var all []string
		for name := range c.cfg.Providers {
			if strings.HasPrefix(name, kubernetesPrefix+":") {
				all = append(all, name)
			}
		}
		slices.Sort(all)
		out = append(out, all...)
	}
	return out
}

// kubernetesPrefix names the kubernetes providers (kubernetes:<cluster>); the control
// plane knows them only by name, so it does not link client-go.
const kubernetesPrefix = "kubernetes"

// placed is the replica as placement sees it.
func (r *replica) placed() scaling.Placed {
	st := replicas.State(r.row.State)
	return scaling.Placed{ID: r.row.ID, Capacity: fleet.Capacity(r.row.Capacity), Provider: r.row.Provider, Region: r.row.Region,
		Zone: r.row.Zone, PricePerHour: r.row.PricePerHour, Ready: st == replicas.Ready, Leaving: st == replicas.Draining,
		LaunchedAt: r.row.LaunchedAt, ReadyAt: r.row.ReadyAt}
}

// place moves the current version toward its target with the mix and zones the placer
// chooses from the provider's offers (reserved first, spot by price ratio, SpotHedge
// fallback and spread), launching and draining what its plan says, each with its rule.
// Caller holds c.mu.
func (c *Controller) place(ctx context.Context, s *service, cur []*replica, offers []scaling.Offer, now time.Time) {
	if len(offers) == 0 {
		s.unplaced = s.target > 0
		return // the provider could not quote: better to wait than to guess
	}
	if gpus := mixGPUs(s.spec(), offers); gpus != nil {
		if len(mergedAdapters(s.spec())) == 0 {
			c.placeMix(ctx, s, cur, offers, gpus, now)
			return
		}
		// The mix planner sizes every GPU type on the service's whole request mix, which
		// its adapters' own replicas would take a share of: not both at once.
		if !s.mixOffSaid {
			s.mixOffSaid = true
			c.event(ctx, s.name, "", "placement", "the GPU mix is off for this service: adapters with a merged checkpoint get replicas of their own, sized apart; one GPU type is placed by price")
		}
	}
	s.gmix = nil
	if !c.havePlacer(ctx, s, &s.placer) {
		return
	}
	existing := placedAll(cur)
	// Draining replicas of this version still run: they count against max_replicas.
	// (An update's old version does not: a rolling or blue-green update needs room beside it.)
	for _, r := range sortedReplicas(s.replicas) {
		if r.row.Version == s.version && r.own() == "" && replicas.State(r.row.State) == replicas.Draining {
			existing = append(existing, r.placed())
		}
	}
	c.applyPlan(ctx, s, s.placer.Plan(now, s.target, existing, offers), now)
}

// havePlacer makes *pl from the service's placement policy where it has none yet; false,
// with an error event, where the policy is invalid. Caller holds c.mu.
func (c *Controller) havePlacer(ctx context.Context, s *service, pl **scaling.Placer) bool {
	if *pl != nil {
		return true
	}
	p, err := scaling.NewPlacer(scaling.PlacementFromSpec(s.spec(), c.cfg.ZoneCooldown))
	if err != nil {
		c.event(ctx, s.name, "", "error", "placement: "+err.Error())
		return false
	}
	*pl = p
	return true
}

// placedAll is rs as placement sees them.
func placedAll(rs []*replica) []scaling.Placed {
	out := make([]scaling.Placed, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.placed())
	}
	return out
}

// applyPlan launches and drains what a placement plan says. Caller holds c.mu.
func (c *Controller) applyPlan(ctx context.Context, s *service, plan scaling.Plan, now time.Time) {
	s.unplaced = len(plan.Launch) == 0 && s.liveOf(s.version) < s.target
	if plan.Reason != s.placement && (len(plan.Launch) > 0 || len(plan.Drain) > 0 || s.gmix == nil) {
		s.placement = plan.Reason
		c.event(ctx, s.name, "", "placement", plan.Reason)
	}
	c.runPlan(ctx, s, plan, now, "")
}

// runPlan launches and drains what a plan says, for the shared replicas or (adapter) an
// adapter's own. Caller holds c.mu.
func (c *Controller) runPlan(ctx context.Context, s *service, plan scaling.Plan, now time.Time, adapter string) {
	if !now.Before(s.nextLaunch) {
		for _, l := range plan.Launch {
			c.launch(ctx, s, &l, adapter)
		}
	}
	for _, d := range plan.Drain {
		r := s.replicas[d.ID]
		if r == nil || r.busy {
			continue // launching: drained on a later tick if still extra
		}
		c.drainOne(ctx, s, r, "placement: "+d.Reason)
	}
}

// launch records a new replica's intent, then launches it in the background; at is the
// placer's choice of offer, or nil for a provider without a market; adapter names the
// merged adapter of a replica of that adapter's own ("" for a shared replica). The row is written
// before the provider hears of it: that is what makes a crash at any point recoverable
// without a leak. Caller holds c.mu.
func (c *Controller) launch(ctx context.Context, s *service, at *scaling.Launch, adapter string) {
	if !c.mayLaunch(ctx, s) {
		return
	}
	sp := s.spec()
	name := ""
	if ps := c.providersFor(sp); len(ps) > 0 {
		name = ps[0].Name()
	}
	if at != nil {
		name = at.Offer.Provider
	}
	p, err := c.provider(name)
	if err != nil {
		c.event(ctx, s.name, "", "error", fmt.Sprintf("arbiter.providers %v: %v", sp.Arbiter.Providers, err))
		return
	}
	// The row carries where the replica is meant to run (placement counts it there while it
	// launches) but no price until the provider has it running: a refused or failed launch
	// costs nothing.
	intent := state.Replica{Service: s.name, Version: s.version, Provider: p.Name(), State: string(replicas.Pending),
		Reason: fmt.Sprintf("target %d", s.target), Capacity: sp.Arbiter.Local.Capacity, Region: sp.Arbiter.Local.Region,
		Zone: sp.Arbiter.Local.Zone, Adapter: adapter}
	run := sp.Run
	if adapter != "" {
		var err error
		if run, err = ownRun(sp, adapter); err != nil {
			c.event(ctx, s.name, "", "error", fmt.Sprintf("adapter %s's own replica: %v", adapter, err))
			return
		}
		intent.Reason = fmt.Sprintf("adapter %s's own, target %d", adapter, s.pools[adapter].target)
	}
	// arbiter.local.price_per_hour is a node's; a replica of num_nodes nodes costs that
	// many (quotes are multiplied in quoteAll).
	price := sp.Arbiter.Local.PricePerHour * float64(max(1, sp.NumNodes))
	if at != nil {
		o := at.Offer
		intent.Capacity, intent.Region, intent.Zone, price = string(o.Capacity), o.Region, o.Zone, o.PricePerHour
		if adapter == "" {
			intent.Reason = at.Reason
		} else {
			intent.Reason += ": " + at.Reason
		}
		intent.PriceSource, intent.Accelerator = o.PriceSource, o.Accelerator
	}
	row, err := c.store.NewReplica(ctx, intent, c.cfg.Now())
	if err != nil {
		// No row, no launch: an instance the state does not name is a leak waiting for a crash.
		c.metrics.stateErrors.Inc()
		c.log.Error("cannot record launch intent; not launching", "service", s.name, "err", err, "why", state.Unavailable(err))
		return
	}
	r := &replica{row: row, busy: true}
	s.replicas[row.ID] = r
	launching := launchNote(p.Name(), at)
	c.transition(ctx, s, r, replicas.Provisioning, launching)
	c.replacing(ctx, s, r, launching)
	version, setupMu := s.version, s.setupLock(s.version)
	// Secrets reach replicas as environment variables, as envs do (SkyPilot's rule); they
	// differ only in being kept out of logs and status.
	envs := maps.Clone(sp.Envs)
	if len(sp.Secrets) > 0 {
		if envs == nil {
			envs = map[string]string{}
		}
		maps.Copy(envs, sp.Secrets)
	}
	if _, set := envs[spec.RuntimeLoRAEnv]; sp.Arbiter.LoRA.RuntimeUpdates && !set {
		// arbiter.adapters are loaded at run time: vLLM has the endpoints only with it.
		if envs == nil {
			envs = map[string]string{}
		}
		envs[spec.RuntimeLoRAEnv] = "true"
	}
	ls := replicas.LaunchSpec{ReplicaID: row.ID, Service: s.name, Version: version, Run: run, Setup: sp.Setup, Workdir: sp.Workdir, Envs: envs,
		Image: strings.TrimPrefix(sp.Resources.ImageID, "docker:"), Capacity: fleet.Capacity(row.Capacity), Region: row.Region, Zone: row.Zone,
		PricePerHour: &price, Port: sp.Service.Port, DiskGiB: sp.Resources.DiskSize,
		NumNodes: sp.NumNodes, FileMounts: sp.FileMounts, Volumes: sp.Volumes,
		PodLabels: sp.Config.KubernetesLabels, PodAnnotations: sp.Config.KubernetesAnnotations}
	if at != nil {
		ls.Accelerator, ls.AcceleratorCount, ls.InstanceType = at.Offer.Accelerator, at.Offer.AcceleratorCount, at.Offer.InstanceType
		ls.PriceSource = at.Offer.PriceSource
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		err := c.runSetup(ctx, s.name, version, setupMu, p, sp.Setup, sp.Workdir, envs)
		var inst replicas.Instance
		if err == nil {
			inst, err = p.Launch(ctx, ls)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		r.busy = false
		if err != nil {
			if errors.Is(err, replicas.ErrNoCapacity) {
				r.refused = true
				if pl := s.placerOf(r); pl != nil {
					pl.Refused(scaling.Offer{Provider: row.Provider, Region: row.Region, Zone: row.Zone, Capacity: fleet.Capacity(row.Capacity), Accelerator: row.Accelerator}, c.cfg.Now())
				}
			}
			c.transition(ctx, s, r, replicas.Failed, "launch failed: "+err.Error())
			c.replacementFailed(ctx, s, r, errors.Is(err, replicas.ErrNoCapacity), err)
			return
		}
		c.adopt(r, inst)
		c.transition(ctx, s, r, replicas.Starting, "launched; waiting for its readiness probe")
		c.replacementLaunched(ctx, s, r)
		r.nextProbe = c.cfg.Now()
	}()
}

// launchNote is a launch's event: the provider and, for a priced offer, what, where and at
// what price (nil at: the provider's own capacity).
func launchNote(provider string, at *scaling.Launch) string {
	note := "launching on " + provider
	if at == nil || at.Offer.PricePerHour <= 0 {
		return note
	}
	o := at.Offer
	note += fmt.Sprintf(" (%s %s", o.Capacity, cmp.Or(o.InstanceType, o.Accelerator, "capacity"))
	if where := cmp.Or(o.Zone, o.Region); where != "" { // a node with no zone or region label names neither
		note += " in " + where
	}
	note += fmt.Sprintf(" at $%.4f/h", o.PricePerHour)
	if o.PriceSource != "" {
		note += ", priced by " + o.PriceSource
	}
	return note + ")"
}

// mayLaunch applies the daemon-wide bounds on launching: the replica ceiling and the
// launch rate. A launch held back is tried again on a later tick; the service's events say
// why, once. Caller holds c.mu.
func (c *Controller) mayLaunch(ctx context.Context, s *service) bool {
	held := ""
	if n := c.liveReplicas(); n >= c.cfg.MaxReplicas && !s.surgeOne() {
		held = fmt.Sprintf("launches wait: this control plane runs %d replicas, its ceiling (serve daemon --max-replicas %d)", n, c.cfg.MaxReplicas)
	} else if !c.launches.AllowN(c.cfg.Now(), 1) {
		held = fmt.Sprintf("launches wait: more than %g launches a second (burst %d) over all services", c.cfg.LaunchesPerSecond, c.cfg.LaunchBurst)
	}
	if held != s.held {
		if held != "" {
			c.event(ctx, s.name, "", "launch", held)
			c.log.Warn("launch held back", "service", s.name, "why", held)
		}
		s.held = held
	}
	return held == ""
}

// surgeOne reports whether a rolling update at the ceiling may start one replica beyond
// it: the service still runs old-version replicas, which leave only as new ones get ready,
// and none of the new version is on its way yet. Without it a service as large as the
// ceiling could never be updated; with it the fleet passes the ceiling by one per
// updating service, for one replica's start.
func (s *service) surgeOne() bool {
	old, starting := false, false
	for _, r := range s.replicas {
		st := replicas.State(r.row.State)
		switch {
		case r.row.Version != s.version && live(st):
			old = true
		case r.row.Version == s.version && live(st) && st != replicas.Ready:
			starting = true
		}
	}
	return old && !starting
}

// liveReplicas counts the replicas of every service that run or are being started.
// Caller holds c.mu.
func (c *Controller) liveReplicas() int {
	n := 0
	for _, s := range c.services {
		for _, r := range s.replicas {
			if live(replicas.State(r.row.State)) {
				n++
			}
		}
	}
	return n
}

func (c *Controller) adopt(r *replica, inst replicas.Instance) {
	r.row.Handle, r.row.Address = inst.Handle, inst.Address
	r.row.Capacity, r.row.Region, r.row.Zone, r.row.PricePerHour = string(inst.Capacity), inst.Region, inst.Zone, inst.PricePerHour
	if inst.PriceSource != "" {
		r.row.PriceSource = inst.PriceSource
	}
}

func (s *service) setupLock(version int) *sync.Mutex {
	if s.setup[version] == nil {
		s.setup[version] = &sync.Mutex{}
	}
	return s.setup[version]
}

// runSetup runs a version's setup once (recorded in the state, so a restart does not run
// it again); concurrent launches of the version wait for it.
func (c *Controller) runSetup(ctx context.Context, service string, version int, mu *sync.Mutex, p replicas.Provider, setup, workdir string, envs map[string]string) error {
	mu.Lock()
	defer mu.Unlock()
	v, err := c.store.GetVersion(ctx, service, version)
	if err != nil {
		return err
	}
	if v.SetupDone {
		return nil
	}
	if err := p.Setup(ctx, service, version, setup, workdir, envs); err != nil {
		return err
	}
	return c.store.MarkSetupDone(ctx, service, version)
}

// check asks the provider whether the replica still runs and probes its readiness, in the
// background. Caller holds c.mu.
func (c *Controller) check(ctx context.Context, s *service, r *replica) {
	sp := s.specs[r.row.Version]
	if sp == nil {
		sp = s.spec()
	}
	rp := sp.Service.ReadinessProbe
	probe := replicas.ProbeSpec{Path: rp.Path, PostData: rp.PostData, Headers: rp.Headers, Timeout: seconds(rp.TimeoutSeconds)}
	interval := seconds(sp.Arbiter.Readiness.ProbeIntervalSeconds)
	threshold := sp.Arbiter.Readiness.FailureThreshold
	budget := seconds(sp.Arbiter.Readiness.ReadyBudgetSeconds)
	p, err := c.provider(r.row.Provider)
	if err != nil {
		c.transition(ctx, s, r, replicas.Failed, err.Error())
		return
	}
	r.busy = true
	row := r.row
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		st, why, serr := p.Status(ctx, row.Handle)
		var perr error
		var models []string
		addr := row.Address
		if serr != nil {
			// A provider that cannot say (a cluster that does not answer) is a failed probe,
			// not a pass: the replica may be gone with its cluster.
			perr = fmt.Errorf("provider %s: %w", row.Provider, serr)
		} else if st == replicas.StatusRunning {
			if addr == "" {
				addr = c.addressOf(ctx, p, row)
			}
			perr = replicas.Probe(ctx, c.probes, addr, probe)
			if perr == nil && replicas.State(row.State) != replicas.Ready {
				models = c.servedModels(ctx, addr, probe.Timeout)
			}
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		r.busy = false
		now := c.cfg.Now()
		r.nextProbe = now.Add(interval)
		if replicas.State(r.row.State) == replicas.Starting {
			// Every second of a cold start is a second that requests held at zero wait:
			// probe a starting replica at least once a second.
			r.nextProbe = now.Add(min(interval, time.Second))
		}
		if ctx.Err() != nil || replicas.State(r.row.State) != replicas.State(row.State) {
			return // stopping, or moved (drained) while we probed
		}
		if serr != nil {
			if r.unansweredSince.IsZero() {
				r.unansweredSince = now
			}
			if now.Sub(r.unansweredSince) >= unansweredBudget {
				// Its cluster (or cloud API) is lost to us: serve from elsewhere now, and end
				// this one when its provider answers again (terminate retries until then).
				r.refused = true // not the replica's fault: no crash-loop backoff
				c.transition(ctx, s, r, replicas.Failed, fmt.Sprintf("%s has not answered for %s (%v); replacing it elsewhere, and ending it once %s answers",
					row.Provider, now.Sub(r.unansweredSince).Round(time.Second), serr, row.Provider))
				return
			}
		} else {
			r.unansweredSince = time.Time{}
		}
		if serr == nil && st == replicas.StatusGone {
			c.transition(ctx, s, r, replicas.Failed, "gone: "+cmp.Or(why, "its process exited or the instance is gone"))
			return
		}
		if r.row.Address == "" {
			r.row.Address = addr
		}
		switch replicas.State(r.row.State) {
		case replicas.Starting:
			if perr == nil {
				c.learnModels(ctx, s, r, models)
				c.transition(ctx, s, r, replicas.Ready, fmt.Sprintf("readiness probe passed after %s", now.Sub(r.row.LaunchedAt).Round(100*time.Millisecond)))
			} else if now.Sub(r.row.LaunchedAt) > budget {
				hint := ""
				if errors.Is(perr, syscall.ECONNREFUSED) {
					// A vLLM binds its port before it loads (connections wait, they are not
					// refused): refused all along, the server most likely listens elsewhere.
					hint = fmt.Sprintf(": nothing listens on %s, where the provider told it to ($PORT); does the run: command's server listen on another port?", addr)
				}
				c.transition(ctx, s, r, replicas.Failed, fmt.Sprintf("not ready within its %s budget (last probe: %v)%s; replacing it", budget, perr, hint))
			}
		case replicas.Ready:
			if perr == nil {
				r.fails = 0
			} else if r.fails++; r.fails >= threshold {
				c.transition(ctx, s, r, replicas.NotReady, fmt.Sprintf("%d probes failed in a row: %v", r.fails, perr))
			}
		case replicas.NotReady:
			// Back only after as many passes in a row as failures took it out: a /health that
			// flaps on every probe must not move it in and out of every router's set.
			if perr == nil {
				if r.passes++; r.passes >= threshold {
					r.fails, r.passes = 0, 0
					c.transition(ctx, s, r, replicas.Ready, fmt.Sprintf("readiness probe passed again, %d times in a row", threshold))
				}
				return
			}
			r.passes = 0
			if now.Sub(r.notReadySince) > budget {
				c.transition(ctx, s, r, replicas.Failed, fmt.Sprintf("not ready for %s: %v; replacing it", budget, perr))
			}
		}
	}()
}

// unansweredBudget is how long a replica's provider may fail to say whether it runs before
// the replica is written off and replaced elsewhere.
const unansweredBudget = 30 * time.Second

// terminateRetry spaces out attempts to terminate through a provider that failed.
const terminateRetry = 10 * time.Second

// terminateFailed schedules the next attempt to end a replica, backing off from
// terminateRetry to 30 s, and logs a failure when it is new or says something new. The cap
// is low because an attempt on a provider that does not answer fails at once without a
// call (the provider knows it is unreachable), and a cluster that comes back should see its
// written-off replicas ended within seconds, not at the end of a long backoff. Caller holds
// c.mu.
func (c *Controller) terminateFailed(ctx context.Context, s *service, r *replica, err error) {
	if r.purge || (s.deleting && s.purge) {
		// Purged: the row ends here, and an instance that still runs is no row's, which
		// the audit ends once the provider answers again.
		msg := fmt.Sprintf("purged: termination not confirmed (%v); if %s still runs it, the audit ends it by its tags", err, r.row.Provider)
		if r.row.Handle != "" {
			msg += " (handle " + r.row.Handle + ")"
		}
		c.log.Warn("replica written off without a confirmed termination", "service", s.name, "replica", r.row.ID, "provider", r.row.Provider, "handle", r.row.Handle, "err", err)
		c.event(ctx, s.name, r.row.ID, "purge", msg)
		c.transition(ctx, s, r, replicas.Terminated, msg)
		return
	}
	r.terminateWait = min(max(r.terminateWait*2, terminateRetry), 30*time.Second)
	r.terminateAfter = c.cfg.Now().Add(r.terminateWait)
	if msg := err.Error(); msg != r.terminateErr {
		r.terminateErr = msg
		c.log.Error("terminate failed; will retry", "replica", r.row.ID, "in", r.terminateWait, "err", err)
	}
}

// addressOf finds the address of a replica adopted before it had one (a pod found
// pending after a restart): the provider's list has it once it runs.
func (c *Controller) addressOf(ctx context.Context, p replicas.Provider, row state.Replica) string {
	insts, err := p.List(ctx)
	if err != nil {
		return ""
	}
	for _, in := range insts {
		if in.Handle == row.Handle || in.ReplicaID == row.ID {
			return in.Address
		}
	}
	return ""
}

// servedModels asks a replica which models it serves (the OpenAI /v1/models list).
func (c *Controller) servedModels(ctx context.Context, addr string, timeout time.Duration) []string {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/models", nil)
	if err != nil {
		return nil
	}
	resp, err := c.probes.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list) != nil {
		return nil
	}
	var out []string
	for _, m := range list.Data {
		if m.ID != "" {
			out = append(out, m.ID)
		}
	}
	return out
}

// terminate stops a replica through its provider in the background and marks it
// terminated once the provider confirms. Caller holds c.mu.
func (c *Controller) terminate(ctx context.Context, s *service, r *replica, reason string) {
	st := replicas.State(r.row.State)
	if st != replicas.Draining && st != replicas.Failed && st != replicas.Preempted {
		c.transition(ctx, s, r, replicas.Draining, reason)
	}
	if c.cfg.Now().Before(r.terminateAfter) {
		return // the last attempt failed moments ago
	}
	p, err := c.provider(r.row.Provider)
	if err != nil {
		c.terminateFailed(ctx, s, r, err)
		return
	}
	if err := c.confirmLead(ctx); err != nil {
		c.log.Warn("not terminating: this control plane no longer leads", "replica", r.row.ID, "err", err)
		return
	}
	r.busy = true
	row := r.row
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		// Termination must finish even when the control plane is stopping: a replica whose
		// termination was cut short is found and finished after the restart anyway, but not
		// starting one that was decided is better.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		err := c.terminateInstance(tctx, p, row)
		c.mu.Lock()
		defer c.mu.Unlock()
		r.busy = false
		if err != nil {
			c.terminateFailed(ctx, s, r, err)
			return
		}
		c.transition(ctx, s, r, replicas.Terminated, reason)
	}()
}

// terminateInstance terminates by handle, or, for a replica whose launch was never
// recorded back (a crash mid-launch), by finding it in the provider's own list.
func (c *Controller) terminateInstance(ctx context.Context, p replicas.Provider, row state.Replica) error {
	if row.Handle != "" {
		return p.Terminate(ctx, row.Handle)
	}
	insts, err := p.List(ctx)
	if err != nil {
		return err
	}
	for _, in := range insts {
		if in.ReplicaID == row.ID {
			if err := p.Terminate(ctx, in.Handle); err != nil {
				return err
			}
		}
	}
	return nil
}

// tearDown terminates every replica of a deleted service, then forgets it. Caller holds c.mu.
func (c *Controller) tearDown(ctx context.Context, s *service) {
	for _, r := range s.replicas {
		if r.busy {
			continue
		}
		if replicas.State(r.row.State) == replicas.Pending {
			c.transition(ctx, s, r, replicas.Failed, "service deleted before launch")
		}
		c.terminate(ctx, s, r, "service deleted")
	}
	if len(s.replicas) > 0 {
		return
	}
	if err := c.store.DeleteService(ctx, s.name, c.cfg.Now()); err != nil {
		c.log.Error("delete service", "service", s.name, "err", err)
		return
	}
	delete(c.services, s.name)
	c.publish()
	c.log.Info("service deleted", "service", s.name)
}
