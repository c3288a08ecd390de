package router

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/oai"
	"github.com/arbiter-serve/arbiter/replicasim"
)

// loraSim is a replicasim serving testModel with adapters loadable at run time, as vLLM
// with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=true.
func loraSim(t *testing.T, maxLoRAs int, profile ...string) *sim {
	t.Helper()
	name := "h100-llama-3.1-8b"
	if len(profile) > 0 {
		name = profile[0]
	}
	return startSim(t, simOpts{profile: name, lora: &replicasim.LoRAConfig{MaxLoRAs: maxLoRAs, RuntimeUpdates: true}})
}

// peftFolder is a LoRA adapter as PEFT saves one (adapter_config.json with its rank r, and
// the weights: here a sparse file).
func peftFolder(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(`{"peft_type":"LORA","r":8,"lora_alpha":16,"target_modules":["q_proj","v_proj"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, "adapter_model.safetensors"), 0); err != nil {
		f, err := os.Create(filepath.Join(dir, "adapter_model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		_ = f.Truncate(8 << 20)
		_ = f.Close()
	}
	return dir
}

// Requests for adapters go to the base model's replicas, which the router loads them on as
// it first sends them there; an adapter's later requests stay where it is active, and
// another adapter, with that replica's one GPU slot taken, goes where a slot is free. An
// adapter that fails to load, an unknown one, and one removed while its request streams
// each get a clear answer; nothing else fails.
func TestAdaptersRoutedByAffinityAndLoadedOnDemand(t *testing.T) {
	t.Parallel() // it mostly waits for its streams
	s1, s2 := loraSim(t, 1), loraSim(t, 1)
	fin, sql := peftFolder(t), peftFolder(t)
	services := func(adapters ...fleet.Adapter) []fleet.Service {
		models := []string{testModel}
		for _, a := range adapters {
			models = append(models, a.Name)
		}
		return []fleet.Service{{Name: "svc", Models: models, Adapters: adapters, MaxLoRAs: 1}}
	}
	all := []fleet.Adapter{{Name: "fin", Base: testModel, Path: fin}, {Name: "sql", Base: testModel, Path: sql},
		{Name: "broken", Base: testModel, Path: filepath.Join(t.TempDir(), "missing")}}
	reps := []fleet.Replica{replica("r1", s1, fleet.OnDemand, 1), replica("r2", s2, fleet.OnDemand, 1)}
	fake := &fakeControlPlane{changed: make(chan struct{})}
	fake.publish(services(all...), reps)
	rig, cp := startWithControlPlane(t, fake, func(c *Config) { c.RoutingHeaders = true }, reps...)
	ctx := context.Background()

	resp, body := get(t, rig.url+"/v1/models")
	if !strings.Contains(body, `"id":"fin"`) || !strings.Contains(body, `"parent":"`+testModel+`"`) {
		t.Errorf("/v1/models: %s; want the adapters with their parent", body)
	}

	// A long stream for fin: loaded on the replica it goes to, and running there.
	stream := func(model string) (*http.Response, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rig.url+"/v1/completions",
			strings.NewReader(`{"model":"`+model+`","prompt":"hi","max_tokens":600,"stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("%s: %d %s", model, resp.StatusCode, b)
		}
		return resp, resp.Header.Get("X-Arbiter-Replica")
	}
	first, finOn := stream("fin")
	defer first.Body.Close()
	// fin's next request stays where fin runs (the other replica is idle and as cheap).
	for range 3 {
		resp, body = post(t, rig.url+"/v1/completions", `{"model":"fin","prompt":"hi","max_tokens":2}`)
		if resp.StatusCode != 200 || !strings.Contains(body, `"model":"fin"`) {
			t.Fatalf("fin: %d %s", resp.StatusCode, body)
		}
		if on := resp.Header.Get("X-Arbiter-Replica"); on != finOn {
			t.Errorf("fin's request went to %s; fin is active on %s", on, finOn)
		}
	}
	// sql: the replica running fin has no free slot (--max-loras 1); the other has.
	second, sqlOn := stream("sql")
	defer second.Body.Close()
	if sqlOn == finOn {
		t.Errorf("sql went to %s, whose one slot fin holds, with the other replica free", sqlOn)
	}

	resp, body = post(t, rig.url+"/v1/completions", `{"model":"broken","prompt":"hi","max_tokens":2}`)
	if resp.StatusCode != 502 || !strings.Contains(body, "adapter_load_failed") || !strings.Contains(body, "No adapter found for") {
		t.Errorf("an adapter whose files are missing: %d %s; want 502 adapter_load_failed with vLLM's message", resp.StatusCode, body)
	}
	resp, body = post(t, rig.url+"/v1/completions", `{"model":"nope","prompt":"hi","max_tokens":2}`)
	if resp.StatusCode != 404 || !strings.Contains(body, "model_not_found") {
		t.Errorf("unknown adapter: %d %s", resp.StatusCode, body)
	}

	// fin removed (serve update) while its stream runs: the stream ends whole, new requests
	// for fin are 404s, sql and the base model still serve.
	fake.publish(services(all[1]), reps)
	waitFor(t, "the set without fin", func() bool { _, _, ok := cp.Adapter("fin"); return !ok })
	resp, body = post(t, rig.url+"/v1/completions", `{"model":"fin","prompt":"hi","max_tokens":2}`)
	if resp.StatusCode != 404 {
		t.Errorf("fin after its removal: %d %s", resp.StatusCode, body)
	}
	for _, m := range []string{"sql", testModel} {
		if resp, body := post(t, rig.url+"/v1/completions", `{"model":"`+m+`","prompt":"hi","max_tokens":2}`); resp.StatusCode != 200 {
			t.Errorf("%s after fin's removal: %d %s", m, resp.StatusCode, body)
		}
	}
	rest, _ := io.ReadAll(first.Body)
	if !strings.Contains(string(rest), "[DONE]") {
		t.Errorf("fin's stream, its adapter removed meanwhile, did not end whole: %q", string(rest)[max(0, len(rest)-200):])
	}
	// The router unloaded fin from the replica it had loaded it on: vLLM lists it no more.
	finSim := map[string]*sim{"r1": s1, "r2": s2}[finOn]
	waitFor(t, "fin unloaded from "+finOn, func() bool {
		_, body := get(t, "http://"+finSim.addr+"/v1/models")
		return !strings.Contains(body, `"id":"fin"`)
	})
	if got := rig.counter(t, "arbiter_router_adapter_loads_total", "result", "unloaded"); got != 1 {
		t.Errorf("unloads counted: %v; want 1", got)
	}
	waitWithin(t, 30*time.Second, "in-flight counts back to zero", func() bool { return rig.inflight("r1")+rig.inflight("r2") <= 1 })
}

func TestParseLoRAInfo(t *testing.T) {
	text := `# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.79e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters="c"} 1.7900000005e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters=""} 1.7900000001e+09
vllm:num_requests_running{engine="0",model_name="m"} 2
`
	g := ParseEngineGauges([]byte(text))
	if g.Invalid != "" || g.LoRA == nil || strings.Join(g.LoRA.Running, "|") != "a|b" || strings.Join(g.LoRA.Waiting, "|") != "c" || g.LoRA.MaxLoRA != 2 || g.Running != 2 {
		t.Fatalf("parsed %+v %+v; want the newest series: a,b running, c waiting", g, g.LoRA)
	}
	for _, bad := range []string{
		`vllm:lora_requests_info{max_lora="x",running_lora_adapters="",waiting_lora_adapters=""} 1`,
		`vllm:lora_requests_info{max_lora="1",running_lora_adapters="a,,b",waiting_lora_adapters=""} 1`,
		`vllm:lora_requests_info{max_lora="1",running_lora_adapters="` + strings.Repeat("x,", 2000) + `x",waiting_lora_adapters=""} 1`,
		`vllm:lora_requests_info{max_lora="1"} NaNx`,
	} {
		if g := ParseEngineGauges([]byte(bad + "\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2\n")); g.LoRAInvalid == "" || g.LoRA != nil || g.Invalid != "" || g.Running != 2 {
			t.Errorf("%.80s: believed (%+v), or it cost the other gauges (%+v)", bad, g.LoRA, g)
		}
	}
}

// A router without a control plane serves the adapters its config names.
func TestAdaptersFromTheRoutersConfig(t *testing.T) {
	s := loraSim(t, 2)
	dir := peftFolder(t)
	rig := startRouter(t, func(c *Config) {
		c.Adapters, c.MaxLoRAs = []fleet.Adapter{{Name: "fin", Base: testModel, Path: dir}}, 2
	}, replica("r1", s, fleet.OnDemand, 1))
	resp, body := post(t, rig.url+"/v1/chat/completions", `{"model":"fin","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`)
	if resp.StatusCode != 200 || !strings.Contains(body, `"model":"fin"`) {
		t.Fatalf("fin: %d %s", resp.StatusCode, body)
	}
	if got := rig.counter(t, "arbiter_router_adapter_loads_total", "result", "loaded"); got != 1 {
		t.Errorf("adapter loads %v, want 1", got)
	}
	if got := rig.counter(t, "arbiter_router_adapter_tokens_total", "adapter", "fin", "type", "completion"); got != 3 {
		t.Errorf("fin's completion tokens %v, want 3", got)
	}
	if got := rig.counter(t, "arbiter_router_requests_total", "model", "fin"); got > 0 {
		t.Errorf("a replica series by adapter (%v): replicas' series are by their base model", got)
	}
	if _, body := get(t, rig.url+"/v1/models"); !strings.Contains(body, `"id":"fin","object":"model","owned_by":"arbiter","parent":"`+testModel+`"`) {
		t.Errorf("/v1/models: %s", body)
	}
	for _, bad := range []Config{
		{Adapters: []fleet.Adapter{{Name: "a", Base: testModel}}},
		{Adapters: []fleet.Adapter{{Name: "a,b", Base: testModel, Path: "/x"}}},
		{Adapters: []fleet.Adapter{{Name: "a", Base: testModel, Path: "/x"}, {Name: "a", Base: testModel, Path: "/y"}}},
	} {
		c := Defaults()
		c.Adapters = bad.Adapters
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "adapters[") {
			t.Errorf("%+v: %v", bad.Adapters, err)
		}
	}
}

// 50 adapters on 3 replicas with 4 GPU slots each, the adapters' popularity skewed (Zipf):
// every request is answered, whatever adapter it names and however long it waits for a slot.
func TestFiftyAdaptersOnThreeReplicasAllAnswered(t *testing.T) {
	t.Parallel() // it mostly waits for GPU slots
	const adapters, requests = 50, 100
	// Llama 3.2 1B's 16 layers load an adapter in half the 8B's time: a shorter test.
	sims := []*sim{loraSim(t, 4, "h100-llama-3.2-1b"), loraSim(t, 4, "h100-llama-3.2-1b"), loraSim(t, 4, "h100-llama-3.2-1b")}
	var list []fleet.Adapter
	for k := range adapters {
		list = append(list, fleet.Adapter{Name: fmt.Sprintf("tune-%02d", k), Base: testModel, Path: peftFolder(t)})
	}
	var reps []fleet.Replica
	for i, s := range sims {
		reps = append(reps, replica(fmt.Sprintf("r%d", i), s, fleet.OnDemand, 1))
	}
	rig := startRouter(t, func(c *Config) { c.Adapters, c.MaxLoRAs = list, 4 }, reps...)
	z := rand.NewZipf(rand.New(rand.NewPCG(51, 1)), 1.1, 1, adapters-1)
	var wg sync.WaitGroup
	var failed atomic.Int64
	var first atomic.Value
	tick := time.NewTicker(50 * time.Millisecond) // 20 requests a second
	defer tick.Stop()
	for range requests {
		<-tick.C
		name := list[z.Uint64()].Name
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(rig.url+"/v1/completions", "application/json",
				strings.NewReader(`{"model":"`+name+`","prompt":"Summarise the ledger.","max_tokens":8,"stream":true}`))
			if err != nil {
				failed.Add(1)
				first.CompareAndSwap(nil, err.Error())
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || !strings.Contains(string(b), "[DONE]") {
				failed.Add(1)
				first.CompareAndSwap(nil, fmt.Sprintf("%s: %d %.300s", name, resp.StatusCode, b))
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d requests failed; the first: %v", n, requests, first.Load())
	}
	if got := rig.counter(t, "arbiter_router_adapter_requests_total", "code", "200"); got != requests {
		t.Errorf("adapter requests counted %v, want %d", got, requests)
	}
}

// Through the endpoint picker, a pick on a replica without the adapter starts its load and
// answers 503 with Retry-After, as for a model starting (the gateway sends the request on,
// and waits 200 ms for a pick); the retry after the load is picked there.
func TestPickerLoadsAnAdapterThenPicks(t *testing.T) {
	s := loraSim(t, 2)
	dir := peftFolder(t)
	rig := startRouter(t, func(c *Config) {
		c.Adapters, c.MaxLoRAs = []fleet.Adapter{{Name: "fin", Base: testModel, Path: dir}}, 2
	}, replica("r1", s, fleet.OnDemand, 1))
	in := HandoffRequest{Method: http.MethodPost, Path: "/v1/completions", ContentType: "application/json",
		Body: []byte(`{"model":"fin","prompt":"hi","max_tokens":2}`)}
	h, f := rig.px.Handoff(in)
	if h != nil || f == nil || f.Status != 503 || f.Reason != "adapter_loading" || f.Headers["Retry-After"] == "" {
		t.Fatalf("first pick: %v %+v; want 503 adapter_loading with Retry-After", h, f)
	}
	var picked *Handoff
	waitWithin(t, 30*time.Second, "a pick once fin is loaded", func() bool {
		h, f := rig.px.Handoff(in)
		if f != nil {
			return false
		}
		picked = h
		return true
	})
	defer picked.Close()
	if eps := picked.Endpoints(); len(eps) == 0 || eps[0] != s.addr {
		t.Errorf("picked %v, want %s", eps, s.addr)
	}
	if _, body := get(t, "http://"+s.addr+"/v1/models"); !strings.Contains(body, `"id":"fin"`) {
		t.Errorf("the replica's models: %s; want fin loaded", body)
	}
}

// A service that names no model (SkyPilot's fine-tuning example has no arbiter: section)
// learns its base from its first replica: an adapter's request at zero replicas is held,
// wakes the service, and goes to the base's replica once the control plane publishes it.
func TestAdapterHeldUntilItsBaseIsKnown(t *testing.T) {
	t.Parallel()
	s := loraSim(t, 2)
	dir := peftFolder(t)
	fake := &fakeControlPlane{changed: make(chan struct{})}
	fake.publish([]fleet.Service{{Name: "svc", Models: []string{"fin"}, Adapters: []fleet.Adapter{{Name: "fin", Path: dir}}, MaxLoRAs: 2}}, nil)
	rig, cp := startWithControlPlane(t, fake, nil)
	if !cp.Knows(testModel) {
		t.Error("the service, which names no model of its own (only an adapter), no longer takes any model")
	}
	done := make(chan string, 1)
	go func() {
		resp, body := post(t, rig.url+"/v1/completions", `{"model":"fin","prompt":"hi","max_tokens":2}`)
		done <- fmt.Sprint(resp.StatusCode, " ", body)
	}()
	waitFor(t, "a wake for fin", func() bool {
		fake.mu.Lock()
		defer fake.mu.Unlock()
		return slices.Contains(fake.wakes, "fin")
	})
	fake.publish([]fleet.Service{{Name: "svc", Models: []string{testModel, "fin"}, Adapters: []fleet.Adapter{{Name: "fin", Base: testModel, Path: dir}}, MaxLoRAs: 2}},
		[]fleet.Replica{replica("r1", s, fleet.OnDemand, 1)})
	select {
	case got := <-done:
		if !strings.HasPrefix(got, "200 ") || !strings.Contains(got, `"model":"fin"`) {
			t.Errorf("held adapter request: %s", got)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the held adapter request was not answered once its base's replica was published")
	}
}

// mergedSim is a replicasim serving a LoRA adapter merged into the base weights, under the
// adapter's name (vllm serve CHECKPOINT --served-model-name NAME): an adapter's own replica.
func mergedSim(t *testing.T, name string) *sim {
	t.Helper()
	return startSim(t, simOpts{model: name})
}

// An adapter's own replica (the control plane publishes it under the adapter's name, issue
// 51) takes the adapter's requests first, with no load on the shared replicas; the base
// model's requests never go there; without it the adapter is loaded on a shared replica.
func TestAdaptersOwnReplicaTakesItsRequests(t *testing.T) {
	t.Parallel()
	s1, s2, own := loraSim(t, 1), loraSim(t, 1), mergedSim(t, "fin")
	fin := peftFolder(t)
	svc := []fleet.Service{{Name: "svc", Models: []string{testModel, "fin"}, MaxLoRAs: 1,
		Adapters: []fleet.Adapter{{Name: "fin", Base: testModel, Path: fin}}}}
	ownRep := replica("own", own, fleet.OnDemand, 1)
	ownRep.Model, ownRep.Service, ownRep.Adapter = "fin", "svc", "fin"
	shared := []fleet.Replica{replica("r1", s1, fleet.OnDemand, 1), replica("r2", s2, fleet.OnDemand, 1)}
	for i := range shared {
		shared[i].Service = "svc"
	}
	fake := &fakeControlPlane{changed: make(chan struct{})}
	fake.publish(svc, append(slices.Clone(shared), ownRep))
	rig, cp := startWithControlPlane(t, fake, func(c *Config) { c.RoutingHeaders = true }, append(slices.Clone(shared), ownRep)...)

	for i := range 6 {
		resp, body := post(t, rig.url+"/v1/completions", `{"model":"fin","prompt":"hi","max_tokens":2}`)
		if resp.StatusCode != 200 || !strings.Contains(body, `"model":"fin"`) {
			t.Fatalf("fin %d: %d %s", i, resp.StatusCode, body)
		}
		if on := resp.Header.Get("X-Arbiter-Replica"); on != "own" {
			t.Errorf("fin's request %d went to %s, with fin's own replica idle", i, on)
		}
		resp, body = post(t, rig.url+"/v1/completions", `{"model":"`+testModel+`","prompt":"hi","max_tokens":2}`)
		if on := resp.Header.Get("X-Arbiter-Replica"); resp.StatusCode != 200 || on == "own" {
			t.Errorf("the base model's request: %d on %s %s", resp.StatusCode, on, body)
		}
	}
	if got := rig.counter(t, "arbiter_router_adapter_loads_total", "result", "loaded"); got != 0 {
		t.Errorf("%v adapter loads with fin's own replica serving it", got)
	}
	// Counted as the adapter's (chargeback per fine-tune), wherever served.
	if got := rig.counter(t, "arbiter_router_adapter_requests_total", "adapter", "fin"); got != 6 {
		t.Errorf("fin's requests counted: %v; want 6", got)
	}
	// Its own replica draining (fin cooling), and its replicas of the base busy or not,
	// fin's requests go to the shared replicas, which load it.
	ownRep.Draining = true
	fake.publish(svc, append(slices.Clone(shared), ownRep))
	waitFor(t, "fin's own replica draining", func() bool { return len(rig.pool.candidates("fin")) == 0 })
	resp, body := post(t, rig.url+"/v1/completions", `{"model":"fin","prompt":"hi","max_tokens":2}`)
	if on := resp.Header.Get("X-Arbiter-Replica"); resp.StatusCode != 200 || on == "own" {
		t.Errorf("fin with its own replica draining: %d on %s %s", resp.StatusCode, on, body)
	}
	// Gone: the same.
	fake.publish(svc, shared)
	waitFor(t, "the set without fin's own replica", func() bool { return rig.pool.Get("own") == nil })
	resp, body = post(t, rig.url+"/v1/completions", `{"model":"fin","prompt":"hi","max_tokens":2}`)
	if on := resp.Header.Get("X-Arbiter-Replica"); resp.StatusCode != 200 || on == "own" {
		t.Errorf("fin without its own replica: %d on %s %s", resp.StatusCode, on, body)
	}
	if got := rig.counter(t, "arbiter_router_adapter_loads_total", "result", "loaded"); got != 1 {
		t.Errorf("%v adapter loads; want fin's one on a shared replica", got)
	}
	_ = cp
}

// The control plane is told each model's requests in flight under the name they asked for:
// an adapter's under the adapter's, though its base model's replica serves it. Before, they
// counted under the base model, which an adapter-only load never reports, so the service
// did not scale on them.
func TestAdapterInFlightReportedUnderItsName(t *testing.T) {
	t.Parallel()
	s1 := loraSim(t, 2)
	fin := peftFolder(t)
	svc := []fleet.Service{{Name: "svc", Models: []string{testModel, "fin"}, MaxLoRAs: 2,
		Adapters: []fleet.Adapter{{Name: "fin", Base: testModel, Path: fin}}}}
	reps := []fleet.Replica{replica("r1", s1, fleet.OnDemand, 1)}
	fake := &fakeControlPlane{changed: make(chan struct{})}
	fake.publish(svc, reps)
	rig, _ := startWithControlPlane(t, fake, nil, reps...)
	var open []io.ReadCloser
	defer func() {
		for _, b := range open {
			b.Close()
		}
	}()
	for _, m := range []string{"fin", "fin", testModel} {
		req, _ := http.NewRequest(http.MethodPost, rig.url+"/v1/completions",
			strings.NewReader(`{"model":"`+m+`","prompt":"hi","max_tokens":2000,"stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", m, resp, err)
		}
		open = append(open, resp.Body)
	}
	got := map[string]float64{}
	for _, m := range rig.px.Load.report(rig.pool.Snapshot()) {
		got[m.Model] = m.InFlight
	}
	if got["fin"] != 2 || got[testModel] != 1 {
		t.Errorf("in flight reported %v; want fin 2 and %s 1", got, testModel)
	}
}

// vLLM caches an adapter's KV apart from its base model's, and a request's cache_salt
// apart from every other salt's: the router's memory of what a replica holds keys prompts
// the same way, so the same text under another adapter or salt counts as not cached.
func TestAdapterAndSaltedPromptsAreCachedApart(t *testing.T) {
	s := loraSim(t, 2)
	rig := startRouter(t, func(c *Config) {
		c.Adapters, c.MaxLoRAs = []fleet.Adapter{{Name: "fin", Base: testModel, Path: peftFolder(t)}}, 2
	}, replica("r1", s, fleet.OnDemand, 1))
	prompt := strings.Repeat("the contract's terms, clause after clause. ", 200) // 8.6 KB: 33 blocks
	body := func(model, salt string) string {
		b := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":1`, model, prompt)
		if salt != "" {
			b += fmt.Sprintf(`,"cache_salt":%q`, salt)
		}
		return b + "}"
	}
	prefix := func(b string) []uint64 {
		c, ref := rig.px.parseCall(oai.Chat, "/v1/chat/completions", "application/json", []byte(b), func(string) []byte { return nil })
		if ref != nil {
			t.Fatalf("parse %s: %s", b, ref.msg)
		}
		return c.route.Prefix
	}
	held := func(b string) int {
		r := rig.pool.Get("r1")
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.prefixes.match(prefix(b), 1)
	}
	base := body(testModel, "")
	if resp, out := post(t, rig.url+"/v1/chat/completions", base); resp.StatusCode != 200 {
		t.Fatalf("base request: %d %s", resp.StatusCode, out)
	}
	if held(base) < 30 {
		t.Fatalf("the base prompt's %d blocks are not remembered on r1 (%d)", len(prefix(base)), held(base))
	}
	for _, other := range []string{body("fin", ""), body(testModel, "tenant-b"), body("fin", "tenant-b")} {
		if got := held(other); got > 0 {
			t.Errorf("%s…: %d blocks counted as cached on r1, where vLLM holds none of its KV", other[:40], got)
		}
	}
	salted := body(testModel, "tenant-b")
	if resp, out := post(t, rig.url+"/v1/chat/completions", salted); resp.StatusCode != 200 {
		t.Fatalf("salted request: %d %s", resp.StatusCode, out)
	}
	if held(salted) < 30 || held(body(testModel, "tenant-c")) > 0 {
		t.Errorf("a salted prompt is remembered under its own salt only: %d blocks, %d under another salt", held(salted), held(body(testModel, "tenant-c")))
	}
}
