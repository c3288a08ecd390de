package control

import (
	"context"
	"strings"
	"testing"
)

// A replica is predicted on the GPU it was placed on: the spec's profile names the model,
// the placement the card.
func TestReplicaProfileFollowsItsGPU(t *testing.T) {
	for _, c := range []struct{ spec, acc, want string }{
		{"h100-llama-3.1-8b", "L4", "l4-llama-3.1-8b"},
		{"h100-llama-3.1-8b", "A100-80GB", "a100-80gb-llama-3.1-8b"},
		{"h100-llama-3.1-8b", "", "h100-llama-3.1-8b"},       // the local machine: no market, no GPU known
		{"h100-llama-3.1-8b", "TPU-v5", "h100-llama-3.1-8b"}, // a card no profile is made for
		{"", "L4", ""}, // routers take the accelerator and the model name themselves
	} {
		if got := replicaProfile(c.spec, c.acc); got != c.want {
			t.Errorf("replicaProfile(%q, %q) = %q, want %q", c.spec, c.acc, got, c.want)
		}
	}
}

// A service offered an L4 and an H100 is placed on the cheaper per token at its SLO: the
// H100 ($1.80/h, the catalogs' cheapest) serves some 30 times the L4's tokens within a
// 100 ms TPOT for a quarter of the L4's ($0.70/h) $ per token. The replica's row keeps the
// GPU it was placed on, and the placement event says what each costs per token.
func TestServiceIsPlacedOnTheCheaperGPUPerToken(t *testing.T) {
	ctx := context.Background()
	c, st, now := gpuMarket(t, nil, onDemandQuote("z-l4", "L4", 0.7045), onDemandQuote("z-h100", "H100", 1.80))
	const gpuSpec = `service:
  readiness_probe: /health
  replicas: 1
resources:
  accelerators: {L4: 1, H100: 1}
run: x
arbiter:
  model: meta-llama/Llama-3.1-8B-Instruct
  providers: [sim]
  slo: {tpot_seconds: 0.1, ttft_seconds: 2}
`
	if _, _, err := c.Create(ctx, "svc", gpuSpec, nil); err != nil {
		t.Fatal(err)
	}
	ticks(c, now, 2)
	rows, err := st.Replicas(ctx, "svc", true)
	if err != nil || len(rows) != 1 {
		t.Fatalf("replicas %+v %v: want one", rows, err)
	}
	if rows[0].Accelerator != "H100" || rows[0].Zone != "z-h100" {
		t.Fatalf("placed on %s in %s; want the H100, cheaper per token (the L4 is cheaper per hour)", rows[0].Accelerator, rows[0].Zone)
	}
	evs, err := st.Events(ctx, "svc", "", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, e := range evs {
		all = append(all, e.Message)
	}
	if text := strings.Join(all, "\n"); !strings.Contains(text, "H100 at $1.80/h ($0.021/M tokens at the SLO)") {
		t.Fatalf("events:\n%s\nwant the launch's $/M tokens at the SLO", text)
	}
}
