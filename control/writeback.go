package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/arbiter-serve/arbiter/state"
)

// A replica's record and the event log must reach the state file even when it is locked
// for a while (a backup, an operator's sqlite3 shell): a write that fails is kept, in
// order, and the ones after it queue behind it, so the file ends up with every transition
// in the order it happened and with the times it happened at. Billing reads the file, so
// a replica that ended while the file was locked is billed to its recorded end once the
// write lands, never past it.

// pendingWrite is one state write not yet in the file.
type pendingWrite struct {
	what  string // for logs
	event bool   // an event-log line (dropped first if the queue overflows)
	write func(ctx context.Context) error
}

// maxPending bounds the queue: a file locked for hours must not grow the daemon's memory
// without end. Beyond it the oldest event-log lines go first; replica records are kept.
const maxPending = 100_000

// saveReplica writes a replica's row (and its transition event) now, or queues it behind
// the writes still waiting. Caller holds c.mu.
func (c *Controller) saveReplica(ctx context.Context, row state.Replica, from string, at time.Time) {
	c.writeOrQueue(ctx, pendingWrite{what: "replica " + row.ID + " " + row.State, write: func(ctx context.Context) error {
		return c.store.SaveReplica(ctx, row, from, at)
	}})
}

// event records a line in the event log, now or behind the writes still waiting. Caller
// holds c.mu.
func (c *Controller) event(ctx context.Context, service, replica, kind, msg string) {
	at := c.cfg.Now()
	c.writeOrQueue(ctx, pendingWrite{what: "event " + kind, event: true, write: func(ctx context.Context) error {
		return c.store.AddEvent(ctx, at, service, replica, kind, msg)
	}})
}

func (c *Controller) writeOrQueue(ctx context.Context, w pendingWrite) {
	if len(c.pending) == 0 {
		err := w.write(ctx)
		if err == nil {
			return
		}
		if errors.Is(err, state.ErrFenced) || errors.Is(err, state.ErrNotLeader) {
			// Another control plane leads and owns the state now: this write never will.
			c.log.Warn("state write refused: this control plane no longer leads", "write", w.what, "err", err)
			return
		}
		c.metrics.stateErrors.Inc()
		c.log.Error("state write failed; kept, and written when the file allows", "write", w.what, "err", err, "why", state.Unavailable(err))
	}
	if len(c.pending) >= maxPending {
		c.dropOldestEvent()
	}
	c.pending = append(c.pending, w)
	c.metrics.pendingWrites.Set(float64(len(c.pending)))
}

// flushPending writes what waits, oldest first, until one fails. Caller holds c.mu.
func (c *Controller) flushPending(ctx context.Context) {
	if len(c.pending) == 0 {
		return
	}
	n := 0
	for _, w := range c.pending {
		if err := w.write(ctx); err != nil {
			if errors.Is(err, state.ErrFenced) || errors.Is(err, state.ErrNotLeader) {
				c.log.Warn("state writes that waited are dropped: this control plane no longer leads", "dropped", len(c.pending), "err", err)
				n = len(c.pending)
			}
			break
		}
		n++
	}
	if n > 0 {
		c.log.Info("state writes that waited are written", "written", n, "still_waiting", len(c.pending)-n)
		c.pending = append(c.pending[:0], c.pending[n:]...)
		if len(c.pending) == 0 {
			c.pending = nil
			c.event(ctx, "", "", "state", fmt.Sprintf("the state file took %d writes that had waited for it", n))
		}
	}
	c.metrics.pendingWrites.Set(float64(len(c.pending)))
}

func (c *Controller) dropOldestEvent() {
	for i, w := range c.pending {
		if w.event {
			c.pending = append(c.pending[:i], c.pending[i+1:]...)
			c.log.Warn("state file unwritable for long: an event-log line is dropped", "pending", len(c.pending))
			return
		}
	}
}
