package router

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fastjson"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/oai"
	"github.com/arbiter-serve/arbiter/replicasim"
)

func TestStreamIsPassedThroughByteForByte(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	r := startRouter(t, nil, replica("a", s, fleet.Reserved, 0))
	// The client asks for usage itself, so the router must change nothing.
	body := chatBody(true, `,"stream_options":{"include_usage":true}`)
	_, direct := post(t, "http://"+s.addr+"/v1/chat/completions", body)
	_, proxied := post(t, r.url+"/v1/chat/completions", body)
	// Completion ids count up per replica request; normalise them before comparing.
	norm := func(x string) string { return strings.NewReplacer("chatcmpl-1", "ID", "chatcmpl-2", "ID").Replace(x) }
	if norm(direct) != norm(proxied) {
		t.Fatalf("stream changed by the router:\ndirect:  %q\nproxied: %q", direct, proxied)
	}
	if !strings.Contains(proxied, `"usage":{"prompt_tokens"`) || !strings.HasSuffix(proxied, "data: [DONE]\n\n") {
		t.Fatalf("unexpected stream: %q", proxied)
	}
}

func TestFirstChunkArrivesBeforeStreamEnds(t *testing.T) {
	s := startSim(t, simOpts{echo: true, interval: 100 * time.Millisecond})
	r := startRouter(t, nil, replica("a", s, fleet.Reserved, 0))
	start := time.Now()
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(true, "")))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events, at := readEvents(t, resp.Body)
	if len(events) < 6 {
		t.Fatalf("got %d events: %q", len(events), events)
	}
	first, last := at[0].Sub(start), at[len(at)-1].Sub(start)
	// Five tokens 100 ms apart: the first must arrive long before the last.
	if last-first < 300*time.Millisecond {
		t.Fatalf("first event at %v, last at %v: the stream was buffered", first, last)
	}
}

func TestIncludeUsageIsAddedAndStripped(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	r := startRouter(t, nil, replica("a", s, fleet.Reserved, 0))
	_, out := post(t, r.url+"/v1/chat/completions", chatBody(true, ""))
	if strings.Contains(out, `"usage"`) {
		t.Fatalf("client that did not ask got a usage chunk: %q", out)
	}
	if !strings.HasSuffix(out, "data: [DONE]\n\n") {
		t.Fatalf("stream not terminated: %q", out)
	}
	// The router still counted the tokens from the chunk it removed.
	if got := r.counter(t, "arbiter_router_tokens_total", "type", "completion"); got != 5 {
		t.Fatalf("completion tokens counted = %v, want 5", got)
	}
	if got := r.counter(t, "arbiter_router_tokens_total", "type", "prompt"); got <= 0 {
		t.Fatalf("prompt tokens counted = %v, want > 0", got)
	}
	// A client that asked explicitly with false also gets none.
	_, out = post(t, r.url+"/v1/chat/completions", chatBody(true, `,"stream_options":{"include_usage":false}`))
	if strings.Contains(out, `"usage"`) {
		t.Fatalf("include_usage false still got usage: %q", out)
	}
	if got := r.counter(t, "arbiter_router_tokens_total", "type", "completion"); got != 10 {
		t.Fatalf("completion tokens counted = %v, want 10", got)
	}
}

func TestRetryGoesToADifferentReplicaBeforeFirstByte(t *testing.T) {
	for _, fault := range []replicasim.Fault{{Kind: replicasim.FaultReset}, {Kind: replicasim.FaultStatus, Status: 503}} {
		t.Run(fault.Kind, func(t *testing.T) {
			bad, good := startSim(t, simOpts{echo: true}), startSim(t, simOpts{echo: true})
			if err := bad.srv.SetFault(fault); err != nil {
				t.Fatal(err)
			}
			// The bad replica is cheaper, so slo_cheapest tries it first.
			r := startRouter(t, nil, replica("bad", bad, fleet.Reserved, 0), replica("good", good, fleet.OnDemand, 4))
			for i := range 3 { // fewer than max_fails: the bad replica stays in rotation
				resp, out := post(t, r.url+"/v1/chat/completions", chatBody(i%2 == 0, ""))
				if resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, out)
				}
			}
			if got := r.counter(t, "arbiter_router_requests_total", "replica", "good", "code", "200"); got != 3 {
				t.Errorf("good replica answered %v, want 3", got)
			}
			if got := r.counter(t, "arbiter_router_retries_total"); got < 1 {
				t.Errorf("retries = %v, want >= 1", got)
			}
			waitFor(t, "in-flight back to 0", func() bool { return r.settled("bad") && r.settled("good") })
		})
	}
}

func TestNoRetryAfterBytesWereSent(t *testing.T) {
	bad, good := startSim(t, simOpts{echo: true, interval: 20 * time.Millisecond}), startSim(t, simOpts{echo: true})
	if err := bad.srv.SetFault(replicasim.Fault{Kind: replicasim.FaultDieMidStream, AfterTokens: 2}); err != nil {
		t.Fatal(err)
	}
	r := startRouter(t, nil, replica("bad", bad, fleet.Reserved, 0), replica("good", good, fleet.OnDemand, 4))
	resp, out := post(t, r.url+"/v1/chat/completions", chatBody(true, ""))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if !strings.Contains(out, `" The"`) || !strings.Contains(out, `"error"`) || !strings.HasSuffix(out, "data: [DONE]\n\n") {
		t.Fatalf("want the first tokens then an SSE error event, got %q", out)
	}
	if got := r.counter(t, "arbiter_router_requests_total", "replica", "good"); got != 0 {
		t.Fatalf("request was retried on good after bytes were sent (%v)", got)
	}
	waitFor(t, "in-flight back to 0", func() bool { return r.settled("bad") })
	// The router stays healthy: the next request is served (by whichever replica).
	if resp, out := post(t, r.url+"/v1/chat/completions", chatBody(false, "")); resp.StatusCode != 200 {
		t.Fatalf("after a broken stream: status %d %s", resp.StatusCode, out)
	}
}

func TestEjectionAndReadmission(t *testing.T) {
	bad, good := startSim(t, simOpts{echo: true}), startSim(t, simOpts{echo: true})
	if err := bad.srv.SetFault(replicasim.Fault{Kind: replicasim.FaultStatus, Status: 500}); err != nil {
		t.Fatal(err)
	}
	r := startRouter(t, func(c *Config) {
		c.Ejection = EjectConfig{MaxFails: 2, BaseBackoff: 300 * time.Millisecond, MaxBackoff: time.Second}
	}, replica("bad", bad, fleet.Reserved, 0), replica("good", good, fleet.OnDemand, 4))
	// 500 is passed through (not a retryable status) but counts as a failure.
	for range 2 {
		post(t, r.url+"/v1/chat/completions", chatBody(false, ""))
	}
	if r.pool.Get("bad").Available(time.Now()) {
		t.Fatal("replica not ejected after 2 consecutive failures")
	}
	if got := r.counter(t, "arbiter_router_ejections_total", "replica", "bad"); got != 1 {
		t.Fatalf("ejections = %v", got)
	}
	resp, _ := post(t, r.url+"/v1/chat/completions", chatBody(false, ""))
	if resp.StatusCode != 200 || r.counter(t, "arbiter_router_requests_total", "replica", "good") != 1 {
		t.Fatal("request during ejection did not go to the good replica")
	}
	_ = bad.srv.SetFault(replicasim.Fault{})
	waitFor(t, "re-admission after backoff", func() bool { return r.pool.Get("bad").Available(time.Now()) })
	post(t, r.url+"/v1/chat/completions", chatBody(false, ""))
	if got := r.counter(t, "arbiter_router_requests_total", "replica", "bad", "code", "200"); got != 1 {
		t.Fatalf("re-admitted replica served %v requests, want 1", got)
	}
}

func TestDrainingTakesNoNewRequestsButFinishesInFlight(t *testing.T) {
	a, b := startSim(t, simOpts{echo: true, interval: 50 * time.Millisecond}), startSim(t, simOpts{echo: true})
	ra, rb := replica("a", a, fleet.Reserved, 0), replica("b", b, fleet.OnDemand, 4)
	r := startRouter(t, nil, ra, rb)
	done := make(chan string)
	go func() {
		resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(true, "")))
		if err != nil {
			done <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- string(b)
	}()
	waitFor(t, "stream in flight on a", func() bool { return r.inflight("a") == 1 })
	ra.Draining = true
	r.pool.SetReplicas([]fleet.Replica{ra, rb})
	for range 3 {
		post(t, r.url+"/v1/chat/completions", chatBody(false, ""))
	}
	if got := r.counter(t, "arbiter_router_requests_total", "replica", "a"); got != 0 {
		t.Fatalf("draining replica got %v new requests", got)
	}
	out := <-done
	if !strings.HasSuffix(out, "data: [DONE]\n\n") || strings.Contains(out, "error") {
		t.Fatalf("in-flight stream on the draining replica did not finish cleanly: %q", out)
	}
	waitFor(t, "in-flight back to 0", func() bool { return r.settled("a") })
}

func TestInFlightReturnsToZeroAfterCancellationsAndFailures(t *testing.T) {
	slow := startSim(t, simOpts{echo: true, interval: 200 * time.Millisecond})
	r := startRouter(t, nil, replica("a", slow, fleet.Reserved, 0))
	// Clients that hang up mid-stream.
	for range 5 {
		c := rawPost(t, r.url, chatBody(true, ""))
		buf := make([]byte, 1)
		_, _ = c.Read(buf) // first byte of the response: the stream has started
		_ = c.Close()
	}
	// Clients that hang up while waiting for a hung replica (before any byte).
	_ = slow.srv.SetFault(replicasim.Fault{Kind: replicasim.FaultHang, HangFor: 10 * time.Second})
	for range 3 {
		c := rawPost(t, r.url, chatBody(false, ""))
		time.Sleep(50 * time.Millisecond)
		_ = c.Close()
	}
	waitFor(t, "in-flight back to 0 after cancellations", func() bool { return r.settled("a") })
	if got := r.counter(t, "arbiter_router_errors_total", "reason", "client_gone"); got < 8 {
		t.Fatalf("client_gone = %v, want 8", got)
	}
	// Failures: a replica that resets every connection.
	_ = slow.srv.SetFault(replicasim.Fault{Kind: replicasim.FaultReset})
	for range 3 {
		post(t, r.url+"/v1/chat/completions", chatBody(false, ""))
	}
	waitFor(t, "in-flight back to 0 after failures", func() bool { return r.settled("a") })
}

func TestBadInputGetsOpenAIErrors(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	r := startRouter(t, func(c *Config) { c.MaxRequestBodyBytes = 1 << 10 }, replica("a", s, fleet.Reserved, 0))
	for _, c := range []struct {
		name, path, body string
		code             int
		want             string
	}{
		{"malformed json", "/v1/chat/completions", `{"model":`, 400, "not valid JSON"},
		{"no messages", "/v1/chat/completions", `{"model":"test-model"}`, 400, "'messages' is required"},
		{"wrong type", "/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"x"}],"stream":"yes"}`, 400, "'stream' must be a boolean"},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, 404, "model_not_found"},
		{"oversized", "/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}`, 413, "too large"},
		{"unknown path", "/v1/nothing", `{}`, 404, "Unknown path"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, out := post(t, r.url+c.path, c.body)
			if resp.StatusCode != c.code || !strings.Contains(out, c.want) || !strings.HasPrefix(out, `{"error":{"message":`) {
				t.Fatalf("status %d body %s; want %d containing %q in OpenAI's error shape", resp.StatusCode, out, c.code, c.want)
			}
		})
	}
	// Like vLLM, a router serving one model serves it to a request that names none.
	if resp, out := post(t, r.url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`); resp.StatusCode != 200 || !strings.Contains(out, `"model":"test-model"`) {
		t.Fatalf("request without a model: %d %s", resp.StatusCode, out)
	}
}

func TestTokenIDPromptsGetTheirOwnPrefixes(t *testing.T) {
	var p fastjson.Parser
	key := func(body string) []uint64 {
		req, err := oai.Parse(&p, []byte(body), oai.Completion)
		if err != nil {
			t.Fatal(err)
		}
		return prefixBlocks(promptKey(req), 0)
	}
	ids := func(first int) string {
		var b strings.Builder
		for i := range 200 {
			fmt.Fprintf(&b, ",%d", first+i)
		}
		return `{"model":"m","prompt":[` + b.String()[1:] + `]}`
	}
	a, b := key(ids(1000)), key(ids(5000))
	if len(a) != 3 || len(b) != 3 {
		t.Fatalf("200 ids gave %d and %d blocks, want 3 (64 ids each)", len(a), len(b))
	}
	if a[0] == b[0] {
		t.Error("different token-id prompts share a prefix hash")
	}
	if c := key(ids(1000)); !slices.Equal(a, c) {
		t.Error("the same token-id prompt hashed differently")
	}
}

func TestStaleUpstreamConnectionIsNotAClientError(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	// Keep idle sockets longer than the replica does (5 s) would take too long; instead
	// close the replica's side by restarting it on the same port between two requests.
	r := startRouter(t, func(c *Config) { c.UpstreamIdleTimeout = time.Minute }, replica("a", s, fleet.Reserved, 0))
	if resp, _ := post(t, r.url+"/v1/chat/completions", chatBody(false, "")); resp.StatusCode != 200 {
		t.Fatal("first request failed")
	}
	addr := s.addr
	s.cancel()
	// Wait for the probes to see the replica down before restarting it: otherwise a probe
	// that failed in the gap can mark it down again just after "ready again" was observed,
	// and the request finds no replica (a 503 seen under a loaded -race run).
	waitFor(t, "replica seen down", func() bool { return !r.pool.Get("a").Available(time.Now()) })
	startSim(t, simOpts{echo: true, addr: addr})
	waitFor(t, "replica ready again", func() bool { return r.pool.Get("a").Available(time.Now()) })
	if resp, out := post(t, r.url+"/v1/chat/completions", chatBody(false, "")); resp.StatusCode != 200 {
		t.Fatalf("request on a stale pooled connection failed: %d %s", resp.StatusCode, out)
	}
	if got := r.counter(t, "arbiter_router_retries_total"); got != 0 {
		t.Fatalf("stale connection cost a cross-replica retry (%v)", got)
	}
}

func TestStalledStreamEndsWithAnErrorEvent(t *testing.T) {
	s := startSim(t, simOpts{echo: true, interval: 400 * time.Millisecond})
	r := startRouter(t, func(c *Config) { c.StreamIdleTimeout = 100 * time.Millisecond }, replica("a", s, fleet.Reserved, 0))
	_, out := post(t, r.url+"/v1/chat/completions", chatBody(true, ""))
	if !strings.Contains(out, "replica stalled mid-stream") || !strings.HasSuffix(out, "data: [DONE]\n\n") {
		t.Fatalf("want an SSE error event after the idle timeout, got %q", out)
	}
	if got := r.counter(t, "arbiter_router_errors_total", "reason", "stream_stalled"); got != 1 {
		t.Fatalf("stream_stalled = %v", got)
	}
	waitFor(t, "in-flight back to 0", func() bool { return r.settled("a") })
}

// rawPost sends a chat request on a raw connection the test can hang up on.
func rawPost(t *testing.T, url, body string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	return c
}

func TestALoneReplicasOwn503IsPassedThrough(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	if err := s.srv.SetFault(replicasim.Fault{Kind: replicasim.FaultStatus, Status: 503, Count: 1}); err != nil {
		t.Fatal(err)
	}
	r := startRouter(t, nil, replica("a", s, fleet.Reserved, 0))
	resp, out := post(t, r.url+"/v1/chat/completions", chatBody(false, ""))
	if resp.StatusCode != 503 || !strings.Contains(out, "injected fault") {
		t.Fatalf("got %d %s, want the replica's own 503", resp.StatusCode, out)
	}
	if resp, _ := post(t, r.url+"/v1/chat/completions", chatBody(false, "")); resp.StatusCode != 200 {
		t.Fatalf("next request: %d", resp.StatusCode)
	}
}

func TestPolicyHeaderChoosesThePolicy(t *testing.T) {
	a, b := startSim(t, simOpts{echo: true}), startSim(t, simOpts{echo: true})
	r := startRouter(t, nil, replica("a", a, fleet.Reserved, 0), replica("b", b, fleet.OnDemand, 4))
	for range 4 {
		post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "X-Arbiter-Policy", "round_robin")
	}
	if got := r.counter(t, "arbiter_router_requests_total", "replica", "b"); got != 2 {
		t.Fatalf("round_robin by header sent %v of 4 to b, want 2", got)
	}
	resp, out := post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "X-Arbiter-Policy", "fastest")
	if resp.StatusCode != 400 || !strings.Contains(out, "X-Arbiter-Policy") {
		t.Fatalf("unknown policy header: %d %s", resp.StatusCode, out)
	}
}

// A replica that dies mid-stream on a response delimited by closing the connection (no
// chunked encoding) looks like a clean end; without its [DONE] it is not one, and the
// client gets an error event instead of a silently cut answer.
func TestStreamEndingWithoutDoneIsAnError(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, _ *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
		buf.WriteString(`data: {"choices":[{"index":0,"delta":{"content":"half"}}]}` + "\n\n")
		buf.Flush()
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	r := startRouter(t, nil, fleet.Replica{ID: "cut", Address: strings.TrimPrefix(srv.URL, "http://"), Model: testModel, Capacity: fleet.Reserved})
	waitFor(t, "replica ready", func() bool { return r.pool.Get("cut").Available(time.Now()) })
	resp, body := post(t, r.url+"/v1/chat/completions", chatBody(true, ""))
	if resp.StatusCode != 200 || !strings.Contains(body, "half") || !strings.Contains(body, `"error"`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("truncated stream reached the client as %d %q; want its content, then an error event and [DONE]", resp.StatusCode, body)
	}
	waitFor(t, "in-flight back to 0", func() bool { return r.settled("cut") })
	if got := r.counter(t, "arbiter_router_errors_total", "reason", "stream_truncated"); got != 1 {
		t.Errorf("stream_truncated errors = %v; want 1", got)
	}
}
