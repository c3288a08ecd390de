package sim

import (
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/spec"
)

// mixInputs is the GPU-mix benchmark's spec (four one-GPU types) on a real request trace.
func mixInputs(t *testing.T, requests string, d time.Duration) Inputs {
	t.Helper()
	in := inputs(t, requests, volatile, d)
	sp, err := spec.Load("../bench/sim/gpumix.yaml")
	if err != nil {
		t.Fatal(err)
	}
	in.Spec, in.Model, in.Utilization = sp, "llama-3.1-8b", 0.35
	return in
}

// Arbiter's mix runs a fleet of several GPU types, each replica on its own GPU's profile,
// within the SLO; Mélange's static mix holds the peak hour's mix; each type alone runs too.
func TestGPUMixRunsAMixedFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("a simulated hour of four GPU types")
	}
	in := mixInputs(t, "azure-conversation", time.Hour)
	mix := run(t, ArbiterMix, in)
	t.Logf("mix GPU hours %v", mix.GPUHours)
	if len(mix.GPUHours) == 0 {
		t.Fatal("no GPU hours by type")
	}
	if mix.SLOAttainment() < 0.9 {
		t.Errorf("arbiter-mix SLO attainment %.3f, want ≥ 0.9", mix.SLOAttainment())
	}
	st := run(t, MelangeStatic, in)
	if st.Mix == "" || st.Launches == 0 {
		t.Errorf("melange-static: mix %q, %d launches", st.Mix, st.Launches)
	}
	one := in
	one.GPUs = []string{"H100"}
	h := run(t, ArbiterMix, one)
	for g := range h.GPUHours {
		if g != "H100" {
			t.Errorf("H100 alone ran a %s", g)
		}
	}
	if _, err := Run(ArbiterMix, Inputs{Spec: in.Spec, Requests: in.Requests, Spot: in.Spot, Catalog: in.Catalog, Start: in.Start, Duration: time.Hour, Profile: in.Profile}); err == nil {
		t.Error("arbiter-mix without a model: want an error")
	}
}

// With LearnHeadroom the planner judges each GPU type by its replicas' answers: on Azure's
// bursty code trace a headroom of 0.35 misses the SLO percentile, so the H100's headroom
// moves (down at the hour's bursts, up between them) and more of the requests are answered
// within the SLO than with it held; a window longer than the run judges nothing and is the
// held run exactly.
func TestGPUMixLearnsEachTypesHeadroomFromItsAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("nine simulated hours of H100s")
	}
	in := mixInputs(t, "azure-code", 3*time.Hour)
	in.GPUs = []string{"H100"}
	held := run(t, ArbiterMix, in)
	if h := held.Headroom["H100"]; h != in.Utilization {
		t.Fatalf("not learning: H100 headroom %v, want the utilization %v", h, in.Utilization)
	}
	if held.SLOAttainment() >= held.Percentile {
		t.Fatalf("the held headroom meets the SLO (%.3f): the trace no longer tests learning", held.SLOAttainment())
	}
	in.LearnHeadroom = true
	learned := run(t, ArbiterMix, in)
	t.Logf("held: %.1f%% within the SLO for $%.2f; learned: headroom %.3g at the end, %.1f%% for $%.2f",
		100*held.SLOAttainment(), held.Dollars, learned.Headroom["H100"], 100*learned.SLOAttainment(), learned.Dollars)
	if h := learned.Headroom["H100"]; h == in.Utilization {
		t.Errorf("learning: the H100's headroom never moved from %v", h)
	}
	if learned.SLOAttainment() <= held.SLOAttainment() {
		t.Errorf("SLO attainment %.3f learning, %.3f held: want more", learned.SLOAttainment(), held.SLOAttainment())
	}
	in.HeadroomWindow = 4 * time.Hour
	long := run(t, ArbiterMix, in)
	if long.Headroom["H100"] != in.Utilization || long.SLOMet != held.SLOMet || long.Dollars != held.Dollars {
		t.Errorf("a 4 h window over a 3 h run: headroom %v, %d within the SLO for $%.2f; want the held run's %v, %d, $%.2f",
			long.Headroom["H100"], long.SLOMet, long.Dollars, in.Utilization, held.SLOMet, held.Dollars)
	}
}
