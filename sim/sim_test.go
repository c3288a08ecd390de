package sim

import (
	"math"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/market"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/spec"
	"github.com/arbiter-serve/arbiter/traces"
)

// inputs builds real inputs: the benchmark's service.yaml, embedded traces and catalogs.
func inputs(t testing.TB, requests, spot string, d time.Duration) Inputs {
	t.Helper()
	sp, err := spec.Load("../bench/sim/h100-gcp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rt, err := traces.NamedRequests(requests)
	if err != nil {
		t.Fatal(err)
	}
	st, err := traces.NamedSpot(spot)
	if err != nil {
		t.Fatal(err)
	}
	cat, err := pricing.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	p, err := engine.LoadProfile("h100-llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	sp.Service.ReplicaPolicy.TargetQPSPerReplica = 8
	sp.Arbiter.Autoscaling.TargetConcurrencyPerReplica = 24
	return Inputs{Spec: sp, Requests: rt, Spot: st, Catalog: cat, Profile: *p, Start: time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC),
		Duration: d, ColdStart: DefaultColdStart, ZoneCooldown: 10 * time.Minute, Seed: 1, Warm: true}
}

const volatile = "skypilot-preemption-aws-04-22-2023-v100_1"

func run(t *testing.T, sys System, in Inputs) *Result {
	t.Helper()
	r, err := Run(sys, in)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: $%.2f $/M %.3f slo %.4f avail %.4f preempt %d failed %v hours %v launches %d refused %d",
		sys, r.Dollars, r.DollarsPerMillionTokens(), r.SLOAttainment(), r.Availability(), r.Preemptions, r.Failed, r.ReplicaHours, r.Launches, r.LaunchFailures)
	return r
}

func TestDeterministic(t *testing.T) {
	in := inputs(t, "azure-conversation", volatile, 2*time.Hour)
	a, b := run(t, SkyServe, in), run(t, SkyServe, in)
	if a.Dollars != b.Dollars || a.Succeeded != b.Succeeded || a.TTFT != b.TTFT || a.Events != b.Events {
		t.Fatalf("same inputs, different runs: %+v vs %+v", a, b)
	}
}

// The accounting adds up: every arrival is a success, a failure, or still open at the end;
// dollars are replica-hours × the prices quoted; tokens are the succeeded requests' own.
func TestAccountingAddsUp(t *testing.T) {
	in := inputs(t, "azure-conversation", volatile, 2*time.Hour)
	r := run(t, OnDemand, in)
	if r.Succeeded+r.FailedTotal() != r.Requests {
		t.Fatalf("succeeded %d + failed %d != requests %d", r.Succeeded, r.FailedTotal(), r.Requests)
	}
	tiled := in.Requests.Tile(in.Duration)
	if r.Requests > len(tiled) || r.Requests < len(tiled)-200 {
		t.Fatalf("%d requests counted, the trace has %d in 2 h", r.Requests, len(tiled))
	}
	if r.ReplicaHours["spot/gcp"] != 0 || r.Preemptions != 0 {
		t.Fatalf("on-demand run used spot: %v, %d preemptions", r.ReplicaHours, r.Preemptions)
	}
	// Every on-demand a3-highgpu-1g in the catalog costs between these (us-central1 is $11.06).
	h := r.ReplicaHours["on_demand/gcp"]
	if perHour := r.Dollars / h; perHour < 10 || perHour > 15 {
		t.Fatalf("$%.2f over %.2f replica-hours = $%.2f/h, not an H100:1 on-demand price", r.Dollars, h, perHour)
	}
	if h < 2 || h > float64(r.PeakReplicas)*2+1e-9 {
		t.Fatalf("%.2f replica-hours for 2 h with at most %d replicas", h, r.PeakReplicas)
	}
	var tokens int64
	for _, q := range tiled[:r.Succeeded] {
		tokens += int64(q.InputTokens + q.OutputTokens)
	}
	if got := r.InputTokens + r.OutputTokens; math.Abs(float64(got-tokens)) > 0.01*float64(tokens) {
		t.Fatalf("%d tokens accounted, the first %d trace requests hold %d", got, r.Succeeded, tokens)
	}
}

// The volatile trace preempts the service's spot replicas several times in six hours. With
// notices Arbiter drains them and loses (almost) nothing; SkyServe, which does not use
// notices, loses the streams under way and sends requests to dead replicas until it sees.
func TestPreemptionsWithAndWithoutNotice(t *testing.T) {
	in := inputs(t, "azure-conversation", volatile, 6*time.Hour)
	// Four replicas across the trace's zones, so its preemptions hit some.
	sp := *in.Spec
	sp.Service.ReplicaPolicy.MinReplicas = 4
	in.Spec = &sp
	a, s := run(t, Arbiter, in), run(t, SkyServe, in)
	if a.Preemptions == 0 || s.Preemptions == 0 {
		t.Fatalf("no preemption in 6 h of %s (arbiter %d, skyserve %d)", volatile, a.Preemptions, s.Preemptions)
	}
	if a.Failed["preempted"] > a.Preemptions {
		t.Fatalf("arbiter lost %d streams in %d preemptions with a 30 s notice", a.Failed["preempted"], a.Preemptions)
	}
	if s.FailedTotal() <= a.FailedTotal() {
		t.Fatalf("skyserve failed %d, arbiter %d: notices should make the difference", s.FailedTotal(), a.FailedTotal())
	}
	if a.ReplicaHours["spot/gcp"] < a.ReplicaHours["on_demand/gcp"] {
		t.Fatalf("arbiter ran mostly on-demand: %v", a.ReplicaHours)
	}
}

// An availability trace refuses spot launches in zones without capacity; dynamic fallback
// covers them with on-demand.
func TestSpotRefusedWhereTheTraceHasNoCapacity(t *testing.T) {
	in := inputs(t, "azure-code", "skypilot-availability-aws-02-15-2023-v100_1", 6*time.Hour)
	r := run(t, Arbiter, in)
	if r.LaunchFailures == 0 {
		t.Fatal("no spot launch refused")
	}
	if r.ReplicaHours["on_demand/gcp"] == 0 {
		t.Fatal("no on-demand stand-in while spot was refused")
	}
}

func TestCalibrationFindsTheSmallestFleet(t *testing.T) {
	in := inputs(t, "azure-code", volatile, time.Hour)
	c, err := Calibrate(in, 30*time.Minute, 6)
	if err != nil {
		t.Fatal(err)
	}
	if c.Replicas < 2 {
		t.Fatalf("calibration %+v: one replica cannot hold azure-code's bursts within the SLO", c)
	}
	sp := *in.Spec
	sp.Service.ReplicaPolicy.MinReplicas, sp.Service.ReplicaPolicy.MaxReplicas = c.Replicas-1, c.Replicas-1
	in.Spec, in.Duration = &sp, 30*time.Minute
	if r := run(t, OnDemand, in); r.SLOAttainment() >= sp.Arbiter.SLO.Percentile {
		t.Fatalf("%d replicas already reach %.3f: calibration %+v is not the smallest", c.Replicas-1, r.SLOAttainment(), c)
	}
	c.Apply(&in)
	if in.Spec.Service.ReplicaPolicy.TargetQPSPerReplica != c.QPSPerReplica || in.Spec.Arbiter.Autoscaling.TargetConcurrencyPerReplica != c.ConcurrencyPerRep {
		t.Fatal("Apply did not set both targets")
	}
}

func TestFromZeroHoldsInsteadOf503(t *testing.T) {
	in := inputs(t, "azure-conversation", volatile, 30*time.Minute)
	in.Warm = false
	a, s := run(t, Arbiter, in), run(t, SkyServe, in)
	if a.ZeroWaits == 0 || a.MaxZeroWait < in.ColdStart-time.Second || a.Failed["no_replica"] != 0 {
		t.Fatalf("arbiter from zero: %d waits, max %v, failed %v", a.ZeroWaits, a.MaxZeroWait, a.Failed)
	}
	if s.Failed["no_replica"] == 0 {
		t.Fatalf("skyserve from zero answered no 503: %v", s.Failed)
	}
}

func TestEngineBlocks(t *testing.T) {
	got := engineBlocks([]uint64{7, 9}, 512, 16, 600)
	if len(got) != 37 { // 600/16 = 37 blocks, within the 64 the two trace blocks cover
		t.Fatalf("%d blocks, want 37", len(got))
	}
	again := engineBlocks([]uint64{7, 3}, 512, 16, 600)
	for i := range 32 {
		if got[i] != again[i] {
			t.Fatalf("block %d differs for the same first trace block", i)
		}
	}
	if got[32] == again[32] {
		t.Fatal("different second trace blocks gave the same engine block")
	}
	if engineBlocks(nil, 512, 16, 600) != nil {
		t.Fatal("no trace blocks should mean no prefix caching")
	}
}

func TestBadInputs(t *testing.T) {
	in := inputs(t, "azure-conversation", volatile, time.Hour)
	if _, err := Run("nope", in); err == nil {
		t.Fatal("unknown system accepted")
	}
	in.Duration = 0
	if _, err := Run(Arbiter, in); err == nil {
		t.Fatal("zero duration accepted")
	}
}

// BenchmarkDay is the performance bar: 24 simulated hours (the heaviest trace,
// Mooncake's long prompts, with Arbiter's policy) must take under 2 minutes. It reports
// simulated seconds per wall second.
func BenchmarkDay(b *testing.B) {
	in := inputs(b, "mooncake-conversation-30min", volatile, 24*time.Hour)
	for b.Loop() {
		r, err := Run(Arbiter, in)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(in.Duration.Seconds()/r.Wall.Seconds(), "sim-s/s")
		b.ReportMetric(float64(r.Events)/r.Wall.Seconds(), "events/s")
	}
}

// The router's model of a replica predicts what the replica's engine does: here both run in
// virtual time, free of the noise a loaded machine adds to replicasim's clock, so what is
// left is the model's own error. On Azure's conversations it meets issue 22's goals. On
// Mooncake's it does not, for a measured reason: the trace's timestamps have a resolution of
// a second (5,719 requests at 600 instants), so 86 % of its requests reach their replica in
// the same instant as others, share one engine step with them, and wait for all of it; no
// prediction made when the first of them is sent can see the ones after it. Over the
// requests that arrive alone the error is half. The bounds keep what is reached (Mooncake
// was 66 % before the model knew KV capacity, the server's preparation time and the
// decoders' ends, and 36 % before the calibration became a median and each replica's
// prefix cache was remembered, and 25 % before the affinity table's match stopped counting).
func TestRouterPredictsTheEngine(t *testing.T) {
	for _, c := range []struct {
		trace              string
		mape, p90, verdict float64
		loneMAPE           float64 // over the requests that reached their replica alone
	}{
		{"azure-conversation", 0.10, 0.30, 0.95, 0.10},
		// 20.7 %, APE p90 59.3 %, lone arrivals 5.5 % since a replica's cached prefix is its
		// prefix memory's count, not the affinity table's, and the cheapest tier prefers the
		// replica holding the prompt (24.8 %, 70.0 % and 18.4 % before; lone arrivals
		// 18.3–20.3 % as the fleet's zones and prices moved).
		{"mooncake-conversation-30min", 0.23, 0.65, 0.95, 0.12},
	} {
		in := inputs(t, c.trace, volatile, 30*time.Minute)
		r := run(t, Arbiter, in)
		mape, p90, verdicts, n := r.PredictionError()
		t.Logf("%s: TTFT predictions over %d requests: MAPE %.1f %%, APE p90 %.1f %%, SLO verdicts right %.1f %%", c.trace, n, 100*mape, 100*p90, 100*verdicts)
		lm, lp, lv, ln := r.LoneArrivalPredictionError()
		t.Logf("%s: over the %d that reached their replica alone: MAPE %.1f %%, APE p90 %.1f %%, verdicts %.1f %%", c.trace, ln, 100*lm, 100*lp, 100*lv)
		if n < 1000 || mape > c.mape || p90 > c.p90 || verdicts < c.verdict {
			t.Errorf("%s: MAPE %.1f %%, APE p90 %.1f %%, verdicts %.1f %% over %d requests: want ≤ %.0f %%, ≤ %.0f %%, ≥ %.0f %%",
				c.trace, 100*mape, 100*p90, 100*verdicts, n, 100*c.mape, 100*c.p90, 100*c.verdict)
		}
		if ln < 500 || lm > c.loneMAPE {
			t.Errorf("%s: MAPE %.1f %% over %d requests that arrived alone: want ≤ %.0f %%", c.trace, 100*lm, ln, 100*c.loneMAPE)
		}
	}
}

// Issue 20: the fleet never exceeds max_replicas over a day, with demand above it, a
// volatile spot trace (replacements after notices) and dynamic on-demand fallback
// (stand-ins for spot replicas not ready): every replica alive counts, those leaving too.
func TestFleetNeverExceedsMaxReplicas(t *testing.T) {
	in := inputs(t, "azure-conversation", volatile, 24*time.Hour)
	sp := *in.Spec
	sp.Service.ReplicaPolicy.MinReplicas, sp.Service.ReplicaPolicy.MaxReplicas = 2, 4
	sp.Arbiter.Autoscaling.TargetConcurrencyPerReplica = 4 // demand asks for more than 4
	in.Spec = &sp
	r := run(t, Arbiter, in)
	if r.PeakReplicas > 4 {
		t.Errorf("%d replicas alive at once with max_replicas 4", r.PeakReplicas)
	}
	if r.Preemptions == 0 || r.ReplicaHours["on_demand/gcp"] == 0 {
		t.Fatalf("the day exercised no preemption (%d) or no on-demand cover (%v): the bound was not tested", r.Preemptions, r.ReplicaHours)
	}
}

// Read as counts, a 1-node trace lets the service hold one spot VM per zone it drives, and
// a preemption takes it; read as availability bits, the same day stacks many in a zone.
func TestCountReadingCapsSpotPerZone(t *testing.T) {
	in := inputs(t, "azure-conversation", volatile, 6*time.Hour)
	sp := *in.Spec
	sp.Service.ReplicaPolicy.MinReplicas = 6 // more than the trace has zones
	in.Spec = &sp
	in.Reading = market.ReadCount
	c := run(t, Arbiter, in)
	if c.PeakSpotInZone != 1 {
		t.Errorf("count reading: %d spot VMs at once in one zone of a 1-node trace, want 1", c.PeakSpotInZone)
	}
	if c.ReplicaHours["on_demand/gcp"] == 0 || c.LaunchFailures == 0 {
		t.Errorf("count reading: no refusal (%d) or no on-demand beyond the zones' spot (%v)", c.LaunchFailures, c.ReplicaHours)
	}
	if c.Preemptions == 0 {
		t.Error("count reading: the trace's falls to 0 preempted nothing")
	}
	if s := run(t, SkyServe, in); s.PeakSpotInZone != 1 {
		t.Errorf("count reading, SkyServe: %d spot VMs in one zone, want 1", s.PeakSpotInZone)
	}
	in.Reading = market.ReadAvailability
	if a := run(t, Arbiter, in); a.PeakSpotInZone < 2 {
		t.Errorf("availability reading: at most %d spot VM in a zone; the test's demand does not tell the readings apart", a.PeakSpotInZone)
	}
}

// A lone spot replica's preemptions hold minutes of arrivals; released, those past their
// TTFT target wait in the router for room (router.Request.Late) behind fresh requests. None
// is lost or counted twice: every request is a success or a failure, none a timeout.
func TestLateHeldRequestsAreAllAccounted(t *testing.T) {
	in := inputs(t, "azure-conversation", volatile, 6*time.Hour)
	in.SpotOffset = 48 * time.Hour // day 2: 12 preemptions in the 7-day tables
	sp := *in.Spec
	sp.Service.ReplicaPolicy.MinReplicas, sp.Service.ReplicaPolicy.MaxReplicas = 1, 1
	in.Spec = &sp
	r := run(t, Arbiter, in)
	if r.Preemptions == 0 || r.ZeroWaits == 0 || r.MaxZeroWait < in.ColdStart {
		t.Fatalf("no hold through a replacement's cold start in 6 h of %s: %d preemptions, %d waits, max %v", volatile, r.Preemptions, r.ZeroWaits, r.MaxZeroWait)
	}
	if r.Succeeded+r.FailedTotal() != r.Requests {
		t.Fatalf("succeeded %d + failed %d != requests %d", r.Succeeded, r.FailedTotal(), r.Requests)
	}
	if r.Failed["timeout"] != 0 {
		t.Fatalf("%d requests timed out waiting: %v", r.Failed["timeout"], r.Failed)
	}
}
