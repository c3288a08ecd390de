package replicasim

import (
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
)

// The 8B profile's weights, read at a local disk's bandwidth as vLLM logged it, plus the
// engine's start and graph capture: the minute and a half a real 8B replica takes.
func TestColdStartOfTheMeasuredProfiles(t *testing.T) {
	for _, tc := range []struct {
		profile    string
		eager      bool
		want       time.Duration
		wantPhases int
	}{
		{"h100-llama-3.1-8b", false, 29330 * time.Millisecond, 3},
		{"h100-llama-3.2-1b", false, 4514 * time.Millisecond, 3},
		{"h100-llama-3.2-1b", true, 4514 * time.Millisecond, 2},
		// A generated profile (issue 36): the same 8B weights, from the model's shape.
		{"l4-llama-3.1-8b", false, 29330 * time.Millisecond, 3},
	} {
		p, err := engine.LoadProfile(tc.profile)
		if err != nil {
			t.Fatal(err)
		}
		cs := ColdStart{WeightGiB: p.WeightGiB, LoadGiBPerSecond: DefaultLoadGiBPerSecond, EngineStart: DefaultEngineStart, GraphCapture: DefaultGraphCapture}
		if tc.eager {
			cs.GraphCapture = 0
		}
		if err := cs.Validate(); err != nil {
			t.Fatal(err)
		}
		if got := cs.Weights(); got.Round(10*time.Millisecond) != tc.want.Round(10*time.Millisecond) {
			t.Errorf("%s: weights %.2f GiB load in %v; want %v", tc.profile, p.WeightGiB, got, tc.want)
		}
		if got, want := cs.Total(), cs.Weights()+cs.EngineStart+cs.GraphCapture; got != want {
			t.Errorf("%s: total %v; want %v", tc.profile, got, want)
		}
		if got := len(cs.Phases()); got != tc.wantPhases {
			t.Errorf("%s eager=%v: %d phases; want %d", tc.profile, tc.eager, got, tc.wantPhases)
		}
	}
	if err := (ColdStart{WeightGiB: 15}).Validate(); err == nil {
		t.Error("weights with no bandwidth: accepted")
	}
	if err := (ColdStart{EngineStart: -time.Second}).Validate(); err == nil {
		t.Error("negative engine start: accepted")
	}
}
