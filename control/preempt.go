package control

import (
	"context"
	"fmt"
	"time"

	"github.com/arbiter-serve/arbiter/replicas"
)

// followNotices turns a provider's preemption notices into routing events: the replica
// drains at once in every router (they follow the ready set within milliseconds) and,
// being no longer counted, is replaced on the next tick while its in-flight requests
// finish within the notice.
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

func (c *Controller) preemptionNotice(ctx context.Context, provider string, n replicas.Notice) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.services {
		r := s.replicas[n.ReplicaID]
		if r == nil || r.row.Provider != provider {
			continue
		}
		left := n.Deadline.Sub(c.cfg.Now()).Round(time.Second)
		c.metrics.preemptions.WithLabelValues(s.name, provider, r.row.Region, r.row.Zone, r.row.Capacity).Inc()
		msg := fmt.Sprintf("%s will reclaim it in %s", provider, left)
		if n.Reason != "" {
			msg += ": " + n.Reason
		}
		c.event(ctx, s.name, r.row.ID, "preemption", msg)
		if s.placer != nil {
			s.placer.Preempted(r.row.Provider, r.row.Region, r.row.Zone, c.cfg.Now())
		}
		if live(replicas.State(r.row.State)) {
			c.transition(ctx, s, r, replicas.Draining, fmt.Sprintf("preemption notice: reclaimed in %s; replacement launching", left))
		}
		c.kickNow()
		return
	}
	c.log.Warn("preemption notice for an unknown replica", "provider", provider, "replica", n.ReplicaID)
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
	for _, s := range c.services {
		r := s.replicas[id]
		if r == nil {
			continue
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
	return fmt.Errorf("replica %q: %w", id, ErrNotFound)
}
