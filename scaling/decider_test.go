package scaling

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// All tests run on virtual time: t0 plus whole seconds.
var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func sec(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

func conc(v float64) Sample { return Sample{InFlight: v} }

// concCfg is a concurrency policy at 4 requests per replica with short,
// test-friendly windows and delays.
func concCfg() Config {
	return Config{
		Signal:           SignalConcurrency,
		TargetPerReplica: 4,
		MinReplicas:      1,
		MaxReplicas:      20,
		StableWindow:     60 * time.Second,
		PanicWindow:      6 * time.Second,
		PanicThreshold:   2,
		UpscaleDelay:     30 * time.Second,
		DownscaleDelay:   60 * time.Second,
	}
}

// run drives a decider the way the control plane does: record, decide, and
// feed the target back as current.
type run struct {
	t       *testing.T
	d       *Decider
	cur     int
	ready   int // < 0: ready follows the target
	changes int
	last    Decision
}

func newRun(t *testing.T, cfg Config, cur int) *run {
	t.Helper()
	d, err := NewDecider(cfg, t0)
	if err != nil {
		t.Fatal(err)
	}
	return &run{t: t, d: d, cur: cur, ready: -1}
}

func (r *run) step(s int, smp Sample) Decision {
	smp.At = sec(s)
	r.d.Record(smp)
	return r.decide(s)
}

func (r *run) decide(s int) Decision {
	ready := r.cur
	if r.ready >= 0 {
		ready = r.ready
	}
	dec := r.d.Decide(sec(s), ready, r.cur)
	if dec.Target != r.cur {
		r.changes++
	}
	r.cur, r.last = dec.Target, dec
	return dec
}

func (r *run) expect(s, want int) {
	r.t.Helper()
	if r.cur != want {
		r.t.Fatalf("t=%ds: target %d, want %d (desired %d, panic %v: %s)", s, r.cur, want, r.last.Desired, r.last.Panic, r.last.Reason)
	}
}

func TestUpscaleDelay(t *testing.T) {
	r := newRun(t, concCfg(), 2)
	for s := 1; s <= 120; s++ {
		r.step(s, conc(8)) // exactly 2 replicas' worth
		r.expect(s, 2)
	}
	// From t=121 the load is 12: the stable average exceeds 8 at once
	// (desired 3) but 3 may only be adopted after 30 s of wanting it.
	for s := 121; s <= 150; s++ {
		dec := r.step(s, conc(12))
		r.expect(s, 2)
		if dec.Desired != 3 || dec.Panic {
			t.Fatalf("t=%d: desired %d panic %v, want 3 without panic", s, dec.Desired, dec.Panic)
		}
	}
	if !strings.Contains(r.last.Reason, "upscale held 29s of 30s") {
		t.Errorf("reason %q does not show the hold", r.last.Reason)
	}
	r.step(151, conc(12))
	r.expect(151, 3)
	for s := 152; s <= 600; s++ {
		r.step(s, conc(12))
		r.expect(s, 3)
	}
	if r.changes != 1 {
		t.Errorf("%d target changes, want 1", r.changes)
	}
}

// A short spike just before the upscale deadline must not be what gets
// adopted: the hold adopts the level sustained for the whole delay.
func TestUpscaleAdoptsSustainedLevel(t *testing.T) {
	cfg := concCfg()
	cfg.PanicWindow = 0
	r := newRun(t, cfg, 2)
	load := func(s int) float64 {
		switch {
		case s <= 120:
			return 8
		case s >= 146 && s <= 150:
			return 40
		}
		return 12
	}
	for s := 1; s <= 150; s++ {
		r.step(s, conc(load(s)))
		r.expect(s, 2)
	}
	dec := r.step(151, conc(load(151)))
	if dec.Desired != 4 || dec.Target != 3 {
		t.Fatalf("t=151: desired %d target %d, want the latest wish 4 but target 3 (the minimum over the hold): %s", dec.Desired, dec.Target, dec.Reason)
	}
	// The spike keeps the 60 s average above 12 (desired 4) for its whole
	// stay in the window, so 4 is sustained 30 s later and adopted then.
	for s := 152; s <= 180; s++ {
		r.step(s, conc(load(s)))
		r.expect(s, 3)
	}
	r.step(181, conc(load(181)))
	r.expect(181, 4)
	// The spike leaves the window at t=210 (desired 3); 60 s later, down.
	for s := 182; s <= 269; s++ {
		r.step(s, conc(load(s)))
		r.expect(s, 4)
	}
	r.step(270, conc(load(270)))
	r.expect(270, 3)
}

func TestDownscaleDelay(t *testing.T) {
	r := newRun(t, concCfg(), 3)
	for s := 1; s <= 120; s++ {
		r.step(s, conc(12))
		r.expect(s, 3)
	}
	// Load 4 from t=121. The 60 s average reaches 8 (desired 2) at t=150
	// and 4 (desired 1) at t=180. The first step down waits 60 s from
	// t=150 and adopts the highest wish of the hold (2), not the latest (1).
	for s := 121; s <= 209; s++ {
		r.step(s, conc(4))
		r.expect(s, 3)
	}
	if r.last.Desired != 1 {
		t.Fatalf("t=209: desired %d, want 1", r.last.Desired)
	}
	r.step(210, conc(4))
	r.expect(210, 2)
	for s := 211; s <= 269; s++ {
		r.step(s, conc(4))
		r.expect(s, 2)
	}
	r.step(270, conc(4))
	r.expect(270, 1)
	if r.changes != 2 {
		t.Errorf("%d target changes, want 2", r.changes)
	}
}

// A decision that agrees with the current target breaks a pending hold.
func TestHoldResetsWhenDesiredEqualsCurrent(t *testing.T) {
	cfg := concCfg()
	cfg.StableWindow = 10 * time.Second
	cfg.PanicWindow = 0
	r := newRun(t, cfg, 2)
	load := func(s int) float64 {
		if s >= 21 && s <= 35 {
			return 6
		}
		return 12
	}
	// Desired 3 from t=1 to 26, 2 (= current) from 27 to 38, 3 from 39.
	// Without the reset the hold begun at t=1 would adopt 3 at t=31.
	for s := 1; s <= 68; s++ {
		r.step(s, conc(load(s)))
		r.expect(s, 2)
	}
	r.step(69, conc(load(69)))
	r.expect(69, 3)
}

func TestPanicOnBurst(t *testing.T) {
	cfg := concCfg()
	cfg.UpscaleDelay = 60 * time.Second
	r := newRun(t, cfg, 2)
	r.ready = 2 // new replicas take minutes to become ready
	for s := 1; s <= 120; s++ {
		r.step(s, conc(8))
		r.expect(s, 2)
	}
	// A burst of 80 concurrent (20 replicas' worth) from t=121 to 130.
	dec := r.step(121, conc(80))
	if !dec.Panic || dec.Target != 5 {
		// Panic window: (5×8 + 80)/6 = 20 → 5 ≥ 2 × 2 ready.
		t.Fatalf("t=121: panic %v target %d, want panic and 5 at once (no 60 s upscale delay): %s", dec.Panic, dec.Target, dec.Reason)
	}
	for s := 122; s <= 130; s++ {
		r.step(s, conc(80))
	}
	r.expect(130, 20)
	// Back to 8 from t=131. The panic condition last holds at t=135 (the
	// window still sees one sample of 80), so panic ends at 135+60 = 195;
	// until then nothing is scaled down.
	for s := 131; s <= 194; s++ {
		dec := r.step(s, conc(8))
		r.expect(s, 20)
		if !dec.Panic {
			t.Fatalf("t=%d: left panic early: %s", s, dec.Reason)
		}
	}
	if !strings.Contains(r.last.Reason, "no downscale in panic") {
		t.Errorf("reason %q", r.last.Reason)
	}
	dec = r.step(195, conc(8))
	if dec.Panic {
		t.Fatalf("t=195: still in panic: %s", dec.Reason)
	}
	// Normal hysteresis again: desired 2 must hold for the downscale delay.
	for s := 195; s <= 254; s++ {
		r.step(s, conc(8))
		r.expect(s, 20)
	}
	r.step(255, conc(8))
	r.expect(255, 2)
}

// Counts are prorated over each sample's interval, so reports every 20 s do
// not look like a burst to a 6 s panic window.
func TestPanicWithCoarseSamples(t *testing.T) {
	cfg := Config{Signal: SignalQPS, TargetPerReplica: 2.5, MinReplicas: 1, MaxReplicas: 50,
		StableWindow: 60 * time.Second, PanicWindow: 6 * time.Second, PanicThreshold: 2,
		UpscaleDelay: 300 * time.Second, DownscaleDelay: 1200 * time.Second}
	r := newRun(t, cfg, 4)
	for s := 20; s <= 200; s += 20 {
		dec := r.step(s, Sample{Requests: 200}) // 10 qps
		if dec.Desired != 4 || dec.Panic || dec.Target != 4 {
			t.Fatalf("t=%d: %+v, want desired 4, no panic", s, dec)
		}
	}
	dec := r.step(220, Sample{Requests: 2000}) // 100 qps over the last 20 s
	if !dec.Panic || dec.Target != 40 {
		t.Fatalf("t=220: %+v, want panic to 40", dec)
	}
}

// A noisy load sitting right on a replica boundary (concurrency 7..9 at 4
// per replica: desired flips between 2 and 3) must not move the target back
// and forth.
func TestNoFlappingUnderNoisyLoad(t *testing.T) {
	cfg := concCfg()
	cfg.DownscaleDelay = 300 * time.Second
	for seed := uint64(1); seed <= 5; seed++ {
		rng := rand.New(rand.NewPCG(seed, 42))
		r := newRun(t, cfg, 2)
		seen := map[int]bool{}
		for s := 1; s <= 1800; s++ {
			dec := r.step(s, Sample{InFlight: 6.5 + 2*rng.Float64(), Waiting: rng.Float64()})
			seen[dec.Desired] = true
		}
		if !seen[2] || !seen[3] {
			t.Fatalf("seed %d: desired values %v; the test load must straddle the boundary", seed, seen)
		}
		if r.changes > 1 {
			t.Errorf("seed %d: %d target changes in 30 min, want ≤ 1", seed, r.changes)
		}
	}
}

func TestScaleToZeroAndWake(t *testing.T) {
	cfg := concCfg()
	cfg.MinReplicas = 0
	cfg.MaxReplicas = 5
	cfg.ScaleToZeroAfter = 120 * time.Second
	r := newRun(t, cfg, 0)

	// A fresh service stays at zero until its first request.
	r.decide(0)
	r.expect(0, 0)
	for s := 1; s <= 9; s++ {
		r.step(s, Sample{})
		r.expect(s, 0)
	}
	if !strings.Contains(r.last.Reason, "no traffic yet") {
		t.Errorf("reason %q", r.last.Reason)
	}
	// The first waiting request wakes it in the very next decision.
	dec := r.step(10, Sample{Waiting: 1})
	if dec.Target != 1 || !strings.Contains(dec.Reason, "wake from zero") {
		t.Fatalf("t=10: %+v, want a wake to 1", dec)
	}
	for s := 11; s <= 100; s++ {
		r.step(s, conc(2))
		r.expect(s, 1)
	}
	// Idle from t=101: the last activity was at t=100.
	for s := 101; s <= 219; s++ {
		r.step(s, Sample{})
		r.expect(s, 1)
	}
	r.step(220, Sample{})
	r.expect(220, 0)
	for s := 221; s <= 299; s++ {
		r.step(s, Sample{})
		r.expect(s, 0)
	}
	r.step(300, Sample{Waiting: 3})
	r.expect(300, 1)

	// Reports stop altogether after a busy one: still goes to zero after
	// the idle period, and that stale busy report does not wake it again.
	for s := 301; s <= 419; s++ {
		r.decide(s)
		r.expect(s, 1)
	}
	for s := 420; s <= 1000; s++ {
		r.decide(s)
		r.expect(s, 0)
	}
}

// Waking on a large queue goes straight to what the queue needs.
func TestWakeFromZeroOnBurst(t *testing.T) {
	cfg := concCfg()
	cfg.MinReplicas = 0
	cfg.ScaleToZeroAfter = 300 * time.Second
	r := newRun(t, cfg, 0)
	r.ready = 0
	for s := 1; s <= 100; s++ {
		r.step(s, Sample{})
	}
	// One second of 40 waiting in a 6 s panic window averages 6.7 → 2,
	// which is already ≥ 2 × max(0 ready, 1): panic, and wake to 2 at once.
	dec := r.step(101, Sample{Waiting: 40, Requests: 40})
	if dec.Target != 2 || !dec.Panic || !strings.Contains(dec.Reason, "wake from zero") {
		t.Fatalf("%+v, want a wake to 2 in panic", dec)
	}
	// The queue persists while replicas start: panic follows it up every
	// second, no upscale delay, to 40/4 = 10 once the panic window is full.
	want := map[int]int{102: 4, 103: 5, 104: 7, 105: 9, 106: 10}
	for s := 102; s <= 106; s++ {
		r.step(s, Sample{Waiting: 40})
		r.expect(s, want[s])
	}
}

func TestScaleToZeroSkipsDownscaleDelay(t *testing.T) {
	cfg := concCfg()
	cfg.MinReplicas = 0
	cfg.DownscaleDelay = 1000 * time.Second
	cfg.ScaleToZeroAfter = 120 * time.Second
	r := newRun(t, cfg, 3)
	for s := 1; s <= 100; s++ {
		r.step(s, conc(12))
		r.expect(s, 3)
	}
	for s := 101; s <= 219; s++ {
		r.step(s, Sample{})
		r.expect(s, 3)
	}
	r.step(220, Sample{})
	r.expect(220, 0)
}

func TestMinReplicasNeverBelow(t *testing.T) {
	cfg := concCfg()
	cfg.MinReplicas = 2
	cfg.DownscaleDelay = 0
	r := newRun(t, cfg, 0)
	r.decide(0) // a fresh service starts at its minimum at once
	r.expect(0, 2)
	for s := 1; s <= 3600; s++ {
		r.step(s, Sample{})
		r.expect(s, 2)
	}
}

// A service's first replicas say why they start: a fixed count is not a wake from zero
// (no load asked for it), nor is a minimum above the load (issue 47, from a user's log:
// "target 0 → 1: … concurrency 0 / 8 … wake from zero" for replicas: 1).
func TestFirstReplicasSayWhy(t *testing.T) {
	for _, tc := range []struct {
		min, max int
		load     float64
		want     int
		say, not string
	}{
		{1, 1, 0, 1, "a fixed 1 replica(s)", "wake from zero"},
		{3, 3, 20, 3, "a fixed 3 replica(s)", "wake from zero"},
		{2, 5, 0, 2, "start at min_replicas 2", "wake from zero"},
		{0, 5, 8, 2, "wake from zero", "min_replicas"},
	} {
		cfg := concCfg()
		cfg.MinReplicas, cfg.MaxReplicas = tc.min, tc.max
		if tc.min == 0 {
			cfg.ScaleToZeroAfter = time.Minute
		}
		r := newRun(t, cfg, 0)
		dec := r.step(1, Sample{InFlight: tc.load})
		if dec.Target != tc.want || !strings.Contains(dec.Reason, tc.say) || strings.Contains(dec.Reason, tc.not) {
			t.Errorf("min %d max %d at %v in flight: target %d, %q; want %d, saying %q and not %q", tc.min, tc.max, tc.load, dec.Target, dec.Reason, tc.want, tc.say, tc.not)
		}
	}
}

func TestQPSMatchesSkyServe(t *testing.T) {
	cfg := Config{Signal: SignalQPS, TargetPerReplica: 2.5, MinReplicas: 1, MaxReplicas: 10,
		StableWindow: 60 * time.Second, PanicWindow: 6 * time.Second, PanicThreshold: 2,
		UpscaleDelay: 300 * time.Second, DownscaleDelay: 1200 * time.Second}

	// 10 req/s ÷ 2.5 → 4, whether reported every second or every 20 s.
	d, _ := NewDecider(cfg, t0)
	for s := 1; s <= 120; s++ {
		d.Record(Sample{At: sec(s), Requests: 10})
	}
	dec := d.Decide(sec(120), 4, 4)
	if dec.Desired != 4 || dec.Target != 4 {
		t.Fatalf("1 s samples: %+v, want 4", dec)
	}
	if !strings.Contains(dec.Reason, "qps 10 / 2.5 per replica → 4") {
		t.Errorf("reason %q", dec.Reason)
	}
	d, _ = NewDecider(cfg, t0)
	for s := 20; s <= 120; s += 20 {
		d.Record(Sample{At: sec(s), Requests: 200})
	}
	if dec := d.Decide(sec(120), 4, 4); dec.Desired != 4 {
		t.Fatalf("20 s samples: %+v, want 4", dec)
	}
	// 9 req/s → 3.6 → 4; 7.5 req/s → exactly 3, no float rounding up.
	d, _ = NewDecider(cfg, t0)
	for s := 1; s <= 120; s++ {
		d.Record(Sample{At: sec(s), Requests: 7.5})
	}
	if dec := d.Decide(sec(120), 3, 3); dec.Desired != 3 {
		t.Fatalf("7.5 qps: %+v, want 3", dec)
	}

	// A fresh service's first 5 s of 50 req/s are 50 req/s, not 250/60.
	d, _ = NewDecider(cfg, t0)
	for s := 1; s <= 5; s++ {
		d.Record(Sample{At: sec(s), Requests: 50})
	}
	if dec := d.Decide(sec(5), 10, 10); dec.Desired != 20 {
		t.Fatalf("fresh burst: %+v, want desired 20", dec)
	}
}

func TestTokensSignal(t *testing.T) {
	cfg := concCfg()
	cfg.Signal = SignalTokens
	cfg.TargetPerReplica = 1000
	r := newRun(t, cfg, 3)
	for s := 1; s <= 120; s++ {
		// 2,500 tokens/s → 3 replicas; requests and concurrency are ignored.
		dec := r.step(s, Sample{Tokens: 2500, Requests: 100, InFlight: 100})
		if s >= 60 && dec.Desired != 3 {
			t.Fatalf("t=%d: %+v, want desired 3", s, dec)
		}
		r.expect(s, 3)
	}
	if !strings.Contains(r.last.Reason, "tokens/s 2500") {
		t.Errorf("reason %q", r.last.Reason)
	}
}

func TestClipping(t *testing.T) {
	cfg := concCfg()
	cfg.MinReplicas, cfg.MaxReplicas = 2, 5
	cfg.UpscaleDelay, cfg.DownscaleDelay = 0, 0
	cfg.PanicWindow = 0
	r := newRun(t, cfg, 2)
	dec := r.step(1, conc(400))
	if dec.Desired != 100 || dec.Target != 5 {
		t.Fatalf("%+v, want desired 100 clipped to 5", dec)
	}
	for s := 2; s <= 200; s++ {
		r.step(s, Sample{})
	}
	r.expect(200, 2)

	// A service update that lowers the maximum applies at once, without the
	// downscale delay (SkyServe #3255: running above max after an update).
	r.d.Record(Sample{At: sec(201), InFlight: 400})
	r.cur = 5
	cfg.MaxReplicas = 3
	cfg.DownscaleDelay = time.Hour
	if err := r.d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	r.decide(201)
	r.expect(201, 3)
}

func TestOverprovision(t *testing.T) {
	cfg := concCfg()
	cfg.MinReplicas = 0
	cfg.NumOverprovision = 2
	cfg.ScaleToZeroAfter = 60 * time.Second
	r := newRun(t, cfg, 0)
	r.decide(0)
	r.expect(0, 0) // 0 is never overprovisioned
	r.step(1, Sample{Waiting: 1})
	r.expect(1, 3) // woken to 1, plus 2
	cfg.UpscaleDelay = 0
	_ = r.d.SetConfig(cfg)
	// Target is fed back as current; the overprovision must not read as
	// excess and drift down, nor compound upward.
	for s := 2; s <= 600; s++ {
		r.step(s, conc(12))
		if s >= 3 {
			r.expect(s, 5)
		}
	}
	if r.changes != 2 {
		t.Errorf("%d changes, want 2 (wake, then 3+2)", r.changes)
	}
	for s := 601; s <= 659; s++ {
		r.step(s, Sample{})
	}
	r.step(660, Sample{})
	r.expect(660, 0)
}

func TestValidate(t *testing.T) {
	good := concCfg()
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	noPanic := good
	noPanic.PanicWindow, noPanic.PanicThreshold = 0, 0
	if err := noPanic.Validate(); err != nil {
		t.Fatalf("panic disabled: %v", err)
	}
	cases := []struct {
		field string
		mod   func(*Config)
	}{
		{"Signal", func(c *Config) { c.Signal = "latency" }},
		{"Signal", func(c *Config) { c.Signal = "" }},
		{"TargetPerReplica", func(c *Config) { c.TargetPerReplica = 0 }},
		{"TargetPerReplica", func(c *Config) { c.TargetPerReplica = math.NaN() }},
		{"TargetPerReplica", func(c *Config) { c.TargetPerReplica = math.Inf(1) }},
		{"MinReplicas", func(c *Config) { c.MinReplicas = -1 }},
		{"MaxReplicas", func(c *Config) { c.MaxReplicas = 0; c.MinReplicas = 0; c.ScaleToZeroAfter = time.Minute }},
		{"MaxReplicas (1) must be ≥ MinReplicas (3)", func(c *Config) { c.MinReplicas, c.MaxReplicas = 3, 1 }},
		{"NumOverprovision", func(c *Config) { c.NumOverprovision = -1 }},
		{"StableWindow", func(c *Config) { c.StableWindow = 0 }},
		{"PanicWindow", func(c *Config) { c.PanicWindow = -time.Second }},
		{"PanicWindow (2m0s) must not be longer", func(c *Config) { c.PanicWindow = 2 * time.Minute }},
		{"PanicThreshold", func(c *Config) { c.PanicThreshold = 1 }},
		{"UpscaleDelay", func(c *Config) { c.UpscaleDelay = -1 }},
		{"DownscaleDelay", func(c *Config) { c.DownscaleDelay = -1 }},
		{"ScaleToZeroAfter", func(c *Config) { c.ScaleToZeroAfter = -1 }},
		{"ScaleToZeroAfter must be > 0 when MinReplicas is 0", func(c *Config) { c.MinReplicas = 0 }},
	}
	for _, tc := range cases {
		c := good
		tc.mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: got %v", tc.field, err)
		}
		if _, err := NewDecider(c, t0); err == nil {
			t.Errorf("%s: NewDecider accepted it", tc.field)
		}
	}
	// Every problem is reported at once.
	bad := Config{Signal: "x", MinReplicas: -1}
	if n := strings.Count(bad.Validate().Error(), "\n") + 1; n < 4 {
		t.Errorf("only %d errors reported: %v", n, bad.Validate())
	}
	d, _ := NewDecider(good, t0)
	if err := d.SetConfig(Config{}); err == nil {
		t.Error("SetConfig accepted an empty config")
	}
}

func TestSetConfigKeepsWindowsAndResetsHolds(t *testing.T) {
	cfg := concCfg()
	cfg.PanicWindow = 0
	r := newRun(t, cfg, 2)
	for s := 1; s <= 120; s++ {
		r.step(s, conc(8))
	}
	// Load 12 from t=121: an upscale hold starts then and would adopt 3 at 151.
	for s := 121; s <= 140; s++ {
		r.step(s, conc(12))
		r.expect(s, 2)
	}
	cfg.TargetPerReplica = 3 // still wants 3 from 12 concurrent... and 4 later
	if err := r.d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	// The samples survived: the very first decision sees the window's load
	// ((8×39 + 12×21)/60 = 9.4 → ceil(9.4/3) = 4), not an empty window.
	dec := r.step(141, conc(12))
	if dec.Desired != 4 {
		t.Fatalf("t=141: %+v, want desired 4 from the kept window", dec)
	}
	// The hold restarted at t=141, so nothing is adopted at t=151.
	for s := 142; s <= 170; s++ {
		r.step(s, conc(12))
		r.expect(s, 2)
	}
	r.step(171, conc(12))
	r.expect(171, 4)
}

func TestRecordIsRobust(t *testing.T) {
	cfg := Config{Signal: SignalQPS, TargetPerReplica: 2.5, MinReplicas: 1, MaxReplicas: 100,
		StableWindow: 60 * time.Second, UpscaleDelay: time.Minute, DownscaleDelay: time.Minute}
	d, _ := NewDecider(cfg, t0)
	// Out of order and a duplicate (a retried report): 10 req/s.
	for _, s := range []int{3, 1, 2, 2, 4} {
		d.Record(Sample{At: sec(s), Requests: 10})
	}
	if dec := d.Decide(sec(4), 4, 4); dec.Desired != 4 {
		t.Fatalf("%+v, want desired 4 (a duplicate replaces, it does not add)", dec)
	}
	// Garbage values count as nothing.
	for i, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -5} {
		d.Record(Sample{At: sec(5 + i), Requests: v, InFlight: v, Waiting: v, Tokens: v})
	}
	if dec := d.Decide(sec(8), 4, 4); dec.Desired != 2 || math.IsNaN(float64(dec.Desired)) {
		// 40 requests over 8 s = 5 qps → 2.
		t.Fatalf("%+v, want desired 2", dec)
	}
	// Far too old: dropped; deciding in the past and at odd instants must
	// not panic.
	d.Record(Sample{At: sec(-1000), Requests: 1e9})
	_ = d.Decide(sec(-5000), 0, 0)
	_ = d.Decide(sec(8).Add(time.Nanosecond), 1, 1)
	if dec := d.Decide(sec(8), 4, 4); dec.Desired != 2 {
		t.Fatalf("after an ancient sample: %+v, want desired 2", dec)
	}
	// A fresh decider with nothing recorded.
	d, _ = NewDecider(cfg, t0)
	if dec := d.Decide(t0, 0, 0); dec.Target != 1 {
		t.Fatalf("empty: %+v, want min 1", dec)
	}
}

// The window stays bounded over a day of one-second samples.
func TestWindowStaysBounded(t *testing.T) {
	cfg := concCfg()
	d, _ := NewDecider(cfg, t0)
	cur := 1
	for s := 1; s <= 86400; s++ {
		d.Record(Sample{At: sec(s), InFlight: float64(s % 50)})
		cur = d.Decide(sec(s), cur, cur).Target
		if len(d.samples) > 62 {
			t.Fatalf("t=%d: %d samples held for a 60 s window", s, len(d.samples))
		}
	}
	if cap(d.samples) > 256 {
		t.Errorf("backing array grew to %d", cap(d.samples))
	}
}

func BenchmarkDecide(b *testing.B) {
	cfg := concCfg()
	d, _ := NewDecider(cfg, t0)
	for s := 0; s < 60; s++ {
		d.Record(Sample{At: sec(s), InFlight: 8, Requests: 5})
	}
	cur := 2
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		now := sec(60 + i)
		d.Record(Sample{At: now, InFlight: float64(6 + i%5), Requests: 5})
		cur = d.Decide(now, cur, cur).Target
	}
}

// 1.1 ÷ 0.1 is 11.000000000000002 in floating point; that is 11 replicas'
// worth of load, not 12.
func TestExactBoundaryIsNotRoundedUp(t *testing.T) {
	cfg := concCfg()
	cfg.TargetPerReplica = 0.1
	d, _ := NewDecider(cfg, t0)
	d.Record(Sample{At: sec(1), InFlight: 1.1})
	if dec := d.Decide(sec(1), 11, 11); dec.Desired != 11 || dec.Target != 11 {
		t.Fatalf("%+v, want 11", dec)
	}
}

// A backlog held through a cold start grows every second; with a scale-up
// rate the target is bounded by the ready replicas, and grows again only as
// replicas become ready.
func TestMaxScaleUpRateBoundsColdStartBacklog(t *testing.T) {
	cfg := concCfg()
	cfg.MinReplicas = 0
	cfg.ScaleToZeroAfter = 300 * time.Second
	cfg.MaxScaleUpRate = 4
	r := newRun(t, cfg, 0)
	r.ready = 0
	for s := 1; s <= 120; s++ { // 5 more held requests every second, nothing ready
		r.step(s, Sample{Waiting: float64(5 * s), Requests: 5})
		if r.cur > 4 {
			t.Fatalf("t=%ds: target %d with 0 ready, want ≤ 4 (%s)", s, r.cur, r.last.Reason)
		}
	}
	r.expect(120, 4)
	if !strings.Contains(r.last.Reason, "at most 4 × 1 ready → 4") {
		t.Fatalf("reason %q does not name the bound", r.last.Reason)
	}
	r.ready = 3
	r.step(121, Sample{InFlight: 600})
	r.expect(121, 12)
	// Without the bound the same backlog asks for the maximum.
	cfg.MaxScaleUpRate = 0
	r = newRun(t, cfg, 0)
	r.ready = 0
	for s := 1; s <= 120; s++ {
		r.step(s, Sample{Waiting: float64(5 * s), Requests: 5})
	}
	r.expect(120, cfg.MaxReplicas)
}

// SkyServe's rule, for the simulator's baseline: the hold ends on the latest wish.
func TestAdoptLatestEndsHoldOnLatestWish(t *testing.T) {
	cfg := concCfg()
	cfg.PanicWindow = 0
	cfg.AdoptLatest = true
	r := newRun(t, cfg, 2)
	for s := 1; s <= 120; s++ {
		r.step(s, conc(8))
	}
	for s := 121; s <= 150; s++ { // 12 → desired 3 from t=121 (avg crosses 8 at once)
		r.step(s, conc(12))
	}
	r.expect(150, 2)
	// Same spike as above: the latest wish at the end of the hold is 4, adopted at once.
	for s := 146; s <= 151; s++ {
		r.d.Record(Sample{At: sec(s), InFlight: 40})
	}
	dec := r.decide(151)
	if dec.Target != 4 {
		t.Fatalf("t=151: target %d, want 4 (the latest wish): %s", dec.Target, dec.Reason)
	}
}

// Requests held through a cold start count as their arrival rate × the time a request
// spends in flight (learned from the last window of normal service), not one each: the
// backlog of a 5-minute start is not demand for a fleet. A real rise in arrivals during
// the hold still raises the target.
func TestHeldRequestsCountAsArrivalsTimesServiceTime(t *testing.T) {
	cfg := concCfg()
	r := newRun(t, cfg, 2)
	for s := 1; s <= 120; s++ { // 3 requests/s, 6 in flight: W = 2 s
		r.step(s, Sample{InFlight: 6, Requests: 3})
	}
	r.expect(120, 2)
	if math.Abs(r.d.serviceTime-2) > 0.01 {
		t.Fatalf("learned W = %vs, want 2s", r.d.serviceTime)
	}
	r.ready = 0 // every replica gone (preempted); the replacements take 5 minutes
	for s := 121; s <= 420; s++ {
		r.step(s, Sample{Waiting: float64(3 * (s - 120)), Requests: 3})
		r.expect(s, 2)
	}
	if !strings.Contains(r.last.Reason, "900 held: counted as arrivals × 2s in flight each") {
		t.Fatalf("reason %q does not say how held requests count", r.last.Reason)
	}
	for s := 421; s <= 600; s++ { // arrivals triple while still held: 9/s × 2 s = 18 → 5
		r.step(s, Sample{Waiting: float64(900 + 9*(s-420)), Requests: 9})
	}
	r.expect(600, 5)
	// The backlog released onto one fresh replica is not normal service: W is not
	// learned from it, so the next hold is still judged by the old W.
	r.ready = 1
	for s := 601; s <= 720; s++ {
		r.step(s, Sample{InFlight: 2000, Requests: 3})
	}
	if math.Abs(r.d.serviceTime-2) > 0.01 {
		t.Fatalf("W = %vs after a released backlog, want still 2s", r.d.serviceTime)
	}

	// Without a learned W (a service never seen serving), held requests count one each.
	r = newRun(t, cfg, 2)
	r.ready = 0
	for s := 1; s <= 300; s++ {
		r.step(s, Sample{Waiting: float64(3 * s), Requests: 3})
	}
	if r.cur != cfg.MaxReplicas {
		t.Fatalf("no W: target %d, want the held count's %d", r.cur, cfg.MaxReplicas)
	}
}

// A lone replica's preemption: requests are held through the replacement's cold start and
// released onto it at once, and that backlog in flight, read as concurrency, used to ask for
// 4 replicas (three cold starts bought for a backlog gone before they were ready). Within a
// stable window of a hold, the reading counts arrivals × W at most.
func TestReleasedBacklogIsNotDemand(t *testing.T) {
	cfg := concCfg()
	cfg.PanicWindow = 0
	cfg.MaxScaleUpRate = 4
	r := newRun(t, cfg, 1)
	for s := 1; s <= 120; s++ { // 3 requests/s at 0.9 s each: 2.7 in flight, W learned
		r.step(s, Sample{Requests: 3, InFlight: 2.7})
	}
	r.ready = 0
	for s := 121; s <= 420; s++ { // preempted: held through a 5-minute cold start
		r.step(s, Sample{Requests: 3, Waiting: float64(3 * (s - 120))})
		r.expect(s, 1)
	}
	r.ready = 1
	for s := 421; s <= 700; s++ { // released: 900 in flight, draining over four minutes
		r.step(s, Sample{Requests: 3, InFlight: max(2.7, 900-4*float64(s-421))})
		r.expect(s, 1)
	}
	// Once drained, a reading that high is demand again, once the fleet has the replicas
	// the arrivals need at W (TestQueueInAShortFleetIsNotDemand).
	r.ready = -1
	for s := 701; s <= 800; s++ {
		r.step(s, Sample{Requests: 3, InFlight: 40})
	}
	if r.cur < 4 {
		t.Fatalf("t=800s: target %d for 40 in flight at 4 per replica, want ≥ 4 (%s)", r.cur, r.last.Reason)
	}
}

// Requests the routers' queues refused for want of room count as the demand they were:
// their arrival rate × W in flight (concurrency), their tokens (tokens_per_second), so that a
// saturated fleet grows and its saturation passes. W is not learned while they are shed.
func TestShedRequestsCountAsDemand(t *testing.T) {
	r := newRun(t, concCfg(), 2)
	for s := 1; s <= 120; s++ { // 3 requests/s, 6 in flight: W = 2 s
		r.step(s, Sample{InFlight: 6, Requests: 3})
	}
	r.expect(120, 2)
	// A flood at 9 requests/s: the fleet's room holds 8 in flight, the queue refuses 5/s.
	// Demand: 8 + 5 × 2 s = 18 in flight → 5 replicas at 4 each (8 alone would keep 2).
	for s := 121; s <= 300; s++ {
		r.step(s, Sample{InFlight: 8, Requests: 9, Shed: 5})
	}
	r.expect(300, 5)
	if math.Abs(r.d.serviceTime-2) > 0.01 {
		t.Fatalf("W = %vs while requests were shed, want still 2s", r.d.serviceTime)
	}

	cfg := concCfg()
	cfg.Signal, cfg.TargetPerReplica = SignalTokens, 1000
	r = newRun(t, cfg, 2)
	for s := 1; s <= 120; s++ {
		r.step(s, Sample{Tokens: 1500, Requests: 3})
	}
	r.expect(120, 2)
	for s := 121; s <= 300; s++ { // 2,000 tokens/s served, 2,500 shed: 4,500 → 5
		r.step(s, Sample{Tokens: 2000, Requests: 9, Shed: 5, ShedTokens: 2500})
	}
	r.expect(300, 5)
}

// A burst queues requests inside a fleet short of replicas, and the in-flight count holds
// that queue. It is not demand: while fewer replicas are ready than the arrivals need at
// W, the reading counts arrivals × W (on azure-code the queue of an hourly burst had asked
// for 11 replicas where 6 served it, each bought with a cold start). Once the fleet has
// the replicas the arrivals need, a reading still above arrivals × W is demand again:
// requests that now take longer than W.
func TestQueueInAShortFleetIsNotDemand(t *testing.T) {
	cfg := concCfg()
	cfg.PanicWindow = 0
	r := newRun(t, cfg, 2)
	for s := 1; s <= 120; s++ { // 3 requests/s, 6 in flight: W = 2 s
		r.step(s, Sample{InFlight: 6, Requests: 3})
	}
	r.expect(120, 2)
	// A burst: 6 requests/s need 6/s × 2 s = 12 in flight, 3 replicas at 4 each. The two
	// ready replicas queue what they cannot run: 40 in flight (10 replicas' worth).
	r.ready = 2
	for s := 121; s <= 300; s++ {
		r.step(s, Sample{InFlight: min(40, 6+float64(s-120)), Requests: 6})
	}
	// W is learned while the queue is still within twice the ready replicas' room, so it
	// grows a little during the burst's first seconds; the target is what the arrivals
	// need at that W, short of the queue's 10.
	w := r.d.serviceTime
	if want := replicasFor(6*w, cfg.TargetPerReplica); r.cur != want || want >= 10 {
		t.Fatalf("t=300s: target %d, want the arrivals' 6/s × W %.2fs at 4 each: %d (%s)", r.cur, w, want, r.last.Reason)
	}
	if !strings.Contains(r.last.Reason, "queued in 2 ready replicas short of the arrivals × ") {
		t.Fatalf("reason %q does not say the queue was left out", r.last.Reason)
	}
	// The new replicas are ready and the queue drains: W is learned again (2 s), and the
	// fleet settles at the 3 replicas the arrivals need.
	r.ready = -1
	for s := 301; s <= 540; s++ {
		r.step(s, Sample{InFlight: max(12, 40-float64(s-300)), Requests: 6})
	}
	r.expect(540, 3)
	// The requests now take longer (W is 20/3 s, not 2): with the replicas the arrivals
	// need at the old W ready, the whole reading is demand and the fleet grows for it.
	for s := 541; s <= 700; s++ {
		r.step(s, Sample{InFlight: 40, Requests: 6})
	}
	r.expect(700, 10)
}
