package control

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/state"
)

// AdapterUse is one LoRA adapter's requests, tokens and cost (chargeback per fine-tune),
// since Since (when the state first counted it).
type AdapterUse struct {
	Name     string    `json:"name"`
	Requests float64   `json:"requests"`
	Tokens   float64   `json:"tokens"`
	Dollars  float64   `json:"dollars"`
	Since    time.Time `json:"since"`
}

// adapterCount is an adapter's use as the routers reported it since the last write to the
// state (flushAdapterUse).
type adapterCount struct {
	requests, tokens float64
	// tickRequests and tickTokens are since the last tick, for its own replicas' decision
	// (own.go).
	tickRequests, tickTokens float64
}

// countAdapter adds a router's report of a model to its adapter's use, if it is one of the
// service's declared adapters (the names are the spec's: a client's string never makes an
// entry). Caller holds c.mu.
func (s *service) countAdapter(m fleet.ModelLoad) {
	sp := s.spec()
	if sp == nil || (m.Requests == 0 && m.Tokens == 0) ||
		!sp.Arbiter.HasAdapter(m.Model) {
		return
	}
	if s.adapterCounts == nil {
		s.adapterCounts = map[string]*adapterCount{}
	}
	a := s.adapterCounts[m.Model]
	if a == nil {
		a = &adapterCount{}
		s.adapterCounts[m.Model] = a
	}
	a.requests += m.Requests
	a.tokens += m.Tokens
	a.tickRequests += m.Requests
	a.tickTokens += m.Tokens
}

// adapterUse lists the use of the adapters the spec declares, in its order: what the state
// holds (stored) and what is not written yet, each costed at the service's $ per million
// tokens. Caller holds c.mu.
func (s *service) adapterUse(stored map[string]state.AdapterUse, perMillion float64) []AdapterUse {
	sp := s.spec()
	if sp == nil {
		return nil
	}
	var out []AdapterUse
	for _, a := range sp.Arbiter.Adapters {
		st := stored[a.Name]
		u := AdapterUse{Name: a.Name, Requests: st.Requests, Tokens: st.Tokens, Since: st.Since}
		if n := s.adapterCounts[a.Name]; n != nil {
			u.Requests += n.requests
			u.Tokens += n.tokens
		}
		u.Dollars = u.Tokens * perMillion / 1e6
		out = append(out, u)
	}
	return out
}

// flushAdapterUse adds what the routers reported of the service's adapters since the last
// tick to the state; what a failed write could not add is kept for the next. Caller holds
// c.mu.
func (c *Controller) flushAdapterUse(ctx context.Context, s *service, now time.Time) {
	if len(s.adapterCounts) == 0 {
		return
	}
	add := make([]state.AdapterUse, 0, len(s.adapterCounts))
	for name, n := range s.adapterCounts {
		add = append(add, state.AdapterUse{Adapter: name, Requests: n.requests, Tokens: n.tokens})
	}
	slices.SortFunc(add, func(a, b state.AdapterUse) int { return strings.Compare(a.Adapter, b.Adapter) })
	if err := c.store.AddAdapterUse(ctx, s.name, add, now); err != nil {
		c.log.Error("adapter use not saved; kept for the next tick", "service", s.name, "err", err)
		return
	}
	clear(s.adapterCounts)
}
