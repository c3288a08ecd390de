package scaling

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/spec"
)

// What `serve validate` accepts must run: every service.yaml the spec package accepts gives
// an autoscaler config and a placement policy that validate, and a decider and placer that
// build. (A spec with panic_threshold: 1 was once accepted, then refused by the decider:
// the API answered 500 after storing it, and the daemon would not start again.)
func FuzzAcceptedSpecsRun(f *testing.F) {
	// min, max, qps target, stable window, panic window, panic threshold, max scale-up rate,
	// scale to zero after, upscale delay, downscale delay, overprovision, base on-demand,
	// spot price ratio, rebalance saving, use spot, signal (0 none, 1 qps, 2 concurrency, 3 tokens),
	// accelerators (an index into accelerators; odd: on the sim market rather than local)
	f.Add(int64(1), int64(4), 2.0, 60.0, 6.0, 2.0, 4.0, 300.0, 0.0, 0.0, int64(0), int64(0), 0.6, 0.2, true, uint8(0), uint8(0))
	f.Add(int64(1), int64(4), 2.0, 60.0, 6.0, 1.0, 4.0, 300.0, 0.0, 0.0, int64(0), int64(0), 0.6, 0.2, true, uint8(2), uint8(3))
	f.Add(int64(0), int64(3), 1.0, 60.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, int64(1), int64(1), 1.0, 0.0, true, uint8(1), uint8(9))
	f.Add(int64(2), int64(2), 0.0, 1.0, 1.0, 1.5, 1.0, 1.0, 5.0, 5.0, int64(0), int64(0), 0.1, 0.9, false, uint8(3), uint8(10))
	f.Add(int64(1), int64(1), 0.0, 60.0, 6.0, 2.0, 4.0, 300.0, 0.0, 0.0, int64(0), int64(0), 0.6, 0.0, false, uint8(0), uint8(11))
	// One GPU at several counts, names no catalog prices beside priced ones, and a set
	// with nothing priced (refused, with its places).
	accelerators := []string{
		"H100:1",
		"{A100:4, A100:8, A100-80GB:2, A100-80GB:4, A100-80GB:8}",
		"{L4:1, L4:4}",
		"[a100:4, A100:8]",
		"{L4:1, L40:1, A100:8, GB200:4}",
		"{B100:8, GB200:4}",
	}
	cat, err := pricing.Embedded()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, minR, maxR int64, qps, stable, panicW, panicT, rate, zero, up, down float64, over, base int64, ratio, saving float64, spot bool, signal, acc uint8) {
		signals := []string{"", "qps", "concurrency", "tokens_per_second"}
		providers := "local"
		if acc%2 == 1 {
			providers = "sim"
		}
		y := fmt.Sprintf(`service:
  readiness_probe: /health
  replica_policy:
    min_replicas: %d
    max_replicas: %d
    target_qps_per_replica: %g
    upscale_delay_seconds: %g
    downscale_delay_seconds: %g
    num_overprovision: %d
`, minR, maxR, qps, up, down, over)
		if spot {
			y += fmt.Sprintf("    base_ondemand_fallback_replicas: %d\n", base)
		}
		savingText := fmt.Sprintf("%g", saving)
		if saving < 0 && saving > -1 {
			savingText = "auto" // the default, written out (other negatives stay refused)
		}
		y += fmt.Sprintf(`resources:
  accelerators: %s
  use_spot: %t
run: x
arbiter:
  providers: [%s]
  model: m
  scale_to_zero_after_seconds: %g
  spot_policy: {max_price_ratio: %g, rebalance_min_saving: %s}
  autoscaling:
    stable_window_seconds: %g
    panic_window_seconds: %g
    panic_threshold: %g
    max_scale_up_rate: %g
    target_tokens_per_second_per_replica: 1000
`, accelerators[int(acc/2)%len(accelerators)], spot, providers, zero, ratio, savingText, stable, panicW, panicT, rate)
		if s := signals[int(signal)%len(signals)]; s != "" {
			y += "    signal: " + s + "\n"
		}
		sp, err := spec.Parse("fuzz.yaml", []byte(y))
		if err != nil {
			return // refused, with its reason: fine
		}
		if _, err := pricing.Resolve(sp, cat); err != nil { // as serve validate and the control plane do
			var el *spec.ErrorList
			if !errors.As(err, &el) || (*el)[0].Line == 0 {
				t.Fatalf("refused without a place in the file: %v\n%s", err, y)
			}
			return
		}
		if providers == "sim" {
			// The market prices the resources with the catalogs: whatever is left must quote.
			if _, err := cat.Quote(sp.Resources, time.Time{}); err != nil {
				var unknown *pricing.UnknownAcceleratorError
				if errors.As(err, &unknown) {
					t.Fatalf("spec accepted for the market, catalog refuses: %v\n%s", err, y)
				}
			}
		}
		cfg := ConfigFromSpec(sp)
		if err := cfg.Validate(); err != nil {
			t.Fatalf("spec accepted, autoscaler refuses: %v\n%s", err, y)
		}
		if _, err := NewDecider(cfg, time.Unix(0, 0)); err != nil {
			t.Fatalf("spec accepted, decider refuses: %v\n%s", err, y)
		}
		pl := PlacementFromSpec(sp, time.Minute)
		if err := pl.Validate(); err != nil {
			t.Fatalf("spec accepted, placement refuses: %v\n%s", err, y)
		}
		if _, err := NewPlacer(pl); err != nil {
			t.Fatalf("spec accepted, placer refuses: %v\n%s", err, y)
		}
	})
}
