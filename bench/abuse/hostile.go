package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arbiter-serve/arbiter/bench/procs"
)

// hostileReplica is a replica an attacker controls (issue 35): it speaks HTTP/1.1 byte by
// byte on loopback, one model name per misbehaviour, so one router in front of it meets
// each in turn. /health answers per the mode of its address (flapping for "flap").
type hostileReplica struct {
	ln      net.Listener
	flap    bool
	probes  atomic.Int64
	wrote   atomic.Int64 // bytes of the 100 MB event written before the router closed
	cutAt   chan time.Duration
	mu      sync.Mutex
	conns   []net.Conn
	metrics string
}

const hostileFirst = `data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}` + "\n\n"

func hostileAnswer(model, text, usage string) string {
	body := fmt.Sprintf(`{"id":"c","object":"chat.completion","created":0,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":%s}`, model, text, usage)
	return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

func hchunk(b string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(b), b) }

const goodUsage = `{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}`

func newHostileReplica(flap bool, metrics string) (*hostileReplica, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &hostileReplica{ln: ln, flap: flap, metrics: metrics, cutAt: make(chan time.Duration, 1)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.conns = append(h.conns, c)
			h.mu.Unlock()
			go h.serve(c)
		}
	}()
	return h, nil
}

func (h *hostileReplica) addr() string { return h.ln.Addr().String() }

func (h *hostileReplica) Close() {
	_ = h.ln.Close()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		_ = c.Close()
	}
}

func (h *hostileReplica) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, _ := io.ReadAll(req.Body)
		switch req.URL.Path {
		case "/health":
			code := 200
			if n := h.probes.Add(1); h.flap && n%3 != 0 {
				code = 503
			}
			fmt.Fprintf(c, "HTTP/1.1 %d X\r\nContent-Length: 0\r\n\r\n", code)
			continue
		case "/metrics":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(h.metrics), h.metrics)
			continue
		}
		var r struct {
			Model string `json:"model"`
		}
		_ = json.Unmarshal(body, &r)
		if !h.answer(c, r.Model) {
			return
		}
	}
}

// answer writes the misbehaviour of mode (the request's model) and says whether the
// connection may go on.
func (h *hostileReplica) answer(c net.Conn, mode string) bool {
	switch mode {
	case "sse-100mb":
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+hchunk(hostileFirst)+hchunk("data: "))
		piece := hchunk(strings.Repeat("x", 64<<10))
		for h.wrote.Load() < 100<<20 {
			_ = c.SetWriteDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.WriteString(c, piece); err != nil {
				return false
			}
			h.wrote.Add(64 << 10)
		}
		fmt.Fprint(c, hchunk("\n\n")+hchunk("data: [DONE]\n\n")+"0\r\n\r\n")
		return false
	case "trickle":
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+hchunk(hostileFirst)+hchunk("data: {"))
		t0 := time.Now()
		for time.Since(t0) < 70*time.Second {
			_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, hchunk("x")); err != nil {
				h.cutAt <- time.Since(t0)
				return false
			}
			time.Sleep(20 * time.Millisecond)
		}
		return false
	case "interim":
		fmt.Fprint(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"+hostileAnswer(mode, "after the interim", goodUsage))
	case "status-999":
		fmt.Fprint(c, "HTTP/1.1 999 Whatever\r\nContent-Length: 2\r\n\r\n{}")
	case "204-forged":
		fmt.Fprint(c, "HTTP/1.1 204 No Content\r\n\r\n"+hostileAnswer(mode, "forged for the next client", goodUsage))
	case "deep-json":
		deep := strings.Repeat("[", 1<<20) + strings.Repeat("]", 1<<20)
		body := `{"id":"c","object":"chat.completion","model":"deep-json","x":` + deep + `,"choices":[],"usage":` + goodUsage + `}`
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	case "negative-usage":
		fmt.Fprint(c, hostileAnswer(mode, "a full answer", `{"prompt_tokens":-100,"completion_tokens":5,"total_tokens":-95}`))
	case "headers":
		body := `{"id":"c","object":"chat.completion","model":"headers","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":` + goodUsage + `}`
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nSet-Cookie: session=stolen; Path=/\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\nUpgrade: h2c\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	default:
		fmt.Fprint(c, hostileAnswer(mode, "answer", goodUsage))
	}
	return true
}

// hostileReplicaAttacks puts one router in front of hostile replicas, one model per
// misbehaviour, and checks that each client gets a clean error or the replica's answer
// unharmed, that the replica is counted or ejected as it deserves, and that the router
// stays up within its memory (issue 35).
func hostileReplicaAttacks(bin, dir string) ([]row, error) {
	h, err := newHostileReplica(false, "vllm:num_requests_running{model_name=\"lies\"} -5\nvllm:num_requests_waiting{model_name=\"lies\"} 0\nvllm:gpu_cache_usage_perc{model_name=\"lies\"} NaN\n")
	if err != nil {
		return nil, err
	}
	defer h.Close()
	flap, err := newHostileReplica(true, "")
	if err != nil {
		return nil, err
	}
	defer flap.Close()
	modes := []string{"sse-100mb", "trickle", "interim", "status-999", "204-forged", "deep-json", "negative-usage", "headers", "lies", "default"}
	var list strings.Builder
	list.WriteString("replicas:\n")
	for _, m := range modes {
		fmt.Fprintf(&list, "  - {id: %s, address: %s, model: %s, capacity: reserved}\n", m, h.addr(), m)
	}
	fmt.Fprintf(&list, "  - {id: flap, address: %s, model: flap, capacity: reserved}\n", flap.addr())
	rf := filepath.Join(dir, "hostile-replicas.yaml")
	if err := os.WriteFile(rf, []byte(list.String()), 0o600); err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "hostile-router.yaml")
	if err := os.WriteFile(cfg, []byte("probe: {interval: 50ms}\n"), 0o600); err != nil {
		return nil, err
	}
	listen, admin := procs.MustFreeAddr(), procs.MustFreeAddr()
	router, err := start(filepath.Join(bin, "router"), "-listen", listen, "-admin", admin, "-replicas", rf, "-config", cfg, "-log-level", "error")
	if err != nil {
		return nil, err
	}
	defer stop(router)
	url := "http://" + listen + "/v1/chat/completions"
	ask := func(model string, stream bool, wait time.Duration) (int, http.Header, string, time.Duration) {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":%v}`, model, stream)
		t0 := time.Now()
		resp, err := (&http.Client{Timeout: wait}).Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			return 0, nil, err.Error(), time.Since(t0)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		if err != nil {
			return resp.StatusCode, resp.Header, fmt.Sprintf("%d bytes, then %v", len(b), err), time.Since(t0)
		}
		return resp.StatusCode, resp.Header, string(b), time.Since(t0)
	}
	if err := waitFor(30*time.Second, func() bool { c, _, _, _ := ask("default", false, 5*time.Second); return c == 200 }); err != nil {
		return nil, fmt.Errorf("the router in front of the hostile replica did not serve: %w", err)
	}
	pid := router.Process.Pid
	var rows []row

	rss0 := rssMiB(pid)
	code, _, out, took := ask("sse-100mb", true, 30*time.Second)
	rows = append(rows, row{"SSE: one data line of 100 MB", "the first event, then an error event; the replica cut off; router RSS bounded",
		fmt.Sprintf("%d in %s, %d bytes, error event: %v; replica wrote %d MiB; RSS %.0f → %.0f MiB", code, took.Round(time.Millisecond), len(out),
			strings.Contains(out, "too large"), h.wrote.Load()>>20, rss0, rssMiB(pid)),
		code == 200 && strings.Contains(out, "too large") && h.wrote.Load() < 16<<20 && rssMiB(pid) < rss0+64})

	// The client reads the first event and leaves; the replica trickles an event that never ends.
	c, err := net.Dial("tcp", listen)
	if err == nil {
		body := `{"model":"trickle","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}`
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil || strings.Contains(line, "data: ") {
				break
			}
		}
		c.Close()
	}
	left := time.Now()
	cut := "still open after 15 s"
	select {
	case <-h.cutAt:
		cut = fmt.Sprintf("closed %s after the client left", time.Since(left).Round(time.Millisecond))
	case <-time.After(15 * time.Second):
	}
	rows = append(rows, row{"SSE: an event that never ends (a byte every 20 ms), the client gone", "the replica's connection closed within 5 s",
		cut, strings.HasPrefix(cut, "closed") && time.Since(left) < 5*time.Second})

	code, _, out, _ = ask("interim", false, 10*time.Second)
	code2, _, out2, _ := ask("default", false, 10*time.Second)
	rows = append(rows, row{"status: 100 Continue and 103 Early Hints before the answer", "the answer; the next request its own",
		fmt.Sprintf("%d %q; next: %d %q", code, excerpt(out, "content"), code2, excerpt(out2, "content")),
		code == 200 && strings.Contains(out, "after the interim") && code2 == 200 && strings.Contains(out2, `"answer"`)})

	code, _, out, _ = ask("status-999", false, 10*time.Second)
	rows = append(rows, row{"status: 999", "502, the replica's failure counted", fmt.Sprintf("%d %.60s; bad_status %.0f", code, out, metricWith(admin, "arbiter_router_errors_total{", `reason="bad_status"`)),
		code == 502})

	code, _, out, took = ask("204-forged", false, 10*time.Second)
	code2, _, out2, _ = ask("default", false, 10*time.Second)
	rows = append(rows, row{"status: 204 followed by a forged response", "204 at once; the next request its own answer",
		fmt.Sprintf("%d in %s %.40q; next: %d %q", code, took.Round(time.Millisecond), out, code2, excerpt(out2, "content")),
		code == 204 && took < 5*time.Second && code2 == 200 && strings.Contains(out2, `"answer"`)})

	code, _, out, took = ask("deep-json", false, 10*time.Second)
	rows = append(rows, row{"JSON: a whole response nested 1,048,576 deep", "200, byte for byte, at once", fmt.Sprintf("%d, %d bytes in %s", code, len(out), took.Round(time.Millisecond)),
		code == 200 && len(out) > 2<<20 && took < 5*time.Second})

	code, _, out, _ = ask("negative-usage", false, 10*time.Second)
	rows = append(rows, row{"usage: prompt_tokens -100", "the answer stands (200); the usage refused and counted", fmt.Sprintf("%d %q; refused %.0f", code, excerpt(out, "content"),
		metricWith(admin, "arbiter_router_replica_reports_rejected_total{", `replica="negative-usage"`)),
		code == 200 && strings.Contains(out, "a full answer") && metricWith(admin, "arbiter_router_replica_reports_rejected_total{", `replica="negative-usage"`) > 0})

	code, hdr, _, _ := ask("headers", false, 10*time.Second)
	var passed []string
	for _, k := range []string{"Set-Cookie", "X-Drop", "Upgrade"} {
		if hdr.Get(k) != "" {
			passed = append(passed, k)
		}
	}
	rows = append(rows, row{"headers: Set-Cookie, Upgrade, a field its Connection names", "none reaches the client", fmt.Sprintf("%d; passed: %v", code, passed),
		code == 200 && len(passed) == 0})

	_ = waitFor(5*time.Second, func() bool {
		return metricWith(admin, "arbiter_router_replica_reports_rejected_total{", `replica="lies"`, `source="metrics"`) > 0
	})
	rows = append(rows, row{"/metrics: running -5, KV use NaN", "the scrape refused and counted", fmt.Sprintf("refused %.0f", metricWith(admin, "arbiter_router_replica_reports_rejected_total{", `replica="lies"`, `source="metrics"`)),
		metricWith(admin, "arbiter_router_replica_reports_rejected_total{", `replica="lies"`, `source="metrics"`) > 0})

	// Flapping /health: fail, fail, pass, ... every 50 ms probe; readiness sampled for 3 s.
	flips, last, samples := 0, -1, 0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		a := adminAvailable(admin, "flap")
		if a < 0 {
			continue
		}
		if last >= 0 && a != last {
			flips++
		}
		last, samples = a, samples+1
	}
	rows = append(rows, row{"/health flapping (fail, fail, pass, ...) at a 50 ms probe", "out of routing once, not back while it flaps",
		fmt.Sprintf("%d readiness changes over %d probes", flips, flap.probes.Load()), flips <= 1 && last == 0})

	alive := procs.Running(pid)
	code, _, _, _ = ask("default", false, 10*time.Second)
	rows = append(rows, row{"afterwards", "router up, a request 200", fmt.Sprintf("router up: %v; request %d; RSS %.0f MiB", alive, code, rssMiB(pid)), alive && code == 200})
	rows = append(rows, framingAttacks(listen)...)
	return rows, nil
}

// adminAvailable is 1 when the admin port lists replica id available, 0 when not, -1
// when it cannot tell.
func adminAvailable(admin, id string) int {
	resp, err := http.Get("http://" + admin + "/replicas")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var vs []struct {
		ID        string `json:"id"`
		Available bool   `json:"available"`
	}
	if json.NewDecoder(resp.Body).Decode(&vs) != nil {
		return -1
	}
	for _, v := range vs {
		if v.ID == id {
			if v.Available {
				return 1
			}
			return 0
		}
	}
	return -1
}

// excerpt is the value of the first "key":"..." in a JSON text, or its start.
func excerpt(s, key string) string {
	i := strings.Index(s, `"`+key+`":"`)
	if i < 0 {
		return fmt.Sprintf("%.40s", s)
	}
	rest := s[i+len(key)+4:]
	if j := strings.IndexByte(rest, '"'); j >= 0 {
		return rest[:j]
	}
	return rest
}

// framingAttacks sends the framing cases a request-smuggling scanner tries, each followed
// by a hidden second request, on raw connections to the router: ambiguous framing must be
// refused 400 with the connection closed (the hidden request never answered).
func framingAttacks(listen string) []row {
	body := `{"model":"default","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	cl := fmt.Sprint(len(body))
	chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
	h := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	const hidden = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
	var rows []row
	for _, c := range []struct {
		name, req string
		want      int
	}{
		{"framing: Content-Length and Transfer-Encoding: chunked", h + "Content-Length: " + cl + "\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked, 200},
		{"framing: duplicate Content-Length", h + "Content-Length: " + cl + "\r\nContent-Length: " + cl + "\r\n\r\n" + body, 400},
		{"framing: conflicting Content-Length", h + "Content-Length: " + cl + "\r\nContent-Length: 5\r\n\r\n" + body, 400},
		{"framing: Transfer-Encoding: gzip", h + "Transfer-Encoding: gzip\r\n\r\n" + chunked, 400},
		{"framing: Transfer-Encoding: identity with Content-Length", h + "Transfer-Encoding: identity\r\nContent-Length: " + cl + "\r\n\r\n" + body, 400},
		{"framing: Transfer-Encoding folded (obs-fold)", h + "Transfer-Encoding:\r\n chunked\r\n\r\n" + chunked, 400},
		{"framing: a bare LF ending a header line", h + "X-Note: a\nContent-Length: " + cl + "\r\n\r\n" + body, 400},
	} {
		code, closed, n := rawFraming(listen, c.req+hidden)
		want := fmt.Sprintf("%d, then closed (one response)", c.want)
		rows = append(rows, row{c.name, want, fmt.Sprintf("%d, closed %v, %d responses", code, closed, n), code == c.want && closed && n == 1})
	}
	return rows
}

func rawFraming(listen, req string) (code int, closed bool, responses int) {
	c, err := net.Dial("tcp", listen)
	if err != nil {
		return 0, false, 0
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	_, _ = io.WriteString(c, req)
	b, err := io.ReadAll(c)
	ne, isNet := err.(net.Error)
	closed = !(isNet && ne.Timeout())
	out := string(b)
	_, _ = fmt.Sscanf(out, "HTTP/1.1 %d", &code)
	return code, closed, strings.Count(out, "HTTP/1.1 ")
}

// metricWith sums the samples of the admin port's /metrics whose line starts with prefix
// and holds every one of labels (label order in the exposition is the registry's).
func metricWith(admin, prefix string, labels ...string) float64 {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
line:
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		for _, lb := range labels {
			if !strings.Contains(l, lb) {
				continue line
			}
		}
		var v float64
		if _, err := fmt.Sscanf(l[strings.LastIndexByte(l, ' ')+1:], "%g", &v); err == nil {
			sum += v
		}
	}
	return sum
}
