package control

import (
	"context"
	"testing"
)

// resources.ordered keeps the user's order, as SkyPilot does: the L4 written first is
// launched although the H100 serves each token for less; any_of ranks the same offers by $
// per token and takes the H100.
func TestOrderedCandidatesKeepTheUsersOrder(t *testing.T) {
	ctx := context.Background()
	c, st, now := gpuMarket(t, nil, onDemandQuote("z-l4", "L4", 0.7045), onDemandQuote("z-h100", "H100", 1.80))
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
	ticks(c, now, 2)
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
