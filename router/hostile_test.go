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

	requests atomic.Int64 // completion requests received
	probes   atomic.Int64
	mu       sync.Mutex
	conns    []net.Conn
}

func startRaw(t *testing.T, answer func(c net.Conn, n int) bool) *rawReplica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rr := &rawReplica{ln: ln, answer: answer}
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
