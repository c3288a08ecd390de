package control

import (
	"slices"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/spec"
)

// AdapterUse is one LoRA adapter's requests, tokens and cost (chargeback per fine-tune).
type AdapterUse struct {
	Name     string    `json:"name"`
	Requests float64   `json:"requests"`
	Tokens   float64   `json:"tokens"`
	Dollars  float64   `json:"dollars"`
	Since    time.Time `json:"since"`
}

// adapterCount is an adapter's use as the routers reported it.
type adapterCount struct {
	requests, tokens float64
	since            time.Time
}

// countAdapter adds a router's report of a model to its adapter's use, if it is one of the
// service's declared adapters (the names are the spec's: a client's string never makes an
// entry). Caller holds c.mu.
func (s *service) countAdapter(m fleet.ModelLoad, now time.Time) {
	sp := s.spec()
	if sp == nil || (m.Requests == 0 && m.Tokens == 0) ||
		!slices.ContainsFunc(sp.Arbiter.Adapters, func(a spec.Adapter) bool { return a.Name == m.Model }) {
		return
	}
	if s.adapterCounts == nil {
		s.adapterCounts = map[string]*adapterCount{}
	}
	a := s.adapterCounts[m.Model]
	if a == nil {
		a = &adapterCount{since: now}
		s.adapterCounts[m.Model] = a
	}
	a.requests += m.Requests
	a.tokens += m.Tokens
}

// adapterUse lists the use of the adapters the spec declares, in its order, each costed at
// the service's $ per million tokens. Caller holds c.mu.
func (s *service) adapterUse(perMillion float64) []AdapterUse {
	sp := s.spec()
	if sp == nil {
		return nil
	}
	var out []AdapterUse
	for _, a := range sp.Arbiter.Adapters {
		u := AdapterUse{Name: a.Name}
		if n := s.adapterCounts[a.Name]; n != nil {
			u.Requests, u.Tokens, u.Since = n.requests, n.tokens, n.since
			u.Dollars = n.tokens * perMillion / 1e6
		}
		out = append(out, u)
	}
	return out
}
