package router

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// relay is a TCP relay on loopback in front of a replica. It holds back what the replica
// sends by a delay the test sets: on every connection (a far link: probes see it too), or
// only on connections that carry inference, whose first bytes are a POST (a replica that
// answers slowly while its health probes stay fast: a congested GPU, a noisy neighbour).
type relay struct {
	addr     string
	target   string
	postOnly bool
	delay    atomic.Int64 // nanoseconds
}

func startRelay(t *testing.T, target string, postOnly bool) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{addr: ln.Addr().String(), target: target, postOnly: postOnly}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.handle(c)
		}
	}()
	return r
}

func (r *relay) handle(c net.Conn) {
	defer c.Close()
	u, err := net.Dial("tcp", r.target)
	if err != nil {
		return
	}
	defer u.Close()
	in := bufio.NewReader(c)
	first, _ := in.Peek(4)
	delayed := !r.postOnly || string(first) == "POST"
	go func() {
		_, _ = io.Copy(u, in)
		_ = u.(*net.TCPConn).CloseWrite()
	}()
	// A delay line, not a pause: each chunk leaves `delay` after it arrived, in order.
	type chunk struct {
		at time.Time
		b  []byte
	}
	chunks := make(chan chunk, 1024)
	go func() {
		defer close(chunks)
		buf := make([]byte, 32<<10)
		for {
			n, err := u.Read(buf)
			if n > 0 {
				var d time.Duration
				if delayed {
					d = time.Duration(r.delay.Load())
				}
				chunks <- chunk{time.Now().Add(d), append([]byte(nil), buf[:n]...)}
			}
			if err != nil {
				return
			}
		}
	}()
	for ck := range chunks {
		time.Sleep(time.Until(ck.at))
		if _, err := c.Write(ck.b); err != nil {
			return
		}
	}
}

// servedBy sends one streamed chat request and says which replica answered it.
func servedBy(t *testing.T, rg *rig, ids ...string) string {
	t.Helper()
	return servedWith(t, rg, nil, ids...)
}

// servedWith is servedBy with request headers (name, value, …).
func servedWith(t *testing.T, rg *rig, hdr []string, ids ...string) string {
	t.Helper()
	before := map[string]float64{}
	for _, id := range ids {
		before[id] = rg.counter(t, "arbiter_router_requests_total", "replica", id)
	}
	if resp, body := post(t, rg.url+"/v1/chat/completions", chatBody(true, ""), hdr...); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	for _, id := range ids {
		if rg.counter(t, "arbiter_router_requests_total", "replica", id) > before[id] {
			return id
		}
	}
	t.Fatal("no replica counted the request")
	return ""
}

// A user's report, replayed: a TTFT SLO of 100 ms, a cheap replica and a dear one. The cheap
// one turns slow (150 ms more per answer, its health probes still fast), and the router
// rightly moves to the dear one; then the cheap one recovers, and nothing but the router's
// own re-sampling can tell, since the SLO filter sends it nothing. It must be used again
// within a minute, and at most one request in each ResampleEvery may go to it meanwhile.
func TestRecoveredReplicaIsUsedAgain(t *testing.T) {
	cheapSim, dearSim := startSim(t, simOpts{}), startSim(t, simOpts{})
	rl := startRelay(t, cheapSim.addr, true)
	rl.delay.Store(int64(150 * time.Millisecond))
	const every = 3 * time.Second
	rg := startRouter(t, func(c *Config) {
		c.SLOs = map[string]SLO{"*": {TTFT: 0.1}}
		c.ResampleEvery = every
	}, replica("cheap", &sim{addr: rl.addr}, fleet.OnDemand, 1), replica("dear", dearSim, fleet.OnDemand, 4))

	start := time.Now()
	var first []string
	for range 8 {
		first = append(first, servedBy(t, rg, "cheap", "dear"))
	}
	for _, id := range first[5:] {
		if id != "dear" {
			t.Fatalf("with the cheap replica 150 ms slow, requests went to %v: the last ones should go to the dear one", first)
		}
	}

	rl.delay.Store(0)
	recovered := time.Now()
	var cheapAt []time.Duration
	var last []string
	for time.Since(recovered) < time.Minute {
		id := servedBy(t, rg, "cheap", "dear")
		if id == "cheap" {
			cheapAt = append(cheapAt, time.Since(recovered))
		}
		last = append(last, id)
		if n := len(last); n >= 5 && last[n-1] == "cheap" && last[n-2] == "cheap" && last[n-3] == "cheap" {
			break
		}
		time.Sleep(100 * time.Millisecond) // about 8 requests a second, one at a time
	}
	t.Logf("after recovery the cheap replica served requests at %v", cheapAt)
	n := len(last)
	if n < 3 || last[n-1] != "cheap" || last[n-2] != "cheap" || last[n-3] != "cheap" {
		t.Fatalf("a minute after the cheap replica recovered it is still not chosen (served at %v)", cheapAt)
	}
	resamples := rg.counter(t, "arbiter_router_picks_total", "reason", ReasonResample)
	if resamples < 1 {
		t.Fatal("recovered without a re-sampling pick: the test no longer shows what it is for")
	}
	if bound := float64(time.Since(start)/every) + 1; resamples > bound {
		t.Fatalf("%v re-sampling picks in %v: more than one per %v", resamples, time.Since(start).Round(time.Second), every)
	}
}

// A far link (150 ms more round trip on every connection, probes included) is measured
// before the replica's first request, so its answers are not taken for slow prefill; when
// the link gets near (20 ms), the probes alone bring the replica back, with no
// re-sampling. Probes run at the default interval (2 s) as a user's router would.
func TestFarLinkIsMeasuredBeforeFirstUse(t *testing.T) {
	cheapSim, dearSim := startSim(t, simOpts{}), startSim(t, simOpts{})
	rl := startRelay(t, cheapSim.addr, false)
	rl.delay.Store(int64(150 * time.Millisecond))
	rg := startRouter(t, func(c *Config) {
		c.SLOs = map[string]SLO{"*": {TTFT: 0.1}}
		c.Probe.Interval = Defaults().Probe.Interval
		c.ResampleEvery = 0
	}, replica("cheap", &sim{addr: rl.addr}, fleet.OnDemand, 1), replica("dear", dearSim, fleet.OnDemand, 4))
	waitFor(t, "the first probe of the far replica", rg.pool.Get("cheap").rttKnown)
	for i := range 5 {
		if id := servedBy(t, rg, "cheap", "dear"); id != "dear" {
			t.Fatalf("request %d went to the far replica: its 150 ms round trip was not measured before use", i)
		}
	}
	rl.delay.Store(int64(20 * time.Millisecond))
	near := time.Now()
	for servedBy(t, rg, "cheap", "dear") != "cheap" {
		if time.Since(near) > 30*time.Second {
			t.Fatal("30 s after the link got near, the cheap replica is still not chosen")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("chosen again %v after the link got near", time.Since(near).Round(100*time.Millisecond))
}

// A client tightens its own request's SLO with llm-d's headers (milliseconds), and the pick
// honours it; it cannot loosen the service's, and a malformed value is a 400 that names
// the header.
func TestPerRequestSLOHeaders(t *testing.T) {
	cheapSim, dearSim := startSim(t, simOpts{}), startSim(t, simOpts{})
	rl := startRelay(t, cheapSim.addr, false)
	rl.delay.Store(int64(60 * time.Millisecond))
	slo := SLO{TTFT: 1}
	rg := startRouter(t, func(c *Config) { c.SLOs = map[string]SLO{"*": slo} },
		replica("cheap", &sim{addr: rl.addr}, fleet.OnDemand, 1), replica("dear", dearSim, fleet.OnDemand, 4))
	waitFor(t, "the first probe of the far replica", rg.pool.Get("cheap").rttKnown)
	if id := servedBy(t, rg, "cheap", "dear"); id != "cheap" {
		t.Fatalf("with a 1 s TTFT SLO the request went to %s, want the cheap replica", id)
	}
	for _, h := range [][]string{{"X-Slo-Ttft-Ms", "40"}, {"x-slo-ttft-ms", "40", "x-slo-tpot-ms", "50"}} {
		if id := servedWith(t, rg, h, "cheap", "dear"); id != "dear" {
			t.Fatalf("with %v the request went to %s, want the near (dear) replica", h, id)
		}
	}
	for _, bad := range []string{"abc", "-5", "0", "NaN", "Inf"} {
		resp, body := post(t, rg.url+"/v1/chat/completions", chatBody(false, ""), "X-Slo-Ttft-Ms", bad)
		if resp.StatusCode != 400 || !strings.Contains(body, "X-Slo-Ttft-Ms") {
			t.Errorf("X-Slo-Ttft-Ms %q: %d %s, want a 400 naming the header", bad, resp.StatusCode, body)
		}
	}
	// Looser than the service's: ignored.
	rg.cfg.SLOs = map[string]SLO{"*": {TTFT: 0.04}}
	if id := servedWith(t, rg, []string{"X-Slo-Ttft-Ms", "5000"}, "cheap", "dear"); id != "dear" {
		t.Fatalf("a client loosened the service's 40 ms TTFT SLO to 5 s: its request went to %s", id)
	}
}

// With routing_headers on, a response names its replica and the prediction that chose it;
// off (the default), it does not.
func TestRoutingHeaders(t *testing.T) {
	s := startSim(t, simOpts{})
	for _, on := range []bool{false, true} {
		rg := startRouter(t, func(c *Config) { c.RoutingHeaders = on }, replica("only", s, fleet.OnDemand, 1))
		for _, stream := range []bool{false, true} {
			resp, body := post(t, rg.url+"/v1/chat/completions", chatBody(stream, ""))
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			id, ttft, tpot := resp.Header.Get("X-Arbiter-Replica"), resp.Header.Get("X-Arbiter-Predicted-Ttft-Ms"), resp.Header.Get("X-Arbiter-Predicted-Tpot-Ms")
			if !on {
				if id != "" || ttft != "" || tpot != "" {
					t.Fatalf("routing headers off, yet the response says %q %q %q", id, ttft, tpot)
				}
				continue
			}
			ms, err := strconv.ParseFloat(ttft, 64)
			if id != "only" || err != nil || ms <= 0 || tpot == "" {
				t.Fatalf("stream %v: replica %q, predicted TTFT %q ms, TPOT %q ms", stream, id, ttft, tpot)
			}
		}
	}
}
