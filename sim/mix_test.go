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
