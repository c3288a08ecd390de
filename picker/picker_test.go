package picker_test

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/router"
)

// The protocol's core MUSTs: the pick goes out as the x-gateway-destination-endpoint header
// and as envoy.lb dynamic metadata, the same ordered list in both, every entry "ip:port" of
// a ready endpoint; the body streams in and back (FULL_DUPLEX_STREAMED); and the answer
// streams back through the picker, which accounts its tokens as the router would.
func TestPickStreamsAndAccounts(t *testing.T) {
	a, b := startSim(t, true), startSim(t, true)
	r := startRig(t, nil, replica("a", a, 1), replica("b", b, 2))
	r.waitReady(t, "a", "b")
	out := r.do(t, call{path: "/v1/chat/completions", body: chat(true, "")})
	if out.immediate != nil {
		t.Fatalf("immediate response %d: %s", out.immediate.GetStatus().GetCode(), out.immediate.GetBody())
	}
	if out.headerDest == "" || out.headerDest != out.metaDest {
		t.Fatalf("header %q and envoy.lb metadata %q must name the same endpoints", out.headerDest, out.metaDest)
	}
	got := strings.Split(out.headerDest, ",")
	if len(got) != 2 || got[0] == got[1] || !isAddr(got[0], a.addr, b.addr) || !isAddr(got[1], a.addr, b.addr) {
		t.Fatalf("endpoints %q: want both replicas, each once, pick first", out.headerDest)
	}
	if !out.clearRouteCache {
		t.Error("the header answer must clear the route cache, or the gateway routes by the route it had")
	}
	if out.contentLength != strconv.Itoa(len(out.sent)) {
		t.Errorf("content-length %q for a body of %d bytes", out.contentLength, len(out.sent))
	}
	if !bytes.Contains(out.sent, []byte(`"include_usage":true`)) {
		t.Errorf("the stream's usage was not asked for: sent %s", out.sent)
	}
	if out.status != 200 || !bytes.Contains(out.body, []byte("data: [DONE]")) {
		t.Fatalf("answer %d: %s", out.status, out.body)
	}
	if bytes.Contains(out.body, []byte(`"usage":{`)) {
		t.Errorf("the client did not ask for the usage chunk but got it: %s", out.body)
	}
	if n := r.counter(t, "arbiter_router_tokens_total", "replica", idOf(out.served, a, b)); n == 0 {
		t.Errorf("no tokens accounted for replica %s", idOf(out.served, a, b))
	}
	waitFor(t, "in-flight counts released", func() bool { return r.inFlight("a") == 0 && r.inFlight("b") == 0 })
}

// A whole answer is read as it passes for its usage; the body reaches the client as it came.
func TestWholeAnswerAccounted(t *testing.T) {
	a := startSim(t, true)
	r := startRig(t, nil, replica("a", a, 1))
	r.waitReady(t, "a")
	out := r.do(t, call{path: "/v1/chat/completions", body: chat(false, ""), trailers: true})
	if out.immediate != nil || out.status != 200 || !bytes.Contains(out.body, []byte(`"usage"`)) {
		t.Fatalf("answer %v %d: %s", out.immediate, out.status, out.body)
	}
	if !bytes.Equal(out.sent, chat(false, "")) {
		t.Errorf("a whole request's body changed: %s", out.sent)
	}
	if n := r.counter(t, "arbiter_router_tokens_total", "replica", "a", "type", "completion"); n == 0 {
		t.Error("no completion tokens accounted")
	}
	if n := r.counter(t, "arbiter_router_requests_total", "replica", "a", "code", "200"); n != 1 {
		t.Errorf("requests counted: %v, want 1", n)
	}
}

// A request the gateway sends whole with its headers (no body: GET /v1/models) is picked
// at once.
func TestHeadersOnlyRequest(t *testing.T) {
	a := startSim(t, true)
	r := startRig(t, nil, replica("a", a, 1))
	r.waitReady(t, "a")
	out := r.do(t, call{method: "GET", path: "/v1/models"})
	if out.immediate != nil || out.headerDest != a.addr || out.status != 200 || !bytes.Contains(out.body, []byte(testModel)) {
		t.Fatalf("dest %q, answer %v %d: %s", out.headerDest, out.immediate, out.status, out.body)
	}
}

// MUST: with the subset hint set, only endpoints in it are picked.
func TestSubsetHintHonoured(t *testing.T) {
	a, b := startSim(t, true), startSim(t, true)
	r := startRig(t, nil, replica("a", a, 1), replica("b", b, 2))
	r.waitReady(t, "a", "b")
	for range 3 {
		out := r.do(t, call{path: "/v1/chat/completions", body: chat(true, ""), hinted: true, subset: []string{b.addr}})
		if out.immediate != nil || out.headerDest != b.addr || out.metaDest != b.addr {
			t.Fatalf("hint %s: picked %q (metadata %q), immediate %v", b.addr, out.headerDest, out.metaDest, out.immediate)
		}
	}
}

// MUST: a hint none of whose endpoints is eligible, or an empty one, is answered 503.
func TestSubsetHintUnknownEndpoints(t *testing.T) {
	a := startSim(t, true)
	r := startRig(t, nil, replica("a", a, 1))
	r.waitReady(t, "a")
	for _, subset := range [][]string{{"10.1.2.3:8000", "10.1.2.4:8000"}, {}} {
		out := r.do(t, call{path: "/v1/chat/completions", body: chat(true, ""), hinted: true, subset: subset})
		if out.immediate == nil || out.immediate.GetStatus().GetCode() != 503 {
			t.Fatalf("hint %v: want 503, got %v (dest %q)", subset, out.immediate, out.headerDest)
		}
		if !bytes.Contains(out.immediate.GetBody(), []byte("endpoints the gateway allows")) {
			t.Errorf("body %s", out.immediate.GetBody())
		}
	}
	if r.inFlight("a") != 0 {
		t.Error("a refused request left a count in flight")
	}
}

// MUST: no ready endpoint is a 503.
func TestNoReadyEndpoint(t *testing.T) {
	a := startSim(t, true)
	r := startRig(t, nil, replica("a", a, 1))
	r.waitReady(t, "a")
	a.stop()
	waitFor(t, "the stopped replica taken out", func() bool { return !r.pool.Get("a").Available(time.Now()) })
	out := r.do(t, call{path: "/v1/chat/completions", body: chat(false, "")})
	if out.immediate == nil || out.immediate.GetStatus().GetCode() != 503 {
		t.Fatalf("want 503, got %v (dest %q)", out.immediate, out.headerDest)
	}
	retryAfter := ""
	for _, h := range out.immediate.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			retryAfter = string(h.GetHeader().GetRawValue())
		}
	}
	if retryAfter == "" {
		t.Fatalf("the 503 says no Retry-After: %v", out.immediate.GetHeaders())
	}
}

// A path the router does not route is its 404 through the picker too, not a replica's
// to answer; the paths the router answers itself go to a replica, which answers alike.
func TestUnknownPathIs404(t *testing.T) {
	a := startSim(t, true)
	r := startRig(t, nil, replica("a", a, 1))
	r.waitReady(t, "a")
	out := r.do(t, call{path: "/v1/unknown", body: chat(false, "")})
	if out.immediate == nil || out.immediate.GetStatus().GetCode() != 404 || !bytes.Contains(out.immediate.GetBody(), []byte("Unknown path POST /v1/unknown")) {
		t.Fatalf("POST /v1/unknown: want the router's 404, got %v (dest %q)", out.immediate, out.headerDest)
	}
	if out := r.do(t, call{method: "GET", path: "/v1/models"}); out.immediate != nil || out.status != 200 {
		t.Fatalf("GET /v1/models: %v %d", out.immediate, out.status)
	}
}

// MUST: a request shed (its key over its concurrency limit) is a 429, as through the router.
func TestShedIs429(t *testing.T) {
	a := startSim(t, true)
	r := startRig(t, nil, replica("a", a, 1))
	ks, err := router.ParseKeys([]byte("keys:\n- name: team\n  key: sk-team-0123456789abcdef\n  max_concurrency: 1\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	r.px.SetKeys(ks)
	r.waitReady(t, "a")
	auth := map[string]string{"authorization": "Bearer sk-team-0123456789abcdef"}
	var second outcome
	first := r.do(t, call{path: "/v1/chat/completions", body: chat(true, ""), header: auth, afterFirstChunk: func() {
		second = r.do(t, call{path: "/v1/chat/completions", body: chat(true, ""), header: auth})
	}})
	if first.immediate != nil || first.status != 200 {
		t.Fatalf("first: %v %d", first.immediate, first.status)
	}
	if second.immediate == nil || second.immediate.GetStatus().GetCode() != 429 {
		t.Fatalf("second while the first streams: want 429, got %v", second.immediate)
	}
	if third := r.do(t, call{path: "/v1/chat/completions", body: chat(false, ""), header: auth}); third.immediate != nil {
		t.Fatalf("after the first ended: %v", third.immediate)
	}
	if out := r.do(t, call{path: "/v1/chat/completions", body: chat(false, "")}); out.immediate == nil || out.immediate.GetStatus().GetCode() != 401 {
		t.Fatalf("no key: want 401, got %v", out.immediate)
	}
}

// The gateway retried on the second endpoint (its served metadata says so): the request is
// counted there, and no longer on the first.
func TestServedEndpointMovesTheRequest(t *testing.T) {
	a, b := startSim(t, true), startSim(t, true)
	r := startRig(t, nil, replica("a", a, 1), replica("b", b, 2))
	r.waitReady(t, "a", "b")
	var during [2]int64
	var ids [2]string
	out := r.do(t, call{path: "/v1/chat/completions", body: chat(true, ""), serveAt: 1, afterFirstChunk: func() {
		during = [2]int64{r.inFlight("a"), r.inFlight("b")}
	}})
	if out.immediate != nil || out.status != 200 {
		t.Fatalf("%v %d", out.immediate, out.status)
	}
	ids[0], ids[1] = "a", "b"
	servedIdx := 0
	if out.served == b.addr {
		servedIdx = 1
	}
	if during[servedIdx] != 1 || during[1-servedIdx] != 0 {
		t.Fatalf("in flight while served by %s: a=%d b=%d, want the request on the served one only", ids[servedIdx], during[0], during[1])
	}
	if n := r.counter(t, "arbiter_router_tokens_total", "replica", ids[servedIdx]); n == 0 {
		t.Errorf("tokens not accounted on the served replica %s", ids[servedIdx])
	}
	waitFor(t, "in-flight counts released", func() bool { return r.inFlight("a") == 0 && r.inFlight("b") == 0 })
}

// A body larger than the picker's buffer is answered 413, and the picker serves on.
func TestBodyLargerThanBuffer(t *testing.T) {
	a := startSim(t, true)
	r := startRig(t, func(c *router.Config) { c.MaxRequestBodyBytes = 16 << 10 }, replica("a", a, 1))
	r.waitReady(t, "a")
	big := chat(false, `,"user":"`+strings.Repeat("x", 32<<10)+`"`)
	out := r.do(t, call{path: "/v1/chat/completions", body: big, chunk: 4 << 10})
	if out.immediate == nil || out.immediate.GetStatus().GetCode() != 413 {
		t.Fatalf("want 413, got %v", out.immediate)
	}
	if n := r.counter(t, "arbiter_router_errors_total", "reason", "body_too_large"); n != 1 {
		t.Fatalf("the 413 counted %v times in arbiter_router_errors_total; want 1, as the router counts its own", n)
	}
	if out := r.do(t, call{path: "/v1/chat/completions", body: chat(false, "")}); out.immediate != nil || out.status != 200 {
		t.Fatalf("after a 413: %v %d", out.immediate, out.status)
	}
}

// A body larger than one streamed message goes back to the gateway in pieces, whole.
func TestLargeBodyStreamsBackWhole(t *testing.T) {
	a := startSim(t, true)
	r := startRig(t, nil, replica("a", a, 1))
	r.waitReady(t, "a")
	prompt := strings.Repeat("lorem ipsum ", 20<<10) // 240 KiB
	body := []byte(`{"model":"` + testModel + `","messages":[{"role":"user","content":"` + prompt + `"}],"max_tokens":3}`)
	out := r.do(t, call{path: "/v1/chat/completions", body: body, chunk: 16 << 10})
	if out.immediate != nil || out.status != 200 {
		t.Fatalf("%v %d: %s", out.immediate, out.status, out.body)
	}
	if !bytes.Equal(out.sent, body) {
		t.Fatalf("sent %d bytes, want the %d of the body", len(out.sent), len(body))
	}
}

// The router's request checks hold through the picker: a bad per-request SLO is a 400.
func TestRequestChecksAsTheRouter(t *testing.T) {
	a := startSim(t, true)
	r := startRig(t, nil, replica("a", a, 1))
	r.waitReady(t, "a")
	out := r.do(t, call{path: "/v1/chat/completions", body: chat(false, ""), header: map[string]string{"x-slo-ttft-ms": "soon"}})
	if out.immediate == nil || out.immediate.GetStatus().GetCode() != 400 || !bytes.Contains(out.immediate.GetBody(), []byte("X-Slo-Ttft-Ms")) {
		t.Fatalf("want 400 naming X-Slo-Ttft-Ms, got %v", out.immediate)
	}
	out = r.do(t, call{path: "/v1/chat/completions", body: []byte(`{"model":"other","messages":[{"role":"user","content":"hi"}]}`)})
	if out.immediate == nil || out.immediate.GetStatus().GetCode() != 404 {
		t.Fatalf("unknown model: want 404, got %v", out.immediate)
	}
}

// The picker restarts mid-stream: the gateway (FailOpen) streams the rest of the answer on
// its own; the old picker's count of the request is released when its stream breaks; the
// new picker, on the same address, picks the next request.
func TestPickerRestartMidStream(t *testing.T) {
	a := startSim(t, true)
	r := startRig(t, nil, replica("a", a, 1))
	r.waitReady(t, "a")
	addr := r.addr
	out := r.do(t, call{path: "/v1/chat/completions", body: chat(true, `,"max_tokens":40`), afterFirstChunk: func() {
		r.srv.Stop() // the picker's process dies
		r.serve(t, addr)
	}})
	if !out.pickerLost {
		t.Fatal("the picker's stream did not break")
	}
	if out.status != 200 || !bytes.Contains(out.body, []byte("data: [DONE]")) {
		t.Fatalf("the answer did not reach the client whole: %d %s", out.status, out.body)
	}
	waitFor(t, "the broken stream's count released", func() bool { return r.inFlight("a") == 0 })
	if next := r.do(t, call{path: "/v1/chat/completions", body: chat(false, "")}); next.immediate != nil || next.headerDest != a.addr || next.status != 200 {
		t.Fatalf("after the restart: %v %q %d", next.immediate, next.headerDest, next.status)
	}
}

func isAddr(s string, addrs ...string) bool {
	for _, a := range addrs {
		if s == a {
			return true
		}
	}
	return false
}

func idOf(addr string, a, b *sim) string {
	if addr == a.addr {
		return "a"
	}
	return "b"
}

// A replica the gateway's retry passed over is not offered first again: the gateway saw
// it fail, and the picker ejects it within that one request rather than waiting for the
// probes (a minute apart here; before, the dead replica stayed first until they noticed).
func TestFailedPickMarkedAtOnce(t *testing.T) {
	a, b := startSim(t, true), startSim(t, true)
	r := startRig(t, func(c *router.Config) { c.Probe.Interval = time.Minute }, replica("a", a, 1), replica("b", b, 2))
	r.waitReady(t, "a", "b")
	if out := r.do(t, call{path: "/v1/chat/completions", body: chat(false, "")}); strings.Split(out.headerDest, ",")[0] != a.addr {
		t.Fatalf("the cheaper replica a should be picked first: %q", out.headerDest)
	}
	a.stop()
	// The gateway tries a, fails, and retries on b.
	if out := r.do(t, call{path: "/v1/chat/completions", body: chat(false, ""), serveAt: 1}); out.status != 200 || out.served != b.addr {
		t.Fatalf("retried request: %d served by %q", out.status, out.served)
	}
	next := r.do(t, call{path: "/v1/chat/completions", body: chat(false, "")})
	if first := strings.Split(next.headerDest, ",")[0]; first != b.addr || next.status != 200 {
		t.Fatalf("after the gateway's retry passed over a: first pick %q (status %d); want b", first, next.status)
	}
}
