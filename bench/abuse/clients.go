package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/arbiter-serve/arbiter/bench/procs"
)

// row is one line of an attack table.
type row struct {
	attack, expected, observed string
	held                       bool
}

func printRows(title string, rows []row) (failed []string) {
	fmt.Printf("\n| %s | expected | observed | held |\n|---|---|---|---|\n", title)
	for _, r := range rows {
		obs := strings.Join(strings.Fields(strings.ReplaceAll(r.observed, "|", "/")), " ")
		fmt.Printf("| %s | %s | %s | %v |\n", r.attack, r.expected, obs, r.held)
		if !r.held {
			failed = append(failed, r.attack)
		}
	}
	return failed
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`

// clientAttacks runs a router with client API keys, default limits otherwise, in front
// of a paced replicasim, and attacks it the way hostile clients do: no key, a key over
// its limit, path tricks, oversized bodies and headers, pprof, clients that vanish
// mid-stream, a flood of idle connections and a slowloris (issue 18 items 3 and 7, and
// the ones that already held).
func clientAttacks(bin, dir string) ([]row, error) {
	simAddr, listen, admin := procs.MustFreeAddr(), procs.MustFreeAddr(), procs.MustFreeAddr()
	sim, err := start(filepath.Join(bin, "replicasim"), "-listen", simAddr, "-model", "m", "-echo", "-echo-token-interval", "20ms", "-log-level", "warn")
	if err != nil {
		return nil, err
	}
	defer stop(sim)
	rf := filepath.Join(dir, "client-replicas.yaml")
	if err := os.WriteFile(rf, []byte("replicas:\n  - {id: r0, address: "+simAddr+", model: m, capacity: reserved}\n"), 0o600); err != nil {
		return nil, err
	}
	digest := func(k string) string { s := sha256.Sum256([]byte(k)); return hex.EncodeToString(s[:]) }
	const alice, bob = "sk-abuse-alice-0123456789", "sk-abuse-bob-0123456789"
	keys := fmt.Sprintf("keys:\n  - {name: alice, sha256: %s}\n  - {name: bob, sha256: %s, requests_per_second: 2, burst: 2}\n", digest(alice), digest(bob))
	kf := filepath.Join(dir, "keys.yaml")
	if err := os.WriteFile(kf, []byte(keys), 0o600); err != nil {
		return nil, err
	}
	router, err := start(filepath.Join(bin, "router"), "-listen", listen, "-admin", admin, "-replicas", rf, "-api-keys", kf, "-log-level", "warn")
	if err != nil {
		return nil, err
	}
	defer stop(router)
	base := "http://" + listen
	client := &http.Client{Timeout: 30 * time.Second}
	send := func(method, path, key, body string, header map[string]string) (int, http.Header, string) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, resp.Header, string(b)
	}
	if err := waitFor(30*time.Second, func() bool { c, _, _ := send("POST", "/v1/chat/completions", alice, chatBody, nil); return c == 200 }); err != nil {
		return nil, fmt.Errorf("the keyed router did not serve: %w", err)
	}
	var rows []row

	// No key, or a wrong one, on every client endpoint.
	codes := map[int]int{}
	for _, key := range []string{"", "sk-wrong"} {
		for _, e := range [][2]string{{"POST", "/v1/chat/completions"}, {"POST", "/v1/completions"}, {"POST", "/v1/embeddings"}, {"GET", "/v1/models"}} {
			c, _, _ := send(e[0], e[1], key, chatBody, nil)
			codes[c]++
		}
	}
	rows = append(rows, row{"no API key, or a wrong one, on each of the 4 client endpoints", "401 × 8", fmt.Sprint(codes), codes[401] == 8})

	// A key over its rate: 20 requests at once from a key allowed 2/s with a burst of 2.
	var limited, ok, other atomic.Int64
	var retryAfter atomic.Bool
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			c, h, _ := send("POST", "/v1/chat/completions", bob, chatBody, nil)
			switch c {
			case 429:
				limited.Add(1)
				if h.Get("Retry-After") != "" {
					retryAfter.Store(true)
				}
			case 200:
				ok.Add(1)
			default:
				other.Add(1)
			}
		})
	}
	wg.Wait()
	rows = append(rows, row{"20 requests at once from a key allowed 2/s, burst 2", "the burst served, the rest 429 with Retry-After",
		fmt.Sprintf("%d × 200, %d × 429 (Retry-After: %v), %d other", ok.Load(), limited.Load(), retryAfter.Load(), other.Load()),
		ok.Load() >= 1 && ok.Load() <= 4 && limited.Load() >= 16 && retryAfter.Load() && other.Load() == 0})

	// Admin and debug paths through the client port, plainly and disguised.
	var leaked []string
	for _, p := range []string{"/metrics", "/replicas", "/debug/pprof/", "/v1/../metrics", "/v1/%2e%2e/replicas", "//metrics", "/v1/chat/completions/../../debug/pprof/cmdline", "/V1/models"} {
		c, _, b := send("GET", p, alice, "", nil)
		if c == 200 || strings.Contains(b, "arbiter_router") || strings.Contains(b, "goroutine") {
			leaked = append(leaked, fmt.Sprintf("%s→%d", p, c))
		}
	}
	rows = append(rows, row{"admin and debug paths on the client port (8, some disguised with .., %2e%2e, //)", "none answered with admin content",
		fmt.Sprintf("answered: %v", leaked), len(leaked) == 0})

	// Oversized body and header.
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", 9<<20) + `"}]}`
	c, _, _ := send("POST", "/v1/chat/completions", alice, big, nil)
	rows = append(rows, row{"a 9 MiB body (max_request_body_bytes 8 MiB)", "413", fmt.Sprint(c), c == 413})
	c, _, _ = send("POST", "/v1/chat/completions", alice, chatBody, map[string]string{"X-Filler": strings.Repeat("x", 64<<10)})
	rows = append(rows, row{"a 64 KiB header (max_header_bytes 8 KiB)", "431", fmt.Sprint(c), c == 431})

	// pprof on the admin port, not enabled.
	resp, err := client.Get("http://" + admin + "/debug/pprof/cmdline")
	pc := 0
	if err == nil {
		pc = resp.StatusCode
		resp.Body.Close()
	}
	rows = append(rows, row{"/debug/pprof on the admin port (pprof not enabled)", "404", fmt.Sprint(pc), pc == 404})

	rows = append(rows, vanishingClients(base, admin, alice))
	rows = append(rows, floodAndSlowloris(base, listen, alice, router.Process.Pid)...)
	return rows, nil
}

// vanishingClients opens 32 streams and drops each after its first chunk: the router
// must release every one (in-flight back to 0 at the replica's view).
func vanishingClients(base, admin, key string) row {
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":500,"stream":true}`
	var wg sync.WaitGroup
	var firstChunks atomic.Int64
	for range 32 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err == nil && strings.HasPrefix(line, "data: ") {
				firstChunks.Add(1)
			}
			cancel() // the client vanishes mid-stream
		})
	}
	wg.Wait()
	inFlight := int64(-1)
	_ = waitFor(10*time.Second, func() bool {
		inFlight = adminInFlight(admin)
		return inFlight == 0
	})
	return row{"32 streaming clients that vanish after the first chunk (500 tokens asked, 20 ms each)", "in-flight back to 0 within 10 s",
		fmt.Sprintf("%d first chunks; in-flight %d", firstChunks.Load(), inFlight), firstChunks.Load() == 32 && inFlight == 0}
}

func adminInFlight(admin string) int64 {
	resp, err := http.Get("http://" + admin + "/replicas")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var vs []struct {
		InFlight int64 `json:"in_flight"`
	}
	if json.NewDecoder(resp.Body).Decode(&vs) != nil {
		return -1
	}
	var n int64
	for _, v := range vs {
		n += v.InFlight
	}
	return n
}

// floodAndSlowloris opens as many idle connections as this process's descriptor limit
// leaves room for (at most 5,000), plus 50 that trickle a request header a byte a second,
// and checks that the router stays up and answers a fresh client (200 or an immediate
// 503, never a hang), then closes both kinds at read_timeout (30 s) without writing an
// unsolicited response into the idle ones, and serves again.
func floodAndSlowloris(base, listen, key string, routerPID int) []row {
	var lim syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	n := min(5000, int(lim.Cur)-200)
	var idle []net.Conn
	for range n {
		c, err := net.DialTimeout("tcp", listen, 2*time.Second)
		if err != nil {
			break
		}
		idle = append(idle, c)
	}
	var slow []net.Conn
	for range 50 {
		c, err := net.DialTimeout("tcp", listen, 2*time.Second)
		if err != nil {
			break
		}
		slow = append(slow, c)
	}
	stopTrickle := make(chan struct{})
	var trickle sync.WaitGroup
	trickle.Go(func() {
		msg := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
		for i := 0; ; i++ {
			for _, c := range slow {
				_ = c.SetWriteDeadline(time.Now().Add(time.Second))
				_, _ = c.Write([]byte{msg[min(i, len(msg)-1)]})
			}
			select {
			case <-stopTrickle:
				return
			case <-time.After(time.Second):
			}
		}
	})
	// A fresh client during the flood.
	t0 := time.Now()
	code := 0
	client := &http.Client{Timeout: 20 * time.Second}
	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := client.Do(req); err == nil {
		code = resp.StatusCode
		resp.Body.Close()
	}
	during := time.Since(t0)
	alive := procs.Running(routerPID)
	rows := []row{{fmt.Sprintf("%d idle connections and %d slowloris ones held open", len(idle), len(slow)),
		"router up; a fresh request gets 200 or an immediate 503",
		fmt.Sprintf("router up: %v; fresh request %d in %s", alive, code, during.Round(time.Millisecond)),
		alive && (code == 200 || code == 503 && during < 2*time.Second)}}

	// read_timeout is 30 s: every idle and trickling connection must be closed by then
	// (with slack for a loaded machine), the idle ones without a byte written.
	// The ones beyond the router's connection budget (under a low descriptor limit) are
	// shed at once with a 503: that is an answer, not an unsolicited write.
	var closedIdle, shedIdle, wroteIdle, closedSlow, wroteSlow atomic.Int64
	var wg sync.WaitGroup
	watch := func(c net.Conn, shed, wrote, closed *atomic.Int64) {
		_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
		b := make([]byte, 512)
		k, err := io.ReadAtLeast(c, b, len("HTTP/1.1 503"))
		switch {
		case k >= len("HTTP/1.1 503") && string(b[:len("HTTP/1.1 503")]) == "HTTP/1.1 503":
			shed.Add(1)
		case k > 0:
			wrote.Add(1)
		}
		if k > 0 {
			_, err = io.Copy(io.Discard, c)
		}
		if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			closed.Add(1)
		}
	}
	for _, c := range idle {
		wg.Go(func() { watch(c, &shedIdle, &wroteIdle, &closedIdle) })
	}
	for _, c := range slow {
		wg.Go(func() { watch(c, &wroteSlow, &wroteSlow, &closedSlow) })
	}
	wg.Wait()
	close(stopTrickle)
	trickle.Wait()
	for _, c := range slices.Concat(idle, slow) {
		c.Close()
	}
	code = 0
	req, _ = http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := client.Do(req); err == nil {
		code = resp.StatusCode
		resp.Body.Close()
	}
	rows = append(rows,
		row{"…the idle ones at read_timeout (30 s)", "all closed by the router within 60 s; none written into but a 503 at once to those beyond its budget",
			fmt.Sprintf("%d of %d closed, %d shed with 503, %d written into otherwise", closedIdle.Load(), len(idle), shedIdle.Load(), wroteIdle.Load()),
			closedIdle.Load() == int64(len(idle)) && wroteIdle.Load() == 0},
		row{"…the slowloris ones at read_timeout", "all closed within 60 s (a 408 at most)",
			fmt.Sprintf("%d of %d closed (%d with a response)", closedSlow.Load(), len(slow), wroteSlow.Load()), closedSlow.Load() == int64(len(slow))},
		row{"…and afterwards", "router up, a request 200", fmt.Sprintf("router up: %v; request %d", procs.Running(routerPID), code),
			procs.Running(routerPID) && code == 200})
	return rows
}

// replicaAttacks runs a router without client keys in front of a replica that accepts
// and never answers (replicasim -fault hang, whose /health still answers: only passive
// health checking can find it out) and one that records the headers it gets, then sends
// requests carrying a client's credentials (issue 18 items 7 and 8).
func replicaAttacks(bin, dir string) ([]row, error) {
	hungAddr, listen, admin := procs.MustFreeAddr(), procs.MustFreeAddr(), procs.MustFreeAddr()
	hung, err := start(filepath.Join(bin, "replicasim"), "-listen", hungAddr, "-model", "m", "-echo", "-fault", "hang", "-log-level", "warn")
	if err != nil {
		return nil, err
	}
	defer stop(hung)
	capture, err := newCaptureReplica()
	if err != nil {
		return nil, err
	}
	defer capture.Close()
	rf := filepath.Join(dir, "replica-replicas.yaml")
	list := fmt.Sprintf("replicas:\n  - {id: hung, address: %s, model: m, capacity: reserved}\n  - {id: capture, address: %s, model: m, capacity: reserved}\n", hungAddr, capture.addr)
	if err := os.WriteFile(rf, []byte(list), 0o600); err != nil {
		return nil, err
	}
	router, err := start(filepath.Join(bin, "router"), "-listen", listen, "-admin", admin, "-replicas", rf, "-log-level", "warn")
	if err != nil {
		return nil, err
	}
	defer stop(router)
	if err := waitFor(30*time.Second, func() bool {
		resp, err := http.Get("http://" + listen + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	}); err != nil {
		return nil, err
	}
	// 16 requests at once, each with an Arbiter key, a cookie and a proxy credential.
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	var slowest time.Duration
	for range 16 {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", "http://"+listen+"/v1/chat/completions", strings.NewReader(chatBody))
			req.Header.Set("Authorization", "Bearer sk-client-secret")
			req.Header.Set("Cookie", "session=client-secret")
			req.Header.Set("Proxy-Authorization", "Basic Y2xpZW50OnNlY3JldA==")
			t0 := time.Now()
			c := 0
			if resp, err := (&http.Client{Timeout: 70 * time.Second}).Do(req); err == nil {
				c = resp.StatusCode
				resp.Body.Close()
			}
			mu.Lock()
			codes[c]++
			slowest = max(slowest, time.Since(t0))
			mu.Unlock()
		})
	}
	wg.Wait()
	retries, ejections := metric(admin, "arbiter_router_retries_total"), metric(admin, `arbiter_router_ejections_total{replica="hung"}`)
	rows := []row{{"a replica that accepts and never answers (its /health fine), 16 requests at once", "all 200 within 3 × first_byte_timeout_min (5 s), retried elsewhere; the replica ejected",
		fmt.Sprintf("%v, slowest %s; %.0f retries, %.0f ejections of it", codes, slowest.Round(time.Millisecond), retries, ejections),
		codes[200] == 16 && slowest < 15*time.Second && retries > 0 && ejections > 0}}
	got := capture.requests()
	var leaks []string
	for _, h := range got {
		for _, k := range []string{"Authorization", "Cookie", "Proxy-Authorization"} {
			if h.Get(k) != "" {
				leaks = append(leaks, k)
			}
		}
	}
	rows = append(rows, row{"a client's Authorization, Cookie and Proxy-Authorization", "none reaches a replica",
		fmt.Sprintf("%d requests at the replica, credentials seen: %v", len(got), leaks), len(got) > 0 && len(leaks) == 0})
	return rows, nil
}

// metric sums the samples of the admin port's /metrics whose line starts with prefix
// (a name, or a name and the start of its labels); -1 if it cannot be read.
func metric(admin, prefix string) float64 { return metricWith(admin, prefix) }

// captureReplica is a minimal OpenAI-compatible replica that records each request's
// headers: what a replica operator (or a compromised one) would see.
type captureReplica struct {
	addr string
	srv  *http.Server
	mu   sync.Mutex
	seen []http.Header
}

func newCaptureReplica() (*captureReplica, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c := &captureReplica{addr: ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"m","object":"model"}]}`))
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		c.mu.Lock()
		c.seen = append(c.seen, r.Header.Clone())
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"c","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`))
	})
	c.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = c.srv.Serve(ln) }()
	return c, nil
}

func (c *captureReplica) requests() []http.Header {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.seen)
}

func (c *captureReplica) Close() { _ = c.srv.Close() }

// waitFor polls cond every 100 ms until it holds or wait passes.
func waitFor(wait time.Duration, cond func() bool) error {
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if cond() {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("not within %s", wait)
}
