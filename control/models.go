package control

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/arbiter-serve/arbiter/replicas"
)

// Models are owned. A service owns the models its spec declares (arbiter.model; Create and
// Update refuse a spec declaring a model another service serves) and, for names no spec
// declares, those its replicas were first to list. A replica may serve only its own
// service's models: one that lists a model another service owns is never routed to for it
// (in the review of issue 35, a second service with no declared model, whose replica's
// /v1/models listed the first service's model, took all of that service's requests). Two
// services that learn the same name from their replicas are the same conflict: the first
// keeps it, the second's replica is not routed to for it, and both are told why.

// modelOwner returns the service other than s that owns model, or nil: one whose current
// spec declares it, else one that learned it first. Caller holds c.mu.
func (c *Controller) modelOwner(s *service, model string) *service {
	var learner *service
	for _, o := range sortedServices(c.services) {
		if o == s || o.deleting {
			continue
		}
		if sp := o.spec(); sp != nil && slices.Contains(sp.Arbiter.Models, model) {
			return o
		}
		if learner == nil && slices.Contains(o.learned, model) {
			learner = o
		}
	}
	return learner
}

// learnModels takes what a replica that just got ready lists on /v1/models: the names no
// other service owns become its service's, and the one routers send it is the spec's first
// model the replica serves, else the first of its own names it lists, else (a server
// without /v1/models) the spec's first. A replica that lists only other services' models
// gets none: it is ready, but no request is routed to it. Names another service owns are
// reported in the service's status, in an event on both services, and in the log. Caller
// holds c.mu.
func (c *Controller) learnModels(ctx context.Context, s *service, r *replica, models []string) {
	if a := r.own(); a != "" {
		// An adapter's own replica serves its merged checkpoint under the adapter's name:
		// routed for that name, as one of the adapter's replicas.
		r.row.Model, r.conflict = a, ""
		if len(models) > 0 && !slices.Contains(models, a) {
			r.row.Model = ""
			r.conflict = fmt.Sprintf("replica %s, adapter %s's own, lists %s, not %s: no request is routed to it", r.row.ID, a, strings.Join(models, ", "), a)
			c.event(ctx, s.name, r.row.ID, "model_conflict", r.conflict)
		}
		return
	}
	var own, taken []string
	sp := s.spec()
	for _, m := range models {
		if sp.Arbiter.HasAdapter(m) {
			continue // an adapter the spec names: routed for by its base model
		}
		if o := c.modelOwner(s, m); o != nil {
			taken = append(taken, fmt.Sprintf("model %q of service %q", m, o.name))
			c.event(ctx, o.name, "", "model_conflict", fmt.Sprintf("replica %s of service %q lists model %q, which this service owns; it is not routed to for it", r.row.ID, s.name, m))
			continue
		}
		own = append(own, m)
		if !slices.Contains(s.learned, m) {
			s.learned = append(s.learned, m)
		}
	}
	declared := sp.Arbiter.Models
	r.row.Model = ""
	for _, m := range declared {
		if slices.Contains(own, m) {
			r.row.Model = m
			break
		}
	}
	if r.row.Model == "" && len(own) > 0 {
		r.row.Model = own[0]
	}
	if r.row.Model == "" && len(models) == 0 && len(declared) > 0 {
		r.row.Model = declared[0] // a server without /v1/models: trust the spec
	}
	r.conflict = ""
	if len(taken) == 0 {
		return
	}
	r.conflict = fmt.Sprintf("replica %s lists %s: a replica serves only its own service's models, so it is not routed to for that", r.row.ID, strings.Join(taken, ", "))
	if r.row.Model == "" {
		r.conflict += "; it lists none of this service's, so no request is routed to it"
	}
	c.event(ctx, s.name, r.row.ID, "model_conflict", r.conflict)
	c.log.Warn("replica lists another service's model", "service", s.name, "replica", r.row.ID, "models", taken, "routed_for", r.row.Model)
}

// relearnModels restores, after a restart, the names services had learned from their
// replicas (kept only in memory): a live replica's recorded model is its service's again,
// so that ownership survives the restart and a replica that starts after it cannot take a
// name another service's replicas serve. Caller holds c.mu.
func (c *Controller) relearnModels() {
	for _, s := range sortedServices(c.services) {
		for _, r := range sortedReplicas(s.replicas) {
			m := r.row.Model
			if m == "" || r.own() != "" || !live(replicas.State(r.row.State)) || slices.Contains(s.learned, m) || c.modelOwner(s, m) != nil {
				continue
			}
			if sp := s.spec(); sp != nil && slices.Contains(sp.Arbiter.Models, m) {
				continue // declared: owned already
			}
			s.learned = append(s.learned, m)
		}
	}
}
