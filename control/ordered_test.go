package control

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
)

// resources.ordered keeps the user's order, as SkyPilot does: the L4 written first is
// launched although the H100 serves each token for less; any_of ranks the same offers by $
// per token and takes the H100.
func TestOrderedCandidatesKeepTheUsersOrder(t *testing.T) {
	ctx := context.Background()
	q := func(zone, acc string, price float64) replicas.Quote {
		return replicas.Quote{Provider: "sim", Region: "r", Zone: zone, Capacity: fleet.OnDemand, PricePerHour: price, Accelerator: acc, AcceleratorCount: 1}
	}
	mkt := &marketMem{memProvider: memProvider{running: map[string]replicas.Instance{}},
		offers: []replicas.Quote{q("z-l4", "L4", 0.7045), q("z-h100", "H100", 1.80)}}
	now := time.UnixMilli(1_800_000_000_000)
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c, err := New(ctx, Config{Store: st, Providers: map[string]replicas.Provider{"sim": mkt}, Now: func() time.Time { return now },
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for name, list := range map[string]string{"ordered": "ordered", "anyof": "any_of"} {
		sp := `service:
  readiness_probe: /health
  replicas: 1
resources:
  ` + list + `:
    - accelerators: L4
    - accelerators: H100
run: x
arbiter:
  models: [` + name + `-model]
  profile: h100-llama-3.1-8b
  providers: [sim]
`
		if _, _, err := c.Create(ctx, name, sp, nil); err != nil {
			t.Fatal(err)
		}
	}
	ticks(c, &now, 2)
	for svc, want := range map[string]string{"ordered": "L4", "anyof": "H100"} {
		rows, err := st.Replicas(ctx, svc, true)
		if err != nil || len(rows) != 1 {
			t.Fatalf("%s: replicas %+v %v: want one", svc, rows, err)
		}
		if rows[0].Accelerator != want {
			t.Errorf("%s placed on %s; want %s", svc, rows[0].Accelerator, want)
		}
	}
}
