// Package replicasim is a vLLM-compatible replica without a GPU: vLLM's OpenAI API and
// /metrics, timed by the engine package's performance model, with faults on demand.
package replicasim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"github.com/valyala/fastjson"

	"github.com/arbiter-serve/arbiter/connwatch"
	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/httplog"
	"github.com/arbiter-serve/arbiter/oai"
	"github.com/arbiter-serve/arbiter/tokens"
)

// Config configures a simulated replica. Zero values mean the documented defaults.
type Config struct {
	// Model is the served model name (vLLM's --served-model-name). Required.
	Model string
	// Profile is the GPU performance model; nil requires Echo.
	Profile *engine.Profile
	// Echo answers at once with no model delay, for proxy benchmarks.
	Echo bool
	// EchoTokenInterval paces echo-mode streams (0: back to back).
	EchoTokenInterval time.Duration
	// DefaultMaxTokens is used when a request sets no max_tokens (default 64).
	DefaultMaxTokens int
	// Tokenizer counts prompt tokens (default: BPE, or approx in echo mode).
	Tokenizer tokens.Counter
	// MaxBodyBytes bounds request bodies (default 32 MiB).
	MaxBodyBytes int
	// EmbeddingDim is the length of embedding vectors (default 384).
	EmbeddingDim int
	Logger       *slog.Logger
	// Exit ends the process for the crash fault and preemption (default os.Exit).
	Exit func(code int)
}

// Server is one simulated replica.
type Server struct {
	cfg      Config
	drv      *driver // nil in echo mode
	met      *metrics
	reg      *prometheus.Registry
	metricsH fasthttp.RequestHandler
	parsers  fastjson.ParserPool
	reqSeq   atomic.Uint64
	faults   faultState
	created  int64

	mu        sync.Mutex // guards unhealthy, preemptAt, readyAt
	unhealthy bool
	preemptAt time.Time
	readyAt   time.Time // /health answers 503 before it, as a loading vLLM does
}

// New builds a server; call Run to start its engine loop and Serve to accept connections.
func New(cfg Config) (*Server, error) {
	if cfg.Model == "" {
		return nil, errors.New("model: required")
	}
	if cfg.Profile == nil && !cfg.Echo {
		return nil, errors.New("profile: required unless echo mode")
	}
	if cfg.DefaultMaxTokens <= 0 {
		cfg.DefaultMaxTokens = 64
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 32 << 20
	}
	if cfg.EmbeddingDim <= 0 {
		cfg.EmbeddingDim = 384
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Exit == nil {
		cfg.Exit = os.Exit
	}
	if cfg.Tokenizer == nil {
		if cfg.Echo {
			cfg.Tokenizer = tokens.Approx{BytesPerToken: 4}
		} else {
			bpe, err := tokens.NewBPE()
			if err != nil {
				return nil, err
			}
			cfg.Tokenizer = bpe
		}
	}
	s := &Server{cfg: cfg, reg: prometheus.NewRegistry(), created: time.Now().Unix()}
	if !cfg.Echo {
		eng, err := engine.New(*cfg.Profile)
		if err != nil {
			return nil, err
		}
		s.drv = newDriver(eng)
	}
	s.met = newMetrics(s.reg, cfg.Model, s.engineStats)
	s.metricsH = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	return s, nil
}

func (s *Server) engineStats() engine.Stats {
	if s.drv == nil {
		return engine.Stats{}
	}
	return s.drv.stats()
}

// SetReadyAt makes /health answer 503 until t.
func (s *Server) SetReadyAt(t time.Time) {
	s.mu.Lock()
	s.readyAt = t
	s.mu.Unlock()
}

// Run drives the engine until ctx ends.
func (s *Server) Run(ctx context.Context) {
	if s.drv == nil {
		<-ctx.Done()
		return
	}
	lbl := prometheus.Labels{"model_name": s.cfg.Model, "engine": "0"}
	itl := s.met.itl.With(lbl)
	s.drv.run(ctx, func(p *pending, index int, now time.Time) {
		if index > 0 {
			itl.Observe(now.Sub(p.last).Seconds())
		}
		p.last = now
	})
}

// Serve answers HTTP on ln until ctx ends. Like vLLM's server it closes connections idle
// for 5 s, which is what a proxy's connection pool must survive.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &fasthttp.Server{
		Handler:                       s.Handle,
		Logger:                        httplog.Fasthttp{L: s.cfg.Logger},
		Name:                          "uvicorn",
		IdleTimeout:                   5 * time.Second,
		MaxRequestBodySize:            s.cfg.MaxBodyBytes,
		DisableHeaderNamesNormalizing: false,
		NoDefaultDate:                 false,
		Concurrency:                   1 << 20,
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.ShutdownWithContext(sctx)
		return nil
	}
}

// Handle routes one request.
func (s *Server) Handle(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
	switch path {
	case "/health":
		s.health(ctx)
	case "/metrics":
		s.metricsH(ctx)
	case "/v1/models":
		s.models(ctx)
	case "/v1/chat/completions":
		s.generate(ctx, oai.Chat)
	case "/v1/completions":
		s.generate(ctx, oai.Completion)
	case "/v1/embeddings":
		s.embed(ctx)
	case "/admin/fault", "/admin/health", "/admin/preempt", "/admin/preemption":
		s.admin(ctx, path)
	default:
		oai.WriteError(ctx, fasthttp.StatusNotFound, oai.NotFound, "Not Found")
	}
}

func (s *Server) health(ctx *fasthttp.RequestCtx) {
	s.mu.Lock()
	notReady := s.unhealthy || time.Now().Before(s.readyAt)
	s.mu.Unlock()
	if notReady {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
}

func (s *Server) models(ctx *fasthttp.RequestCtx) {
	maxLen := 0
	if s.drv != nil {
		maxLen = s.drv.eng.MaxContext()
	}
	ctx.SetContentType("application/json")
	fmt.Fprintf(ctx, `{"object":"list","data":[{"id":%q,"object":"model","created":%d,"owned_by":"vllm","root":%q,"parent":null,"max_model_len":%d}]}`,
		s.cfg.Model, s.created, s.cfg.Model, maxLen)
}

// promptTokens counts what the engine will prefill: the text plus the chat template's
// framing (Llama 3: BOS, a header per message, the assistant header), and returns the
// chained hashes of its full KV blocks for prefix caching.
func (s *Server) promptTokens(r *oai.Request) (int, []uint64) {
	ids := s.cfg.Tokenizer.Encode(nil, r.Prompt)
	n := len(ids)
	if len(r.TokenIDs) > 0 {
		ids = append(ids, r.TokenIDs...) // ids are the prompt as is: no BOS is added
	} else {
		n++ // BOS
	}
	n += len(r.TokenIDs)
	if r.Kind == oai.Chat {
		n += 5*r.Messages + 4
	}
	if s.drv == nil {
		return n, nil
	}
	bs := s.drv.eng.Profile().BlockSize
	hashes := make([]uint64, 0, len(ids)/bs)
	var buf [8]byte
	var prev uint64
	for i := 0; i+bs <= len(ids); i += bs {
		d := xxhash.New()
		binary.LittleEndian.PutUint64(buf[:], prev)
		_, _ = d.Write(buf[:])
		for _, id := range ids[i : i+bs] {
			binary.LittleEndian.PutUint64(buf[:], uint64(id))
			_, _ = d.Write(buf[:])
		}
		prev = d.Sum64()
		hashes = append(hashes, prev)
	}
	return n, hashes
}

func (s *Server) parse(ctx *fasthttp.RequestCtx, kind oai.Kind) (oai.Request, bool) {
	if !ctx.IsPost() {
		oai.WriteError(ctx, fasthttp.StatusMethodNotAllowed, oai.InvalidRequest, "Method Not Allowed")
		return oai.Request{}, false
	}
	p := s.parsers.Get()
	req, err := oai.Parse(p, ctx.PostBody(), kind)
	s.parsers.Put(p)
	if err != nil {
		oai.WriteError(ctx, fasthttp.StatusBadRequest, oai.InvalidRequest, err.Error())
		return req, false
	}
	if req.Model == "" {
		req.Model = s.cfg.Model // vLLM serves its model to a request that names none
	}
	if req.Model != s.cfg.Model {
		oai.WriteError(ctx, fasthttp.StatusNotFound, oai.NotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return req, false
	}
	return req, true
}

func (s *Server) generate(ctx *fasthttp.RequestCtx, kind oai.Kind) {
	req, ok := s.parse(ctx, kind)
	if !ok {
		return
	}
	f := s.faults.take()
	if s.preFault(ctx, f) {
		return
	}
	promptN, hashes := s.promptTokens(&req)
	maxTokens := req.MaxTokens
	finish := "length"
	if maxTokens == 0 {
		maxTokens, finish = s.cfg.DefaultMaxTokens, "stop"
	}
	g := &generation{
		srv: s, kind: kind, model: req.Model, id: s.reqSeq.Add(1), created: time.Now().Unix(),
		prompt: promptN, max: maxTokens, finish: finish, usage: req.IncludeUsage, fault: f,
		start: time.Now(), conn: ctx.Conn(),
	}
	if s.drv != nil {
		id, p, err := s.drv.submit(engine.Request{PromptTokens: promptN, MaxTokens: maxTokens, BlockHashes: hashes})
		if err != nil {
			oai.WriteError(ctx, fasthttp.StatusBadRequest, oai.InvalidRequest,
				fmt.Sprintf("This model's maximum context length is %d tokens: %v", s.drv.eng.MaxContext(), err))
			return
		}
		g.engineID, g.p = id, p
	}
	if req.Stream {
		ctx.SetContentType("text/event-stream; charset=utf-8")
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		ctx.SetBodyStreamWriter(g.stream)
		return
	}
	if !g.wait(g.max) {
		return // client gone; nothing to answer
	}
	if f.Kind == FaultDieMidStream || f.Kind == FaultCrash {
		s.die(ctx.Conn(), f)
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(g.appendResponse(nil))
	g.account()
}

// embed answers /v1/embeddings with deterministic unit vectors derived from the input.
func (s *Server) embed(ctx *fasthttp.RequestCtx) {
	req, ok := s.parse(ctx, oai.Embedding)
	if !ok {
		return
	}
	if s.preFault(ctx, s.faults.take()) {
		return
	}
	n, _ := s.promptTokens(&req)
	if s.cfg.Profile != nil && !s.cfg.Echo {
		time.Sleep(time.Duration(s.cfg.Profile.PrefillMs(n, 0) * float64(time.Millisecond)))
	}
	b := make([]byte, 0, 64+s.cfg.EmbeddingDim*12)
	b = append(b, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[`...)
	seed := xxhash.Sum64String(req.Prompt)
	norm := math.Sqrt(float64(s.cfg.EmbeddingDim))
	for i := range s.cfg.EmbeddingDim {
		if i > 0 {
			b = append(b, ',')
		}
		x := xxhash.Sum64(binary.LittleEndian.AppendUint64(nil, seed+uint64(i)))
		v := (float64(x%2000)/1000 - 1) / norm
		b = strconv.AppendFloat(b, v, 'f', 6, 64)
	}
	b = fmt.Appendf(b, `]}],"model":%q,"usage":{"prompt_tokens":%d,"total_tokens":%d}}`, req.Model, n, n)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
	lbl := prometheus.Labels{"model_name": s.cfg.Model, "engine": "0"}
	s.met.promptTokens.With(lbl).Add(float64(n))
}

// clientGone reports whether the connection's peer hung up.
func clientGone(c net.Conn) bool { return c != nil && connwatch.PeerClosed(c) }
