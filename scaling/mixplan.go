package scaling

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// The mix planner: how many replicas of each GPU type a service runs, re-decided as its
// load, its request mix and the prices move. It keeps the decider's rules of time (moves
// must be wanted for the up- or downscale delay, the most conservative wish of the hold
// is adopted, scale from zero at once, scale to zero when idle) and adds one of money: a
// change of type is made only when the hours it saves pay for the cold starts it costs
// (PayBack). Like the decider it is pure: the caller passes the clock, the classes' rates
// from Record, the types with their prices and sustained rates, and the counts running.

// MixPolicy is a service's mix policy.
type MixPolicy struct {
	MinReplicas, MaxReplicas int
	// StableWindow averages the load's level (requests a second); MixWindow, longer,
	// its composition (each class's share and mean shape), which a few minutes of
	// long prompts would otherwise swing.
	StableWindow, MixWindow      time.Duration
	UpscaleDelay, DownscaleDelay time.Duration
	// ScaleToZeroAfter: no request for this long and nothing held: no replicas
	// (MinReplicas 0 only). 0: never.
	ScaleToZeroAfter time.Duration
	// ColdStart is a replica's launch to ready: each launch is charged this many hours
	// of its price when a change of type is weighed.
	ColdStart time.Duration
	// PayBack: a mix that needs launches is chosen over one that needs fewer only when
	// its saving over PayBack exceeds the difference in cold starts.
	PayBack time.Duration
	// Utilization in (0, 1]: replicas are sized for each class's rate ÷ Utilization,
	// the headroom for bursts beyond Poisson arrivals. With Attainment set it is each
	// GPU type's headroom at the start, then learned per type.
	Utilization float64
	// Attainment, when in (0, 1) (the SLO's percentile), gives each GPU type a headroom
	// of its own, learned from its replicas' answers (Outcome): the share of a type's
	// requests answered within the SLO over a HeadroomWindow below Attainment lowers the
	// type's headroom by a fifth; above halfway from Attainment to all of them, it rises
	// by a tenth (to at most 1). A burst costs a GPU that prefills fast less headroom than
	// a slow one, which one utilization for every type cannot say. 0: every type's
	// headroom is Utilization.
	Attainment float64
	// HeadroomWindow is how long a type's answers are judged before its headroom moves,
	// counted after a ColdStart for the fleet a move changes to settle (0:
	// DefaultHeadroomWindow).
	HeadroomWindow time.Duration
	// PeakWindow: cuts and changes of type are sized for the peak level over this long
	// (0: MixWindow), so that capacity a burst bought is not cut and bought again.
	PeakWindow time.Duration
	// BurstWindow, when set, makes the load's level the highest rate over any BurstWindow
	// of the stable window rather than its mean: a burst of requests arriving together
	// must be prefilled within the TTFT target whatever the minute's mean (each GPU's
	// sustained rate is for Poisson arrivals, which real traces are not).
	BurstWindow time.Duration
}

// Validate names what is wrong.
func (p MixPolicy) Validate() error {
	var errs []error
	if p.MinReplicas < 0 || p.MaxReplicas < 0 || (p.MaxReplicas > 0 && p.MinReplicas > p.MaxReplicas) {
		errs = append(errs, fmt.Errorf("min %d, max %d replicas: want 0 ≤ min ≤ max (max 0: none)", p.MinReplicas, p.MaxReplicas))
	}
	if p.StableWindow <= 0 || p.MixWindow < p.StableWindow {
		errs = append(errs, fmt.Errorf("stable window %v, mix window %v: want 0 < stable ≤ mix", p.StableWindow, p.MixWindow))
	}
	if p.UpscaleDelay < 0 || p.DownscaleDelay < 0 || p.PeakWindow < 0 || p.ScaleToZeroAfter < 0 || p.ColdStart < 0 || p.PayBack <= 0 {
		errs = append(errs, errors.New("delays, scale to zero and cold start must be ≥ 0 and the payback period > 0"))
	}
	if p.BurstWindow < 0 || p.BurstWindow > p.StableWindow {
		errs = append(errs, fmt.Errorf("burst window %v: want 0 (off) to the stable window", p.BurstWindow))
	}
	if !(p.Utilization > 0 && p.Utilization <= 1) {
		errs = append(errs, fmt.Errorf("utilization %v: want a fraction in (0, 1]", p.Utilization))
	}
	if !(p.Attainment >= 0 && p.Attainment < 1) || p.HeadroomWindow < 0 {
		errs = append(errs, fmt.Errorf("attainment %v, headroom window %v: want a fraction in [0, 1) (0: one headroom for every type) and a window ≥ 0", p.Attainment, p.HeadroomWindow))
	}
	return errors.Join(errs...)
}

// The mix planner's windows by default (the simulator's gpumix and the control plane): the
// level is the mean over DefaultMixLevelWindow, cuts are sized for the peak level over
// DefaultMixPeakWindow. A replica takes minutes to start, so capacity that follows a
// burst arrives after it; bursts are what the utilization's headroom is for. Measured on a
// day of Azure's code trace (bench/docs/gpumix.md): against the spec's 120 s window and a
// 15-minute peak, 35 % less cost at a higher SLO attainment and 9 launches instead of 77 in
// six hours.
const (
	DefaultMixLevelWindow = 15 * time.Minute
	DefaultMixPeakWindow  = time.Hour
)

// DefaultHeadroomWindow is how long a GPU type's answers are judged before its headroom
// moves (MixPolicy.HeadroomWindow): long enough for some hundreds of requests on a busy
// service, short against the hours a mix is held.
const DefaultHeadroomWindow = 10 * time.Minute

// Bounds of a learned headroom: a type's replicas sized for more than its Poisson rate
// within the SLO would be no headroom at all; below minHeadroom a type is so far from its
// model that it is wiser to buy the others. minJudged answers at least make a judgement.
const (
	minHeadroom = 0.02
	minJudged   = 50
)

// MixEdges are the classes' bounds: prompt tokens, then output tokens. A request falls in
// the class of the first edge above each of its lengths.
var (
	MixPromptEdges = []int{1024, 4096, 16384}
	MixOutputEdges = []int{256}
)

// classOf is a request's class index.
func classOf(in, out int) int {
	i, _ := slices.BinarySearch(MixPromptEdges, in+1)
	o, _ := slices.BinarySearch(MixOutputEdges, out+1)
	return i*(len(MixOutputEdges)+1) + o
}

// MixClasses is how many classes there are.
func MixClasses() int { return (len(MixPromptEdges) + 1) * (len(MixOutputEdges) + 1) }

// mixSecond is one second's arrivals.
type mixSecond struct {
	at     int64 // unix second
	n      []int
	in, ou []float64
}

// MixPlanner holds the window of arrivals and the hysteresis of one service's mix. Not
// safe for concurrent use.
type MixPlanner struct {
	policy  MixPolicy
	seconds []mixSecond // oldest first, within MixWindow
	first   time.Time   // earliest arrival recorded: the level is over no longer than since
	last    time.Time   // latest arrival

	// The move being held: toward which side (+1 up, -1 down or across), since when, and
	// the peak (down) or trough (up) of the load's level meanwhile.
	pendingDir   int
	pendingSince time.Time
	pendingLevel float64

	// levels are the levels Decide saw over the last MixWindow: a cut is sized for their
	// peak, so a mix that is only down for a moment is not cut and bought back.
	levels []timedLevel

	// memo remembers SolveMix's answers by their inputs; cleared when full.
	memo map[string]mixAnswer

	// headroom is each GPU type's learned headroom (Attainment set), by MixType.Name.
	headroom map[string]*typeHeadroom
}

// typeHeadroom is one GPU type's learned headroom and the answers judged since it last
// moved: those from from on (a move's ColdStart later) count.
type typeHeadroom struct {
	h           float64
	from        time.Time
	judged, met int64
}

type timedLevel struct {
	at    time.Time
	level float64
}

type mixAnswer struct {
	s   MixSolution
	err error
}

// mixMemoMax bounds the memo: a day's levels × mixes × bounds are far fewer.
const mixMemoMax = 8192

// solveMix is SolveMix, remembered.
func (m *MixPlanner) solveMix(classes []MixClass, types []MixType, maxTotal int) (MixSolution, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "%d|", maxTotal)
	for _, c := range classes {
		fmt.Fprintf(&b, "%.6g,", c.Rate)
	}
	for _, t := range types {
		fmt.Fprintf(&b, "|%.6g,%d,%d:", t.PricePerHour, t.Min, t.Max)
		for _, r := range t.Rates {
			fmt.Fprintf(&b, "%.6g,", r)
		}
	}
	key := b.String()
	if a, ok := m.memo[key]; ok {
		return a.s, a.err
	}
	s, err := SolveMix(classes, types, maxTotal)
	if m.memo == nil || len(m.memo) >= mixMemoMax {
		m.memo = map[string]mixAnswer{}
	}
	s.Counts = slices.Clip(s.Counts)
	m.memo[key] = mixAnswer{s, err}
	return s, err
}

// NewMixPlanner returns a planner for p.
func NewMixPlanner(p MixPolicy) (*MixPlanner, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &MixPlanner{policy: p}, nil
}

// Record counts one request of in prompt and out output tokens arriving at at.
func (m *MixPlanner) Record(at time.Time, in, out int) {
	sec := at.Unix()
	if n := len(m.seconds); n == 0 || m.seconds[n-1].at < sec {
		k := MixClasses()
		m.seconds = append(m.seconds, mixSecond{at: sec, n: make([]int, k), in: make([]float64, k), ou: make([]float64, k)})
	}
	s := &m.seconds[len(m.seconds)-1]
	c := classOf(in, out)
	s.n[c]++
	s.in[c] += float64(in)
	s.ou[c] += float64(out)
	if at.After(m.last) {
		m.last = at
	}
	if m.first.IsZero() || at.Before(m.first) {
		m.first = at
	}
}

// levelSpan is how long the level at now is averaged over: StableWindow, or the time since
// the first arrival where that is shorter (a new service, or a planner that has just
// started, knows nothing of before), at least minLevelSpan.
func (m *MixPlanner) levelSpan(now time.Time) time.Duration {
	span := m.policy.StableWindow
	if !m.first.IsZero() {
		span = min(span, now.Sub(m.first))
	}
	return max(span, minLevelSpan)
}

// minLevelSpan is the shortest time the level is averaged over: the first seconds' arrivals
// say little about a rate (the control plane's mixMinSpan).
const minLevelSpan = 10 * time.Second

// Outcome records answers of one GPU type's replicas at at: judged requests whose
// latency was judged against the SLO, met of them within it. Answers before the type's
// fleet settled after its headroom last moved are not counted. Without Attainment it
// does nothing.
func (m *MixPlanner) Outcome(at time.Time, gpu string, judged, met int64) {
	if m.policy.Attainment <= 0 || judged <= 0 || met < 0 || met > judged {
		return
	}
	t := m.typeHeadroom(gpu)
	if t.from.IsZero() {
		t.from = at
	}
	if at.Before(t.from) {
		return
	}
	t.judged += judged
	t.met += met
}

func (m *MixPlanner) typeHeadroom(gpu string) *typeHeadroom {
	if m.headroom == nil {
		m.headroom = map[string]*typeHeadroom{}
	}
	t := m.headroom[gpu]
	if t == nil {
		t = &typeHeadroom{h: m.policy.Utilization}
		m.headroom[gpu] = t
	}
	return t
}

// Headroom is the share of a GPU type's rate within the SLO for Poisson arrivals its
// replicas are sized for: learned where Attainment is set, else Utilization.
func (m *MixPlanner) Headroom(gpu string) float64 {
	if t := m.headroom[gpu]; t != nil {
		return t.h
	}
	return m.policy.Utilization
}

// learn moves the headroom of each type whose answers over a window say so, and says
// which moved and why.
func (m *MixPlanner) learn(now time.Time) []string {
	p := m.policy
	if p.Attainment <= 0 {
		return nil
	}
	window := p.HeadroomWindow
	if window <= 0 {
		window = DefaultHeadroomWindow
	}
	names := make([]string, 0, len(m.headroom))
	for name := range m.headroom {
		names = append(names, name)
	}
	slices.Sort(names)
	var moved []string
	for _, name := range names {
		t := m.headroom[name]
		if t.from.IsZero() || now.Sub(t.from) < window || t.judged < minJudged {
			continue
		}
		got := float64(t.met) / float64(t.judged)
		old := t.h
		switch {
		case got < p.Attainment:
			t.h = max(minHeadroom, t.h*0.8)
		case got > p.Attainment+(1-p.Attainment)/2:
			t.h = min(1, t.h*1.1)
		}
		if t.h != old {
			moved = append(moved, fmt.Sprintf("%s's headroom %.3g → %.3g (%.1f %% of %d requests within the SLO, want %.0f %%)",
				name, old, t.h, 100*got, t.judged, 100*p.Attainment))
			t.from = now.Add(p.ColdStart)
		} else {
			t.from = now
		}
		t.judged, t.met = 0, 0
	}
	return moved
}

// withHeadroom is types with each one's rates scaled by its headroom.
func (m *MixPlanner) withHeadroom(types []MixType) []MixType {
	out := slices.Clone(types)
	for g := range out {
		h := m.Headroom(out[g].Name)
		rates := make([]float64, len(out[g].Rates))
		for b, r := range out[g].Rates {
			rates[b] = r * h
		}
		out[g].Rates = rates
	}
	return out
}

// Classes is the window's request mix: each class's mean shape over MixWindow and its rate,
// the level over StableWindow split by the MixWindow's shares. Classes with no request
// in MixWindow have rate 0 and their bucket's middle as shape.
func (m *MixPlanner) Classes(now time.Time) []MixClass {
	cut := now.Add(-m.policy.MixWindow).Unix()
	i := 0
	for i < len(m.seconds) && m.seconds[i].at <= cut {
		i++
	}
	m.seconds = m.seconds[i:]
	k := MixClasses()
	n, in, ou := make([]float64, k), make([]float64, k), make([]float64, k)
	total, stable := 0.0, 0.0
	stableCut := now.Add(-m.policy.StableWindow).Unix()
	for _, s := range m.seconds {
		for c := range k {
			n[c] += float64(s.n[c])
			in[c] += s.in[c]
			ou[c] += s.ou[c]
			total += float64(s.n[c])
			if s.at > stableCut {
				stable += float64(s.n[c])
			}
		}
	}
	level := stable / m.levelSpan(now).Seconds()
	if bw := m.policy.BurstWindow; bw > 0 {
		level = max(level, m.peakRate(now, bw))
	}
	level = quantizeUp(level)
	out := make([]MixClass, k)
	for c := range k {
		pi, po := c/(len(MixOutputEdges)+1), c%(len(MixOutputEdges)+1)
		out[c] = MixClass{In: middle(MixPromptEdges, pi), Out: middle(MixOutputEdges, po)}
		if n[c] > 0 {
			out[c] = MixClass{In: int(math.Round(in[c] / n[c])), Out: max(2, int(math.Round(ou[c]/n[c]))), Rate: level * n[c] / total}
		}
	}
	return out
}

// peakRate is the highest arrival rate over any bw-long slice of the stable window (slices
// aligned on bw, counted from the seconds kept).
func (m *MixPlanner) peakRate(now time.Time, bw time.Duration) float64 {
	w := max(int64(bw/time.Second), 1)
	from := now.Add(-m.policy.StableWindow).Unix()
	counts := map[int64]int{}
	best := 0
	for _, s := range m.seconds {
		if s.at <= from {
			continue
		}
		n := 0
		for _, c := range s.n {
			n += c
		}
		k := (now.Unix() - s.at) / w
		counts[k] += n
		best = max(best, counts[k])
	}
	return float64(best) / float64(w)
}

// quantizeUp rounds a rate up to a grid of 5 % steps, so that a level that wavers a little
// asks the same question again (SolveMix's answers are remembered by their inputs).
func quantizeUp(r float64) float64 {
	if r <= 0 {
		return 0
	}
	return math.Pow(1.05, math.Ceil(math.Log(r)/math.Log(1.05)))
}

// middle is a bucket's geometric middle, for a class with no request to average.
func middle(edges []int, i int) int {
	lo, hi := 1, 0
	if i > 0 {
		lo = edges[i-1]
	}
	if i < len(edges) {
		hi = edges[i]
	} else {
		hi = lo * 4
	}
	return int(math.Sqrt(float64(lo) * float64(hi)))
}

// MixDecision is one Decide's outcome.
type MixDecision struct {
	Counts []int
	// Level is the load's level, requests a second, the mix was sized for.
	Level  float64
	Reason string
	// Learned says which GPU types' headroom moved at this decision and why (also in
	// Reason).
	Learned []string
}

// Decide returns the replicas per type to run at now. classes are Classes(now) (their
// rates as measured; each type's headroom is applied here), types the GPU types with
// each class's sustained rate, current the counts running (starting ones included), held
// the requests waiting for want of a ready replica.
func (m *MixPlanner) Decide(now time.Time, classes []MixClass, types []MixType, current []int, held int) MixDecision {
	moved := m.learn(now)
	d := m.decide(now, classes, types, current, held)
	if len(moved) > 0 {
		d.Learned = moved
		d.Reason += "; " + strings.Join(moved, "; ")
	}
	return d
}

func (m *MixPlanner) decide(now time.Time, classes []MixClass, types []MixType, current []int, held int) MixDecision {
	p := m.policy
	// Each type's rates as its replicas are sized for: its headroom applied.
	types = m.withHeadroom(types)
	level := 0.0
	for _, c := range classes {
		level += c.Rate
	}
	curTotal := 0
	for _, n := range current {
		curTotal += n
	}
	keep := MixDecision{Counts: slices.Clone(current), Level: level}
	idle := held == 0 && (m.last.IsZero() || now.Sub(m.last) >= p.ScaleToZeroAfter)
	if p.ScaleToZeroAfter > 0 && idle && p.MinReplicas == 0 {
		m.pendingDir = 0
		keep.Counts = make([]int, len(types))
		keep.Reason = fmt.Sprintf("no request for %v: scale to zero", p.ScaleToZeroAfter)
		return keep
	}
	want, why := m.solve(classes, types, level, nil, nil)
	if curTotal == 0 {
		// From zero at once: requests are waiting, or will be.
		m.pendingDir = 0
		want = m.atLeastOne(want, classes, types, held)
		return MixDecision{Counts: want, Level: level, Reason: "from zero: " + why}
	}
	m.levels = append(m.levels, timedLevel{now, level})
	i := 0
	peakWindow := p.PeakWindow
	if peakWindow <= 0 {
		peakWindow = p.MixWindow
	}
	for i < len(m.levels) && now.Sub(m.levels[i].at) > peakWindow {
		i++
	}
	m.levels = m.levels[i:]
	peak := level
	for _, l := range m.levels {
		peak = max(peak, l.level)
	}
	covered := Covers(classes, types, current) && curTotal >= p.MinReplicas &&
		(p.MaxReplicas == 0 || curTotal <= p.MaxReplicas)
	var options [][]int
	dir := -1
	if covered {
		// Cuts and changes of type are sized for the peak of the mix window.
		options = append(options, slices.Clone(current))
		if level <= 0 {
			want = nil // no shape to size a cut for; idle is handled above
		} else if peak > level {
			atPeak := ScaleClasses(classes, peak/level)
			want, _ = m.solve(atPeak, types, peak, nil, nil)
			classes, level = atPeak, peak
		}
		if shrink, _ := m.solve(classes, types, level, nil, current); shrink != nil {
			options = append(options, shrink)
		}
	} else {
		dir = 1
		if grow, _ := m.solve(classes, types, level, current, nil); grow != nil {
			options = append(options, grow)
		}
	}
	if want != nil {
		options = append(options, want)
	}
	if len(options) == 0 {
		keep.Reason = "no mix: " + why
		return keep
	}
	best := m.cheapest(types, current, options)
	if slices.Equal(best, current) {
		m.pendingDir = 0
		keep.Reason = fmt.Sprintf("%s serves %.2f req/s within the SLO", DescribeMix(types, current), level)
		return keep
	}
	delay := p.DownscaleDelay
	if dir > 0 {
		delay = p.UpscaleDelay
	}
	if m.pendingDir != dir {
		m.pendingDir, m.pendingSince, m.pendingLevel = dir, now, level
	}
	if dir > 0 {
		m.pendingLevel = min(m.pendingLevel, level)
	} else {
		m.pendingLevel = max(m.pendingLevel, level)
	}
	if now.Sub(m.pendingSince) < delay {
		keep.Reason = fmt.Sprintf("holding %s until the move to %s has been wanted for %v", DescribeMix(types, current), DescribeMix(types, best), delay)
		return keep
	}
	// Adopt the most conservative level of the hold, re-solved, among the same options.
	if m.pendingLevel != level && level > 0 {
		f := m.pendingLevel / level
		sc := ScaleClasses(classes, f)
		var alt [][]int
		if dir > 0 {
			if covered := Covers(sc, types, current); covered {
				alt = append(alt, slices.Clone(current))
			}
			if grow, _ := m.solve(sc, types, m.pendingLevel, current, nil); grow != nil {
				alt = append(alt, grow)
			}
		} else if shrink, _ := m.solve(sc, types, m.pendingLevel, nil, current); shrink != nil {
			alt = append(alt, slices.Clone(current), shrink)
		}
		if w, _ := m.solve(sc, types, m.pendingLevel, nil, nil); w != nil {
			alt = append(alt, w)
		}
		if len(alt) > 0 {
			best = m.cheapest(types, current, alt)
		}
	}
	m.pendingDir = 0
	verb := "down"
	if dir > 0 {
		verb = "up"
	}
	return MixDecision{Counts: best, Level: level, Reason: fmt.Sprintf("%s → %s (%s, %.2f req/s; launches paid back within %v)",
		DescribeMix(types, current), DescribeMix(types, best), verb, level, p.PayBack)}
}

// cheapest is the option of least effective cost over current.
func (m *MixPlanner) cheapest(types []MixType, current []int, options [][]int) []int {
	return slices.MinFunc(options, func(a, b []int) int {
		return cmpFloat(m.effective(types, current, a), m.effective(types, current, b))
	})
}

// effective is a mix's price per hour plus the cold starts it needs over current, spread
// over the payback period.
func (m *MixPlanner) effective(types []MixType, current, counts []int) float64 {
	cost, launch := 0.0, 0.0
	for g, n := range counts {
		cost += float64(n) * types[g].PricePerHour
		if d := n - current[g]; d > 0 {
			launch += float64(d) * types[g].PricePerHour * m.policy.ColdStart.Hours()
		}
	}
	return cost + launch/m.policy.PayBack.Hours()
}

// solve is the cheapest mix for the classes (types' rates with their headroom) within the replica
// bounds, at least atLeast and at most atMost per type where given. Past MaxReplicas it
// serves as much of the load as MaxReplicas allows.
func (m *MixPlanner) solve(classes []MixClass, types []MixType, level float64, atLeast, atMost []int) ([]int, string) {
	p := m.policy
	ts := slices.Clone(types)
	zero := make([]float64, len(classes))
	for g := range ts {
		if atLeast != nil {
			ts[g].Min = max(ts[g].Min, atLeast[g])
		}
		if atMost != nil {
			if atMost[g] == 0 {
				ts[g].Rates, ts[g].Min, ts[g].Max = zero, 0, 0
			} else {
				ts[g].Max = atMost[g]
			}
		}
	}
	solve := func(cs []MixClass) (MixSolution, error) { return m.solveMix(cs, ts, p.MaxReplicas) }
	s, err := solve(classes)
	if errors.Is(err, ErrMixInfeasible) && p.MaxReplicas > 0 && atMost == nil {
		s, err = largestFit(solve, classes, p.MaxReplicas)
	}
	if err != nil {
		return nil, err.Error()
	}
	counts := slices.Clone(s.Counts)
	total := 0
	for _, n := range counts {
		total += n
	}
	for total < p.MinReplicas {
		// min_replicas above what the load needs: the cheapest type that serves anything.
		g := cheapestServing(ts, classes)
		if g < 0 {
			break
		}
		counts[g]++
		total++
	}
	why := fmt.Sprintf("%s for %.2f req/s", DescribeMix(types, counts), level)
	if len(s.Unserved) > 0 {
		var names []string
		for _, b := range s.Unserved {
			names = append(names, fmt.Sprintf("%d:%d tokens", classes[b].In, classes[b].Out))
		}
		why += "; no GPU offered meets the SLO for " + strings.Join(names, ", ")
	}
	return counts, why
}

// largestFit is the cheapest mix serving the largest share of the classes' load that
// maxTotal replicas can (by bisection on the share), where all of it needs more.
func largestFit(solve func([]MixClass) (MixSolution, error), classes []MixClass, maxTotal int) (MixSolution, error) {
	lo, hi := 0.0, 1.0
	var fit MixSolution
	for range 20 {
		mid := (lo + hi) / 2
		if t, e := solve(ScaleClasses(classes, mid)); e == nil {
			lo, fit = mid, t
		} else {
			hi = mid
		}
	}
	if fit.Counts == nil {
		return MixSolution{}, fmt.Errorf("no mix of at most %d replicas", maxTotal)
	}
	return fit, nil
}

// SolveMixWithin is SolveMix, but where the load needs more than maxTotal (> 0) replicas
// it is the cheapest mix serving the largest share of the load that fits, as the planner
// sizes a service at max_replicas.
func SolveMixWithin(classes []MixClass, types []MixType, maxTotal int) (MixSolution, error) {
	solve := func(cs []MixClass) (MixSolution, error) { return SolveMix(cs, types, maxTotal) }
	s, err := solve(classes)
	if errors.Is(err, ErrMixInfeasible) && maxTotal > 0 {
		return largestFit(solve, classes, maxTotal)
	}
	return s, err
}

// atLeastOne makes a wake from zero launch at least one replica: the type that serves the
// most of the load's classes, cheapest first (held requests of unknown shape).
func (m *MixPlanner) atLeastOne(want []int, classes []MixClass, types []MixType, held int) []int {
	if want == nil {
		want = make([]int, len(types))
	}
	for _, n := range want {
		if n > 0 {
			return want
		}
	}
	if held == 0 && m.last.IsZero() {
		return want
	}
	if g := cheapestServing(types, classes); g >= 0 {
		want[g] = 1
	}
	return want
}

// cheapestServing is the type serving the most classes with load (every class when none
// has load), the cheapest of those; -1 when none serves any.
func cheapestServing(types []MixType, classes []MixClass) int {
	best, bestN := -1, 0
	anyLoad := false
	for _, c := range classes {
		anyLoad = anyLoad || c.Rate > 0
	}
	for g, t := range types {
		n := 0
		for b, r := range t.Rates {
			if r > 0 && (!anyLoad || classes[b].Rate > 0) {
				n++
			}
		}
		if n > bestN || (n == bestN && n > 0 && t.PricePerHour < types[best].PricePerHour) {
			best, bestN = g, n
		}
	}
	return best
}

// ScaleClasses is classes with every rate multiplied by f.
func ScaleClasses(cs []MixClass, f float64) []MixClass {
	out := slices.Clone(cs)
	for i := range out {
		out[i].Rate *= f
	}
	return out
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// MixTypePolicy is the placement policy of one GPU type's placer within a mix of total
// replicas, from the service's: with more than one replica in the mix, the other replicas
// hedge a lone one of a type (no min_zones pair) and keep one ready (no availability target
// judged per type); and no type moves a replica to a cheaper zone, since a move runs its
// replacement beside the replica it replaces, one beyond the mix's count, which no per-type
// placer can bound. The control plane and the simulator both place a mix with it.
func MixTypePolicy(p PlacementPolicy, total int) PlacementPolicy {
	if total > 1 {
		p.SpotMinZones = 0
		p.Availability = 0
	}
	p.RebalanceMinSaving, p.RebalanceWhenItPays = 0, false
	return p
}

// PlacementTargets is what each type's placement is asked for while the fleet moves to
// want: a type being cut keeps its replicas until every type has its wanted replicas
// ready (make before break), so that a change of type never leaves the service short
// while the new replicas start. alive counts each type's replicas not leaving (starting
// ones included), ready those ready.
func PlacementTargets(want, alive, ready []int) []int {
	short := false
	for g := range want {
		if ready[g] < want[g] {
			short = true
		}
	}
	out := slices.Clone(want)
	if short {
		for g := range out {
			out[g] = max(out[g], min(alive[g], ready[g]))
		}
	}
	return out
}

// Active records a request seen at at without its lengths (a router's count): the service
// is in use, so it does not scale to zero.
func (m *MixPlanner) Active(at time.Time) {
	if at.After(m.last) {
		m.last = at
	}
}

// MixTypes prices each GPU type as its placement would buy the next replica (spot where
// pol takes it, a zone offers it and it costs at most pol.MaxSpotPriceRatio × on-demand,
// else on-demand) and fills what one replica sustains within the SLO for each class with
// load (every class when none has), from rate (0: it cannot). usable narrows a type's
// offers to those its placer would choose from now (Placer.Offered). A type with no
// offer now serves nothing and costs nothing.
func MixTypes(gpus []string, offers []Offer, pol PlacementPolicy, classes []MixClass,
	usable func(gpu string, offers []Offer) []Offer, rate func(gpu string, in, out int) float64) []MixType {
	anyLoad := slices.ContainsFunc(classes, func(c MixClass) bool { return c.Rate > 0 })
	types := make([]MixType, len(gpus))
	for g, gpu := range gpus {
		var mine []Offer
		for _, o := range offers {
			if strings.EqualFold(o.Accelerator, gpu) {
				mine = append(mine, o)
			}
		}
		if usable != nil {
			mine = usable(gpu, mine)
		}
		od, spot := math.Inf(1), math.Inf(1)
		for _, o := range mine {
			if o.Capacity == fleet.Spot {
				spot = min(spot, o.PricePerHour)
			} else {
				od = min(od, o.PricePerHour)
			}
		}
		price := od
		if pol.UseSpot && spot <= pol.MaxSpotPriceRatio*od {
			price = spot
		}
		t := MixType{Name: strings.ToUpper(gpu), Rates: make([]float64, len(classes))}
		if !math.IsInf(price, 1) {
			t.PricePerHour = price
			for b, c := range classes {
				if c.Rate > 0 || !anyLoad {
					t.Rates[b] = rate(gpu, c.In, max(c.Out, 2))
				}
			}
		}
		types[g] = t
	}
	return types
}
