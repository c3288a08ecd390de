package router

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/fleet"
)

// headerReplica answers every chat request with a fixed completion and keeps the headers
// each one arrived with.
func headerReplica(t *testing.T) (addr string, seen func() []http.Header) {
	t.Helper()
	var mu sync.Mutex
	var got []http.Header
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			return // /health, /metrics: 200, empty
		}
		mu.Lock()
		got = append(got, r.Header.Clone())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","model":"` + testModel + `","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String(), func() []http.Header {
		mu.Lock()
		defer mu.Unlock()
		return append([]http.Header(nil), got...)
	}
}

// The client's credentials (its Arbiter API key, cookies) are not the replica's to read:
// stripped unless pass_headers names them; other headers pass.
func TestClientCredentialsAreNotForwarded(t *testing.T) {
	for _, pass := range [][]string{nil, {"authorization"}} {
		addr, seen := headerReplica(t)
		r := startRouter(t, func(c *Config) { c.PassHeaders = pass },
			fleet.Replica{ID: "h", Address: addr, Model: testModel, Capacity: fleet.OnDemand, PricePerHour: 1})
		resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""),
			"Authorization", "Bearer sk-client-secret", "Cookie", "session=abc", "Proxy-Authorization", "Basic eA==", "X-Request-Id", "req-7")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		hs := seen()
		if len(hs) != 1 {
			t.Fatalf("the replica saw %d requests", len(hs))
		}
		h := hs[0]
		if h.Get("Cookie") != "" || h.Get("Proxy-Authorization") != "" {
			t.Errorf("pass %v: the replica got Cookie %q, Proxy-Authorization %q", pass, h.Get("Cookie"), h.Get("Proxy-Authorization"))
		}
		wantAuth := ""
		if pass != nil {
			wantAuth = "Bearer sk-client-secret"
		}
		if h.Get("Authorization") != wantAuth {
			t.Errorf("pass %v: the replica got Authorization %q; want %q", pass, h.Get("Authorization"), wantAuth)
		}
		if h.Get("X-Request-Id") != "req-7" {
			t.Errorf("an ordinary header was dropped: %v", h)
		}
	}
}

// The admin port takes no key, so it serves profiles only when the config asks for them.
func TestPprofOnlyWhenEnabled(t *testing.T) {
	reg := prometheus.NewRegistry()
	pool := NewPool(&Config{}, slog.New(slog.DiscardHandler), NewMetrics(reg), nil)
	for _, on := range []bool{false, true} {
		h := AdminHandler(reg, pool, on)
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI("/debug/pprof/")
		h(&ctx)
		if got := ctx.Response.StatusCode() == 200; got != on {
			t.Fatalf("pprof %v: /debug/pprof/ answered %d", on, ctx.Response.StatusCode())
		}
	}
}

// A replica that takes requests and never answers costs each request a few times its
// expected TTFT, not first_byte_timeout's minute: the attempt is retried on another
// replica before any byte reached the client, and after ejection.max_fails such attempts
// passive health ejects it.
func TestHungReplicaIsLeftWithinTheFirstByteTimeout(t *testing.T) {
	stop := make(chan struct{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hung := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			select { // accepted, never answered
			case <-stop:
			case <-r.Context().Done():
			}
		}
	})}
	go func() { _ = hung.Serve(ln) }()
	t.Cleanup(func() { close(stop); _ = hung.Close() })
	good := startSim(t, simOpts{echo: true})
	r := startRouter(t, func(c *Config) {
		c.SLOs = map[string]SLO{"*": {TTFT: 0.1}}
		c.FirstByteTimeoutMin = 300 * time.Millisecond
	}, fleet.Replica{ID: "hung", Address: ln.Addr().String(), Model: testModel, Capacity: fleet.Reserved},
		replica("good", good, fleet.OnDemand, 4))
	for i := range 4 {
		start := time.Now()
		resp, body := post(t, r.url+"/v1/chat/completions", chatBody(true, ""))
		took := time.Since(start)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		if took > 10*time.Second {
			t.Fatalf("request %d took %v behind a hung replica; want a few times the 0.1 s TTFT SLO", i, took)
		}
	}
	if got := r.counter(t, "arbiter_router_errors_total", "reason", "first_byte_timeout"); got < 1 {
		t.Errorf("first-byte timeouts counted: %v; want ≥ 1", got)
	}
	if r.pool.Get("hung").Available(time.Now()) {
		t.Error("the hung replica is still available after repeated first-byte timeouts")
	}
	if got := r.counter(t, "arbiter_router_requests_total", "replica", "good", "code", "200"); got != 4 {
		t.Errorf("the good replica answered %v of 4", got)
	}
}

// A connection that sends nothing is closed at read_timeout without a word (an unsolicited
// 400 would be read as the answer to the client's next request); one that sends half a
// request gets 408.
func TestIdleConnectionsCloseSilently(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	r := startRouter(t, func(c *Config) { c.ReadTimeout = 300 * time.Millisecond }, replica("a", s, fleet.Reserved, 0))
	addr := r.url[len("http://"):]
	read := func(send string) string {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if send != "" {
			if _, err := c.Write([]byte(send)); err != nil {
				t.Fatal(err)
			}
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, _ := io.ReadAll(c)
		return string(b)
	}
	if got := read(""); got != "" {
		t.Fatalf("an idle connection was sent %q", got)
	}
	if got := read("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"); !strings.HasPrefix(got, "HTTP/1.1 408") {
		t.Fatalf("half a request got %q; want 408", got)
	}
}

// Bodies built to blow up the parser are refused cheaply: nesting past oai.MaxDepth gets 400
// before any parse, and large bodies are parsed a budget's worth at a time (503 with
// Retry-After beyond it), so a flood of them cannot multiply into parse trees.
func TestJSONBombsAreRefusedCheaply(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	r := startRouter(t, nil, replica("a", s, fleet.Reserved, 0))
	deep := `{"model":"` + testModel + `","messages":[{"role":"user","content":"x"}],"x":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`
	resp, body := post(t, r.url+"/v1/chat/completions", deep)
	if resp.StatusCode != 400 || !strings.Contains(body, "deeper than") {
		t.Fatalf("a body nested 100,000 deep: %d %s", resp.StatusCode, body)
	}
	wide := `{"model":"` + testModel + `","messages":[{"role":"user","content":"x"}],"x":[` + strings.Repeat("{},", 1<<20) + `{}]}`
	resp, body = post(t, r.url+"/v1/chat/completions", wide)
	if resp.StatusCode != 400 || !strings.Contains(body, "more than") {
		t.Fatalf("a body of a million empty objects: %d %.200s", resp.StatusCode, body)
	}
	// A long token-id prompt is a large parse: it takes from the budget, and fits alone.
	ids := strings.TrimSuffix(strings.Repeat("7,", 100_000), ",")
	big := `{"model":"` + testModel + `","prompt":[` + ids + `],"max_tokens":2}`
	resp, body = post(t, r.url+"/v1/completions", big)
	if resp.StatusCode != 200 {
		t.Fatalf("a 100k-token id prompt alone: %d %.200s", resp.StatusCode, body)
	}
	// Others hold the budget: the next large parse waits for none of it.
	if !r.px.largeBodies.TryAcquire(r.px.largeBudget) {
		t.Fatal("the budget is not free")
	}
	resp, body = post(t, r.url+"/v1/completions", big)
	r.px.largeBodies.Release(r.px.largeBudget)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a large body with the budget taken: %d %.200s; want 503 with Retry-After", resp.StatusCode, body)
	}
	if resp, body = post(t, r.url+"/v1/chat/completions", chatBody(false, "")); resp.StatusCode != 200 {
		t.Fatalf("a small body meanwhile: %d %s", resp.StatusCode, body)
	}
}
