package router

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/oai"
)

// hostileReplica is an OpenAI-compatible server on loopback whose usage counts and /metrics
// say what a test sets: a buggy engine, a proxy in front of one, or a replica an attacker
// controls. Its answers are otherwise shaped as vLLM's.
type hostileReplica struct {
	srv   *httptest.Server
	model string

	mu      sync.Mutex
	usage   string // the usage object's JSON
	metrics string // /metrics text
}

func startHostile(t *testing.T, model, usage string) *hostileReplica {
	t.Helper()
	h := &hostileReplica{model: model, usage: usage}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		h.mu.Lock()
		defer h.mu.Unlock()
		fmt.Fprint(w, h.metrics)
	})
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		usage := h.usage
		h.mu.Unlock()
		req, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(req), `"stream":true`) {
			// vLLM's ChatCompletionResponse, field for field.
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"a full answer","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":%s,"prompt_logprobs":null}`, h.model, usage)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"a full answer\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n", h.model)
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":%q,\"choices\":[],\"usage\":%s}\n\n", h.model, usage)
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	h.srv = httptest.NewServer(mux)
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hostileReplica) setMetrics(text string) {
	h.mu.Lock()
	h.metrics = text
	h.mu.Unlock()
}

func (h *hostileReplica) addr() string { return strings.TrimPrefix(h.srv.URL, "http://") }

// vllmUsage is vLLM's UsageInfo as it serialises it (prompt_tokens, total_tokens,
// completion_tokens, prompt_tokens_details).
func vllmUsage(prompt, completion, total int) string {
	return fmt.Sprintf(`{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":0}}`, prompt, total, completion)
}

// A replica that reports a negative token count (issue 35 item 1) once made the router
// panic in accounting: the client got a 500 for an answer the replica had given in full,
// and every load report after carried the negative count, which the control plane refused
// whole, so a good service beside it stopped counting tokens. The answer must stand, the
// count be dropped and counted against the replica, and the good service keep counting.
func TestNegativeUsageIsDroppedAndNothingElseIsHarmed(t *testing.T) {
	const badModel = "bad-model"
	bad := startHostile(t, badModel, vllmUsage(-100, 5, -95))
	good := startSim(t, simOpts{echo: true})
	fake := &fakeControlPlane{changed: make(chan struct{})}
	goodRep := replica("good-1", good, fleet.Reserved, 0)
	goodRep.Service = "good"
	fake.publish([]fleet.Service{{Name: "bad", Models: []string{badModel}}, {Name: "good", Models: []string{testModel}}},
		[]fleet.Replica{goodRep, {ID: "bad-1", Service: "bad", Address: bad.addr(), Model: badModel, Capacity: fleet.Reserved}})
	cps := httptest.NewServer(fake)
	defer cps.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cp *ControlPlane
	rig := startRouterWith(t, nil, func(px *Proxy, pool *Pool) {
		cp = NewControlPlane(cps.URL, "tok", "r1", pool, px.Load, slog.New(slog.DiscardHandler))
		cp.ReportEvery = 50 * time.Millisecond
		px.ControlPlane = cp
	})
	go cp.Run(ctx)
	waitFor(t, "both replicas ready", func() bool {
		return rig.pool.Get("bad-1") != nil && rig.pool.Get("bad-1").Available(time.Now()) && rig.pool.Get("good-1").Available(time.Now())
	})

	whole := `{"model":"` + badModel + `","messages":[{"role":"user","content":"hello"}]}`
	resp, body := post(t, rig.url+"/v1/chat/completions", whole)
	if resp.StatusCode != 200 || !strings.Contains(body, "a full answer") {
		t.Errorf("whole answer with a negative usage reached the client as %d %s; want the replica's 200", resp.StatusCode, body)
	}
	resp, body = post(t, rig.url+"/v1/chat/completions", strings.TrimSuffix(whole, "}")+`,"stream":true}`)
	if resp.StatusCode != 200 || !strings.Contains(body, "a full answer") || !strings.HasSuffix(body, "data: [DONE]\n\n") || strings.Contains(body, `"usage"`) {
		t.Errorf("streamed answer with a negative usage reached the client as %d %q; want the replica's stream, its usage chunk stripped", resp.StatusCode, body)
	}
	if resp, body := post(t, rig.url+"/v1/chat/completions", chatBody(false, "")); resp.StatusCode != 200 {
		t.Fatalf("good service: %d %s", resp.StatusCode, body)
	}
	waitFor(t, "a load report the control plane took with the good service's tokens", func() bool {
		fake.mu.Lock()
		defer fake.mu.Unlock()
		for _, rep := range fake.reports {
			for _, m := range rep.Models {
				if m.Model == testModel && m.Tokens > 0 {
					return true
				}
			}
		}
		return false
	})
	if got := rig.counter(t, "arbiter_router_replica_reports_rejected_total", "replica", "bad-1", "source", "usage", "reason", "negative"); got != 2 {
		t.Errorf("rejected usage reports of bad-1 = %v; want 2", got)
	}
	if got := rig.counter(t, "arbiter_router_tokens_total", "replica", "bad-1"); got != 0 {
		t.Errorf("tokens counted for bad-1 = %v; want 0 (its counts are not to be trusted)", got)
	}
	if got := rig.counter(t, "arbiter_router_errors_total", "reason", "panic"); got != 0 {
		t.Errorf("panics = %v", got)
	}
	waitFor(t, "in-flight back to 0", func() bool { return rig.settled("bad-1") })
}

// A /metrics that lies (issue 35) is refused and counted against the replica, and the
// router's view of its load stays its own count: a replica saying it runs a billion
// requests once looked full and was starved of traffic; one saying -3 or NaN was
// silently half-read.
func TestLyingMetricsAreRefusedAndCounted(t *testing.T) {
	h := startHostile(t, testModel, vllmUsage(3, 1, 4))
	h.setMetrics("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 1e9\nvllm:kv_cache_usage_perc{engine=\"0\"} NaN\n")
	rig := startRouter(t, nil, fleet.Replica{ID: "liar", Address: h.addr(), Model: testModel, Capacity: fleet.Reserved})
	waitFor(t, "a refused scrape", func() bool {
		return rig.counter(t, "arbiter_router_replica_reports_rejected_total", "replica", "liar", "source", "metrics", "reason", "too_large") > 0
	})
	if load := rig.pool.Get("liar").Load(time.Now(), time.Minute); load != 0 {
		t.Errorf("the liar's load is %v; want 0, the router's own count", load)
	}
	h.setMetrics("vllm:num_requests_running -3\n")
	waitFor(t, "a negative gauge refused", func() bool {
		return rig.counter(t, "arbiter_router_replica_reports_rejected_total", "replica", "liar", "source", "metrics", "reason", "negative") > 0
	})
	h.setMetrics(strings.Repeat("# padding line of a /metrics body far larger than any vLLM's\n", maxScrapeBytes/60+1))
	waitFor(t, "a huge /metrics refused", func() bool {
		return rig.counter(t, "arbiter_router_replica_reports_rejected_total", "replica", "liar", "source", "metrics", "reason", "too_big") > 0
	})
	if resp, body := post(t, rig.url+"/v1/chat/completions", chatBody(false, "")); resp.StatusCode != 200 || !strings.Contains(body, "a full answer") {
		t.Fatalf("the replica still serves: %d %s", resp.StatusCode, body)
	}
}

// A panic in accounting, after the client has its answer, costs the request's figures and
// nothing else; a panic in the handler once an answer is the response leaves it standing.
func TestPanicAfterTheAnswerKeepsIt(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	rig := startRouter(t, nil, replica("a", s, fleet.Reserved, 0))
	// A call with no load counters makes account panic where it counts tokens.
	rig.px.account(&call{model: testModel}, rig.pool.Get("a"), result{code: 200, usage: oai.Usage{Prompt: 1, Completion: 1}})
	if got := rig.counter(t, "arbiter_router_errors_total", "reason", "panic_after_answer"); got != 1 {
		t.Fatalf("panics survived in accounting = %v; want 1", got)
	}
	var ctx fasthttp.RequestCtx
	ctx.Response.SetBodyString("the replica's answer")
	rig.px.recovered(&ctx, "boom")
	if ctx.Response.StatusCode() != 200 || string(ctx.Response.Body()) != "the replica's answer" {
		t.Errorf("after a panic the answer became %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	var empty fasthttp.RequestCtx
	rig.px.recovered(&empty, "boom")
	if empty.Response.StatusCode() != 500 {
		t.Errorf("a panic before any answer gave %d; want 500", empty.Response.StatusCode())
	}
}

// A replica's response header fields that are not the client's (issue 35, "beyond the
// two") are dropped and counted: hop-by-hop fields, the fields its Connection header names,
// and those by which it would speak for the endpoint's origin (Set-Cookie, Alt-Svc). What a
// replica may say (its own X- fields, Content-Type) passes; a header block too large for the
// router's buffer is the replica's failure, answered 502, never passed on.
func TestHostileResponseHeadersAreScrubbed(t *testing.T) {
	var huge atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Connection", "X-Internal-Token, keep-alive")
		h.Set("X-Internal-Token", "secret")
		h.Set("Keep-Alive", "timeout=1")
		h.Set("Upgrade", "h2c")
		h.Set("Proxy-Authenticate", "Basic")
		h.Add("Set-Cookie", "session=evil; Path=/")
		h.Set("Alt-Svc", `h3="evil.example:443"`)
		h.Set("X-Replica-Own", "kept")
		if huge.Load() {
			h.Set("X-Padding", strings.Repeat("p", 64<<10))
		}
		h.Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"a full answer"},"finish_reason":"stop"}],"usage":%s}`, testModel, vllmUsage(3, 2, 5))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	rig := startRouter(t, nil, fleet.Replica{ID: "hdr", Address: strings.TrimPrefix(srv.URL, "http://"), Model: testModel, Capacity: fleet.Reserved})
	resp, body := post(t, rig.url+"/v1/chat/completions", chatBody(false, ""))
	if resp.StatusCode != 200 || !strings.Contains(body, "a full answer") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	for _, h := range []string{"X-Internal-Token", "Keep-Alive", "Upgrade", "Proxy-Authenticate", "Set-Cookie", "Alt-Svc"} {
		if v := resp.Header.Values(h); len(v) > 0 {
			t.Errorf("the replica's %s reached the client: %q", h, v)
		}
	}
	if resp.Header.Get("X-Replica-Own") != "kept" || resp.Close {
		t.Errorf("X-Replica-Own %q, connection close %v; want the replica's own field kept and the client's connection open", resp.Header.Get("X-Replica-Own"), resp.Close)
	}
	if got := rig.counter(t, "arbiter_router_replica_reports_rejected_total", "replica", "hdr", "source", "headers"); got != 2 {
		t.Errorf("header refusals counted = %v; want 2 (hop_by_hop, origin)", got)
	}
	if got := rig.counter(t, "arbiter_router_tokens_total", "replica", "hdr", "type", "completion"); got != 2 {
		t.Errorf("completion tokens = %v; want 2", got)
	}
	huge.Store(true)
	resp, body = post(t, rig.url+"/v1/chat/completions", chatBody(false, ""))
	if resp.StatusCode != 502 || strings.Contains(body, "ppppp") {
		t.Errorf("a 64 KiB header block: %d %.200s; want 502, nothing of it passed on", resp.StatusCode, body)
	}
}
