package router

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// The framing cases a request-smuggling scanner tries, on a raw connection to a real
// router: each ambiguous one is answered 400 and its connection closed, so nothing after
// its header (a second request hidden in its body) is read as a request, and no replica
// sees it. Content-Length with Transfer-Encoding is read by the chunked framing and the
// connection then closed, as RFC 9112 §6.1 allows. Before framingError, fasthttp took
// obsolete line folding (in any field, Transfer-Encoding and Content-Length included), a
// bare LF ending a header line, and Transfer-Encoding: identity, each with a 200.
func TestAmbiguousRequestFramingIs400AndClose(t *testing.T) {
	rr := startRaw(t, func(c net.Conn, _ int) bool {
		fmt.Fprint(c, wholeAnswer("ok"))
		return true
	})
	r := rawRouter(t, func(c *Config) { c.ReadTimeout, c.IdleTimeout = time.Second, 300*time.Millisecond }, rr)
	body := chatBody(false, "")
	cl := fmt.Sprint(len(body))
	chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
	h := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	// smuggled follows every request on its connection: a reader that takes a wrong
	// length reads it as a second request and answers it.
	const smuggled = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
	for _, c := range []struct {
		name, req string
		want      int // 200: answered, then closed; 400: refused and closed
	}{
		{"Content-Length and Transfer-Encoding: chunked", h + "Content-Length: " + cl + "\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked, 200},
		{"Transfer-Encoding: chunked, then Content-Length", h + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n" + chunked, 200},
		{"duplicate Content-Length, equal", h + "Content-Length: " + cl + "\r\nContent-Length: " + cl + "\r\n\r\n" + body, 400},
		{"conflicting Content-Length", h + "Content-Length: " + cl + "\r\nContent-Length: 5\r\n\r\n" + body, 400},
		{"Content-Length as a list", h + "Content-Length: " + cl + ", " + cl + "\r\n\r\n" + body, 400},
		{"Content-Length with a sign", h + "Content-Length: +" + cl + "\r\n\r\n" + body, 400},
		{"Transfer-Encoding: gzip", h + "Transfer-Encoding: gzip\r\n\r\n" + chunked, 400},
		{"Transfer-Encoding: gzip, chunked", h + "Transfer-Encoding: gzip, chunked\r\n\r\n" + chunked, 400},
		{"Transfer-Encoding: identity with Content-Length", h + "Transfer-Encoding: identity\r\nContent-Length: " + cl + "\r\n\r\n" + body, 400},
		{"Transfer-Encoding: xchunked", h + "Transfer-Encoding: xchunked\r\n\r\n" + chunked, 400},
		{"Transfer-Encoding twice", h + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked, 400},
		{"a space before the colon", h + "Transfer-Encoding : chunked\r\n\r\n" + chunked, 400},
		{"Transfer-Encoding over HTTP/1.0", "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked, 400},
		{"obsolete line folding", h + "X-Note: a\r\n b\r\nContent-Length: " + cl + "\r\n\r\n" + body, 400},
		{"Transfer-Encoding folded", h + "Transfer-Encoding:\r\n chunked\r\n\r\n" + chunked, 400},
		{"Content-Length folded", h + "Content-Length:\r\n\t" + cl + "\r\n\r\n" + body, 400},
		{"a bare LF ending a header line", h + "X-Note: a\nContent-Length: " + cl + "\r\n\r\n" + body, 400},
		{"a bare CR in a header line", h + "X-Note: a\rContent-Length: 5\r\nContent-Length: " + cl + "\r\n\r\n" + body, 400},
		{"Transfer-Encoding: Chunked (case is free)", h + "Transfer-Encoding: Chunked\r\n\r\n" + chunked, 200},
		{"plain Content-Length", h + "Content-Length: " + cl + "\r\n\r\n" + body, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := rr.requests.Load()
			code, closed, n, out := rawExchange(t, r.url, c.req+smuggled, 5*time.Second)
			answered := rr.requests.Load() - before
			both := strings.Contains(c.req, "Transfer-Encoding") && strings.Contains(c.req, "Content-Length")
			switch {
			case code != c.want:
				t.Errorf("status %d, want %d: %.200q", code, c.want, out)
			case c.want == 400 && (!closed || n != 1 || answered != 0):
				t.Errorf("refused, but connection closed: %v, %d responses, %d requests at the replica; want closed after the one 400, none at the replica", closed, n, answered)
			case c.want == 200 && both && (!closed || n != 1):
				t.Errorf("answered, but connection closed: %v, %d responses; want closed after the one answer (the request after it unread)", closed, n)
			case c.want == 200 && !both && n != 2:
				t.Errorf("%d responses; want the answer and the next request's", n)
			}
		})
	}
	// A header block whose lines all end in a bare LF never ends for fasthttp (it waits for
	// CRLF CRLF): the connection is held to read_timeout like a slow client's, then closed,
	// and nothing reaches a replica.
	t.Run("every line ending in a bare LF", func(t *testing.T) {
		before := rr.requests.Load()
		req := "POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Length: " + cl + "\n\n" + body
		t0 := time.Now()
		code, closed, _, out := rawExchange(t, r.url, req, 5*time.Second)
		if code == 200 || !closed || rr.requests.Load() != before {
			t.Errorf("status %d after %s, closed %v: %.200q; want no answer but a 408 at read_timeout (1 s), closed, nothing at the replica", code, time.Since(t0).Round(time.Millisecond), closed, out)
		}
	})
}

// rawExchange writes req on a fresh connection and reads until the router closes it or
// wait passes: the first response's status, whether it closed, the number of responses.
func rawExchange(t *testing.T, url, req string, wait time.Duration) (code int, closed bool, responses int, out string) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	var b []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		b = append(b, buf[:n]...)
		if err != nil {
			var ne net.Error
			closed = !(errorsAs(err, &ne) && ne.Timeout())
			break
		}
	}
	out = string(b)
	responses = strings.Count(out, "HTTP/1.1 ")
	if _, err := fmt.Sscanf(out, "HTTP/1.1 %d", &code); err != nil {
		code = 0
	}
	return code, closed, responses, out
}

func errorsAs(err error, target *net.Error) bool { return errors.As(err, target) }
