package control

import (
	"context"
	"fmt"
	"time"

	"github.com/arbiter-serve/arbiter/replicas"
)

// DefaultNoticeMargin is how long before a preemption notice's deadline a replica with no
// replacement ready drains (Config.NoticeMargin). The drain takes it out of every router's
// set within milliseconds, so the margin is only for the requests already on it: 10 s
// finishes a typical chat completion (a few hundred tokens at vLLM's 20–40 ms a token),
// and absorbs a reclaim that comes a little early (Karpenter evicts as soon as its drain
// gets to the pod). A request cut at the reclaim that had sent no byte is retried on
// another replica by the router; one longer than the margin is cut whenever the drain
// starts. Shorter notices than the margin (a `serve preempt --notice 3s`) drain at once.
const DefaultNoticeMargin = 10 * time.Second

// followNotices hands a provider's preemption notices to preemptionNotice.
func (c *Controller) followNotices(ctx context.Context, p replicas.Provider) {
	for {
		select {
		case <-ctx.Done():
			return
		case n := <-p.Notices():
			c.preemptionNotice(ctx, p.Name(), n)
		}
	}
}

// preemptionNotice takes a provider's notice that a replica will be reclaimed. A ready
// replica keeps serving, but counts no more toward its service's size, so its replacement
// launches on the next tick (at once: the notice kicks it); it drains once the replicas
// ready besides it cover the target, or NoticeMargin before the deadline, whichever comes
// first (followNotice). Draining at the notice, as Arbiter did, left a lone replica's
// service with nothing ready for the rest of the notice whenever no replacement could
// launch, while the machine still ran. A replica not serving yet drains at once.
func (c *Controller) preemptionNotice(ctx context.Context, provider string, n replicas.Notice) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.services {
		r := s.replicas[n.ReplicaID]
		if r == nil || r.row.Provider != provider {
			continue
		}
		now := c.cfg.Now()
		if r.noticed() {
			if n.Deadline.Before(r.notice.Deadline) {
				r.notice.Deadline = n.Deadline // the nearer reclaim rules
			}
			c.followNotice(ctx, s, r, now)
			return
		}
		left := n.Deadline.Sub(now).Round(time.Second)
		c.metrics.preemptions.WithLabelValues(s.name, provider, r.row.Region, r.row.Zone, r.row.Capacity).Inc()
		msg := fmt.Sprintf("%s will reclaim it in %s", provider, left)
		if n.Reason != "" {
			msg += ": " + n.Reason
		}
		st := replicas.State(r.row.State)
		if pl := s.placerOf(r); pl != nil {
			pl.Preempted(r.row.Provider, r.row.Region, r.row.Zone, now)
		}
		if st != replicas.Ready {
			c.event(ctx, s.name, r.row.ID, "preemption", msg)
			if live(st) {
				c.transition(ctx, s, r, replicas.Draining, fmt.Sprintf("preemption notice: reclaimed in %s; it was %s, not serving: drained at once", left, st))
			}
			c.kickNow()
			return
		}
		r.notice, r.noticeAt = n, now
		margin := c.cfg.NoticeMargin
		if left > margin {
			msg += fmt.Sprintf("; it serves until a replacement is ready, or until %s before the reclaim", margin)
		}
		c.event(ctx, s.name, r.row.ID, "preemption", msg)
		r.row.Reason = fmt.Sprintf("preemption notice: reclaimed at %s", n.Deadline.UTC().Format(time.RFC3339))
		c.saveReplica(ctx, r.row, r.row.State, now)
		c.followNotice(ctx, s, r, now)
		c.kickNow()
		return
	}
	c.log.Warn("preemption notice for an unknown replica", "provider", provider, "replica", n.ReplicaID)
}

// noticed reports whether the replica has had a preemption notice while it served.
func (r *replica) noticed() bool { return !r.notice.Deadline.IsZero() }

// Outcomes of a notice on a serving replica (arbiter_control_preemption_outcomes_total).
const (
	noticeReplaced  = "replaced"  // drained once the replicas ready besides it covered the target
	noticeDeadline  = "deadline"  // drained at the notice's deadline, no replacement ready
	noticeReclaimed = "reclaimed" // gone (or failing) before either
)

// followNotice drains a noticed replica once it may: when the replicas ready besides it
// cover the service's target, or when the notice's deadline is within NoticeMargin.
// Caller holds c.mu.
func (c *Controller) followNotice(ctx context.Context, s *service, r *replica, now time.Time) {
	if !r.noticed() {
		return
	}
	st := replicas.State(r.row.State)
	if st != replicas.Ready {
		if live(st) { // its probes fail: it serves nothing, so nothing is lost by draining it
			c.noticeOutcome(s, r, noticeReclaimed)
			c.transition(ctx, s, r, replicas.Draining, "preemption notice: not ready any more; drained before the reclaim")
		}
		return
	}
	left := r.notice.Deadline.Sub(now)
	others, replacement := 0, ""
	for _, o := range sortedReplicas(s.replicas) {
		if o != r && !o.noticed() && o.own() == r.own() && replicas.State(o.row.State) == replicas.Ready {
			others++
			if o.row.ID == r.replacement {
				replacement = o.row.ID
			}
		}
	}
	var why string
	target := s.poolTarget(r)
	switch {
	case target == 0:
		r.noticeEnded = true // not wanted anyway: nothing to count
		why = "the service's target is 0"
		if r.own() != "" {
			why = fmt.Sprintf("adapter %s's own replicas' target is 0", r.own())
		}
	case others >= target:
		c.noticeOutcome(s, r, noticeReplaced)
		switch {
		case replacement != "":
			why = fmt.Sprintf("replacement %s ready", replacement)
		default:
			why = fmt.Sprintf("%d other replicas ready cover the target of %d", others, target)
		}
	case left <= c.cfg.NoticeMargin:
		c.noticeOutcome(s, r, noticeDeadline)
		if now.Equal(r.noticeAt) {
			why = fmt.Sprintf("a notice shorter than the %s margin for requests in flight: drained at once, %d of %d replicas ready besides it", c.cfg.NoticeMargin, others, target)
		} else {
			why = fmt.Sprintf("drained at the deadline, %d of %d replicas ready besides it", others, target)
		}
		if r.replacement != "" {
			why += fmt.Sprintf(" (replacement %s not ready yet)", r.replacement)
		} else if r.noCapacity {
			why += " (no capacity for a replacement)"
		}
	default:
		return
	}
	c.transition(ctx, s, r, replicas.Draining, fmt.Sprintf("preemption notice: %s; draining %s before the reclaim", why, max(left, 0).Round(time.Second)))
}

// noticeOutcome counts how a noticed replica's notice ended, once. Caller holds c.mu.
func (c *Controller) noticeOutcome(s *service, r *replica, outcome string) {
	if r.noticeEnded {
		return
	}
	r.noticeEnded = true
	c.metrics.noticeOutcomes.WithLabelValues(s.name, outcome).Inc()
}

// leftByNotice notes a noticed replica leaving service (r is in state to already): one
// that fails before its drain was reclaimed first (counted), and a service left with no
// replica ready starts counting the time until one is. Caller holds c.mu.
func (c *Controller) leftByNotice(s *service, r *replica, to replicas.State, now time.Time) {
	if to == replicas.Draining {
		r.noticeEnded = true // drained by followNotice (counted there) or for another reason
	} else {
		c.noticeOutcome(s, r, noticeReclaimed)
	}
	if s.countReady() == 0 && s.target > 0 && s.unreadySince.IsZero() {
		s.unreadySince, s.unreadyCounted, s.unreadyBy = now, now, r.row.ID
	}
}

// readyAgain ends a time with no replica ready that a notice began: its last seconds are
// counted and the service's events say how long it was. Caller holds c.mu.
func (c *Controller) readyAgain(ctx context.Context, s *service, r *replica, now time.Time) {
	if s.unreadySince.IsZero() {
		return
	}
	c.countUnready(s, now)
	c.event(ctx, s.name, r.row.ID, "preemption", fmt.Sprintf("ready: the service had no replica ready for %s, since %s left on its preemption notice",
		now.Sub(s.unreadySince).Round(100*time.Millisecond), s.unreadyBy))
	s.unreadySince, s.unreadyCounted, s.unreadyBy = time.Time{}, time.Time{}, ""
}

// countUnready adds the time with no replica ready since it was last counted, so that the
// counter grows while the service waits, not only once it is over. A service scaled to
// zero (or deleted) meanwhile wants none ready: the count stops there. Caller holds c.mu.
func (c *Controller) countUnready(s *service, now time.Time) {
	if s.unreadySince.IsZero() {
		return
	}
	if d := now.Sub(s.unreadyCounted); d > 0 {
		c.metrics.unready.WithLabelValues(s.name).Add(d.Seconds())
		s.unreadyCounted = now
	}
	if s.target == 0 || s.deleting {
		s.unreadySince, s.unreadyCounted, s.unreadyBy = time.Time{}, time.Time{}, ""
	}
}

func (s *service) countReady() int {
	n := 0
	for _, r := range s.replicas {
		if replicas.State(r.row.State) == replicas.Ready {
			n++
		}
	}
	return n
}

// replacing links a launch to the first noticed replica with no replacement on its way,
// and says so in that replica's events; launching says where. Caller holds c.mu.
func (c *Controller) replacing(ctx context.Context, s *service, launched *replica, launching string) {
	for _, r := range sortedReplicas(s.replicas) {
		if r.noticed() && !r.noticeEnded && r.replacement == "" && r.own() == launched.own() {
			r.replacement = launched.row.ID
			if !r.noCapacity { // after a refusal, retries are said only once one launches (replacementLaunched)
				c.event(ctx, s.name, r.row.ID, "preemption", fmt.Sprintf("replacement %s %s", launched.row.ID, launching))
			}
			return
		}
	}
}

// replacementLaunched says that a replacement launched after one was refused for want of
// capacity. Caller holds c.mu.
func (c *Controller) replacementLaunched(ctx context.Context, s *service, launched *replica) {
	for _, r := range s.replicas {
		if r.noticed() && r.noCapacity && r.replacement == launched.row.ID {
			c.event(ctx, s.name, r.row.ID, "preemption", fmt.Sprintf("replacement %s launched on %s, capacity found after all", launched.row.ID, launched.row.Provider))
		}
	}
}

// replacementFailed unlinks a replacement whose launch failed, so that the next launch
// replaces the noticed replica instead; a refusal for want of capacity is said once per
// notice. Caller holds c.mu.
func (c *Controller) replacementFailed(ctx context.Context, s *service, failed *replica, noCapacity bool, err error) {
	for _, r := range sortedReplicas(s.replicas) {
		if !r.noticed() || r.replacement != failed.row.ID {
			continue
		}
		r.replacement = ""
		if !noCapacity || r.noCapacity || r.noticeEnded {
			return
		}
		r.noCapacity = true
		drainAt := r.notice.Deadline.Add(-c.cfg.NoticeMargin)
		c.event(ctx, s.name, r.row.ID, "preemption", fmt.Sprintf("no capacity for a replacement (%v): it serves until %s, %s before the reclaim, and a replacement is tried again meanwhile",
			err, drainAt.UTC().Format(time.RFC3339), c.cfg.NoticeMargin))
		return
	}
}

// Preempter is a provider that can announce a preemption on demand (the local provider,
// for tests and demos; a simulated market replays real ones).
type Preempter interface {
	Preempt(replicaID, handle string, warn time.Duration)
}

// Preempt asks a replica's provider to preempt it after a notice of warn.
func (c *Controller) Preempt(id string, warn time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, r := c.replicaByID(id)
	if r == nil {
		return fmt.Errorf("replica %q: %w", id, ErrNotFound)
	}
	if r.row.Handle == "" {
		return fmt.Errorf("%w: replica %s is not running yet", errBadRequest, id)
	}
	p, err := c.provider(r.row.Provider)
	if err != nil {
		return err
	}
	pp, ok := p.(Preempter)
	if !ok {
		return fmt.Errorf("%w: provider %s cannot preempt on demand", errBadRequest, p.Name())
	}
	pp.Preempt(id, r.row.Handle, warn)
	return nil
}
