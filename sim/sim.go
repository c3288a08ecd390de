package sim

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/market"
	"github.com/arbiter-serve/arbiter/router"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/traces"
)

const (
	// scrapeEvery and staleAfter are the router's defaults (scrape_interval, 3× it).
	scrapeEvery = 250 * time.Millisecond
	staleAfter  = 3 * scrapeEvery
	sampleEvery = time.Second
	// rtt is the router-to-replica round trip the predictor is given.
	rtt = time.Millisecond
)

// replica is one simulated VM running one engine.
type replica struct {
	id       string
	offer    scaling.Offer
	launched time.Duration
	readyAt  time.Duration // when its cold start ended (0: not yet, or ready from the start)
	ready    bool          // cold start over
	draining bool
	dead     bool // the VM is gone
	known    bool // dead, and the control plane knows
	ended    bool // terminated or dead: no longer billed
	noticed  bool
	eng      *engine.Engine
	// views are each router's view of the replica (Inputs.Routers), in router order.
	views    []*router.Replica
	stepping bool
	step     engine.StepResult // the pass in progress; applied when it ends
	reqs     map[uint64]*request
	gen      uint32
	// lastSent is the request sent last, at lastSentAt: one sent in the same instant makes
	// both a burst (see Result.PredictionError).
	lastSent   *request
	lastSentAt time.Duration
}

// age is the replica's age for the trace at now: "launched Ns ago, ready Ms" (or "not
// ready").
func (r *replica) age(now time.Duration) string {
	ready := "not ready"
	if r.ready {
		ready = fmt.Sprintf("ready %.0fs", (now - r.readyAt).Seconds())
	}
	return fmt.Sprintf("launched %.0fs ago, %s", (now - r.launched).Seconds(), ready)
}

// request is one trace request on its way through the system.
type request struct {
	// burst: another request reached the same replica in the same instant (the trace's
	// timestamps coincide).
	burst bool
	id    uint64
	tr    *traces.Request
	route router.Request
	pred  router.Prediction
	// router is the router the balancer sent the request to; peers, with a shared view,
	// the request as each other router's view holds it (by router; its own unused), once
	// the peers have applied its begin (Inputs.PeerDelay later).
	router   int
	peers    []router.PeerRequest
	rep      *replica
	sentAt   time.Duration
	firstAt  time.Duration
	attempts int
	heldAt   time.Duration
	held     bool
	// lateUntil is when a late request (router.Request.Late) stops waiting for room: as
	// long again as it was held, or half the time its deadline leaves if less.
	lateUntil time.Duration
	// heldFor is how long it waited for a replica because none was ready.
	heldFor time.Duration
}

type simulation struct {
	sys System
	in  *Inputs
	w   wiring
	mkt *market.Market
	// routers are the routers requests go through: one unless Inputs.Routers.
	routers []simRouter
	dec     *scaling.Decider
	placer  *scaling.Placer
	rng     *rand.Rand
	q       queue
	now     time.Duration
	end     time.Duration

	reqs     []traces.Request
	next     int
	blockTok int
	drops    []market.Drop

	live   []*replica // launched and not ended, in launch order
	byView map[*router.Replica]*replica
	lbList []*replica // a polling balancer's ready list
	held   []*request
	// late are requests held past their TTFT target and released since: they wait in the
	// router for a replica with room (router.Request.Late), in arrival order.
	late   []*request
	target int
	nextID int

	// since the last sample
	arrivals, tokens float64

	res   *Result
	cands []*router.Replica
	// mix is the mixed fleet (Inputs.Model set), nil otherwise.
	mix *mixFleet
}

// Run simulates one system on the inputs.
func Run(sys System, in Inputs) (*Result, error) {
	if err := in.validate(); err != nil {
		return nil, err
	}
	w, err := wire(sys, &in)
	if err != nil {
		return nil, err
	}
	s := &simulation{sys: sys, in: &in, w: w, end: in.Duration, byView: map[*router.Replica]*replica{},
		rng: rand.New(rand.NewPCG(in.Seed, uint64(len(sys)))), blockTok: in.Requests.BlockTokens}
	if s.mkt, err = market.New(market.Config{Catalog: in.Catalog, Resources: in.Spec.Resources, Start: in.Start, Spot: in.Spot, Offset: in.SpotOffset, Reading: in.Reading}); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	for range max(in.Routers, 1) {
		rt, err := newSimRouter(w.routing, s.blockTok, in.ScanAll)
		if err != nil {
			return nil, err
		}
		s.routers = append(s.routers, rt)
	}
	if s.dec, err = scaling.NewDecider(w.scaling, s.clock()); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	if s.placer, err = scaling.NewPlacer(w.placement); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	s.reqs = in.Requests.Tile(in.Duration)
	s.drops = s.mkt.Drops(0, in.Duration)
	s.res = &Result{System: sys, Simulated: in.Duration, Failed: map[string]int{}, ReplicaHours: map[string]float64{},
		GPUHours: map[string]float64{}, GPUDollars: map[string]float64{}, Percentile: w.slo.Percentile}
	if err := s.setupMix(); err != nil {
		return nil, err
	}
	s.res.SLO.TTFT, s.res.SLO.TPOT = w.slo.TTFT, w.slo.TPOT
	s.res.HoldBound = HoldBound(in.Spec)
	if s.res.Percentile <= 0 {
		s.res.Percentile = 0.9
	}

	start := time.Now()
	s.run()
	s.res.Wall = time.Since(start)
	if s.mix != nil && s.mix.planner != nil && s.sys == ArbiterMix {
		s.res.Headroom = map[string]float64{}
		for _, g := range s.mix.gpus {
			g = strings.ToUpper(g)
			s.res.Headroom[g] = s.mix.planner.Headroom(g)
		}
	}
	s.res.finish()
	return s.res, nil
}

// clock is the wall-clock time the decision code sees.
func (s *simulation) clock() time.Time { return s.in.Start.Add(s.now) }

func (s *simulation) at(d time.Duration, e event) {
	e.at = s.now + d
	s.q.push(e)
}

func (s *simulation) run() {
	if s.in.Warm {
		// The day starts with the service up: min_replicas placed and ready at t=0.
		s.target = s.w.scaling.MinReplicas
		// A zone without spot capacity refuses its launch at once; the next plans go
		// elsewhere (another zone, or on-demand), as a service that was up would have.
		for range 8 {
			if s.decide(); len(s.live) >= s.target {
				break
			}
		}
		for _, r := range s.live {
			r.gen++ // their cold-start events are void
			s.becameReady(r)
		}
	}
	s.at(0, event{kind: evScrape})
	s.at(sampleEvery, event{kind: evSample})
	s.at(0, event{kind: evDecide})
	if s.w.lbSync > 0 {
		s.at(0, event{kind: evSync})
	}
	for i, d := range s.drops {
		lead := time.Duration(0)
		if s.w.useNotices {
			lead = d.Notice
		}
		s.q.push(event{at: max(d.At-lead, 0), kind: evDrop, idx: i})
	}
	for {
		nextArrival := time.Duration(math.MaxInt64)
		if s.next < len(s.reqs) {
			nextArrival = s.reqs[s.next].At
		}
		if s.q.len() > 0 && s.q.peek().at <= nextArrival {
			e := s.q.pop()
			if e.at >= s.end {
				break
			}
			s.now = e.at
			s.res.Events++
			s.handle(e)
			continue
		}
		if nextArrival >= s.end {
			break
		}
		s.now = nextArrival
		s.res.Events++
		s.arrive(&s.reqs[s.next])
		s.next++
	}
	s.now = s.end
	for _, r := range slices.Clone(s.live) {
		s.bill(r)
	}
	// Requests still open at the end are neither successes nor failures of the system:
	// they are left out of the denominators.
	s.res.Requests -= s.open()
}

func (s *simulation) open() int {
	n := len(s.held) + len(s.late)
	for _, r := range s.live {
		n += len(r.reqs)
	}
	for i := range s.q.ev {
		if s.q.ev[i].kind == evRetry {
			n++
		}
	}
	return n
}

func (s *simulation) handle(e event) {
	switch e.kind {
	case evStep:
		if e.rep.gen == e.gen {
			s.stepped(e.rep)
		}
	case evReady:
		if e.rep.gen == e.gen && !e.rep.ended {
			s.becameReady(e.rep)
		}
	case evDrop:
		s.announceDrop(e.idx)
	case evKill:
		if !e.rep.dead && !e.rep.ended {
			s.kill(e.rep)
		}
	case evDetect:
		s.detected(e.rep)
	case evTerminate:
		if !e.rep.ended {
			s.terminate(e.rep)
		}
	case evRetry:
		s.dispatch(e.req)
	case evScrape:
		s.scrape()
		s.at(scrapeEvery, event{kind: evScrape})
	case evSample:
		s.sample()
		s.at(sampleEvery, event{kind: evSample})
	case evDecide:
		s.decide()
		s.at(s.w.decideInt, event{kind: evDecide})
	case evWake:
		s.decide()
	case evEnqueue:
		if e.rep.gen == e.gen {
			s.enqueue(e.rep, e.req)
		}
	case evSync:
		s.sync()
		s.at(s.w.lbSync, event{kind: evSync})
	case evPeer:
		e.fn()
	}
}

// --- requests: in → pick a replica → engine → account ---

func (s *simulation) arrive(tr *traces.Request) {
	s.res.Requests++
	s.arrivals++
	req := &request{id: uint64(s.next) + 1, tr: tr, heldAt: -1, router: s.next % len(s.routers)}
	req.route = router.Request{PromptTokens: max(tr.InputTokens, 1), OutTokens: max(tr.OutputTokens, 1), Prefix: tr.PrefixBlocks, BlockTokens: float64(s.blockTok), SLO: s.w.slo, Streamed: true}
	if s.mix != nil && s.mix.planner != nil {
		// The routers' accounting of the request mix (issue 36): its prompt and output
		// lengths, counted at arrival (a router learns the output length as it streams).
		s.mix.planner.Record(s.clock(), req.route.PromptTokens, req.route.OutTokens)
	}
	s.dispatch(req)
}

func (s *simulation) dispatch(req *request) {
	cands := s.candidates(req.router)
	if len(cands) == 0 && req.route.Late {
		s.late = append(s.late, req) // it waits for room, and for a replica first
		if s.target == 0 {
			s.at(0, event{kind: evWake}) // the router's wake call, as hold's
		}
		return
	}
	if len(cands) == 0 {
		if s.w.holdAtZero {
			s.hold(req)
			return
		}
		s.fail("no_replica")
		return
	}
	req.route.Now = s.clock()
	if req.route.Late && s.now >= req.lateUntil {
		req.route.Late = false
	}
	picked := s.routers[req.router].policy.Pick(&req.route, cands, s.rng)
	if picked == nil { // a late request (router.Request.Late) with no room: it waits on
		s.late = append(s.late, req)
		return
	}
	req.route.Late = false // a retry goes wherever it can
	rep := s.byView[picked]
	req.attempts++
	if rep.dead {
		// A stale balancer list: the connection is refused, which may be retried.
		if req.attempts <= s.w.retries {
			s.at(s.w.retryBackoff(req.attempts-1), event{kind: evRetry, req: req})
			return
		}
		s.fail("connection")
		return
	}
	if req.held {
		req.held = false
		wait := s.now - req.heldAt
		req.heldFor += wait
		s.res.ZeroWaits++
		s.res.MaxZeroWait = max(s.res.MaxZeroWait, wait)
	}
	s.begin(rep, req)
	if rep.lastSent != nil && rep.lastSentAt == s.now {
		rep.lastSent.burst, req.burst = true, true
	}
	rep.lastSent, rep.lastSentAt = req, s.now
	req.rep, req.sentAt, req.firstAt = rep, s.now, -1
	rep.reqs[req.id] = req
	// The replica's server prepares the prompt (parses and tokenizes it) before its engine
	// sees it, as vLLM's does, and as the router's model of a replica expects.
	s.at(time.Duration(req.route.PromptTokens)*router.PrepPerToken, event{kind: evEnqueue, rep: rep, req: req, gen: rep.gen})
}

// enqueue hands a prepared request to the replica's engine.
func (s *simulation) enqueue(rep *replica, req *request) {
	if rep.reqs[req.id] != req || rep.dead || rep.eng == nil {
		return // the replica went (its requests were failed with it)
	}
	err := rep.eng.Add(engine.Request{ID: req.id, PromptTokens: req.route.PromptTokens, MaxTokens: req.route.OutTokens,
		BlockHashes: engineBlocks(req.tr.PrefixBlocks, s.blockTok, rep.eng.Profile().BlockSize, req.route.PromptTokens)})
	if err != nil {
		delete(rep.reqs, req.id)
		s.release(rep, req)
		s.fail("too_long")
		return
	}
	s.kick(rep)
}

// candidates are the replicas router k's balancer may pick now, as its views.
func (s *simulation) candidates(k int) []*router.Replica {
	s.cands = s.cands[:0]
	if s.w.lbSync > 0 {
		for _, r := range s.lbList {
			s.cands = append(s.cands, r.views[k])
		}
		router.SortByCost(s.cands)
		return s.cands
	}
	now := s.clock()
	for _, r := range s.live {
		if r.ready && !r.draining && !r.dead && r.views[k].Available(now) {
			s.cands = append(s.cands, r.views[k])
		}
	}
	router.SortByCost(s.cands) // as the router's pool keeps them
	return s.cands
}

// fleetLine describes each live replica for the trace: capacity, state, age.
func (s *simulation) fleetLine() string {
	var b strings.Builder
	fmt.Fprintf(&b, "target %d, alive %d:", s.target, len(s.live))
	for _, r := range s.live {
		state := "starting"
		switch {
		case r.dead:
			state = "dead"
		case r.noticed:
			state = "noticed"
		case r.draining:
			state = "draining"
		case r.ready:
			state = "ready"
		}
		fmt.Fprintf(&b, " %s %s %.0fs;", r.offer.Capacity, state, (s.now - r.launched).Seconds())
	}
	return b.String()
}

// hold keeps req until a replica is ready. A request is never on s.held when it is
// dispatched (becameReady empties the list first), so it goes on it here even when it was
// held before (a held request sent to a replica that had died, whose retry finds none).
func (s *simulation) hold(req *request) {
	if !req.held {
		req.held, req.heldAt = true, s.now
	}
	if len(s.held) == 0 && s.in.Trace != nil {
		fmt.Fprintf(s.in.Trace, "%8.0fs held: no ready replica; %s\n", s.now.Seconds(), s.fleetLine())
	}
	s.held = append(s.held, req)
	if s.target == 0 {
		// The router's wake call: the control plane decides at once.
		s.at(0, event{kind: evWake})
	}
}

// kick starts the replica's next forward pass if it is idle and has work.
func (s *simulation) kick(r *replica) {
	if r.stepping || r.dead || r.eng == nil || r.eng.Idle() {
		return
	}
	r.step = r.eng.Step()
	r.stepping = true
	s.at(max(r.step.Duration, time.Microsecond), event{kind: evStep, rep: r, gen: r.gen})
}

func (s *simulation) stepped(r *replica) {
	r.stepping = false
	for _, em := range r.step.Emits {
		req := r.reqs[em.ID]
		if req == nil {
			continue
		}
		if em.Index == 0 {
			req.firstAt = s.now
			s.firstToken(r, req)
		}
		if em.Done {
			s.complete(r, req)
		}
	}
	if len(s.late) > 0 {
		s.releaseLate()
	}
	s.kick(r)
}

func (s *simulation) complete(r *replica, req *request) {
	delete(r.reqs, req.id)
	s.release(r, req)
	out := req.route.OutTokens
	ttft := (req.firstAt - req.tr.At).Seconds()
	e2e := (s.now - req.tr.At).Seconds()
	tpot := 0.0
	if out > 1 {
		tpot = (s.now - req.firstAt).Seconds() / float64(out-1)
	}
	r.views[req.router].Completed(&req.route, req.pred, (req.firstAt - req.sentAt).Seconds(), (s.now - req.sentAt).Seconds(), out, true)
	res := s.res
	res.Succeeded++
	if req.heldFor > res.HoldBound {
		res.HeldLong++
	}
	res.requestSeconds += e2e
	res.InputTokens += int64(req.route.PromptTokens)
	res.OutputTokens += int64(out)
	s.tokens += float64(req.route.PromptTokens + out)
	res.ttfts = append(res.ttfts, ttft)
	res.predicted = append(res.predicted, req.pred.TTFT)
	res.sentTTFT = append(res.sentTTFT, (req.firstAt - req.sentAt).Seconds())
	res.burst = append(res.burst, req.burst)
	if out > 1 {
		res.tpots = append(res.tpots, tpot)
	}
	slo := s.w.slo
	within := func(ttft, e2e float64) bool {
		return (slo.TTFT <= 0 || ttft <= slo.TTFT) && (slo.TPOT <= 0 || tpot <= slo.TPOT) && (slo.E2E <= 0 || e2e <= slo.E2E)
	}
	if within(ttft, e2e) {
		res.SLOMet++
	}
	if s.mix != nil && s.mix.planner != nil {
		// The replica's GPU type is judged on what it did, from the router's send (as a
		// router's load report says it): a wait for a replica is not the type's.
		met := int64(0)
		if within((req.firstAt - req.sentAt).Seconds(), (s.now - req.sentAt).Seconds()) {
			met = 1
		}
		s.mix.planner.Outcome(s.clock(), strings.ToUpper(r.offer.Accelerator), 1, met)
	}
	if r.draining && len(r.reqs) == 0 && s.w.drainFor == 0 {
		s.terminate(r)
	}
}

func (s *simulation) fail(why string) {
	s.res.Failed[why]++
}

// engineBlocks expands a trace's prefix blocks (blockTok tokens each, ids already unique
// per prefix) into the engine's smaller blocks, covering at most the prompt.
func engineBlocks(ids []uint64, blockTok, size, prompt int) []uint64 {
	if len(ids) == 0 || blockTok <= 0 || size <= 0 {
		return nil
	}
	per := blockTok / size
	n := min(len(ids)*per, prompt/size)
	out := make([]uint64, n)
	var key [16]byte
	for i := range out {
		binary.LittleEndian.PutUint64(key[:8], ids[i/per])
		binary.LittleEndian.PutUint64(key[8:], uint64(i%per))
		out[i] = xxhash.Sum64(key[:])
	}
	return out
}

// --- observation: what routers and the autoscaler see ---

func (s *simulation) scrape() {
	now := s.clock()
	for _, r := range s.live {
		if r.ready && !r.dead {
			st := r.eng.Stats()
			for _, v := range r.views {
				v.ObserveEngine(now, st.Running, st.Waiting, st.KVUsage)
			}
		}
	}
}

// timeOut fails the requests of waiting (held, or late) that have waited holdTimeout, and
// returns the others.
func (s *simulation) timeOut(waiting []*request) []*request {
	kept := waiting[:0]
	for _, req := range waiting {
		if s.now-req.heldAt >= s.w.holdTimeout {
			req.held = false
			s.fail("timeout")
			continue
		}
		kept = append(kept, req)
	}
	clear(waiting[len(kept):])
	return kept
}

func (s *simulation) sample() {
	inflight := 0
	for _, r := range s.live {
		if !r.dead {
			inflight += len(r.reqs)
		}
	}
	if s.w.holdAtZero && len(s.held) > 0 {
		s.held = s.timeOut(s.held)
	}
	if len(s.late) > 0 {
		s.late = s.timeOut(s.late)
		s.releaseLate()
	}
	s.dec.Record(scaling.Sample{At: s.clock(), Requests: s.arrivals, InFlight: float64(inflight), Waiting: float64(len(s.held) + len(s.late)), Tokens: s.tokens})
	s.arrivals, s.tokens = 0, 0
}

// sync refreshes a polling balancer's list with what the control plane believes READY.
func (s *simulation) sync() {
	s.lbList = s.lbList[:0]
	for _, r := range s.live {
		if r.ready && !r.draining && !r.known {
			s.lbList = append(s.lbList, r)
		}
	}
}

// --- the control plane: decide, place, launch, drain ---

func (s *simulation) decide() {
	if s.mix != nil && s.mix.placers != nil {
		s.decideMix()
		return
	}
	ready := 0
	var placed []scaling.Placed
	for _, r := range s.live {
		leaving := r.draining || r.known
		if r.ready && !leaving {
			ready++
		}
		placed = append(placed, r.placed(s.in.Start, leaving))
	}
	d := s.dec.Decide(s.clock(), ready, s.target)
	if s.in.Trace != nil && d.Target != s.target {
		fmt.Fprintf(s.in.Trace, "%8.0fs target %d → %d (ready %d): %s\n", s.now.Seconds(), s.target, d.Target, ready, d.Reason)
	}
	s.target = d.Target
	plan := s.placer.Plan(s.clock(), s.target, placed, s.offers())
	for _, l := range plan.Launch {
		if s.in.Trace != nil {
			fmt.Fprintf(s.in.Trace, "%8.0fs launch: %s\n", s.now.Seconds(), l.Reason)
		}
		s.launch(l.Offer)
	}
	for _, dr := range plan.Drain {
		for _, r := range s.live {
			if r.id == dr.ID {
				if s.in.Trace != nil {
					fmt.Fprintf(s.in.Trace, "%8.0fs drain %s %s in %s at $%.2f/h (%s): %s\n", s.now.Seconds(), r.offer.Capacity, r.id, r.offer.Zone, r.offer.PricePerHour, r.age(s.now), dr.Reason)
				}
				s.drain(r)
				break
			}
		}
	}
}

func (s *simulation) launch(o scaling.Offer) {
	held := 0
	if o.Capacity == fleet.Spot {
		p := market.Place(o.Provider, o.Region, o.Zone)
		if held = s.spotHeld(p); held >= s.mkt.SpotLimit(p, s.now) {
			s.res.LaunchFailures++
			s.placerFor(o).Refused(o, s.clock())
			return
		}
	}
	eng, err := engine.New(s.profileFor(o))
	if err != nil {
		panic(err) // validated in Run
	}
	s.nextID++
	r := &replica{id: strconv.Itoa(s.nextID), offer: o, launched: s.now, eng: eng, reqs: map[uint64]*request{}}
	prof := eng.Profile()
	for range s.routers {
		v := router.NewDetachedReplica(fleet.Replica{ID: r.id, Model: "m", Address: "sim:" + r.id, Provider: o.Provider,
			Region: o.Region, Zone: o.Zone, Capacity: o.Capacity, PricePerHour: o.PricePerHour, Profile: prof.Name, Accelerator: o.Accelerator}, &prof)
		r.views = append(r.views, v)
		s.byView[v] = r
	}
	s.live = append(s.live, r)
	s.res.Launches++
	s.res.PeakReplicas = max(s.res.PeakReplicas, len(s.live))
	if o.Capacity == fleet.Spot {
		s.res.PeakSpotInZone = max(s.res.PeakSpotInZone, held+1)
	}
	s.at(s.in.ColdStart, event{kind: evReady, rep: r, gen: r.gen})
}

// placed is the replica as placement sees it, its launch and readiness on the clock that
// starts at start.
func (r *replica) placed(start time.Time, leaving bool) scaling.Placed {
	p := scaling.Placed{ID: r.id, Capacity: r.offer.Capacity, Provider: r.offer.Provider,
		Region: r.offer.Region, Zone: r.offer.Zone, PricePerHour: r.offer.PricePerHour, Ready: r.ready, Leaving: leaving,
		LaunchedAt: start.Add(r.launched)}
	if r.readyAt > 0 {
		p.ReadyAt = start.Add(r.readyAt)
	}
	return p
}

func (s *simulation) becameReady(r *replica) {
	r.ready, r.readyAt = true, s.now
	for _, v := range r.views {
		v.ObserveRTT(rtt)
	}
	if r.draining {
		return
	}
	held := s.held
	s.held = nil
	for _, req := range held {
		// Held past its TTFT target, it waits for room as the router has it wait
		// (router.Request.Late): released at once, the backlog would queue every fresh
		// request behind it in the engine.
		req.route.Late = router.HeldLate(s.w.slo, s.now-req.heldAt)
		req.lateUntil = s.now + router.LateWait(s.now-req.heldAt, req.heldAt+s.w.holdTimeout-s.now)
		s.dispatch(req)
	}
	s.releaseLate()
}

// releaseLate sends the late requests (router.Request.Late) whose wait for room is over,
// then the others, oldest first, while a replica has room for the next. (The router's
// late requests each wait on their own, so one with a smaller prompt may pass a larger one
// that has none; here they go in order, which costs one prediction a step instead of one
// for each of the thousand-odd a preemption leaves.)
func (s *simulation) releaseLate() {
	kept := s.late[:0]
	var over []*request
	for _, req := range s.late {
		if s.now >= req.lateUntil {
			over = append(over, req)
		} else {
			kept = append(kept, req)
		}
	}
	clear(s.late[len(kept):])
	s.late = kept
	for _, req := range over {
		s.dispatch(req) // its wait for room is over: it goes as any request does
	}
	for len(s.late) > 0 {
		req := s.late[0]
		s.late = s.late[1:]
		n := len(s.late)
		s.dispatch(req)
		if len(s.late) > n { // no room: back at the head
			copy(s.late[1:], s.late[:n])
			s.late[0] = req
			return
		}
	}
}

// drain stops new requests to r; it ends when its requests have (or after drainFor).
func (s *simulation) drain(r *replica) {
	if r.draining {
		return
	}
	s.stopRouting(r)
	switch {
	case !r.ready || (len(r.reqs) == 0 && s.w.drainFor == 0):
		s.terminate(r)
	case s.w.drainFor > 0:
		s.at(s.w.drainFor, event{kind: evTerminate, rep: r})
	}
}

// stopRouting marks r draining, in the simulation and in the router's view of it.
func (s *simulation) stopRouting(r *replica) {
	r.draining = true
	for _, v := range r.views {
		info := *v.Info()
		info.Draining = true
		v.SetInfo(info)
	}
}

// terminate ends a replica on purpose.
func (s *simulation) terminate(r *replica) {
	s.failOpen(r, "drain_timeout")
	s.remove(r)
}

// failOpen fails every request still open on r.
func (s *simulation) failOpen(r *replica, why string) {
	for _, req := range r.reqs {
		s.fail(why)
		s.release(r, req)
	}
	clear(r.reqs)
}

// retire takes r out of the control plane's fleet: no engine, no pending events.
func (s *simulation) retire(r *replica) {
	r.gen++
	r.eng = nil
	if i := slices.Index(s.live, r); i >= 0 {
		s.live = slices.Delete(s.live, i, i+1)
	}
}

func (s *simulation) remove(r *replica) {
	s.bill(r)
	s.retire(r)
	for k, v := range r.views {
		if aff := s.routers[k].aff; aff != nil {
			aff.Forget(v)
		}
		delete(s.byView, v)
	}
	if i := slices.Index(s.lbList, r); i >= 0 && !r.dead {
		s.lbList = slices.Delete(s.lbList, i, i+1)
	}
}

func (s *simulation) bill(r *replica) {
	if r.ended {
		return
	}
	r.ended = true
	h := (s.now - r.launched).Hours()
	s.res.Dollars += h * r.offer.PricePerHour
	if r.offer.Capacity == fleet.Spot {
		s.res.SpotDollars += h * r.offer.PricePerHour
	}
	s.res.ReplicaHours[string(r.offer.Capacity)+"/"+r.offer.Provider] += h
	if g := r.offer.Accelerator; g != "" {
		s.res.GPUHours[g] += h
		s.res.GPUDollars[g] += h * r.offer.PricePerHour
	}
}

// --- spot capacity: notices, preemptions, detection ---

// spotHeld counts the spot VMs the service holds in p's capacity domain: every one not yet
// taken back, a noticed one included (its VM is still there).
func (s *simulation) spotHeld(p string) int {
	n := 0
	domain := s.mkt.Domain(p)
	for _, r := range s.live {
		if r.offer.Capacity == fleet.Spot && !r.dead && slices.Contains(domain, market.Place(r.offer.Provider, r.offer.Region, r.offer.Zone)) {
			n++
		}
	}
	return n
}

// announceDrop picks the victims of a capacity drop, newest first: the drop's share of the
// service's spot replicas in its zone (availability reading), or all but what remains
// (count reading). With notices they drain now; all die at d.At.
func (s *simulation) announceDrop(i int) {
	d := s.drops[i]
	var in []*replica
	for _, r := range s.live {
		if r.offer.Capacity == fleet.Spot && !r.dead && !r.noticed && slices.Contains(d.Places, market.Place(r.offer.Provider, r.offer.Region, r.offer.Zone)) {
			in = append(in, r)
		}
	}
	var n int
	if s.mkt.Reading() == market.ReadCount {
		n = len(in) - min(d.Remaining, len(in)) // those already noticed are leaving anyway
	} else {
		n = int(math.Ceil(d.Share * float64(len(in))))
	}
	gone := max(d.At, s.now)
	for _, r := range in[len(in)-n:] {
		r.noticed = true
		s.res.Preemptions++
		if s.in.Trace != nil {
			fmt.Fprintf(s.in.Trace, "%8.0fs preempted: spot %s in %s at $%.2f/h (%s); takes it at %.0fs\n",
				s.now.Seconds(), r.id, r.offer.Zone, r.offer.PricePerHour, r.age(s.now), gone.Seconds())
		}
		if s.w.useNotices {
			s.placerFor(r.offer).Preempted(r.offer.Provider, r.offer.Region, r.offer.Zone, s.clock())
			s.drainForPreemption(r)
		}
		s.q.push(event{at: gone, kind: evKill, rep: r})
	}
}

// drainForPreemption stops new requests at the notice; the replica stays billed and keeps
// serving what it has until the VM goes.
func (s *simulation) drainForPreemption(r *replica) {
	s.stopRouting(r)
	if !r.ready {
		s.remove(r)
	}
}

// kill takes the VM away: its open requests fail (their streams were under way).
func (s *simulation) kill(r *replica) {
	r.dead = true
	s.failOpen(r, "preempted")
	r.stepping = false
	s.bill(r)
	if s.w.useNotices {
		r.known = true
		s.remove(r)
		return
	}
	// Without notices the replica is found dead by the next probe; until then the
	// control plane counts it and the balancer may send it requests.
	s.at(time.Duration(s.rng.Int64N(int64(s.w.probeEvery))), event{kind: evDetect, rep: r})
}

func (s *simulation) detected(r *replica) {
	r.known = true
	s.placerFor(r.offer).Preempted(r.offer.Provider, r.offer.Region, r.offer.Zone, s.clock())
	s.retire(r)
	// The balancer keeps it until its next sync; byView stays so a pick can still land on it.
}

// simRouter is one router's policy and prefix affinity table.
type simRouter struct {
	policy router.Policy
	aff    *router.Affinity
}

func newSimRouter(routing string, blockTok, scanAll int) (simRouter, error) {
	var rt simRouter
	var err error
	if blockTok > 0 {
		if rt.aff, err = router.NewAffinity(router.Defaults().AffinitySize, blockTok); err != nil {
			return rt, err
		}
	}
	if rt.policy, err = router.NewPolicy(routing, rt.aff, staleAfter); err != nil {
		return rt, fmt.Errorf("sim: %w", err)
	}
	if p, ok := rt.policy.(*router.SLOCheapest); ok && scanAll != 0 {
		p.ScanAll = scanAll
	}
	return rt, nil
}

// toPeers runs fn for every router but req's, at once or Inputs.PeerDelay later (the
// network's delay between routers: peers learn of a request after the sender picked).
func (s *simulation) toPeers(rep *replica, req *request, fn func(k int, v *router.Replica)) {
	apply := func() {
		for k, v := range rep.views {
			if k != req.router {
				fn(k, v)
			}
		}
	}
	if s.in.PeerDelay <= 0 {
		apply()
		return
	}
	s.at(s.in.PeerDelay, event{kind: evPeer, fn: apply})
}

// begin sends req to rep through its router's view; with a shared view every other router's
// view of rep takes it in too.
func (s *simulation) begin(rep *replica, req *request) {
	req.pred = rep.views[req.router].Begin(&req.route, staleAfter)
	req.peers = nil
	if !s.in.SharedView {
		return
	}
	ph := make([]router.PeerRequest, len(rep.views)) // filled when the peers apply the begin
	route, pred := req.route, req.pred
	req.peers = ph
	s.toPeers(rep, req, func(k int, v *router.Replica) { ph[k] = v.PeerBegan(&route, pred, s.routers[k].aff) })
}

// firstToken says req's first token came, to every view that holds it.
func (s *simulation) firstToken(rep *replica, req *request) {
	now := s.clock()
	rep.views[req.router].FirstToken(req.pred, now)
	if ph := req.peers; ph != nil {
		s.toPeers(rep, req, func(k int, v *router.Replica) { v.PeerFirstToken(ph[k], now) })
	}
}

// release takes req out of every view that holds it.
func (s *simulation) release(rep *replica, req *request) {
	now := s.clock()
	rep.views[req.router].End(req.pred, now)
	if ph := req.peers; ph != nil {
		s.toPeers(rep, req, func(k int, v *router.Replica) { v.PeerEnded(ph[k], now) })
	}
	req.peers = nil
}
