package router

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-serve/arbiter/fleet"
)

// A model's candidates are its ready, undrained replicas, cheapest first, kept current as
// the set and readiness change; other models' replicas never appear among them.
func TestPoolIndexesCandidatesByModelAndCost(t *testing.T) {
	pool := NewPool(&Config{}, slog.New(slog.NewTextHandler(io.Discard, nil)), NewMetrics(prometheus.NewRegistry()), nil)
	ids := func(rs []*Replica) string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Info().ID)
		}
		return fmt.Sprint(out)
	}
	rep := func(id, model string, price float64, draining bool) fleet.Replica {
		return fleet.Replica{ID: id, Address: "127.0.0.1:1", Model: model, Capacity: fleet.OnDemand, PricePerHour: price, TokensPerSecond: 1000, Draining: draining}
	}
	pool.SetReplicas([]fleet.Replica{rep("a", "m", 3, false), rep("b", "m", 1, false), rep("c", "m", 2, false), rep("d", "m", 1, false),
		rep("e", "other", 0.5, false), rep("f", "m", 0.1, true)})
	if got := ids(pool.candidates("m")); got != "[b d c a]" {
		t.Fatalf("candidates of m: %s; want [b d c a] (by price, then ID; the draining f left out)", got)
	}
	if got := ids(pool.candidates("other")); got != "[e]" {
		t.Fatalf("candidates of other: %s", got)
	}
	if got := pool.candidates("nobody"); got != nil {
		t.Fatalf("candidates of an unknown model: %v", ids(got))
	}

	// Readiness: a replica that fails its probes leaves the list, and comes back.
	b := pool.Get("b")
	for range 3 {
		b.probed(false, 0, 3)
	}
	pool.mu.Lock()
	pool.reindex()
	pool.mu.Unlock()
	if got := ids(pool.candidates("m")); got != "[d c a]" {
		t.Fatalf("after b failed its probes: %s", got)
	}
	// A price change reorders; a replica removed from the set leaves.
	pool.SetReplicas([]fleet.Replica{rep("a", "m", 0.5, false), rep("b", "m", 1, false), rep("c", "m", 2, false)})
	if got := ids(pool.candidates("m")); got != "[a c]" {
		t.Fatalf("after a's price fell and d left: %s; want [a c] (b still not ready)", got)
	}
	// Taken out by its probes, it comes back after as many passes in a row.
	for range 3 {
		b.probed(true, time.Millisecond, 3)
	}
	pool.mu.Lock()
	pool.reindex()
	pool.mu.Unlock()
	if got := ids(pool.candidates("m")); got != "[a b c]" {
		t.Fatalf("after b recovered: %s", got)
	}
}
