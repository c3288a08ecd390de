package scaling

import (
	"math"
	"slices"
	"time"
)

// Sample is one load observation, aggregated over all routers for one
// service, at time At.
type Sample struct {
	At time.Time
	// Requests that ARRIVED since the previous sample (a count, not a rate),
	// including ones answered with an error: a 503 while no replica is ready
	// is exactly the demand that must bring replicas up.
	Requests float64
	// InFlight is the number of requests being served at At.
	InFlight float64
	// Waiting is the number of requests held by routers at At because no
	// replica is ready (requests queued inside a replica are in flight).
	Waiting float64
	// Tokens is prompt+completion tokens completed since the previous sample.
	Tokens float64
	// Shed counts the requests (among Requests) the routers' queues refused since the
	// previous sample for want of room, and ShedTokens the tokens they would have had:
	// demand that was never served, so it shows in no in-flight count and no completed
	// token. The concurrency signal counts each as its arrival rate × W (what replicas
	// would have carried), the tokens signal its tokens; the qps signal has it already.
	Shed, ShedTokens float64
}

func (s Sample) active() bool {
	return s.Requests > 0 || s.InFlight > 0 || s.Waiting > 0 || s.Tokens > 0
}

// clean maps NaN, ±Inf and negative values to 0: one bad router report must
// not poison a whole window's average (NaN would propagate into every
// decision until it aged out).
func clean(v float64) float64 {
	if v > 0 && !math.IsInf(v, 1) {
		return v
	}
	return 0
}

// Record adds a sample. Samples may arrive late, out of order or twice; a
// second sample with the same At replaces the first, because each sample is
// already the aggregate over all routers and counting a retried report twice
// would double the apparent arrivals.
func (d *Decider) Record(s Sample) {
	s.Requests, s.InFlight, s.Waiting, s.Tokens = clean(s.Requests), clean(s.InFlight), clean(s.Waiting), clean(s.Tokens)
	s.Shed, s.ShedTokens = clean(s.Shed), clean(s.ShedTokens)

	// Activity is noted even for a sample too old for the window: the
	// scale-to-zero idle period may be longer than the window.
	if s.active() && (!d.everActive || s.At.After(d.lastActive)) {
		d.lastActive, d.everActive = s.At, true
	}
	d.followBacklog(s)

	n := len(d.samples)
	if n > 0 && s.At.Before(d.newest.Add(-d.cfg.StableWindow)) {
		return
	}
	if n == 0 || s.At.After(d.newest) {
		d.newest = s.At
	}
	switch {
	case n == 0 || d.samples[n-1].At.Before(s.At):
		d.samples = append(d.samples, s)
	default:
		i, found := slices.BinarySearchFunc(d.samples, s.At, func(e Sample, t time.Time) int { return e.At.Compare(t) })
		if found {
			d.samples[i] = s
		} else {
			d.samples = slices.Insert(d.samples, i, s)
		}
	}
	d.trim(d.newest)
}

// trim drops samples that can no longer reach into a stable window ending at
// or after ref. The newest sample at or before the window start is kept: it
// marks where the first in-window sample's interval begins.
func (d *Decider) trim(ref time.Time) {
	cutoff := ref.Add(-d.cfg.StableWindow)
	i := 0
	for i+1 < len(d.samples) && !d.samples[i+1].At.After(cutoff) {
		i++
	}
	if i > 0 {
		// Copying down instead of re-slicing keeps one backing array for
		// the decider's lifetime: no garbage per decision in a 24 h replay.
		n := copy(d.samples, d.samples[i:])
		clear(d.samples[n:])
		d.samples = d.samples[:n]
	}
}

// load is the service's signal averaged over (now-w, now].
func (d *Decider) load(now time.Time, w time.Duration) float64 {
	return d.signal(now, w, d.cfg.Signal)
}

// heldDemand is what the requests held at s add to the concurrency signal; interval is
// the time s speaks for (0: unknown). A held request waits through a whole cold start, so
// counting each as one request in flight reads minutes of arrivals as that many requests
// served at once: 5 requests/s held through a 5-minute start look like 1,500 concurrent
// requests, where replicas would carry 5/s × W. Once the decider knows W (serviceTime),
// held requests count as their arrival rate × W, never more than their number.
func (d *Decider) heldDemand(s Sample, interval time.Duration) float64 {
	if carried, ok := d.carried(s, interval); ok && s.Waiting > 0 {
		return min(s.Waiting, carried)
	}
	return s.Waiting
}

// shedDemand is what the requests the queues refused at s would have added in flight: their
// rate × W, once W is known (before, nothing: no request has been served to learn it from,
// and the held and in-flight counts carry the demand).
func (d *Decider) shedDemand(s Sample, interval time.Duration) float64 {
	if d.serviceTime <= 0 || interval <= 0 {
		return 0
	}
	return s.Shed / interval.Seconds() * d.serviceTime
}

// carried is what replicas carry in flight for s's arrivals: their rate × W, the service
// time; false until W is known or where the interval s speaks for is not.
func (d *Decider) carried(s Sample, interval time.Duration) (float64, bool) {
	if d.serviceTime <= 0 || interval <= 0 {
		return 0, false
	}
	return s.Requests / interval.Seconds() * d.serviceTime, true
}

// followBacklog follows a hold and the backlog it leaves: heldFrom–heldAt is the latest
// run of samples with requests held; the backlog released after it is drained at the first
// sample whose in-flight count is back within twice its arrivals × W (drainedAt).
func (d *Decider) followBacklog(s Sample) {
	if s.Waiting > 0 {
		if !s.At.After(d.heldAt) {
			return
		}
		if d.heldAt.IsZero() || !d.drainedAt.IsZero() {
			d.heldFrom = s.At // a new hold
		}
		d.heldAt, d.drainedAt = s.At, time.Time{}
		return
	}
	n := len(d.samples)
	if d.heldAt.IsZero() || !d.drainedAt.IsZero() || !s.At.After(d.heldAt) || n == 0 {
		return
	}
	if carried, ok := d.carried(s, s.At.Sub(d.samples[n-1].At)); ok && s.InFlight <= 2*carried {
		d.drainedAt = s.At
	}
}

// draining reports whether t falls after a hold, while its backlog drains: until it has
// drained, for at least a stable window and at most a stable window plus twice the hold.
func (d *Decider) draining(t time.Time) bool {
	if d.heldAt.IsZero() || !t.After(d.heldAt) {
		return false
	}
	since := t.Sub(d.heldAt)
	if since <= d.cfg.StableWindow {
		return true
	}
	return (d.drainedAt.IsZero() || t.Before(d.drainedAt)) && since <= d.cfg.StableWindow+2*d.heldAt.Sub(d.heldFrom)
}

// afterHold is what a concurrency reading v at s says of demand while requests are held,
// or while the backlog they leave drains: released at once onto the replica that came up,
// it is in flight together for minutes, which reads as dozens of replicas' worth of load
// for a service that needs one (a lone replica's preemption did it every time: 1 → 4
// replicas, three cold starts bought for a backlog gone before they were ready). The
// arrivals, at W each, are what replicas will carry; the reading counts no more than that
// once W is known.
func (d *Decider) afterHold(s Sample, interval time.Duration, v float64) float64 {
	if carried, ok := d.carried(s, interval); ok {
		return min(v, carried)
	}
	return v
}

// signal is sig averaged over (now-w, now].
//
// Each sample speaks for the interval since the previous one, (prev.At, At]:
// counts (requests, tokens) are prorated by how much of that interval lies in
// the window, and gauges (in flight + waiting) are weighted by it. That keeps
// the result right when samples are irregular or coarser than the panic
// window (a 20 s report must not make a 6 s window read 0 or 3× too high),
// and it lets the latest sample count at once, which a burst needs.
func (d *Decider) signal(now time.Time, w time.Duration, sig Signal) float64 {
	start := now.Add(-w)
	gauge := sig == SignalConcurrency
	var sum, weight, pointSum float64
	points := 0
	for i, s := range d.samples {
		if !s.At.After(start) {
			continue
		}
		if i > 0 && !d.samples[i-1].At.Before(now) {
			break // this and later intervals start at or after now
		}
		var v float64
		switch sig {
		case SignalQPS:
			v = s.Requests
		case SignalTokens:
			v = s.Tokens + s.ShedTokens
		default:
			var interval time.Duration
			if i > 0 {
				interval = s.At.Sub(d.samples[i-1].At)
			}
			v = s.InFlight + d.heldDemand(s, interval) + d.shedDemand(s, interval)
			if s.Waiting > 0 || d.draining(s.At) {
				v = d.afterHold(s, interval, v)
			}
		}
		var lo time.Time
		switch {
		case i > 0:
			lo = d.samples[i-1].At
		case !gauge && d.created.Before(s.At):
			// The first count covers the time since observation began. (A
			// first gauge reading says nothing about before it, so it stays
			// a point.)
			lo = d.created
		default:
			// Nothing before it, so its interval is unknown: take it as a
			// point, counted whole if it lies in the window.
			if !s.At.After(now) {
				pointSum += v
				points++
			}
			continue
		}
		hi := s.At
		from, to := lo, hi
		if start.After(from) {
			from = start
		}
		if now.Before(to) {
			to = now
		}
		ov := to.Sub(from)
		if ov <= 0 {
			continue
		}
		if gauge {
			sum += v * ov.Seconds()
			weight += ov.Seconds()
		} else {
			sum += v * float64(ov) / float64(hi.Sub(lo))
		}
	}
	if gauge {
		// Averaged over the time actually covered, not the whole window, so
		// a fresh decider or a reporting gap does not read as low load.
		switch {
		case weight > 0:
			return sum / weight
		case points > 0:
			return pointSum / float64(points)
		}
		return 0
	}
	// Rates divide by the window, or by the time the decider has existed if
	// that is shorter, so a fresh service's first burst is not diluted by
	// seconds nobody observed. At least 1 s, so a lone first sample cannot
	// read as an absurd rate.
	span := w
	if age := now.Sub(d.created); age < span {
		span = age
	}
	if span < time.Second {
		span = time.Second
	}
	return (sum + pointSum) / span.Seconds()
}

// replicasFor is ceil(load ÷ target). The small tolerance keeps float noise
// (8.000000001 concurrent ÷ 4) from asking for a whole extra replica at an
// exact boundary, a classic source of flapping.
func replicasFor(load, target float64) int {
	x := math.Ceil(load/target - 1e-9)
	switch {
	case !(x > 0):
		return 0
	case x > math.MaxInt32:
		return math.MaxInt32
	}
	return int(x)
}

// learnEvery spaces the service-time estimates: a window's mean moves little in seconds,
// and a day's replay decides every second.
const learnEvery = 5 * time.Second

// learnServiceTime updates serviceTime, W, from the stable window ending at now by
// Little's law (mean in flight ÷ arrival rate), when that window shows replicas serving
// normally: arrivals, nothing held nor shed (a saturated fleet's in-flight count is its
// room, not its demand), and no more in flight than twice what the ready
// replicas are meant to carry (a held backlog released at once onto a fresh replica
// would read as slow service).
func (d *Decider) learnServiceTime(now time.Time, ready int) {
	w := d.cfg.StableWindow
	if ready == 0 || now.Sub(d.created) < w || now.Sub(d.learnedAt) < learnEvery {
		return
	}
	d.learnedAt = now
	start := now.Add(-w)
	for _, s := range d.samples {
		if s.At.After(start) && !s.At.After(now) && (s.Waiting > 0 || s.Shed > 0) {
			return
		}
	}
	inflight, rate := d.signal(now, w, SignalConcurrency), d.signal(now, w, SignalQPS)
	if rate > 0 && inflight > 0 && inflight <= 2*float64(ready)*d.cfg.TargetPerReplica {
		d.serviceTime = inflight / rate
	}
}
