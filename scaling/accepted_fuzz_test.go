package scaling

import (
	"fmt"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/spec"
)

// What `serve validate` accepts must run: every service.yaml the spec package accepts gives
// an autoscaler config and a placement policy that validate, and a decider and placer that
// build. (A spec with panic_threshold: 1 was once accepted, then refused by the decider:
// the API answered 500 after storing it, and the daemon would not start again.)
func FuzzAcceptedSpecsRun(f *testing.F) {
	// min, max, qps target, stable window, panic window, panic threshold, max scale-up rate,
	// scale to zero after, upscale delay, downscale delay, overprovision, base on-demand,
	// spot price ratio, rebalance saving, use spot, signal (0 none, 1 qps, 2 concurrency, 3 tokens)
	f.Add(int64(1), int64(4), 2.0, 60.0, 6.0, 2.0, 4.0, 300.0, 0.0, 0.0, int64(0), int64(0), 0.6, 0.2, true, uint8(0))
	f.Add(int64(1), int64(4), 2.0, 60.0, 6.0, 1.0, 4.0, 300.0, 0.0, 0.0, int64(0), int64(0), 0.6, 0.2, true, uint8(2))
	f.Add(int64(0), int64(3), 1.0, 60.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, int64(1), int64(1), 1.0, 0.0, true, uint8(1))
	f.Add(int64(2), int64(2), 0.0, 1.0, 1.0, 1.5, 1.0, 1.0, 5.0, 5.0, int64(0), int64(0), 0.1, 0.9, false, uint8(3))
	f.Fuzz(func(t *testing.T, minR, maxR int64, qps, stable, panicW, panicT, rate, zero, up, down float64, over, base int64, ratio, saving float64, spot bool, signal uint8) {
		signals := []string{"", "qps", "concurrency", "tokens_per_second"}
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
		y += fmt.Sprintf(`resources:
  accelerators: H100:1
  use_spot: %t
run: x
arbiter:
  model: m
  scale_to_zero_after_seconds: %g
  spot_policy: {max_price_ratio: %g, rebalance_min_saving: %g}
  autoscaling:
    stable_window_seconds: %g
    panic_window_seconds: %g
    panic_threshold: %g
    max_scale_up_rate: %g
    target_tokens_per_second_per_replica: 1000
`, spot, zero, ratio, saving, stable, panicW, panicT, rate)
		if s := signals[int(signal)%len(signals)]; s != "" {
			y += "    signal: " + s + "\n"
		}
		sp, err := spec.Parse("fuzz.yaml", []byte(y))
		if err != nil {
			return // refused, with its reason: fine
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
