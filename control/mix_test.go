package control

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/scaling"
)

// The control plane keeps the last 15 minutes of a service's request mix: classes with
// their mean lengths and rate, older reports forgotten.
func TestMixWindow(t *testing.T) {
	var m requestMix
	t0 := time.Date(2026, 11, 26, 12, 0, 30, 0, time.UTC)
	if cls, n := m.classes(t0); cls != nil || n != 0 {
		t.Fatalf("no reports: %v %v", cls, n)
	}
	m.add(t0, []fleet.MixCell{{Prompt: 0, Output: 0, Requests: 100, PromptTokens: 10_000, OutputTokens: 5_000}})
	m.add(t0.Add(50*time.Second), []fleet.MixCell{
		{Prompt: 0, Output: 0, Requests: 100, PromptTokens: 8_000, OutputTokens: 4_000},
		{Prompt: 2, Output: 2, Requests: 50, PromptTokens: 150_000, OutputTokens: 15_000},
	})
	cls, n := m.classes(t0.Add(100 * time.Second))
	want := []scaling.MixClass{{In: 90, Out: 45, Rate: 2}, {In: 3000, Out: 300, Rate: 0.5}}
	if n != 250 || len(cls) != 2 || cls[0] != want[0] || cls[1] != want[1] {
		t.Fatalf("classes after 100 s = %+v (%v requests); want %+v (250)", cls, n, want)
	}
	// 15 minutes on, the first minute's counts have left the window.
	cls, n = m.classes(t0.Add(15*time.Minute + 10*time.Second))
	if n != 150 || len(cls) != 2 || cls[0].In != 80 {
		t.Fatalf("classes after 15 min = %+v (%v requests); want the second report's 150 alone", cls, n)
	}
	if cls, n = m.classes(t0.Add(time.Hour)); len(cls) != 0 || n != 0 {
		t.Fatalf("classes an hour on = %+v (%v requests); want none", cls, n)
	}
}

// Which GPU is cheapest per token depends on the requests: for long answers (256:1,024
// tokens) an H100 at 22× an L4's hour serves each token for less (about 26× the L4's
// tokens), for short chats of 100:50 the L4 does (the H100 serves about 18× its tokens).
// The routers' observed mix decides, once there is enough of it; before any traffic, or
// with too little, the spec's arbiter.workload. (Before the L4's KV cache was sized as
// vLLM sizes it, 1,024:256 made the difference: with a third of its cache the L4 served
// far fewer of them at once.)
func TestObservedMixChoosesTheGPU(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	c, st, now := gpuMarket(t, reg, onDemandQuote("z-l4", "L4", 0.10), onDemandQuote("z-h100", "H100", 2.20))
	specFor := func(model, extra string) string {
		return `service:
  readiness_probe: /health
  replicas: 1
resources:
  accelerators: {L4: 1, H100: 1}
run: x
arbiter:
  models: [` + model + `]
  profile: h100-llama-3.1-8b
  providers: [sim]
  slo: {tpot_seconds: 0.1, ttft_seconds: 2}
` + extra
	}
	long := "  workload: {prompt_tokens: 256, output_tokens: 1024}\n"
	for _, sv := range []struct{ name, extra string }{
		{"plain", long},
		{"chat", ""},
		{"few", long},
		{"hinted", "  workload: {prompt_tokens: 100, output_tokens: 50}\n"},
	} {
		if _, _, err := c.Create(ctx, sv.name, specFor(sv.name+"-model", sv.extra), nil); err != nil {
			t.Fatal(err)
		}
	}
	short := func(n float64) []fleet.MixCell {
		return []fleet.MixCell{{Prompt: 0, Output: 0, Requests: n, PromptTokens: 100 * n, OutputTokens: 50 * n}}
	}
	rep := fleet.LoadReport{Router: "r1", Models: []fleet.ModelLoad{
		{Model: "chat-model", Requests: 200, Mix: short(200)},
		{Model: "few-model", Requests: 20, Mix: short(20)}, // too few to go by
	}}
	if err := rep.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Report(rep)
	if got := c.Mix("chat"); len(got) != 1 || got[0] != (scaling.MixClass{In: 100, Out: 50, Rate: 20}) {
		t.Fatalf("Mix(chat) = %+v; want one class of 100:50 at 200 requests over the first 10 s", got)
	}
	if got := c.Mix("plain"); got != nil {
		t.Fatalf("Mix(plain) = %+v; want none", got)
	}
	ticks(c, now, 2)
	for svc, want := range map[string]string{"plain": "H100", "chat": "L4", "few": "H100", "hinted": "L4"} {
		rows, err := st.Replicas(ctx, svc, true)
		if err != nil || len(rows) != 1 {
			t.Fatalf("%s: replicas %+v %v: want one", svc, rows, err)
		}
		if rows[0].Accelerator != want {
			t.Errorf("%s placed on %s; want %s", svc, rows[0].Accelerator, want)
		}
	}
	// serve status shows each replica's predicted $ per million tokens at the SLO, for the
	// service's mix on its GPU: the API carries it by replica.
	sts, err := c.Status(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts {
		if len(st.Replicas) != 1 {
			t.Fatalf("%s: %d replicas", st.Name, len(st.Replicas))
		}
		r := st.Replicas[0]
		pt, ok := st.PerToken[r.ID]
		if !ok || pt.TokensPerSecond <= 0 {
			t.Fatalf("%s: no prediction for %s: %+v", st.Name, r.ID, st.PerToken)
		}
		if want := r.PricePerHour / 3600 / pt.TokensPerSecond * 1e6; math.Abs(pt.DollarsPerMillionTokens-want) > 1e-9 {
			t.Errorf("%s: $%v/M tokens; want $/h over tokens/s, %v", st.Name, pt.DollarsPerMillionTokens, want)
		}
		wantWhy := map[string]string{"plain": "arbiter.workload 256:1024 tokens", "few": "arbiter.workload 256:1024 tokens", "chat": "the observed mix (200 requests: 100% 100:50)", "hinted": "arbiter.workload 100:50 tokens"}[st.Name]
		if !strings.Contains(pt.Why, wantWhy) || !strings.Contains(pt.Why, strings.ToLower(r.Accelerator)+"-llama-3.1-8b") {
			t.Errorf("%s: why %q; want the %s profile and %q", st.Name, pt.Why, r.Accelerator, wantWhy)
		}
		t.Logf("%s on %s: $%.4f/M tokens at the SLO (%s)", st.Name, r.Accelerator, pt.DollarsPerMillionTokens, pt.Why)
		b, err := json.Marshal(st)
		if err != nil || !strings.Contains(string(b), `"per_token":{"`+r.ID+`":{"dollars_per_million_tokens":`) {
			t.Errorf("%s: status JSON %s (%v): want per_token by replica", st.Name, b, err)
		}
	}
	// Cost by GPU type: the spend, per-replica dollars and prices carry the accelerator.
	if price := gathered(t, reg, "arbiter_control_replica_price_dollars_per_hour", "accelerator"); price["L4"] != 0.2 || math.Abs(price["H100"]-4.4) > 1e-9 || len(price) != 2 {
		t.Errorf("price per hour by accelerator %v; want L4 0.2 (two at $0.10), H100 4.4 (two at $2.20)", price)
	}
	if spend := gathered(t, reg, "arbiter_control_spend_dollars_total", "accelerator"); len(spend) != 2 || !(spend["L4"] > 0) || !(spend["H100"] > spend["L4"]) {
		t.Errorf("spend by accelerator %v; want L4 and H100, each billed", spend)
	}
}
