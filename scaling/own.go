package scaling

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Own decides how many replicas of its own a hot LoRA adapter runs (issue 51): replicas
// that serve a checkpoint with the adapter merged into the base weights, so each step runs
// at the base model's cost, where on the service's shared replicas a step of the
// adapter's tokens costs 1 + StepCost as much (vLLM's LoRA kernels; engine.LoRA).
//
// The economics, in replicas: the adapter's load B (in base-model work, the service's
// signal unit) costs B × (1 + StepCost) ÷ T shared replicas, where T is the service's
// target per replica; k replicas of its own take up to k × T of it at cost k. A whole
// replica's worth is always cheaper on its own; the remainder r is, once r ÷ T ≥
// 1 ÷ (1 + StepCost) (two thirds of a replica at vLLM's 1.51×). So the wish is
// floor(B ÷ T), plus one where the remainder passes that. It moves by the service's own
// hysteresis (holds): only once wanted for the whole upscale or downscale delay, to the
// most conservative wish seen in the hold. A replica of its own costs a cold start, and a
// dip shorter than the downscale delay does not pay for one.
//
// Own is pure: the caller gives it the time. Not safe for concurrent use.
type Own struct {
	// StepCost is the extra cost of a step of adapter tokens on a shared replica, over
	// the base model's (0.51: engine.DefaultLoRAStepCost); > 0.
	StepCost float64
	// Window is what the load is averaged over (the service's stable window).
	Window time.Duration
	// UpscaleDelay and DownscaleDelay are the service's.
	UpscaleDelay, DownscaleDelay time.Duration

	samples []OwnSample
	holds
}

// OwnSample is the adapter's load at a time: in base-model work, in the service's signal
// unit (concurrent requests as if served at the base model's speed, requests/s, or
// tokens/s).
type OwnSample struct {
	At   time.Time
	Load float64
}

// Record adds a sample; samples older than the window are dropped. A bad load (negative,
// NaN, infinite) is recorded as 0: a router's report is input.
func (o *Own) Record(s OwnSample) {
	if !(s.Load >= 0) || math.IsInf(s.Load, 0) {
		s.Load = 0
	}
	o.samples = append(o.samples, s)
	cut := 0
	for cut < len(o.samples) && s.At.Sub(o.samples[cut].At) > o.Window {
		cut++
	}
	o.samples = o.samples[cut:]
}

// load is the mean load over the window.
func (o *Own) load() float64 {
	if len(o.samples) == 0 {
		return 0
	}
	sum := 0.0
	for _, s := range o.samples {
		sum += s.Load
	}
	return sum / float64(len(o.samples))
}

// Wish is how many replicas of its own an adapter of mean load b should run at target t
// per replica: the whole replicas it fills, and one more for a remainder that costs more
// on shared replicas than a replica of its own does.
func (o *Own) Wish(b, t float64) int {
	if !(t > 0) || !(b > 0) {
		return 0
	}
	whole := math.Floor(b / t)
	if rem := b/t - whole; rem >= 1/(1+o.StepCost) {
		whole++
	}
	return int(min(whole, 1e6))
}

// Decide returns the replicas of its own to run at now, at most most (the room the
// service's max_replicas leaves), given the current count and the service's target per
// replica t; with why, for the service's events.
func (o *Own) Decide(now time.Time, t float64, current, most int) (int, string) {
	most = max(most, 0)
	if current > most {
		// The room shrank (max_replicas lowered, another adapter took it): a bound, not a
		// move, so it holds at once.
		current = most
	}
	b := o.load()
	wish := min(o.Wish(b, t), most)
	var why strings.Builder
	fmt.Fprintf(&why, "mean load %s over %s at %s per replica: %d of its own wanted (a shared replica costs %.2f× per step)", num(b), secs(o.Window), num(t), wish, 1+o.StepCost)
	n := o.holds.step(now, current, wish, o.UpscaleDelay, o.DownscaleDelay, false, &why)
	return n, why.String()
}
