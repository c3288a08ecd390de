package control

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
)

// l4H100Spec is an autoscaled Llama-3.1-8B service offered an L4 or an H100 on the sim
// market, TTFT ≤ 2 s and TPOT ≤ 100 ms for 90 % of requests.
func l4H100Spec(maxReplicas int) string {
	return fmt.Sprintf(`service:
  readiness_probe: /health
  replica_policy: {min_replicas: 1, max_replicas: %d, target_qps_per_replica: 2, upscale_delay_seconds: 10, downscale_delay_seconds: 60}
resources:
  accelerators: {L4: 1, H100: 1}
run: x
arbiter:
  models: [meta-llama/Llama-3.1-8B-Instruct]
  providers: [sim]
  slo: {tpot_seconds: 0.1, ttft_seconds: 2, percentile: 90}
  scale_to_zero_after_seconds: 0
`, maxReplicas)
}

// An autoscaled service offered an L4 and an H100 is sized per GPU type from the routers'
// observed mix: short chats on L4s (cheapest per token for them), and an H100 for the long
// prompts no L4 prefills within the TTFT target; when the long prompts stop, the H100
// goes once they have left the mix window and the downscale delay has passed.
func TestGPUMixFollowsTheRequestMix(t *testing.T) {
	ctx := context.Background()
	c, st, now := gpuMarket(t, nil, onDemandQuote("z-l4", "L4", 0.70), onDemandQuote("z-h100", "H100", 25))
	if _, _, err := c.Create(ctx, "mixed", l4H100Spec(8), nil); err != nil {
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

// The routers' judgement of each replica's answers against the SLO reaches the planner by
// GPU type: L4s that answer 30 % of their requests late get less headroom, so more L4s
// serve the same load, and an event says why.
func TestGPUMixLearnsHeadroomFromReplicasAnswers(t *testing.T) {
	ctx := context.Background()
	c, st, now := gpuMarket(t, nil, onDemandQuote("z-l4", "L4", 0.70), onDemandQuote("z-h100", "H100", 25))
	if _, _, err := c.Create(ctx, "judged", l4H100Spec(12), nil); err != nil {
		t.Fatal(err)
	}
	l4s := func() []string {
		rows, err := st.Replicas(ctx, "judged", false)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range rows {
			if r.State != string(replicas.Draining) && r.Accelerator == "L4" {
				ids = append(ids, r.ID)
			}
		}
		return ids
	}
	// Every 5 s, 5 s of short chats at 20 a second; each L4 answered its share, late of
	// them late (the market's replicas never pass a probe here: which are ready does not
	// matter to the planner).
	run := func(d time.Duration, late float64) {
		for end := now.Add(d); now.Before(end); *now = now.Add(5 * time.Second) {
			rep := fleet.LoadReport{Router: "r1", Models: []fleet.ModelLoad{{Model: "meta-llama/Llama-3.1-8B-Instruct", Requests: 100,
				Mix: []fleet.MixCell{{Prompt: 0, Output: 0, Requests: 100, PromptTokens: 100 * 100, OutputTokens: 100 * 50}}}}}
			if ids := l4s(); late >= 0 {
				for _, id := range ids {
					n := int64(100 / len(ids))
					rep.Replicas = append(rep.Replicas, fleet.Load{ReplicaID: id, SLOJudged: n, SLOMisses: int64(late * float64(n))})
				}
			}
			if err := rep.Validate(); err != nil {
				t.Fatal(err)
			}
			c.Report(rep)
			c.tick(ctx)
			c.wg.Wait()
		}
	}
	run(5*time.Minute, -1)
	before := len(l4s())
	if before < 1 {
		t.Fatalf("no L4 after 5 minutes of short chats")
	}
	run(45*time.Minute, 0.3)
	after := len(l4s())
	var moved []string
	evs, _ := st.Events(ctx, "judged", "", 0, 1000)
	for _, e := range evs {
		if strings.Contains(e.Message, "L4's headroom") {
			moved = append(moved, e.Message)
		}
	}
	if len(moved) == 0 || !strings.Contains(moved[0], "L4's headroom 0.6 → 0.48 (72.") {
		t.Fatalf("no GPU mix event says the L4's headroom fell from 0.6 to 0.48 on some 72 %% of answers within the SLO (each L4 reports 30 %% late of its share, rounded down): %q", moved)
	}
	if after <= before {
		t.Fatalf("L4s answering 30 %% late: %d L4s, as many as before (%d); want more for the same load", after, before)
	}
	t.Logf("L4s %d → %d; %d headroom moves, the first: %s", before, after, len(moved), moved[0])
}
