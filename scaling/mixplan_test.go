package scaling

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// mixTypes are an L4 and an H100 with rates per class from a rate function.
func mixTypes(classes []MixClass, h100Price float64) []MixType {
	l4 := MixType{Name: "L4", PricePerHour: 0.70, Rates: make([]float64, len(classes))}
	h := MixType{Name: "H100", PricePerHour: h100Price, Rates: make([]float64, len(classes))}
	for b, c := range classes {
		if c.In < 4096 {
			l4.Rates[b] = 4
		}
		h.Rates[b] = 40
		if c.In >= 8192 {
			h.Rates[b] = 0.6
		}
	}
	return []MixType{l4, h}
}

func TestMixPlannerFollowsTheMix(t *testing.T) {
	pol := MixPolicy{MaxReplicas: 10, StableWindow: 2 * time.Minute, MixWindow: 10 * time.Minute,
		UpscaleDelay: time.Minute, DownscaleDelay: 5 * time.Minute, ScaleToZeroAfter: 5 * time.Minute,
		ColdStart: 5 * time.Minute, PayBack: time.Hour, Utilization: 0.8}
	m, err := NewMixPlanner(pol)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	cur := []int{0, 0}
	step := func(from, to time.Duration, every time.Duration, in, out int) MixDecision {
		var d MixDecision
		for at := from; at < to; at += time.Second {
			if every > 0 && at%every == 0 {
				m.Record(t0.Add(at), in, out)
			}
			if at%(10*time.Second) == 0 {
				cls := m.Classes(t0.Add(at))
				d = m.Decide(t0.Add(at), cls, mixTypes(cls, 5.4), cur, 0)
				cur = d.Counts
			}
		}
		return d
	}
	// Short requests at 2/s: one L4 at 0.8 utilization serves 3.2/s.
	d := step(0, 10*time.Minute, 500*time.Millisecond, 500, 100)
	if cur[0] < 1 || cur[1] != 0 {
		t.Fatalf("short load: %v (%s), want L4s only", cur, d.Reason)
	}
	// Long prompts join: an H100 is needed, added after the upscale delay.
	for at := 10 * time.Minute; at < 20*time.Minute; at += time.Second {
		m.Record(t0.Add(at), 500, 100)
		if at%(5*time.Second) == 0 {
			m.Record(t0.Add(at), 16000, 200)
		}
		if at%(10*time.Second) == 0 {
			cls := m.Classes(t0.Add(at))
			d = m.Decide(t0.Add(at), cls, mixTypes(cls, 5.4), cur, 0)
			cur = d.Counts
		}
	}
	if cur[1] < 1 {
		t.Fatalf("long prompts: %v (%s), want an H100", cur, d.Reason)
	}
	// Idle: to zero once ScaleToZeroAfter has passed.
	d = step(20*time.Minute, 30*time.Minute, 0, 0, 0)
	if cur[0] != 0 || cur[1] != 0 || !strings.Contains(d.Reason, "scale to zero") {
		t.Fatalf("idle: %v (%s), want zero", cur, d.Reason)
	}
}

// A swap to a cheaper type happens only when the saving pays for the cold starts.
func TestMixPlannerSwapsOnlyWhenItPaysBack(t *testing.T) {
	classes := []MixClass{{In: 500, Out: 100, Rate: 2}}
	types := []MixType{{Name: "L4", PricePerHour: 0.70, Rates: []float64{4}}, {Name: "H100", PricePerHour: 0.75, Rates: []float64{40}}}
	for _, tc := range []struct {
		payBack time.Duration
		swap    bool
	}{{time.Hour, false}, {1000 * time.Hour, true}} {
		m, _ := NewMixPlanner(MixPolicy{StableWindow: time.Minute, MixWindow: time.Minute, DownscaleDelay: time.Minute,
			ColdStart: 5 * time.Minute, PayBack: tc.payBack, Utilization: 1})
		t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
		m.Record(t0, 500, 100)
		cur := []int{0, 1} // an H100 runs; an L4 would save $0.05/h
		var d MixDecision
		for k := range 20 {
			d = m.Decide(t0.Add(time.Duration(k)*10*time.Second), classes, types, cur, 0)
			cur = d.Counts
		}
		if swapped := cur[0] == 1 && cur[1] == 0; swapped != tc.swap {
			t.Errorf("payback %v: %v (%s), want swap %v", tc.payBack, cur, d.Reason, tc.swap)
		}
	}
}

func TestPlacementTargetsMakeBeforeBreak(t *testing.T) {
	// Two L40S → one H100: while the H100 starts, the L40S stay.
	if got := PlacementTargets([]int{0, 1}, []int{2, 1}, []int{2, 0}); got[0] != 2 || got[1] != 1 {
		t.Errorf("H100 starting: %v, want the two L40S kept", got)
	}
	// Once it is ready they go.
	if got := PlacementTargets([]int{0, 1}, []int{2, 1}, []int{2, 1}); got[0] != 0 || got[1] != 1 {
		t.Errorf("H100 ready: %v, want the L40S drained", got)
	}
	// A plain downscale is not held.
	if got := PlacementTargets([]int{1, 0}, []int{2, 0}, []int{2, 0}); got[0] != 1 {
		t.Errorf("downscale: %v", got)
	}
}

// With a burst window the level is the highest rate over any slice of the stable window: 20
// requests in one second of a quiet minute read as 2 a second over 10 s, not 0.36.
func TestMixPlannerBurstWindow(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		burst time.Duration
		want  float64
	}{{0, 21.0 / 59}, {10 * time.Second, 2}} {
		m, err := NewMixPlanner(MixPolicy{StableWindow: time.Minute, MixWindow: time.Minute, PayBack: time.Hour, Utilization: 1, BurstWindow: tc.burst})
		if err != nil {
			t.Fatal(err)
		}
		m.Record(t0.Add(time.Second), 500, 100) // the first request: the planner has seen 59 s
		for range 20 {
			m.Record(t0.Add(30*time.Second), 500, 100)
		}
		level := 0.0
		for _, c := range m.Classes(t0.Add(time.Minute)) {
			level += c.Rate
		}
		if level < tc.want || level > tc.want*1.06 { // rounded up to the 5 % grid
			t.Errorf("burst window %v: level %.3f, want %.3f", tc.burst, level, tc.want)
		}
	}
}

// The level is the rate since the first arrival the planner saw where that is shorter than
// the stable window: five minutes of 2 requests a second read as 2 a second, not as 0.67
// over a 15-minute window of which ten minutes were before the planner started (a new
// service, a restarted control plane, the start of a simulated day).
func TestMixPlannerLevelOverWhatItHasSeen(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	m, err := NewMixPlanner(MixPolicy{StableWindow: 15 * time.Minute, MixWindow: 15 * time.Minute, PayBack: time.Hour, Utilization: 1})
	if err != nil {
		t.Fatal(err)
	}
	level := func(at time.Duration) float64 {
		l := 0.0
		for _, c := range m.Classes(t0.Add(at)) {
			l += c.Rate
		}
		return l
	}
	for i := range 600 {
		m.Record(t0.Add(time.Duration(i)*500*time.Millisecond), 500, 100)
	}
	if l := level(5 * time.Minute); l < 2 || l > 2*1.06 {
		t.Errorf("after 5 minutes at 2 a second: level %.3f, want 2", l)
	}
	// At the window's length it is the window's mean: 600 requests, then 10 quiet minutes.
	if l := level(15 * time.Minute); l < 600.0/900*0.95 || l > 600.0/900*1.06 {
		t.Errorf("15 minutes in: level %.3f, want %.3f", l, 600.0/900)
	}
}

// A GPU type whose replicas answer fewer requests within the SLO than the percentile gets
// less headroom (more replicas for the same load, or the other type), one that answers
// nearly all of them more; with no Attainment, answers change nothing.
func TestMixPlannerLearnsHeadroomPerType(t *testing.T) {
	pol := MixPolicy{MaxReplicas: 20, StableWindow: 2 * time.Minute, MixWindow: 10 * time.Minute,
		UpscaleDelay: time.Minute, DownscaleDelay: 5 * time.Minute, ColdStart: 5 * time.Minute,
		PayBack: time.Hour, Utilization: 0.5, Attainment: 0.9, HeadroomWindow: 10 * time.Minute}
	t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	run := func(pol MixPolicy, l4Met int64, until time.Duration) (*MixPlanner, []int, []string) {
		m, err := NewMixPlanner(pol)
		if err != nil {
			t.Fatal(err)
		}
		cur := []int{0, 0}
		var reasons []string
		for at := time.Duration(0); at < until; at += time.Second {
			now := t0.Add(at)
			for range 3 {
				m.Record(now, 500, 100) // 3/s of short requests: L4s serve them
			}
			if at%(10*time.Second) == 0 {
				// Each type's replicas' answers over the last 10 s: the L4s' l4Met of 30.
				if cur[0] > 0 {
					m.Outcome(now, "L4", 30, l4Met)
				}
				if cur[1] > 0 {
					m.Outcome(now, "H100", 30, 30)
				}
				cls := m.Classes(now)
				d := m.Decide(now, cls, mixTypes(cls, 5.4), cur, 0)
				if !slices.Equal(d.Counts, cur) || strings.Contains(d.Reason, "headroom") {
					reasons = append(reasons, d.Reason)
				}
				cur = d.Counts
			}
		}
		return m, cur, reasons
	}
	// The L4s meet the SLO for 29 of 30: their headroom rises from 0.5 toward 1, and fewer
	// L4s serve the same 3/s.
	m, good, reasons := run(pol, 29, 2*time.Hour)
	if h := m.Headroom("L4"); h <= 0.5 {
		t.Fatalf("L4s within the SLO for 97 %%: headroom %v, want above 0.5; %q", h, reasons)
	}
	if !slices.ContainsFunc(reasons, func(r string) bool { return strings.Contains(r, "L4's headroom 0.5 → 0.55 (96.7 % of") }) {
		t.Errorf("no decision says the L4's headroom moved: %q", reasons)
	}
	// Within the SLO for 24 of 30 (80 %): the L4's headroom falls, more L4s are run, then
	// the H100 serves the load once L4s would cost more.
	m, bad, reasons := run(pol, 24, 2*time.Hour)
	if h := m.Headroom("L4"); h >= 0.5 {
		t.Fatalf("L4s within the SLO for 80 %%: headroom %v, want below 0.5; %q", h, reasons)
	}
	if bad[0] <= good[0] && bad[1] == 0 {
		t.Fatalf("L4s missing the SLO run as %v, L4s meeting it as %v: want more L4s or an H100", bad, good)
	}
	// One headroom for every type when Attainment is 0: the answers move nothing.
	pol.Attainment = 0
	m, fixed, _ := run(pol, 24, 2*time.Hour)
	if h := m.Headroom("L4"); h != 0.5 || fixed[0] != 2 || fixed[1] != 0 {
		t.Fatalf("without Attainment: L4 headroom %v, mix %v; want 0.5 and 2 L4s (3/s ÷ (4/s × 0.5))", h, fixed)
	}
}

// A mix's per-type placers hedge and target availability over the mix, not per type, and
// never move a replica: its replacement would run beyond the mix's count.
func TestMixTypePolicy(t *testing.T) {
	svc := PlacementPolicy{UseSpot: true, SpotMinZones: 2, Availability: 0.999, RebalanceMinSaving: 0.2, RebalanceWhenItPays: true, MaxReplicas: 8}
	one := MixTypePolicy(svc, 1)
	if one.SpotMinZones != 2 || one.Availability != 0.999 || one.MaxReplicas != 8 {
		t.Errorf("a mix of one replica keeps the service's hedge and target: %+v", one)
	}
	many := MixTypePolicy(svc, 3)
	if many.SpotMinZones != 0 || many.Availability != 0 {
		t.Errorf("a mix of three: want no per-type hedge or target, got %+v", many)
	}
	for _, p := range []PlacementPolicy{one, many} {
		if p.RebalanceMinSaving != 0 || p.RebalanceWhenItPays {
			t.Errorf("a mix's placer moves replicas: %+v", p)
		}
	}
}
