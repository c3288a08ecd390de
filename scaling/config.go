// Package scaling is Arbiter's autoscaling decider: from load samples it
// computes how many replicas a service should have.
//
// It is pure on purpose. The clock is injected (every call takes now), it does
// no I/O and starts no goroutines, so the control plane and the trace-driven
// simulator run exactly the same policy, and a day of traffic can be replayed
// in milliseconds of virtual time.
//
// The model follows Knative's autoscaler (an averaged stable window plus a
// short panic window for bursts) and keeps SkyServe's knobs and arithmetic
// (target per replica, upscale and downscale delays, num_overprovision, scale
// to zero) so that a SkyServe service.yaml means the same thing here.
package scaling

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Signal chooses what load means.
type Signal string

const (
	// SignalQPS is SkyServe's signal: requests/s ÷ target_qps_per_replica.
	SignalQPS Signal = "qps"
	// SignalConcurrency is in-flight plus waiting requests ÷ target per
	// replica. For LLMs it tracks saturation better than QPS, because request
	// cost varies by orders of magnitude with prompt and output length.
	SignalConcurrency Signal = "concurrency"
	// SignalTokens is (prompt+completion) tokens/s ÷ target per replica.
	SignalTokens Signal = "tokens_per_second"
)

// unit names the signal in Reason strings.
func (s Signal) unit() string {
	switch s {
	case SignalQPS:
		return "qps"
	case SignalConcurrency:
		return "concurrency"
	case SignalTokens:
		return "tokens/s"
	}
	return string(s)
}

// Config is one service's autoscaling policy.
type Config struct {
	Signal Signal
	// TargetPerReplica is in the signal's unit (qps, concurrent requests,
	// tokens/s); > 0.
	TargetPerReplica         float64
	MinReplicas, MaxReplicas int
	// NumOverprovision is added on top of the load-derived target when that
	// target is > 0 (as SkyServe's num_overprovision).
	NumOverprovision int
	// StableWindow is the averaging window for normal decisions (e.g. 60s),
	// and also how long the panic condition must stay false before panic
	// mode ends.
	StableWindow time.Duration
	// PanicWindow is the short window that detects bursts (e.g. 6s). 0
	// disables panic mode.
	PanicWindow time.Duration
	// PanicThreshold: panic when the panic-window desired count is ≥
	// PanicThreshold × ready replicas (e.g. 2.0). Must be > 1 when panic is
	// enabled.
	PanicThreshold float64
	// MaxScaleUpRate (Knative's max-scale-up-rate): a decision that raises the target
	// asks for at most ceil(MaxScaleUpRate × max(ready, 1)) replicas, or the current
	// target if that is more. Requests held while nothing is ready pile up for a whole
	// cold start and would otherwise read as a fleet's worth of concurrency. 0: no bound.
	MaxScaleUpRate float64
	// UpscaleDelay: a higher target must be wanted continuously this long
	// before it is adopted.
	UpscaleDelay time.Duration
	// DownscaleDelay: a lower target must be wanted continuously this long.
	DownscaleDelay time.Duration
	// AdoptLatest ends a hold on the latest wish, as SkyServe does, instead of the most
	// conservative one seen during the hold. For baselines; Arbiter leaves it off.
	AdoptLatest bool
	// ScaleToZeroAfter: with MinReplicas 0, go to 0 only after no request at
	// all (no arrivals, nothing in flight, nothing waiting) for this long.
	ScaleToZeroAfter time.Duration
}

// Validate reports every invalid field at once, so a bad service.yaml is
// fixed in one round trip rather than one error at a time.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("scaling: "+format, args...))
	}
	switch c.Signal {
	case SignalQPS, SignalConcurrency, SignalTokens:
	default:
		bad("Signal %q is not one of %q, %q, %q", c.Signal, SignalQPS, SignalConcurrency, SignalTokens)
	}
	if !(c.TargetPerReplica > 0) || math.IsInf(c.TargetPerReplica, 0) {
		bad("TargetPerReplica must be a finite number > 0, got %v", c.TargetPerReplica)
	}
	if c.MinReplicas < 0 {
		bad("MinReplicas must be ≥ 0, got %d", c.MinReplicas)
	}
	if c.MaxReplicas < 1 {
		bad("MaxReplicas must be ≥ 1, got %d", c.MaxReplicas)
	}
	if c.MaxReplicas < c.MinReplicas {
		bad("MaxReplicas (%d) must be ≥ MinReplicas (%d)", c.MaxReplicas, c.MinReplicas)
	}
	if c.NumOverprovision < 0 {
		bad("NumOverprovision must be ≥ 0, got %d", c.NumOverprovision)
	}
	if c.StableWindow <= 0 {
		bad("StableWindow must be > 0, got %v", c.StableWindow)
	}
	if c.PanicWindow < 0 {
		bad("PanicWindow must be ≥ 0 (0 disables panic mode), got %v", c.PanicWindow)
	}
	if c.PanicWindow > c.StableWindow {
		bad("PanicWindow (%v) must not be longer than StableWindow (%v)", c.PanicWindow, c.StableWindow)
	}
	// A threshold ≤ 1 would declare panic at ordinary steady load (desired ==
	// ready), and panic never scales down, so the service could never shrink.
	if c.PanicWindow > 0 && (!(c.PanicThreshold > 1) || math.IsInf(c.PanicThreshold, 0)) {
		bad("PanicThreshold must be a finite number > 1 when PanicWindow is set, got %v", c.PanicThreshold)
	}
	if c.MaxScaleUpRate != 0 && (!(c.MaxScaleUpRate >= 1) || math.IsInf(c.MaxScaleUpRate, 0)) {
		bad("MaxScaleUpRate must be 0 (no bound) or a finite number ≥ 1, got %v", c.MaxScaleUpRate)
	}
	if c.UpscaleDelay < 0 {
		bad("UpscaleDelay must be ≥ 0, got %v", c.UpscaleDelay)
	}
	if c.DownscaleDelay < 0 {
		bad("DownscaleDelay must be ≥ 0, got %v", c.DownscaleDelay)
	}
	if c.ScaleToZeroAfter < 0 {
		bad("ScaleToZeroAfter must be ≥ 0, got %v", c.ScaleToZeroAfter)
	}
	// With 0 the service would count as idle at the very instant a request
	// is seen and could never leave zero.
	if c.MinReplicas == 0 && c.ScaleToZeroAfter <= 0 {
		bad("ScaleToZeroAfter must be > 0 when MinReplicas is 0, got %v", c.ScaleToZeroAfter)
	}
	return errors.Join(errs...)
}
