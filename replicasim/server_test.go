package replicasim

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
)

func start(t *testing.T, echo bool) (*Server, string) {
	t.Helper()
	s, ln := newServer(t, echo)
	return s, serve(t, s, ln)
}

// newServer builds a server (the H100 8B profile unless echo) and a loopback listener for
// it, neither started.
func newServer(t *testing.T, echo bool) (*Server, net.Listener) {
	t.Helper()
	cfg := Config{Model: "m", Echo: echo, Logger: slog.New(slog.DiscardHandler), Exit: func(int) {}}
	if !echo {
		p, err := engine.LoadProfile("h100-llama-3.1-8b")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Profile = p
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return s, ln
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestHealthFollowsLoadingAndAdmin(t *testing.T) {
	s, url := start(t, true)
	s.SetReadyAt(time.Now().Add(time.Hour))
	if code, _ := get(t, url+"/health"); code != 503 {
		t.Fatalf("loading replica /health = %d, want 503", code)
	}
	s.SetReadyAt(time.Time{})
	if code, _ := get(t, url+"/health"); code != 200 {
		t.Fatalf("ready replica /health = %d", code)
	}
	post(t, url+"/admin/health", `{"healthy":false}`)
	if code, _ := get(t, url+"/health"); code != 503 {
		t.Fatalf("unhealthy replica /health = %d", code)
	}
}

func TestMetricsUseVLLMNames(t *testing.T) {
	_, url := start(t, false)
	if code, out := post(t, url+"/v1/completions", `{"model":"m","prompt":"hello","max_tokens":3}`); code != 200 || !strings.Contains(out, `"completion_tokens":3`) {
		t.Fatalf("completion: %d %s", code, out)
	}
	_, text := get(t, url+"/metrics")
	for _, name := range []string{
		"vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{",
		"vllm:time_to_first_token_seconds_bucket{", "vllm:inter_token_latency_seconds_bucket{", "vllm:e2e_request_latency_seconds_bucket{",
		"vllm:prompt_tokens_total{", "vllm:generation_tokens_total{", "vllm:prefix_cache_queries_total{", "vllm:prefix_cache_hits_total{",
		`model_name="m"`, "# TYPE vllm:num_requests_running gauge", "# TYPE vllm:prompt_tokens_total counter",
	} {
		if !strings.Contains(text, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	// The request's mean time per output token, observed once when it ends: its 2 gaps.
	if n, sum := metricValue(t, text, "vllm:request_time_per_output_token_seconds_count"), metricValue(t, text, "vllm:request_time_per_output_token_seconds_sum"); n != 1 || !(sum > 0) {
		t.Errorf("vllm:request_time_per_output_token_seconds count %v sum %v; want one request's mean TPOT", n, sum)
	}
}

func TestPrefixCacheHitsThroughTheAPI(t *testing.T) {
	s, url := start(t, false)
	long := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 200)
	body := `{"model":"m","messages":[{"role":"user","content":"` + long + `"}],"max_tokens":1}`
	t0 := time.Now()
	post(t, url+"/v1/chat/completions", body)
	cold := time.Since(t0)
	t0 = time.Now()
	post(t, url+"/v1/chat/completions", body)
	warm := time.Since(t0)
	if st := s.engineStats(); st.PrefixHits == 0 {
		t.Fatalf("no prefix hits after a repeated prompt: %+v", st)
	}
	if warm >= cold {
		t.Errorf("repeated prompt took %v, first %v: the prefix cache saved nothing", warm, cold)
	}
}

func TestErrorsAndFaults(t *testing.T) {
	s, url := start(t, true)
	if code, out := post(t, url+"/v1/chat/completions", `{"model":"x","messages":[{"role":"user","content":"a"}]}`); code != 404 || !strings.Contains(out, "does not exist") {
		t.Fatalf("unknown model: %d %s", code, out)
	}
	if err := s.SetFault(Fault{Kind: FaultStatus, Status: 503, Count: 1}); err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","messages":[{"role":"user","content":"a"}]}`
	if code, _ := post(t, url+"/v1/chat/completions", body); code != 503 {
		t.Fatalf("status fault: %d", code)
	}
	if code, _ := post(t, url+"/v1/chat/completions", body); code != 200 {
		t.Fatalf("fault with count 1 struck twice: %d", code)
	}
	if err := s.SetFault(Fault{Kind: "melt"}); err == nil {
		t.Fatal("unknown fault accepted")
	}
	if code, _ := post(t, url+"/admin/fault", `{"kind":"reset","count":1}`); code != 200 {
		t.Fatal("admin fault endpoint refused a valid fault")
	}
	if _, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body)); err == nil {
		t.Fatal("reset fault answered")
	}
}

func TestTokenIDPromptsAreCountedAndCachedByTheirIDs(t *testing.T) {
	s, url := start(t, false)
	ids := func(first, n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(first + i))
		}
		return `{"model":"m","prompt":[` + b.String() + `],"max_tokens":1}`
	}
	if code, out := post(t, url+"/v1/completions", ids(1000, 320)); code != 200 || !strings.Contains(out, `"prompt_tokens":320,`) {
		t.Fatalf("320 token ids: %d %s; want prompt_tokens 320 (ids are the prompt, no BOS added)", code, out)
	}
	// Other ids of the same length share no block with the first prompt.
	post(t, url+"/v1/completions", ids(9000, 320))
	if st := s.engineStats(); st.PrefixHits != 0 {
		t.Fatalf("two different token-id prompts hit the prefix cache: %+v", st)
	}
	post(t, url+"/v1/completions", ids(1000, 320))
	if st := s.engineStats(); st.PrefixHits != 304 {
		t.Fatalf("the repeated token-id prompt hit %d cached tokens, want 304 (19 of its 20 blocks)", st.PrefixHits)
	}
}

// When the engine loop stops while the HTTP server still answers (vLLM's engine core died),
// /health says so with a 503, as vLLM's does, and a new request is refused with a 503
// instead of waiting for ever on an engine that will never step.
func TestHealthIsUnavailableOnceTheEngineIsDead(t *testing.T) {
	s, ln := newServer(t, false)
	serveCtx, stopServe := context.WithCancel(context.Background())
	t.Cleanup(stopServe)
	engineCtx, stopEngine := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { s.Run(engineCtx); close(stopped) }()
	go func() { _ = s.Serve(serveCtx, ln) }()
	url := "http://" + ln.Addr().String()
	if code, _ := get(t, url+"/health"); code != 200 {
		t.Fatalf("/health with the engine running = %d", code)
	}
	stopEngine()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the engine loop did not stop")
	}
	if code, _ := get(t, url+"/health"); code != 503 {
		t.Fatalf("/health with the engine dead = %d, want 503", code)
	}
	if code, out := post(t, url+"/v1/completions", `{"model":"m","prompt":"hello","max_tokens":3}`); code != 503 || !strings.Contains(out, "engine is dead") {
		t.Fatalf("a request to a dead engine: %d %s, want 503 saying so", code, out)
	}
}

// A stopped server closes what its grace left open, as a process that exits would: past
// fasthttp's shutdown deadline a connection still streaming was left served, and kept alive
// after it (a router's probe connection then found the stopped replica healthy for ever).
func TestStoppedServerClosesEveryConnection(t *testing.T) {
	s, ln := newServer(t, false)
	engineCtx, stopEngine := context.WithCancel(context.Background())
	t.Cleanup(stopEngine)
	go s.Run(engineCtx)
	serveCtx, stopServe := context.WithCancel(context.Background())
	t.Cleanup(stopServe)
	served := make(chan struct{})
	go func() { _ = s.Serve(serveCtx, ln); close(served) }()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// 4,000 tokens stream for some seconds on the H100 profile: longer than the grace.
	body := `{"model":"m","prompt":"hello","max_tokens":4000,"ignore_eos":true,"stream":true}`
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Minute))
	buf := make([]byte, 64<<10)
	var got strings.Builder
	for !strings.Contains(got.String(), "data: {") {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("before the first chunk: %v (%q)", err, got.String())
		}
		got.Write(buf[:n])
	}
	stopServe()
	<-served
	for {
		n, err := conn.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			break // closed: what a client of an exited process sees
		}
	}
	if strings.Contains(got.String(), "[DONE]") {
		t.Fatal("the stream ran to its end on a stopped server")
	}
}

// A server stopped before it got to serve does not serve afterwards: the stop found no
// listener registered yet, left it open, and the late goroutine then answered on it for ever
// (picker's TestNoReadyEndpoint saw a stopped replica healthy for its whole 10 s).
func TestServerStoppedAtOnceServesNothing(t *testing.T) {
	for i := range 20 {
		s, ln := newServer(t, true)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := s.Serve(ctx, ln); err != nil {
			t.Fatal(err)
		}
		if c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second); err == nil {
			c.Close()
			t.Fatalf("try %d: a stopped server still accepts connections", i)
		}
	}
}
