package router

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// rawReplica is a replica an attacker controls, on loopback: it speaks HTTP/1.1 byte by
// byte, so it can send what no well-behaved server library would (a status of 999, a 204
// with a body, an event that never ends). /health and /metrics answer as vLLM's do; each
// completion request is answered by answer, which writes raw bytes to the connection and
// says whether the connection may serve another request.
type rawReplica struct {
	ln     net.Listener
	answer func(c net.Conn, n int) (keep bool)
	health func(n int) int // /health's status for probe n (nil: 200)
	// onRequest, when set, sees each completion request's header.
	onRequest func(*http.Request)

	requests atomic.Int64 // completion requests received
	probes   atomic.Int64
	mu       sync.Mutex
	conns    []net.Conn
}

func startRaw(t *testing.T, answer func(c net.Conn, n int) bool, setup ...func(*rawReplica)) *rawReplica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rr := &rawReplica{ln: ln, answer: answer}
	for _, f := range setup {
		f(rr)
	}
	go rr.serve()
	t.Cleanup(rr.close)
	return rr
}

func (rr *rawReplica) addr() string { return rr.ln.Addr().String() }

func (rr *rawReplica) close() {
	_ = rr.ln.Close()
	rr.mu.Lock()
	defer rr.mu.Unlock()
	for _, c := range rr.conns {
		_ = c.Close()
	}
}

func (rr *rawReplica) serve() {
	for {
		c, err := rr.ln.Accept()
		if err != nil {
			return
		}
		rr.mu.Lock()
		rr.conns = append(rr.conns, c)
		rr.mu.Unlock()
		go rr.conn(c)
	}
}

func (rr *rawReplica) conn(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		switch req.URL.Path {
		case "/health":
			code := 200
			if rr.health != nil {
				code = rr.health(int(rr.probes.Add(1)))
			}
			fmt.Fprintf(c, "HTTP/1.1 %d X\r\nContent-Length: 0\r\n\r\n", code)
			continue
		case "/metrics", "/v1/models":
			fmt.Fprint(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
			continue
		}
		if rr.onRequest != nil {
			rr.onRequest(req)
		}
		if !rr.answer(c, int(rr.requests.Add(1))) {
			return
		}
	}
}

// wholeAnswer is a complete chat completion response whose content is text.
func wholeAnswer(text string) string {
	body := fmt.Sprintf(`{"id":"c","object":"chat.completion","created":0,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`, testModel, text)
	return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

const sseHeader = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

// chunk frames b as one HTTP chunk.
func chunk(b string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(b), b) }

const firstEvent = `data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"test-model","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}` + "\n\n"

// postWithin posts body and reads the answer for at most wait: a replica that never ends
// must fail the test, not hang it.
func postWithin(t *testing.T, url, body string, wait time.Duration) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: wait}).Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("no answer within %s: %v", wait, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("the answer was not read within %s: %v (%d bytes: %.200q)", wait, err, len(b), b)
	}
	return resp.StatusCode, string(b)
}

func rawRouter(t *testing.T, mod func(*Config), rrs ...*rawReplica) *rig {
	t.Helper()
	var set []fleet.Replica
	for i, rr := range rrs {
		set = append(set, fleet.Replica{ID: fmt.Sprintf("h%d", i), Address: rr.addr(), Model: testModel, Provider: "local", Region: "lo", Capacity: fleet.Reserved})
	}
	r := startRouter(t, mod, set...)
	// Cleanups run last-registered first: the replicas close before the router shuts down,
	// which would otherwise wait on a stream a replica never ends.
	t.Cleanup(func() {
		for _, rr := range rrs {
			rr.close()
		}
	})
	waitFor(t, "the replicas ready", func() bool {
		for i := range rrs {
			if !r.pool.Get(fmt.Sprintf("h%d", i)).Available(time.Now()) {
				return false
			}
		}
		return true
	})
	return r
}

// A replica that sends one SSE data line of 100 MB must not make the router hold it: the
// router bounds what it buffers of one event, ends the stream with an error event, closes
// the replica's connection (the replica's writes fail long before 100 MB) and counts the
// failure against the replica.
func TestOversizedSSEEventEndsTheStream(t *testing.T) {
	var written atomic.Int64
	rr := startRaw(t, func(c net.Conn, _ int) bool {
		fmt.Fprint(c, sseHeader+chunk(firstEvent)+chunk("data: "))
		piece := chunk(strings.Repeat("x", 64<<10))
		for written.Load() < 100<<20 {
			_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, piece); err != nil {
				return false
			}
			written.Add(64 << 10)
		}
		fmt.Fprint(c, chunk("\n\n")+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
		return false
	})
	r := rawRouter(t, nil, rr)
	code, out := postWithin(t, r.url+"/v1/chat/completions", chatBody(true, ""), 30*time.Second)
	if code != 200 || !strings.HasPrefix(out, firstEvent) || !strings.Contains(out, "event too large") || len(out) > 1<<20 {
		t.Errorf("client got %d and %d bytes: %.300q; want the first event, then an error event naming the oversized event", code, len(out), out)
	}
	if w := written.Load(); w > 16<<20 {
		t.Errorf("the replica wrote %d MiB of one event before the router closed its connection; want it closed past the event bound", w>>20)
	}
	if got := r.counter(t, "arbiter_router_errors_total", "reason", "stream_event_too_large"); got != 1 {
		t.Errorf("stream_event_too_large = %v, want 1", got)
	}
	waitFor(t, "in-flight back to 0", func() bool { return r.settled("h0") })
}

// A replica that, once its client left, trickles an event that never ends (a byte every
// 20 ms, never the blank line) must not keep the router's stream, nor its in-flight count,
// alive: nothing is written to the client while no event completes, so the router never
// sees the client gone by a write; it must look.
func TestUnterminatedEventIsClosedOnceTheClientLeaves(t *testing.T) {
	closed := make(chan time.Time, 1)
	rr := startRaw(t, func(c net.Conn, _ int) bool {
		fmt.Fprint(c, sseHeader+chunk(firstEvent)+chunk("data: {"))
		for {
			_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, chunk("x")); err != nil {
				closed <- time.Now()
				return false
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	r := rawRouter(t, nil, rr)
	c := rawPost(t, r.url, chatBody(true, ""))
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") || strings.Contains(line, "data: ") {
			break
		}
	}
	waitFor(t, "the stream in flight", func() bool { return r.inflight("h0") == 1 })
	left := time.Now()
	c.Close()
	select {
	case at := <-closed:
		t.Logf("replica connection closed %s after the client left", at.Sub(left).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatalf("the replica's connection was still open 10 s after the client left (in flight: %d)", r.inflight("h0"))
	}
	waitFor(t, "in-flight back to 0", func() bool { return r.settled("h0") })
}

// An event that never ends while the client waits is a stall: stream_idle_timeout runs from
// the last complete event, not from the last byte, or a replica trickling one byte at a
// time would hold the client forever.
func TestTricklingEventIsAStall(t *testing.T) {
	rr := startRaw(t, func(c net.Conn, _ int) bool {
		fmt.Fprint(c, sseHeader+chunk(firstEvent)+chunk("data: {"))
		for {
			_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, chunk("x")); err != nil {
				return false
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	r := rawRouter(t, func(c *Config) { c.StreamIdleTimeout = 500 * time.Millisecond }, rr)
	t0 := time.Now()
	_, out := postWithin(t, r.url+"/v1/chat/completions", chatBody(true, ""), 10*time.Second)
	if !strings.Contains(out, "replica stalled mid-stream") || time.Since(t0) > 5*time.Second {
		t.Fatalf("after %s the client got %.300q; want a stall error event after about 500 ms", time.Since(t0).Round(time.Millisecond), out)
	}
	waitFor(t, "in-flight back to 0", func() bool { return r.settled("h0") })
}

// Status lines a replica should not send. An interim 100 Continue or 103 Early Hints before
// the answer is skipped (taken for the answer, it went to the client and left the real
// answer on the pooled connection for the next client); a status HTTP does not define
// (999) or a 101 is a failed attempt (a 502 here, with one replica), not passed on; a 204
// whose "body" is a whole forged response is passed on as the 204 it is, and the forged
// response never reaches the next request on that connection. A client's Expect:
// 100-continue, which the router answers itself, is not forwarded.
func TestOddStatusLinesAreNotTakenForAnswers(t *testing.T) {
	var sawExpect atomic.Bool
	modes := map[string]func(c net.Conn) bool{
		"interim": func(c net.Conn) bool {
			fmt.Fprint(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"+wholeAnswer("after the interim"))
			return true
		},
		"999": func(c net.Conn) bool {
			fmt.Fprint(c, "HTTP/1.1 999 Whatever\r\nContent-Length: 2\r\n\r\n{}")
			return true
		},
		"101": func(c net.Conn) bool {
			fmt.Fprint(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n")
			return true
		},
		"204 forged": func(c net.Conn) bool {
			forged := wholeAnswer("forged for the next client")
			fmt.Fprint(c, "HTTP/1.1 204 No Content\r\n\r\n"+forged) // a 204 ends at its header
			return true
		},
	}
	for _, name := range []string{"interim", "999", "101", "204 forged"} {
		t.Run(name, func(t *testing.T) {
			rr := startRaw(t, func(c net.Conn, n int) bool {
				if n == 1 {
					return modes[name](c)
				}
				fmt.Fprint(c, wholeAnswer(fmt.Sprintf("answer %d", n)))
				return true
			})
			r := rawRouter(t, func(c *Config) { c.UpstreamIdleTimeout = time.Minute }, rr)
			code, out := postWithin(t, r.url+"/v1/chat/completions", chatBody(false, ""), 10*time.Second)
			switch name {
			case "interim":
				if code != 200 || !strings.Contains(out, "after the interim") {
					t.Errorf("got %d %.200q; want the answer after the interim responses", code, out)
				}
			case "204 forged":
				if code != 204 || out != "" {
					t.Errorf("got %d %.200q; want the replica's 204, empty", code, out)
				}
			default:
				if code != 502 {
					t.Errorf("got %d %.200q; want 502", code, out)
				}
				if got := r.counter(t, "arbiter_router_errors_total", "reason", "bad_status"); got != 1 {
					t.Errorf("bad_status = %v, want 1", got)
				}
			}
			// The next request gets its own answer, whichever connection it takes.
			for i := 0; i < 2; i++ {
				code, out = postWithin(t, r.url+"/v1/chat/completions", chatBody(false, ""), 10*time.Second)
				if code != 200 || !strings.Contains(out, "answer ") {
					t.Errorf("the next request got %d %.200q; want its own answer", code, out)
				}
			}
			waitFor(t, "in-flight back to 0", func() bool { return r.settled("h0") })
		})
	}
	t.Run("expect", func(t *testing.T) {
		rr := startRaw(t, func(c net.Conn, _ int) bool {
			fmt.Fprint(c, wholeAnswer("ok"))
			return true
		}, func(rr *rawReplica) {
			rr.onRequest = func(req *http.Request) {
				if req.Header.Get("Expect") != "" {
					sawExpect.Store(true)
				}
			}
		})
		r := rawRouter(t, nil, rr)
		body := chatBody(false, "")
		c := rawPostHeaders(t, r.url, body, "Expect: 100-continue\r\n")
		defer c.Close()
		resp := readFinal(t, bufio.NewReader(c))
		if resp.StatusCode != 200 || sawExpect.Load() {
			t.Errorf("got %d; the replica saw Expect: %v; want 200 and no Expect forwarded", resp.StatusCode, sawExpect.Load())
		}
	})
}

// rawPostHeaders sends a chat request with extra raw header lines on a fresh connection.
func rawPostHeaders(t *testing.T, url, body, extra string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s", extra, len(body), body)
	return c
}

// readFinal reads responses until a final (non-1xx) one.
func readFinal(t *testing.T, br *bufio.Reader) *http.Response {
	t.Helper()
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode >= 200 {
			return resp
		}
	}
}

// JSON that is valid but nested a million deep, in a whole response: the answer reaches the
// client byte for byte, and reading its usage stays bounded (the parser refuses depth past
// its limit; the router reads the usage object alone). With the nesting inside the usage
// object itself, nothing is counted. Already held before issue 35: this keeps it so.
func TestDeeplyNestedResponseIsPassedOnAndUsageStaysBounded(t *testing.T) {
	deep := strings.Repeat("[", 1<<20) + strings.Repeat("]", 1<<20)
	bodies := map[string]string{
		"nested answer": `{"id":"c","object":"chat.completion","model":"test-model","x":` + deep + `,"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`,
		"nested usage":  `{"id":"c","object":"chat.completion","model":"test-model","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"x":` + deep + `}}`,
	}
	for _, name := range []string{"nested answer", "nested usage"} {
		t.Run(name, func(t *testing.T) {
			body := bodies[name]
			rr := startRaw(t, func(c net.Conn, _ int) bool {
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				return true
			})
			r := rawRouter(t, nil, rr)
			t0 := time.Now()
			code, out := postWithin(t, r.url+"/v1/chat/completions", chatBody(false, ""), 10*time.Second)
			if code != 200 || out != body {
				t.Fatalf("got %d and %d bytes; want the replica's 200 and its %d bytes", code, len(out), len(body))
			}
			tokens := r.counter(t, "arbiter_router_tokens_total", "replica", "h0")
			want := 5.0
			if name == "nested usage" {
				want = 0
			}
			if tokens != want || r.counter(t, "arbiter_router_errors_total", "reason", "panic") != 0 {
				t.Errorf("tokens counted %v, want %v (no panic)", tokens, want)
			}
			t.Logf("answered in %s", time.Since(t0).Round(time.Millisecond))
		})
	}
}

// A /health that flaps (fail, fail, pass, over and over: a replica restarting its engine in
// a loop, or answering its probes from a dying worker) must not move the replica in and out
// of routing every three probes: taken out, it returns only after failure_threshold passes
// in a row, and then does.
func TestFlappingHealthDoesNotOscillate(t *testing.T) {
	var flapping atomic.Bool
	flapping.Store(true)
	rr := startRaw(t, func(c net.Conn, _ int) bool {
		fmt.Fprint(c, wholeAnswer("ok"))
		return true
	}, func(rr *rawReplica) {
		rr.health = func(n int) int {
			if flapping.Load() && n%3 != 0 {
				return 503
			}
			return 200
		}
	})
	r := startRouter(t, func(c *Config) { c.Probe.Interval = 20 * time.Millisecond }, fleet.Replica{ID: "h0", Address: rr.addr(), Model: testModel, Capacity: fleet.Reserved})
	t.Cleanup(rr.close)
	rep := r.pool.Get("h0")
	flips, last := 0, rep.ready.Load()
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		if now := rep.ready.Load(); now != last {
			flips, last = flips+1, now
		}
	}
	if probes := rr.probes.Load(); flips > 1 || last || probes < 30 {
		t.Fatalf("over %d flapping probes the replica changed readiness %d times, ready at the end: %v; want out once and for good", probes, flips, last)
	}
	flapping.Store(false)
	waitFor(t, "the replica back once its probes pass", func() bool { return rep.ready.Load() })
}
