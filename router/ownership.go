package router

import (
	"log/slog"
	"slices"

	"github.com/arbiter-serve/arbiter/fleet"
)

// ownedReplicas returns the replicas of a ready set that may be routed to: those whose
// model their own service lists, or that no other service lists. A replica routed for a
// model another service lists would take that service's requests (issue 35 item 2); the
// control plane publishes none (it routes a replica only for its own service's models),
// so one here is a control plane's bug or an older version's, dropped and logged. rs is
// not changed.
func ownedReplicas(services []fleet.Service, rs []fleet.Replica, log *slog.Logger) []fleet.Replica {
	if len(services) == 0 {
		return rs
	}
	lists := func(name, model string) (own, other bool) {
		for _, s := range services {
			if slices.Contains(s.Models, model) {
				if s.Name == name {
					own = true
				} else {
					other = true
				}
			}
		}
		return own, other
	}
	var out []fleet.Replica
	for _, r := range rs {
		if own, other := lists(r.Service, r.Model); r.Service == "" || own || !other {
			out = append(out, r)
			continue
		}
		log.Warn("replica not routed: its model belongs to another service", "replica", r.ID, "service", r.Service, "model", r.Model)
	}
	return out
}
