package control

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
)

// An autoscaled service offered an L4 and an H100 is sized per GPU type from the routers'
// observed mix: short chats on L4s (cheapest per token for them), and an H100 for the long
// prompts no L4 prefills within the TTFT target; when the long prompts stop, the H100
// goes once they have left the mix window and the downscale delay has passed.
func TestGPUMixFollowsTheRequestMix(t *testing.T) {
	ctx := context.Background()
	c, st, now := gpuMarket(t, nil, onDemandQuote("z-l4", "L4", 0.70), onDemandQuote("z-h100", "H100", 25))
	sp := `service:
  readiness_probe: /health
  replica_policy: {min_replicas: 1, max_replicas: 8, target_qps_per_replica: 2, upscale_delay_seconds: 10, downscale_delay_seconds: 60}
resources:
  accelerators: {L4: 1, H100: 1}
run: x
arbiter:
  models: [meta-llama/Llama-3.1-8B-Instruct]
  providers: [sim]
  slo: {tpot_seconds: 0.1, ttft_seconds: 2}
  scale_to_zero_after_seconds: 0
`
	if _, _, err := c.Create(ctx, "mixed", sp, nil); err != nil {
		t.Fatal(err)
	}
	// Every 5 s a router reports 5 s of traffic: short chats (100:50) at 40 a second, and
	// (while long) 16k-token prompts at 0.4 a second. One L4 sustains some 13.5 chats a
	// second within the SLO and no long prompt; one H100 248 chats or 0.78 long prompts,
	// at 35 times the L4's price: the long prompts need an H100 (half of it, at the
	// planner's 0.6 utilization), its spare takes ~20 chats, and L4s the other ~20.
	report := func(long bool) {
		cells := []fleet.MixCell{{Prompt: 0, Output: 0, Requests: 200, PromptTokens: 200 * 100, OutputTokens: 200 * 50}}
		n := 200.0
		if long {
			cells = append(cells, fleet.MixCell{Prompt: 4, Output: 1, Requests: 2, PromptTokens: 2 * 16000, OutputTokens: 2 * 200})
			n += 2
		}
		rep := fleet.LoadReport{Router: "r1", Models: []fleet.ModelLoad{{Model: "meta-llama/Llama-3.1-8B-Instruct", Requests: n, Mix: cells}}}
		if err := rep.Validate(); err != nil {
			t.Fatal(err)
		}
		c.Report(rep)
	}
	byGPU := func() map[string]int {
		rows, err := st.Replicas(ctx, "mixed", false)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, r := range rows {
			if r.State != string(replicas.Draining) {
				out[r.Accelerator]++
			}
		}
		return out
	}
	run := func(d time.Duration, long bool) {
		for end := now.Add(d); now.Before(end); *now = now.Add(5 * time.Second) {
			report(long)
			c.tick(ctx)
			c.wg.Wait()
		}
	}
	run(3*time.Minute, true)
	got := byGPU()
	if got["L4"] < 1 || got["H100"] != 1 {
		t.Fatalf("with long prompts: %v; want L4s and one H100", got)
	}
	var mixEvents int
	evs, _ := st.Events(ctx, "mixed", "", 0, 1000)
	for _, e := range evs {
		if strings.Contains(e.Message, "GPU mix:") {
			mixEvents++
			t.Logf("event: %s", e.Message)
		}
	}
	if mixEvents == 0 {
		t.Error("no GPU mix event says what was chosen and why")
	}
	run(18*time.Minute, false)
	evs, _ = st.Events(ctx, "mixed", "", 0, 1000)
	for _, e := range evs {
		if strings.Contains(e.Message, "GPU mix:") || e.Kind == "placement" {
			t.Logf("event: %s", e.Message)
		}
	}
	if got := byGPU(); got["H100"] != 0 || got["L4"] < 1 {
		t.Fatalf("after the long prompts stopped: %v; want L4s only", got)
	}
}
