package scaling

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Decision is the outcome of one Decide call.
type Decision struct {
	// Target is the replica count to run: the load-derived count clipped to
	// [MinReplicas, MaxReplicas] and passed through hysteresis, plus
	// NumOverprovision (SkyServe's final = target + num_overprovision, so it
	// may exceed MaxReplicas by the overprovision). 0 stays 0: spare
	// replicas for a service nobody is using are pure cost.
	Target int
	// Desired is the raw load-derived wish before clipping and hysteresis:
	// ceil(stable load ÷ TargetPerReplica), or the larger panic-window wish
	// while in panic mode. It may exceed MaxReplicas, which shows how far
	// demand is above what the service may use.
	Desired int
	// Panic reports panic mode: bursts are followed at once and nothing is
	// scaled down.
	Panic bool
	// Reason is one short human sentence for logs and `status -v`.
	Reason string
}

// Decider turns load samples into replica targets for one service. It holds
// the windowed samples and the hysteresis state. It is not safe for
// concurrent use: each service's control loop owns its own.
type Decider struct {
	cfg     Config
	created time.Time

	samples    []Sample // sorted by At, no two with the same At
	newest     time.Time
	lastActive time.Time // At of the latest sample showing any traffic
	everActive bool

	holds

	// heldFrom–heldAt is the latest hold (samples with requests held) and drainedAt when
	// the backlog it left had drained (zero: not yet); see followBacklog. Kept past the
	// samples' window.
	heldFrom, heldAt, drainedAt time.Time

	panicking  bool
	panicSince time.Time
	panicLast  time.Time // last time the panic condition held

	// serviceTime is W, seconds a request spends in flight when replicas serve it,
	// learned from the last stable window of normal service (learnServiceTime); 0 until
	// then. It survives scale to zero: the next wake is the same service.
	serviceTime float64
	learnedAt   time.Time
}

// NewDecider returns a decider for cfg. now is when observation starts: until
// a full stable window has passed, rates are averaged over the time since
// then.
func NewDecider(cfg Config, now time.Time) (*Decider, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Decider{cfg: cfg, created: now}, nil
}

// SetConfig applies a service update. The samples are kept, because the
// load did not change with the spec and a fresh window would read as no
// traffic at all. Pending upscale and downscale holds are dropped: they were
// measured against the old bounds and target. Panic mode is kept (it is a
// fact about the load), unless the new config disables it.
func (d *Decider) SetConfig(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	d.cfg = cfg
	d.resetHolds()
	if cfg.PanicWindow == 0 {
		d.panicking = false
	}
	if len(d.samples) > 0 {
		d.trim(d.newest)
	}
	return nil
}

func (d *Decider) resetHolds() { d.holds.reset() }

// holds is a replica target's hysteresis: a pending move and the most conservative wish
// seen while it has been pending. The service's Decider and an adapter's Own move by it.
type holds struct {
	holdingUp   bool
	upSince     time.Time
	upMin       int
	holdingDown bool
	downSince   time.Time
	downMax     int
}

func (h *holds) reset() {
	h.holdingUp, h.holdingDown = false, false
}

// base is the load-derived part of current. current is the target in force,
// as returned in a previous Decision.Target, so it includes the
// overprovision; taking it off again lets callers pass Target straight back
// without the overprovision being mistaken for excess and scaled away. A
// positive target always has a base of at least 1 (0 is never
// overprovisioned).
func (d *Decider) base(current int) int {
	if current <= 0 {
		return 0
	}
	return max(1, current-d.cfg.NumOverprovision)
}

// Decide returns the replica target at now. ready is the number of replicas
// currently READY; current is the target currently in force (the Target of
// the previous Decision, overprovision included).
//
// Decisions may come at any interval: every delay is measured in time, not
// in calls, so a control loop that stalls or speeds up neither lags nor
// flaps.
func (d *Decider) Decide(now time.Time, ready, current int) Decision {
	c := d.cfg
	if len(d.samples) > 0 && now.After(d.newest) {
		d.trim(now)
	}

	if c.Signal == SignalConcurrency {
		d.learnServiceTime(now, ready)
	}
	stableLoad, queued := d.demand(now, c.StableWindow, ready)
	want := replicasFor(stableLoad, c.TargetPerReplica)
	var b strings.Builder
	fmt.Fprintf(&b, "stable %s %s %s / %s per replica → %d",
		secs(c.StableWindow), c.Signal.unit(), num(stableLoad), num(c.TargetPerReplica), want)
	if queued > 0 {
		fmt.Fprintf(&b, " (%s more in flight, queued in %d ready replicas short of the arrivals × %s: not counted)",
			num(queued), ready, secs(time.Duration(d.serviceTime*float64(time.Second))))
	}
	if n := len(d.samples); c.Signal == SignalConcurrency && d.serviceTime > 0 && n > 0 && d.samples[n-1].Waiting > 0 {
		fmt.Fprintf(&b, " (%s held: counted as arrivals × %s in flight each)", num(d.samples[n-1].Waiting), secs(time.Duration(d.serviceTime*float64(time.Second))))
	}

	// Panic mode (Knative): the stable window is deliberately slow, so a
	// burst that would need ≥ PanicThreshold × the ready replicas is
	// followed at once, and nothing shrinks until the burst has been over
	// for a whole stable window.
	if c.PanicWindow > 0 {
		panicLoad, _ := d.demand(now, c.PanicWindow, ready)
		panicWant := replicasFor(panicLoad, c.TargetPerReplica)
		if panicWant > 0 && float64(panicWant) >= c.PanicThreshold*float64(max(ready, 1)) {
			if !d.panicking {
				d.panicking, d.panicSince = true, now
			}
			d.panicLast = now
		} else if d.panicking && now.Sub(d.panicLast) >= c.StableWindow {
			d.panicking = false
		}
		if d.panicking {
			want = max(want, panicWant)
			fmt.Fprintf(&b, "; panic for %s: %s %s %s → %d (threshold %s × %d ready)",
				secs(now.Sub(d.panicSince)), secs(c.PanicWindow), c.Signal.unit(), num(panicLoad), panicWant, num(c.PanicThreshold), max(ready, 1))
		}
	}

	base := d.base(current)
	if c.MaxScaleUpRate > 0 && want > base {
		if limit := max(base, int(math.Ceil(c.MaxScaleUpRate*float64(max(ready, 1))))); want > limit {
			fmt.Fprintf(&b, "; at most %s × %d ready → %d", num(c.MaxScaleUpRate), max(ready, 1), limit)
			want = limit
		}
	}
	lo := c.MinReplicas
	if c.MinReplicas == 0 {
		if idle, why := d.idle(now, base); idle {
			d.resetHolds()
			d.panicking = false
			return Decision{Target: 0, Desired: want, Reason: why}
		}
		// Not idle: someone is using the service, so at least one replica
		// stays, whatever a window average says.
		lo = 1
	}
	clipped := min(max(want, lo), c.MaxReplicas)

	if base > 0 {
		// Bounds are not subject to delay: after an update that lowers
		// max_replicas, running above it is exactly SkyServe's overshoot
		// bug (#3255). Only the bound is enforced at once; moving further
		// toward the load still waits like any other move.
		if b2 := min(max(base, lo), c.MaxReplicas); b2 != base {
			d.resetHolds()
			fmt.Fprintf(&b, "; %d outside [%d, %d] → %d", base, lo, c.MaxReplicas, b2)
			base = b2
		}
	}

	var target int
	switch {
	case base == 0 && c.MinReplicas == c.MaxReplicas:
		// A fixed count (replicas: N) starts with its N: no load moved it.
		d.resetHolds()
		target = clipped
		b.Reset()
		fmt.Fprintf(&b, "a fixed %d replica(s) (min_replicas = max_replicas)", c.MinReplicas)
	case base == 0 && c.MinReplicas > 0 && want < c.MinReplicas:
		d.resetHolds()
		target = clipped
		fmt.Fprintf(&b, "; start at min_replicas %d", c.MinReplicas)
	case base == 0:
		// Scale from zero at once: requests are waiting and every second
		// is latency they see (SkyServe waits for a decision tick and makes
		// clients retry 503s; we do not).
		d.resetHolds()
		target = clipped
		b.WriteString("; wake from zero")
	case d.panicking:
		d.resetHolds()
		target = max(base, clipped)
		if target > base {
			b.WriteString("; panic upscale")
		} else {
			b.WriteString("; no downscale in panic")
		}
	default:
		target = d.hysteresis(now, base, clipped, &b)
	}

	dec := Decision{Target: target, Desired: want, Panic: d.panicking}
	if target > 0 {
		dec.Target += c.NumOverprovision
		if c.NumOverprovision > 0 {
			fmt.Fprintf(&b, "; +%d overprovision", c.NumOverprovision)
		}
	}
	dec.Reason = b.String()
	return dec
}

// demand is the load over the window w ending at now, and what of it was left out (0 but
// for the concurrency signal). A fleet short of replicas queues requests inside them
// (vLLM's waiting queue), and the in-flight count holds that queue: read as demand, a
// burst's queue asks for the replicas it would need if it lasted, each bought with a cold
// start and ready minutes after the queue has drained (on azure-code, 11 replicas ordered
// for a burst that 6 served). So while fewer replicas are ready than the arrivals need at
// W, the time a request spends in flight in normal service, the reading counts no more
// than arrivals × W. Once that many are ready, all of it counts again: requests that have
// come to take longer than W (a new mix) show there, the fleet grows for them, and W is
// learned anew once it serves them normally.
func (d *Decider) demand(now time.Time, w time.Duration, ready int) (load, queued float64) {
	load = d.load(now, w)
	if d.cfg.Signal != SignalConcurrency || d.serviceTime <= 0 {
		return load, 0
	}
	carried := d.signal(now, w, SignalQPS) * d.serviceTime
	if load > carried && ready < replicasFor(carried, d.cfg.TargetPerReplica) {
		return carried, load - carried
	}
	return load, 0
}

// hysteresis moves from base toward clipped only once the move has been
// wanted continuously for the delay in its direction.
//
// The value adopted is the most conservative wish seen while the move was
// pending: the minimum for an upscale, the maximum for a downscale. It is
// still a real move (every wish in the hold was beyond base), but it is
// the level the load actually sustained for the whole delay. Adopting the
// latest wish instead (SkyServe) overshoots whenever the last sample
// before the deadline is a spike, and the overshoot then takes a full
// downscale delay to undo.
func (d *Decider) hysteresis(now time.Time, base, clipped int, b *strings.Builder) int {
	return d.holds.step(now, base, clipped, d.cfg.UpscaleDelay, d.cfg.DownscaleDelay, d.cfg.AdoptLatest, b)
}

// step is hysteresis with the delays up and down; adoptLatest ends a hold on the latest
// wish (Config.AdoptLatest).
func (h *holds) step(now time.Time, base, clipped int, up, down time.Duration, adoptLatest bool, b *strings.Builder) int {
	switch {
	case clipped > base:
		h.holdingDown = false
		if !h.holdingUp {
			h.holdingUp, h.upSince, h.upMin = true, now, clipped
		} else {
			h.upMin = min(h.upMin, clipped)
		}
		held := now.Sub(h.upSince)
		if held < up {
			fmt.Fprintf(b, "; upscale held %s of %s", secs(held), secs(up))
			return base
		}
		t := max(h.upMin, base+1)
		if adoptLatest {
			t = clipped
		}
		h.holdingUp = false
		if clipped > t {
			// Still wanting more: the next step's hold starts now, not at
			// the next call, so a ramp is not slowed by the decision interval.
			h.holdingUp, h.upSince, h.upMin = true, now, clipped
		}
		fmt.Fprintf(b, "; upscale after %s", secs(held))
		return t
	case clipped < base:
		h.holdingUp = false
		if !h.holdingDown {
			h.holdingDown, h.downSince, h.downMax = true, now, clipped
		} else {
			h.downMax = max(h.downMax, clipped)
		}
		held := now.Sub(h.downSince)
		if held < down {
			fmt.Fprintf(b, "; downscale held %s of %s", secs(held), secs(down))
			return base
		}
		t := min(h.downMax, base-1)
		if adoptLatest {
			t = clipped
		}
		h.holdingDown = false
		if clipped < t {
			h.holdingDown, h.downSince, h.downMax = true, now, clipped
		}
		fmt.Fprintf(b, "; downscale after %s", secs(held))
		return t
	}
	// Any decision that agrees with the current target breaks both holds
	// (as SkyServe): a move must be wanted without interruption.
	h.reset()
	b.WriteString("; at target")
	return base
}

// idle reports whether a min-0 service should be at zero now, and why.
//
// Idle is measured from the last sample showing any traffic, not from the
// latest sample: if reports stop altogether, a service whose last report
// was busy still goes to zero after ScaleToZeroAfter, and stays there
// instead of being woken again by that same stale report.
func (d *Decider) idle(now time.Time, base int) (bool, string) {
	c := d.cfg
	if !d.everActive {
		// A fresh service stays at zero until its first request. One that
		// is already running with no traffic seen yet (e.g. the control
		// plane restarted) is given ScaleToZeroAfter from the decider's
		// creation rather than being torn down on the first decision.
		if base == 0 {
			return true, "no traffic yet → 0"
		}
		if quiet := now.Sub(d.created); quiet >= c.ScaleToZeroAfter {
			return true, fmt.Sprintf("no traffic for %s since start ≥ %s → 0", secs(quiet), secs(c.ScaleToZeroAfter))
		}
		return false, ""
	}
	if quiet := now.Sub(d.lastActive); quiet >= c.ScaleToZeroAfter {
		return true, fmt.Sprintf("no traffic for %s ≥ %s → 0", secs(quiet), secs(c.ScaleToZeroAfter))
	}
	return false, ""
}

// secs formats a duration in seconds ("12s", "1.5s"), which reads better
// in a Reason than time.Duration's "1m0s".
func secs(d time.Duration) string {
	return strconv.FormatFloat(d.Round(100*time.Millisecond).Seconds(), 'f', -1, 64) + "s"
}

// num formats a load with one decimal for readability, or exactly if it is
// a whole number.
func num(v float64) string {
	if v == float64(int64(v)) && v < 1e15 && v > -1e15 {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}
