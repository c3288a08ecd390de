package control

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/spec"
	"github.com/arbiter-serve/arbiter/state"
)

// Several control planes may share one store (Config.Lease): one leads, and the others
// stand by. A standby renews nothing and writes nothing; every tick it tries to take the
// lease and, until it does, reads the services and replicas from the store, so that its
// ready set and API answer what the leader recorded. Once it takes the lease it recovers
// as a restarted control plane does (adopting what runs, writing off what never launched)
// and leads: it ticks while the lease holds, renewing it every third of its duration.
// When a renewal finds another leader, the lease ends unrenewed, or a write is refused as
// fenced (state/lease.go), it stops deciding, waits for its work in flight, and stands by
// again.

// Lease is the hold on the lead of control planes sharing one store: the store's own
// (*state.Lease), or one that a lock outside the store elects (a Kubernetes Lease, package
// kubelease) while the store's term still fences every write.
type Lease interface {
	// Holder names this control plane to the others.
	Holder() string
	// TTL is how long a renewal holds the lease; it is renewed every third of it.
	TTL() time.Duration
	// Renew takes the lease if this control plane may, or extends it, and returns the
	// term it leads (0: it does not).
	Renew(ctx context.Context) (int64, error)
	// Leading is the term led now, without a database call (0: none).
	Leading() int64
	// Release gives the lease up, for a control plane that stops.
	Release(ctx context.Context) error
}

var _ Lease = (*state.Lease)(nil)

// Lock order: c.mu, then the lease's own (tick asks Leading under c.mu; the lease never
// takes c.mu).

// leading reports whether this control plane may decide: always without a lease.
func (c *Controller) leading() bool {
	return c.cfg.Lease == nil || c.cfg.Lease.Leading() != 0
}

// confirmLead checks with the store that this control plane still leads, before an action
// that writes nothing first (a termination).
func (c *Controller) confirmLead(ctx context.Context) error {
	if c.cfg.Lease == nil {
		return nil
	}
	return c.store.Confirm(ctx)
}

// renewEvery is how often the lease is renewed, and a standby tries to take it.
func (c *Controller) renewEvery() time.Duration { return c.cfg.Lease.TTL() / 3 }

// runLeased alternates between standing by and leading until ctx ends, then gives the
// lease up so that a standby takes it at once.
func (c *Controller) runLeased(ctx context.Context) {
	l := c.cfg.Lease
	defer func() {
		if err := l.Release(context.WithoutCancel(ctx)); err != nil {
			c.log.Warn("lease not released; another control plane takes it when it expires", "err", err)
		}
	}()
	for {
		term, ok := c.standBy(ctx)
		if !ok {
			return
		}
		c.log.Info("leading", "holder", l.Holder(), "term", term)
		lctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() {
			c.keepLease(lctx)
			cancel()
		})
		c.mu.Lock()
		// recover replaces the services it followed; what a past term left queued or
		// suspected is not this term's to write or judge.
		c.pending, c.unswept, c.suspects = nil, map[string]bool{}, map[string]bool{}
		c.mu.Unlock()
		if err := c.recover(lctx); err != nil {
			c.log.Error("recovery after taking the lease failed; standing by", "term", term, "err", err)
		} else {
			c.lead(lctx)
		}
		cancel()
		wg.Wait()
		c.mu.Lock()
		c.view = "" // what it led is not what the store says now: read it all again
		c.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		c.log.Warn("no longer leading; standing by", "holder", l.Holder(), "term", term)
	}
}

// standBy follows the store until this control plane takes the lease (its term, true) or
// ctx ends (false).
func (c *Controller) standBy(ctx context.Context) (int64, bool) {
	t := time.NewTicker(c.renewEvery())
	defer t.Stop()
	for {
		term, err := c.renew(ctx)
		if err != nil {
			c.log.Warn("lease: could not try to take it", "err", err)
		}
		if term != 0 {
			return term, true
		}
		if err := c.follow(ctx); err != nil {
			c.log.Warn("standby: could not read the store", "err", err)
		}
		select {
		case <-ctx.Done():
			return 0, false
		case <-t.C:
		}
	}
}

// freshWithin bounds a standby's read of the store before it answers.
const freshWithin = 2 * time.Second

// fresh brings a standby's view up to the store before its API answers a read (issue 46
// §1): a write the leader acknowledged a moment ago is readable through whichever control
// plane the CLI asks next, not only after the standby's next periodic read (a third of the
// lease later). A read that fails leaves the view as it was; the answer then says what the
// store last said.
func (c *Controller) fresh(ctx context.Context) {
	if c.leading() {
		return
	}
	// A store out of reach must not stall the answer: past this, what was read last.
	ctx, cancel := context.WithTimeout(ctx, freshWithin)
	defer cancel()
	if err := c.follow(ctx); err != nil {
		c.log.Warn("standby: could not read the store before answering", "err", err)
	}
}

// keepLease renews the lease until ctx ends or the lease is lost.
func (c *Controller) keepLease(ctx context.Context) {
	t := time.NewTicker(c.renewEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		term, err := c.renew(ctx)
		if err != nil {
			c.log.Warn("lease: renewal failed", "err", err)
		}
		if term == 0 {
			c.kickNow() // the leader's loop sees it at once
			return
		}
	}
}

// follow replaces the in-memory services and replicas with what the store says, reading
// only, and republishes the ready set when it changed. A standby's view: it asks no
// provider and writes nothing.
func (c *Controller) follow(ctx context.Context) error {
	select {
	case c.following <- struct{}{}:
		defer func() { <-c.following }()
	case <-ctx.Done():
		return ctx.Err()
	}
	now := c.cfg.Now()
	svcs, err := c.store.Services(ctx)
	if err != nil {
		return err
	}
	rows, err := c.store.Replicas(ctx, "", false)
	if err != nil {
		return err
	}
	var fp strings.Builder
	fp.WriteString("v:") // never the "" of a view not read yet
	for _, sv := range svcs {
		fmt.Fprintf(&fp, "%s/%d/%s;", sv.Name, sv.Version, sv.Status)
	}
	for _, r := range rows {
		fmt.Fprintf(&fp, "%s/%s/%s/%s;", r.ID, r.State, r.Address, r.Model)
	}
	c.mu.Lock()
	same := fp.String() == c.view
	c.mu.Unlock()
	if same {
		return nil
	}
	services := map[string]*service{}
	for _, sv := range svcs {
		v, err := c.store.GetVersion(ctx, sv.Name, sv.Version)
		if err != nil {
			return err
		}
		sp, err := parseStored(sv.Name, v)
		var s *service
		if err == nil {
			s, err = c.newService(sv.Name, sv.Version, sp, now)
		}
		if err != nil {
			s = &service{name: sv.Name, version: sv.Version, specs: map[int]*spec.Service{}, replicas: map[string]*replica{},
				setup: map[int]*sync.Mutex{}, failed: fmt.Sprintf("version %d no longer loads: %v", sv.Version, err)}
		}
		s.deleting = sv.Status == "deleting"
		s.blueGreen = storedMode(v.Envs) == ModeBlueGreen
		services[sv.Name] = s
	}
	for _, row := range rows {
		s := services[row.Service]
		if s == nil {
			continue
		}
		if s.specs[row.Version] == nil {
			if v, err := c.store.GetVersion(ctx, s.name, row.Version); err == nil {
				if sp, err := parseStored(s.name, v); err == nil {
					s.specs[row.Version] = sp
				}
			}
		}
		s.replicas[row.ID] = &replica{row: row}
		if live(replicas.State(row.State)) && row.Version == s.version {
			s.target++
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leading() {
		// The lease was taken meanwhile: recovery replaces the services from the store,
		// and what it adopts is not to be overwritten by this read.
		return nil
	}
	c.services, c.view = services, fp.String()
	c.relearnModels()
	c.publish()
	return nil
}
