package router

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// largeChat is a valid chat request of about size bytes (one long user message).
func largeChat(size int) string {
	head := `{"model":"` + testModel + `","max_tokens":2,"messages":[{"role":"user","content":"`
	return head + strings.Repeat("x", max(size-len(head)-4, 0)) + `"}]}`
}

// stalledBody opens a connection and sends a request's headers and the first half of its
// body, then nothing: the router holds what it reserved for that body until it is closed.
func stalledBody(t *testing.T, url, body string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:len(body)/2])
	return c
}

func TestLargeBodiesAreHeldWithinTheBudget(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	const size = 300 << 10
	r := startRouter(t, func(c *Config) {
		c.MaxRequestBodyBytes = 512 << 10
		c.MaxBodyBufferBytes = 2 * size // two large bodies at once
	}, replica("a", s, fleet.Reserved, 0))
	body := largeChat(size)
	if resp, out := post(t, r.url+"/v1/chat/completions", body); resp.StatusCode != 200 {
		t.Fatalf("one large body alone: %d %s", resp.StatusCode, out)
	}

	// Two clients stall halfway through their large bodies: the budget is full.
	a, b := stalledBody(t, r.url, body), stalledBody(t, r.url, body)
	waitFor(t, "both stalled bodies to hold the budget", func() bool { return !r.budgetFree(1) })
	start := time.Now()
	resp, out := post(t, r.url+"/v1/chat/completions", body)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(out, "max_body_buffer_bytes") {
		t.Fatalf("a third large body with the budget full: %d (Retry-After %q) %s; want 503 naming max_body_buffer_bytes", resp.StatusCode, resp.Header.Get("Retry-After"), out)
	}
	if waited := time.Since(start); waited < bodyWait/2 {
		t.Fatalf("refused after %v; a large body waits up to %v for room", waited, bodyWait)
	}
	// Small bodies do not take from the budget.
	if resp, out := post(t, r.url+"/v1/chat/completions", chatBody(false, "")); resp.StatusCode != 200 {
		t.Fatalf("a small body with the budget full: %d %s", resp.StatusCode, out)
	}
	if got := r.counter(t, "arbiter_router_errors_total", "reason", "body_buffer_busy"); got != 1 {
		t.Fatalf("body_buffer_busy = %v, want 1", got)
	}

	// One stalled client finishes its body: its request is served and gives its room back;
	// the other hangs up: its room comes back too.
	if _, err := a.Write([]byte(body[len(body)/2:])); err != nil {
		t.Fatal(err)
	}
	got, err := http.ReadResponse(bufio.NewReader(a), nil)
	if err != nil || got.StatusCode != 200 {
		t.Fatalf("the stalled body, once sent whole: %v %v", got, err)
	}
	_ = b.Close()
	waitFor(t, "the budget to be whole again", func() bool { return r.budgetFree(2 * size) })
	if resp, out := post(t, r.url+"/v1/chat/completions", body); resp.StatusCode != 200 {
		t.Fatalf("a large body after the others: %d %s", resp.StatusCode, out)
	}
}

func TestChunkedBodiesAreBounded(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	r := startRouter(t, func(c *Config) { c.MaxRequestBodyBytes = 256 << 10 }, replica("a", s, fleet.Reserved, 0))
	send := func(body string) (int, string) {
		t.Helper()
		c, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprint(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
		for rest := body; len(rest) > 0; {
			n := min(len(rest), 4096)
			fmt.Fprintf(c, "%x\r\n%s\r\n", n, rest[:n])
			rest = rest[n:]
		}
		fmt.Fprint(c, "0\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var sb strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&sb)
		return resp.StatusCode, sb.String()
	}
	if code, out := send(largeChat(100 << 10)); code != 200 {
		t.Fatalf("a large chunked body within the limit: %d %s", code, out)
	}
	if code, out := send(largeChat(300 << 10)); code != 413 || !strings.Contains(out, "too large") {
		t.Fatalf("a chunked body over the limit: %d %s; want 413", code, out)
	}
	if !r.budgetFree(int64(r.cfg.MaxBodyBufferBytes)) {
		t.Fatal("the chunked bodies kept their room in the budget")
	}
	// With the budget taken, a small chunked body (most clients' streamed uploads) is still
	// read: only one past 64 KiB holds room for the largest.
	all := int64(r.cfg.MaxBodyBufferBytes)
	if !r.px.bodies.TryAcquire(all) {
		t.Fatal("budget not free")
	}
	defer r.px.bodies.Release(all)
	if code, out := send(largeChat(32 << 10)); code != 200 {
		t.Fatalf("a small chunked body with the budget full: %d %s", code, out)
	}
	if code, out := send(largeChat(100 << 10)); code != 503 || !strings.Contains(out, "max_body_buffer_bytes") {
		t.Fatalf("a large chunked body with the budget full: %d %s; want 503", code, out)
	}
}

// budgetFree reports whether n bytes of the body budget are free.
func (r *rig) budgetFree(n int64) bool {
	if !r.px.bodies.TryAcquire(n) {
		return false
	}
	r.px.bodies.Release(n)
	return true
}
