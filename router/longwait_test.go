package router

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// Timers that a long cold start, a long prefill or a long generation runs past: each is
// either longer than the work it bounds or refreshed by its progress. The mechanism is
// shown here with timers shortened to seconds; e2e's cold-start tests run it at a real
// vLLM cold start's length.

// cpRig is a router whose control plane is a fake over real HTTP, publishing services and
// replicas, with load reports every reportEvery (0: the default).
func cpRig(t *testing.T, mod func(*Config), reportEvery time.Duration, services []fleet.Service, replicas []fleet.Replica) (*rig, *fakeControlPlane) {
	t.Helper()
	fake := &fakeControlPlane{changed: make(chan struct{})}
	fake.publish(services, replicas)
	cps := httptest.NewServer(fake)
	t.Cleanup(cps.Close)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var cp *ControlPlane
	r := startRouterWith(t, mod, func(px *Proxy, pool *Pool) {
		cp = NewControlPlane(cps.URL, "tok", "r1", pool, px.Load, slog.New(slog.DiscardHandler))
		if reportEvery > 0 {
			cp.ReportEvery = reportEvery
		}
		px.ControlPlane = cp
	})
	go cp.Run(ctx)
	waitFor(t, "the first ready set", func() bool { return cp.Revision() == 1 })
	return r, fake
}

// heldRig is a router whose control plane declares testModel's service with no replica: a
// request for it is held.
func heldRig(t *testing.T, mod func(*Config)) (*rig, *fakeControlPlane) {
	t.Helper()
	return cpRig(t, mod, 0, []fleet.Service{{Name: "svc", Models: []string{testModel}}}, nil)
}

// A request held through a cold start longer than the connection's read_timeout is
// answered by the replica once it is ready. fasthttp leaves read_timeout armed through the
// handler; the check for a departed client took the deadline for the client leaving and
// returned an empty 200 (counted client_gone) as soon as the hold outlived it.
func TestHeldPastReadTimeoutIsAnswered(t *testing.T) {
	r, fake := heldRig(t, func(c *Config) { c.ReadTimeout = 500 * time.Millisecond })
	type result struct {
		code int
		body string
	}
	done := make(chan result, 1)
	go func() {
		resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""))
		done <- result{resp.StatusCode, body}
	}()
	waitFor(t, "the request to be held", func() bool { return r.px.held.Load() == 1 })
	// The replica becomes ready three read_timeouts later.
	select {
	case res := <-done:
		t.Fatalf("answered while no replica existed: %d %q", res.code, res.body)
	case <-time.After(1500 * time.Millisecond):
	}
	s := startSim(t, simOpts{echo: true})
	fake.publish(fake.set.Services, []fleet.Replica{replica("a", s, fleet.Reserved, 0)})
	select {
	case res := <-done:
		if res.code != 200 || !strings.Contains(res.body, `"choices"`) {
			t.Fatalf("held request: %d %q; want 200 with the replica's answer", res.code, res.body)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("held request not answered after a replica was published")
	}
	if got := r.counter(t, "arbiter_router_errors_total", "reason", "client_gone"); got != 0 {
		t.Errorf("client_gone counted %v times; the client never left", got)
	}
}

// A hold that runs out is a 503 with Retry-After, which clients retry (the OpenAI SDKs
// honour Retry-After on 503), never an empty answer.
func TestHoldThatRunsOutIs503WithRetryAfter(t *testing.T) {
	r, _ := heldRig(t, func(c *Config) {
		c.ReadTimeout = 300 * time.Millisecond
		c.RequestTimeout = time.Second
	})
	start := time.Now()
	resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""))
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("hold ran out: %d Retry-After %q %s; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	var e struct {
		Error struct{ Message, Type string }
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || !strings.Contains(e.Error.Message, "starting") {
		t.Fatalf("body %q: want an OpenAI error saying the model is starting", body)
	}
	if took := time.Since(start); took < time.Second || took > 10*time.Second {
		t.Fatalf("answered after %v; want the 1 s hold", took)
	}
	if n := r.px.held.Load(); n != 0 {
		t.Fatalf("held count %d after the request ended", n)
	}
	// Counted under its service, so an operator can tell which service is failing.
	if got := r.counter(t, "arbiter_router_errors_total", "reason", "hold_deadline", "service", "svc"); got != 1 {
		t.Errorf("errors_total{reason=hold_deadline,service=svc} = %v; want 1", got)
	}
}

// A stream that outlasts request_timeout, chunks arriving all along, runs to its end:
// request_timeout bounds the wait for a replica to take the request, not the answer.
func TestStreamOutlastingRequestTimeoutCompletes(t *testing.T) {
	s := startSim(t, simOpts{echo: true, interval: 100 * time.Millisecond})
	r := startRouter(t, func(c *Config) {
		c.RequestTimeout = time.Second
		c.StreamIdleTimeout = time.Second
	}, replica("a", s, fleet.Reserved, 0))
	body := `{"model":"` + testModel + `","messages":[{"role":"user","content":"hello"}],"max_tokens":30,"stream":true}`
	start := time.Now()
	resp, out := post(t, r.url+"/v1/chat/completions", body)
	took := time.Since(start)
	if resp.StatusCode != 200 || !strings.Contains(out, "data: [DONE]") || strings.Contains(out, `"error"`) {
		t.Fatalf("stream: %d after %v:\n%s", resp.StatusCode, took, out)
	}
	if took < 2*time.Second {
		t.Fatalf("the stream took %v; the test needs one longer than request_timeout (1 s)", took)
	}
}

// A client's own deadline still bounds its stream.
func TestClientDeadlineEndsAStream(t *testing.T) {
	s := startSim(t, simOpts{echo: true, interval: 100 * time.Millisecond})
	r := startRouter(t, nil, replica("a", s, fleet.Reserved, 0))
	body := `{"model":"` + testModel + `","messages":[{"role":"user","content":"hello"}],"max_tokens":100,"stream":true}`
	start := time.Now()
	resp, out := post(t, r.url+"/v1/chat/completions", body, "X-Arbiter-Deadline-Ms", "1000")
	if took := time.Since(start); resp.StatusCode != 200 || !strings.Contains(out, `"error"`) || took > 5*time.Second {
		t.Fatalf("stream with a 1 s client deadline: %d after %v:\n%s", resp.StatusCode, took, out)
	}
}

// A whole (non-streamed) response comes only when its generation is done. One that takes
// three first-byte timeouts, with the replica's engine progressing all along, is waited
// for; the wait used to cut it at first_byte_timeout whatever the engine was doing.
func TestLongWholeResponseIsWaitedForWhileItProgresses(t *testing.T) {
	s := startSim(t, simOpts{})
	r := startRouter(t, func(c *Config) {
		c.FirstByteTimeout = time.Second
		c.FirstByteSLOMultiple = 0
		c.ScrapeInterval = 50 * time.Millisecond
	}, replica("a", s, fleet.Reserved, 0))
	// The measured H100 profile decodes an 8B model at about 7 ms a token alone: 600
	// tokens take over 3 s.
	body := `{"model":"` + testModel + `","messages":[{"role":"user","content":"hello"}],"max_tokens":600,"ignore_eos":true}`
	start := time.Now()
	resp, out := post(t, r.url+"/v1/chat/completions", body)
	took := time.Since(start)
	if resp.StatusCode != 200 || !strings.Contains(out, `"completion_tokens":600`) {
		t.Fatalf("whole response after %v: %d %s", took, resp.StatusCode, out)
	}
	if took < 2*time.Second {
		t.Fatalf("the generation took %v; the test needs one longer than first_byte_timeout (1 s)", took)
	}
	if got := r.counter(t, "arbiter_router_first_byte_extensions_total"); got < 1 {
		t.Errorf("first_byte_extensions_total %v; want ≥ 1", got)
	}
}

// While a replica's engine generates, the router's load reports say it progresses, so a
// drain waits for its requests instead of cutting them at the drain timeout.
func TestLoadReportsSayWhichReplicasProgress(t *testing.T) {
	s := startSim(t, simOpts{})
	r, fake := cpRig(t, nil, 100*time.Millisecond, []fleet.Service{{Name: "svc", Models: []string{testModel}}}, []fleet.Replica{replica("a", s, fleet.Reserved, 0)})
	progressing := func(inflight int) bool {
		fake.mu.Lock()
		defer fake.mu.Unlock()
		for _, rep := range fake.reports {
			for _, l := range rep.Replicas {
				if l.ReplicaID == "a" && l.InFlight == inflight && l.Progressing {
					return true
				}
			}
		}
		return false
	}
	if progressing(0) {
		t.Fatal("an idle replica reported progressing")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		post(t, r.url+"/v1/chat/completions", `{"model":"`+testModel+`","messages":[{"role":"user","content":"hello"}],"max_tokens":400,"ignore_eos":true}`)
	}()
	waitFor(t, "a report of the replica progressing with the request in flight", func() bool { return progressing(1) })
	<-done
}

// vLLM sends a stream's header at once and its first chunk after the prompt's prefill,
// which for a long prompt is far longer than a gap between tokens. This replica does the
// same, prefilling for 2.5 s: with stream_idle_timeout at 1 s the first token is still
// waited for (first_byte_slo_multiple × the 1 s TTFT target = 4 s), the gaps after it are
// not. Before, the prefill was cut at the idle timeout as a stalled stream.
func TestLongPrefillAfterTheStreamHeaderIsWaitedFor(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return // probes
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush() // the header now, as Starlette's StreamingResponse sends it
		stall := r.Header.Get("X-Test-Stall") == "1"
		prefill := 2500 * time.Millisecond
		if stall {
			prefill = 10 * time.Second
		}
		select {
		case <-time.After(prefill):
		case <-r.Context().Done():
			return
		}
		if stall {
			<-r.Context().Done() // the first token comes, then nothing
		}
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"},\"finish_reason\":null}]}\n\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	r := startRouter(t, func(c *Config) {
		c.StreamIdleTimeout = time.Second
		c.SLOs = map[string]SLO{"*": {TTFT: 1}}
	}, fleet.Replica{ID: "v", Address: ln.Addr().String(), Model: testModel, Capacity: fleet.Reserved})
	resp, out := post(t, r.url+"/v1/chat/completions", chatBody(true, ""))
	if resp.StatusCode != 200 || !strings.Contains(out, "t2") || strings.Contains(out, `"error"`) {
		t.Fatalf("a 2.5 s prefill after the header: %d\n%s", resp.StatusCode, out)
	}
	// A replica that stops after its header is still let go: within the 4 s first-token wait.
	start := time.Now()
	resp, out = post(t, r.url+"/v1/chat/completions", chatBody(true, ""), "X-Test-Stall", "1")
	if took := time.Since(start); !strings.Contains(out, "stalled") || took > 8*time.Second {
		t.Fatalf("a replica silent after its header: %d after %v\n%s", resp.StatusCode, took, out)
	}
}
