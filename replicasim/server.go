// Package replicasim is a vLLM-compatible replica without a GPU: vLLM's OpenAI API and
// /metrics, timed by the engine package's performance model, with faults on demand.
package replicasim

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"github.com/valyala/fastjson"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/internal/conn/connwatch"
	"github.com/arbiter-serve/arbiter/internal/httplog"
	"github.com/arbiter-serve/arbiter/internal/text/tokens"
	"github.com/arbiter-serve/arbiter/oai"
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
	// StopAfter is where the simulated model's output ends (finish_reason "stop", as at an
	// end-of-sequence token) when a request sets no max_tokens (default 64). vLLM's limit
	// then is the rest of the context, which the simulator also enforces.
	StopAfter int
	// Tokenizer counts prompt tokens (default: BPE, or approx in echo mode).
	Tokenizer tokens.Counter
	// MaxBodyBytes bounds request bodies (default 32 MiB).
	MaxBodyBytes int
	// PromptTokensDetails adds prompt_tokens_details.cached_tokens (the prompt tokens its
	// prefix cache served) to usage, as vLLM's --enable-prompt-tokens-details does
	// (vllm/entrypoints/openai/serving_completion.py and serving_chat.py, 0.11).
	PromptTokensDetails bool
	// StoreResponses keeps Responses API answers for previous_response_id and
	// GET /v1/responses/{id}, as vLLM does with VLLM_ENABLE_RESPONSES_API_STORE=1 (which
	// the simulator honours too); off, as vLLM's default.
	StoreResponses bool
	// EmbeddingDim is the length of embedding vectors (default 384).
	EmbeddingDim int
	// Task is what the model serves, as vLLM's --task (TaskNames; default generate): the
	// endpoints of other tasks answer vLLM's 400 "The model does not support … API".
	Task string
	// LoRA serves adapters on the model, as vLLM's --enable-lora; nil: none (a request
	// naming an adapter is then a 404, the load endpoints too).
	LoRA *LoRAConfig
	// PriorityScheduling orders the engine's queue by each request's priority field, as
	// vLLM's --scheduling-policy priority does (engine.SetPriorityScheduling); off (fcfs,
	// vLLM's default), a request with a priority other than 0 is refused as vLLM refuses it.
	PriorityScheduling bool
	Logger             *slog.Logger
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
	// responses are the stored Responses API answers (responses.go).
	responses responseStore
	// wordIDs are the simulated output's tokens (words), as the tokenizer numbers them.
	wordIDs [len(words)]int
	lora    *loras // nil without Config.LoRA

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
	if cfg.StopAfter <= 0 {
		cfg.StopAfter = 64
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 32 << 20
	}
	if cfg.EmbeddingDim <= 0 {
		cfg.EmbeddingDim = 384
	}
	if cfg.Task != "" && !slices.Contains(TaskNames, cfg.Task) {
		return nil, fmt.Errorf("task %q: want one of %v", cfg.Task, TaskNames)
	}
	if cfg.LoRA != nil {
		if err := cfg.LoRA.validate(); err != nil {
			return nil, err
		}
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
	for i, w := range words {
		// One token each in Llama 3's and cl100k's vocabularies; the approx counter may split.
		s.wordIDs[i] = cfg.Tokenizer.Encode(nil, w)[0]
	}
	var eng *engine.Engine
	if !cfg.Echo {
		var err error
		if eng, err = engine.New(*cfg.Profile); err != nil {
			return nil, err
		}
		if cfg.PriorityScheduling {
			if err = eng.SetPriorityScheduling(); err != nil {
				return nil, err
			}
		}
	}
	maxLen, prof := echoMaxModelLen, (*engine.Profile)(nil)
	if eng != nil {
		maxLen, prof = eng.MaxContext(), cfg.Profile
	}
	s.met = newMetrics(s.reg, cfg.Model, maxLen, cacheInfo(prof), s.engineStats)
	if eng != nil {
		s.drv = newDriver(eng, s.met)
	}
	if cfg.LoRA != nil {
		if err := s.startLoRA(eng); err != nil {
			return nil, err
		}
	}
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
	s.drv.run(ctx)
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
		// A stopping server says Connection: close on what it still answers.
		CloseOnShutdown: true,
	}
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	srv.ConnState = func(c net.Conn, st fasthttp.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch st {
		case fasthttp.StateNew:
			conns[c] = struct{}{}
		case fasthttp.StateClosed, fasthttp.StateHijacked:
			delete(conns, c)
		}
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
		// The listener closes here too: a Shutdown that ran before the goroutine above reached
		// srv.Serve found no listener to close, and the server then served for ever.
		_ = ln.Close()
		<-done
		// Whatever the grace left open closes now, as it would when a process exits: past its
		// deadline fasthttp leaves open connections served, so a client that kept one (a
		// router's probes every 50 ms) would find the stopped replica answering for ever.
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		return nil
	}
}

// Handle routes one request.
func (s *Server) Handle(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
	switch path {
	case "/health", "/ping": // vLLM's /ping (GET or POST) is its /health, for SageMaker
		s.health(ctx)
	case "/version":
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"version":"` + vllmVersion + `"}`)
	case "/tokenize":
		s.tokenize(ctx)
	case "/detokenize":
		s.detokenize(ctx)
	case "/metrics":
		s.metricsH(ctx)
	case "/v1/models":
		s.models(ctx)
	case "/v1/chat/completions":
		if s.supports(ctx, "generate", "Chat Completions API") {
			s.generate(ctx, oai.Chat)
		}
	case "/v1/completions":
		if s.supports(ctx, "generate", "Completions API") {
			s.generate(ctx, oai.Completion)
		}
	case "/v1/embeddings":
		if s.supports(ctx, "embeddings", "Embeddings API") {
			s.embed(ctx)
		}
	case "/v1/responses":
		if s.supports(ctx, "generate", "Responses API") {
			s.generate(ctx, oai.Responses)
		}
	case "/rerank", "/v1/rerank", "/v2/rerank":
		s.rerank(ctx)
	case "/score", "/v1/score":
		s.score(ctx)
	case "/classify":
		s.classify(ctx)
	case "/pooling":
		s.pooling(ctx)
	case "/v1/audio/transcriptions":
		s.transcribe(ctx, false)
	case "/v1/audio/translations":
		s.transcribe(ctx, true)
	case "/admin/fault", "/admin/health", "/admin/preempt", "/admin/preemption":
		s.admin(ctx, path)
	case "/v1/load_lora_adapter", "/v1/unload_lora_adapter":
		if s.lora == nil || !s.lora.cfg.RuntimeUpdates {
			// vLLM registers them only with VLLM_ALLOW_RUNTIME_LORA_UPDATING: FastAPI's 404.
			ctx.SetStatusCode(fasthttp.StatusNotFound)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"detail":"Not Found"}`)
		} else if path == "/v1/load_lora_adapter" {
			s.loadAdapterHTTP(ctx)
		} else {
			s.unloadAdapterHTTP(ctx)
		}
	default:
		if strings.HasPrefix(path, "/v1/responses/") {
			s.storedResponseGet(ctx, path)
			return
		}
		oai.WriteError(ctx, fasthttp.StatusNotFound, oai.NotFound, "Not Found")
	}
}

func (s *Server) health(ctx *fasthttp.RequestCtx) {
	s.mu.Lock()
	notReady := s.unhealthy || time.Now().Before(s.readyAt) || (s.drv != nil && s.drv.dead.Load())
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
	fmt.Fprintf(ctx, `{"object":"list","data":[{"id":%q,"object":"model","created":%d,"owned_by":"vllm","root":%q,"parent":null,"max_model_len":%d}`,
		s.cfg.Model, s.created, s.cfg.Model, maxLen)
	if s.lora != nil {
		// vLLM's cards for adapters, in load order (serving_models.py show_available_models):
		// root the path it was loaded from, parent the base, no max_model_len.
		now := time.Now().Unix()
		for _, a := range s.lora.list() {
			fmt.Fprintf(ctx, `,{"id":%q,"object":"model","created":%d,"owned_by":"vllm","root":%q,"parent":%q,"max_model_len":null}`, a.name, now, a.path, a.parent)
		}
	}
	ctx.WriteString("]}")
}

// Llama 3's special tokens, as its tokenizer numbers them.
const (
	bosID         = 128000 // <|begin_of_text|>
	startHeaderID = 128006 // <|start_header_id|>
	endHeaderID   = 128007 // <|end_header_id|>
	eotID         = 128009 // <|eot_id|>
	doubleNLID    = 271    // "\n\n" after each header
)

// promptIDs is the prompt the engine prefills, as token ids: BOS and the text's tokens, or the
// client's ids as they are (vLLM adds nothing to a token prompt). A chat (v its parsed body)
// is rendered in Llama 3's template order: per message a header with its role, the content
// and an end-of-turn, then the assistant header; so a conversation's next turn repeats the
// last turn's prompt and answer token for token, as it does on a real Llama 3 server.
func (s *Server) promptIDs(r *oai.Request, v *fastjson.Value) []int {
	if len(r.TokenIDs) > 0 && r.Prompt == "" {
		return append([]int(nil), r.TokenIDs...)
	}
	ids := append(make([]int, 0, len(r.Prompt)/3+8+6*r.Messages), bosID)
	if r.Kind != oai.Chat || v == nil {
		ids = s.cfg.Tokenizer.Encode(ids, r.Prompt)
		return append(ids, r.TokenIDs...)
	}
	for _, m := range v.GetArray("messages") {
		ids = append(ids, startHeaderID)
		ids = s.cfg.Tokenizer.Encode(ids, string(m.GetStringBytes("role")))
		ids = append(ids, endHeaderID, doubleNLID)
		ids = s.cfg.Tokenizer.Encode(ids, contentText(m.Get("content"), ""))
		ids = append(ids, eotID)
	}
	return append(ids, startHeaderID, 78191 /* "assistant" */, endHeaderID, doubleNLID)
}

// blockHashes returns the chained hashes of the full KV blocks of a prompt's ids followed by
// the first gen-1 tokens of its answer (the last token's KV is never computed), by which the
// engine finds cached prefixes: vLLM hashes each full block with its parent's hash
// (vllm/v1/core/kv_cache_utils.py hash_block_tokens) and caches an answer's blocks as they
// fill. A cache_salt enters the first block's hash, so the whole chain
// (generate_block_hash_extra_keys). nil without an engine.
func (s *Server) blockHashes(ids []int, gen int, salt string) []uint64 {
	if s.drv == nil {
		return nil
	}
	for i := range max(gen-1, 0) {
		ids = append(ids, s.wordIDs[i%len(words)])
	}
	bs := s.drv.eng.Profile().BlockSize
	hashes := make([]uint64, 0, len(ids)/bs)
	var buf [8]byte
	var prev uint64
	if salt != "" {
		prev = xxhash.Sum64String(salt)
	}
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
	return hashes
}

// tokenize answers vLLM's /tokenize (vllm/entrypoints/openai/serving_tokenization.py): a
// completion-style {"prompt"} or chat-style {"messages"} body, counted exactly as a
// generation request with the same prompt is.
func (s *Server) tokenize(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		vllmError(ctx, fasthttp.StatusMethodNotAllowed, "Method Not Allowed")
		return
	}
	jp := s.parsers.Get()
	defer s.parsers.Put(jp)
	v, err := oai.ParseJSON(jp, ctx.PostBody())
	if err != nil {
		vllmError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	kind := oai.Completion
	if v.Exists("messages") {
		kind = oai.Chat
	}
	req, ok := s.request(ctx, v, kind)
	if !ok {
		return
	}
	addSpecial := v.Get("add_special_tokens") == nil || v.GetBool("add_special_tokens")
	withStrs := v.GetBool("return_token_strs")
	ids := s.promptIDs(&req, v)
	if !addSpecial && len(ids) > 0 && ids[0] == bosID && len(req.TokenIDs) == 0 {
		ids = ids[1:]
	}
	b := fmt.Appendf(nil, `{"count":%d,"max_model_len":%d,"tokens":[`, len(ids), s.maxModelLen())
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	b = append(b, `],"token_strs":`...)
	dec, canDecode := s.cfg.Tokenizer.(decoder)
	if withStrs && canDecode {
		b = append(b, '[')
		for i, id := range ids {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendQuote(b, dec.Decode([]int{id}))
		}
		b = append(b, ']')
	} else {
		b = append(b, "null"...)
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(append(b, '}'))
}

// detokenize answers vLLM's /detokenize: {"tokens":[ids]} to {"prompt": text}.
func (s *Server) detokenize(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		vllmError(ctx, fasthttp.StatusMethodNotAllowed, "Method Not Allowed")
		return
	}
	jp := s.parsers.Get()
	defer s.parsers.Put(jp)
	v, err := jp.ParseBytes(ctx.PostBody())
	if err != nil {
		vllmError(ctx, fasthttp.StatusBadRequest, "body is not valid JSON: "+err.Error())
		return
	}
	var ids []int
	if err := appendTokenList(&ids, v.Get("tokens")); err != nil {
		vllmError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	dec, ok := s.cfg.Tokenizer.(decoder)
	if !ok {
		vllmError(ctx, fasthttp.StatusNotImplemented, "this replica counts tokens approximately (-tokenizer approx) and cannot detokenize")
		return
	}
	b := append([]byte(`{"prompt":`), strconv.Quote(dec.Decode(ids))...)
	ctx.SetContentType("application/json")
	ctx.SetBody(append(b, '}'))
}

func appendTokenList(ids *[]int, v *fastjson.Value) error {
	arr, err := v.Array()
	if err != nil {
		return errors.New("'tokens' is required and must be an array of token ids")
	}
	for i, x := range arr {
		n, err := x.Int()
		if err != nil || n < 0 || n >= vocabSize {
			return fmt.Errorf("'tokens[%d]' must be a token id from 0 to %d", i, vocabSize-1)
		}
		*ids = append(*ids, n)
	}
	return nil
}

// maxModelLen is vLLM's max_model_len: the profile's context bounded by the KV cache, or in
// echo mode (no profile) the 131,072 tokens of the Llama 3 models.
func (s *Server) maxModelLen() int {
	if s.drv != nil {
		return s.drv.eng.MaxContext()
	}
	return echoMaxModelLen
}

// echoMaxModelLen is the context of the Llama 3 models, for echo mode (no profile).
const echoMaxModelLen = 131072

// decoder is a token counter that can also turn ids back into text (tokens.BPE; the approx
// counter has no vocabulary).
type decoder interface{ Decode([]int) string }

// promptText is the prompt as text: what the client sent, or its token ids decoded.
func (s *Server) promptText(r *oai.Request) string {
	if len(r.TokenIDs) == 0 {
		return r.Prompt
	}
	if d, ok := s.cfg.Tokenizer.(decoder); ok {
		return d.Decode(r.TokenIDs)
	}
	return strings.Repeat("<tok>", len(r.TokenIDs)) // the approx counter has no vocabulary
}

// parse reads a request body with p, which the caller holds while it uses the returned JSON
// value (for the fields oai.Request does not keep); on failure it has answered the client.
func (s *Server) parse(ctx *fasthttp.RequestCtx, p *fastjson.Parser, kind oai.Kind) (oai.Request, *fastjson.Value, bool) {
	if !ctx.IsPost() {
		oai.WriteError(ctx, fasthttp.StatusMethodNotAllowed, oai.InvalidRequest, "Method Not Allowed")
		return oai.Request{}, nil, false
	}
	v, err := oai.ParseJSON(p, ctx.PostBody())
	if err != nil {
		vllmError(ctx, fasthttp.StatusBadRequest, err.Error())
		return oai.Request{}, nil, false
	}
	req, ok := s.request(ctx, v, kind)
	return req, v, ok
}

// request reads the request for kind from a parsed body and checks its model; on failure it
// has answered the client.
func (s *Server) request(ctx *fasthttp.RequestCtx, v *fastjson.Value, kind oai.Kind) (oai.Request, bool) {
	req, err := oai.FromValue(v, kind)
	if err != nil {
		vllmError(ctx, fasthttp.StatusBadRequest, err.Error())
		return req, false
	}
	if req.Model == "" {
		// vLLM serves its model to a request that names none
		// (vllm/entrypoints/openai/serving_engine.py _is_model_supported, 0.11.0).
		req.Model = s.cfg.Model
	}
	if req.Model != s.cfg.Model && (s.lora == nil || s.lora.get(req.Model) == nil) {
		vllmError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return req, false
	}
	return req, true
}

func (s *Server) generate(ctx *fasthttp.RequestCtx, kind oai.Kind) {
	jp := s.parsers.Get()
	defer s.parsers.Put(jp)
	req, v, ok := s.parse(ctx, jp, kind)
	if !ok {
		return
	}
	sp, err := parseSampling(v, kind)
	if err != nil {
		vllmError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if req.MaxTokensSet && req.MaxTokens < 1 {
		vllmError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("max_tokens must be at least 1, got %d.", req.MaxTokens))
		return
	}
	priority, err := s.priority(v)
	if err != nil {
		vllmError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	f := s.faults.take()
	if s.preFault(ctx, f) {
		return
	}
	var rr *responsesRequest
	if kind == oai.Responses {
		if rr, ok = s.responsesFields(ctx, v, &req); !ok {
			return
		}
	}
	ids := s.promptIDs(&req, v)
	if rr != nil && rr.prevTokens > 0 {
		// vLLM prefills the stored conversation again ahead of the new input.
		// Its tokens stand for the stored conversation: the same for every continuation
		// of it (so they hit the prefix cache as a real continuation does), no other's.
		prev := make([]int, rr.prevTokens, rr.prevTokens+len(ids))
		seed := xxhash.Sum64String(rr.previous)
		for i := range prev {
			prev[i] = int((seed + uint64(i)*0x9E3779B97F4A7C15) % vocabSize)
		}
		ids = append(prev, ids...)
	}
	promptN := len(ids)
	// vLLM's checks and default (vllm/entrypoints/openai/serving_engine.py _validate_input;
	// vllm/entrypoints/utils.py get_max_tokens): the prompt must leave room for one token,
	// max_tokens must fit in what is left, and without max_tokens the limit is the rest of
	// the context. The simulated model has no end-of-sequence token, so without max_tokens
	// it stops after StopAfter tokens, as a real model stops at its own.
	maxLen := s.maxModelLen()
	if promptN >= maxLen {
		vllmError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", maxLen, promptN))
		return
	}
	room := maxLen - promptN
	maxTokens, finish := req.MaxTokens, "length"
	switch {
	case !req.MaxTokensSet:
		maxTokens = room
		if s.cfg.StopAfter < room {
			maxTokens, finish = s.cfg.StopAfter, "stop"
		}
	case maxTokens > room:
		vllmError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
			maxTokens, maxLen, promptN, maxTokens, maxLen, promptN))
		return
	}
	g := &generation{
		srv: s, kind: kind, model: req.Model, id: s.reqSeq.Add(1), created: time.Now().Unix(),
		prompt: promptN, max: maxTokens, finish: finish, usage: req.IncludeUsage, fault: f,
		start: time.Now(), conn: ctx.Conn(), sp: sp, maxSet: req.MaxTokensSet, resp: rr,
	}
	switch {
	case sp.echo && kind == oai.Chat:
		g.echoText = chatEcho(v)
	case sp.echo:
		g.echoText = s.promptText(&req)
	}
	s.met.paramsN.Observe(float64(sp.n))
	if s.drv != nil {
		hashes := s.blockHashes(ids, maxTokens, req.CacheSalt)
		er := engine.Request{PromptTokens: promptN, MaxTokens: maxTokens, BlockHashes: hashes, Priority: priority}
		if req.Model != s.cfg.Model {
			a := s.lora.get(req.Model)
			if a == nil { // unloaded since the check
				vllmError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model))
				return
			}
			er.Adapter, er.AdapterLoad = a.id, a.load
			// The adapter's KV is its own: vLLM's block hashes carry the LoRA's id
			// (kv_cache_utils.py _gen_lora_extra_hash_keys).
			for i := range hashes {
				hashes[i] ^= uint64(a.id) * 0x9E3779B97F4A7C15
			}
		}
		for range sp.n {
			id, p, err := s.drv.submit(er)
			if err != nil {
				g.abandon()
				status := fasthttp.StatusBadRequest
				if errors.Is(err, errEngineDead) {
					status = fasthttp.StatusServiceUnavailable
				}
				vllmError(ctx, status, err.Error())
				return
			}
			g.seqs = append(g.seqs, seqRef{id: id, p: p})
		}
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
	if kind == oai.Responses {
		body := g.appendResponseObject(nil, true)
		g.finishResponse(body)
		ctx.SetBody(body)
	} else {
		ctx.SetBody(g.appendResponse(nil))
	}
	g.account()
}

// embed answers /v1/embeddings with one deterministic unit vector per input, as floats or,
// with encoding_format "base64", as base64 of little-endian float32s (what the official
// OpenAI SDKs ask for by default and decode). Shaped as vLLM's EmbeddingResponse
// (vllm/entrypoints/openai/protocol.py).
func (s *Server) embed(ctx *fasthttp.RequestCtx) {
	jp := s.parsers.Get()
	defer s.parsers.Put(jp)
	req, v, ok := s.parse(ctx, jp, oai.Embedding)
	if !ok {
		return
	}
	inputs, base64Out, err := embeddingInputs(v)
	if err != nil {
		vllmError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if s.preFault(ctx, s.faults.take()) {
		return
	}
	total := 0
	counts := make([]int, len(inputs))
	for i, in := range inputs {
		one := oai.Request{Kind: oai.Embedding, Prompt: in.text, TokenIDs: in.ids}
		counts[i] = len(s.promptIDs(&one, nil))
		if counts[i] > s.maxModelLen() {
			vllmError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens in the input for embedding generation. Please reduce the length of the input.", s.maxModelLen(), counts[i]))
			return
		}
		total += counts[i]
	}
	if s.cfg.Profile != nil && !s.cfg.Echo {
		var ms float64
		for _, n := range counts {
			ms += s.cfg.Profile.PrefillMs(n, 0)
		}
		time.Sleep(time.Duration(ms * float64(time.Millisecond)))
	}
	b := make([]byte, 0, 128+len(inputs)*s.cfg.EmbeddingDim*12)
	b = fmt.Appendf(b, `{"id":"embd-%d","object":"list","created":%d,"model":%q,"data":[`, s.reqSeq.Add(1), time.Now().Unix(), req.Model)
	vec := make([]float32, s.cfg.EmbeddingDim)
	raw := make([]byte, 4*len(vec))
	for i, in := range inputs {
		if i > 0 {
			b = append(b, ',')
		}
		s.embedding(vec, in)
		b = fmt.Appendf(b, `{"index":%d,"object":"embedding","embedding":`, i)
		if base64Out {
			for j, x := range vec {
				binary.LittleEndian.PutUint32(raw[4*j:], math.Float32bits(x))
			}
			b = append(b, '"')
			b = base64.StdEncoding.AppendEncode(b, raw)
			b = append(b, '"')
		} else {
			b = append(b, '[')
			for j, x := range vec {
				if j > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendFloat(b, float64(x), 'g', -1, 32)
			}
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	b = fmt.Appendf(b, `],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":0,"prompt_tokens_details":null}}`, total, total)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
	s.met.promptTokens.Add(float64(total))
}

// embeddingInput is one item of an embeddings request: text or token ids.
type embeddingInput struct {
	text string
	ids  []int
}

// embeddingInputs splits an embeddings body's input into its items (oai.Parse has checked
// its shape) and reads encoding_format.
func embeddingInputs(v *fastjson.Value) ([]embeddingInput, bool, error) {
	base64Out := false
	if f := v.Get("encoding_format"); f != nil && f.Type() != fastjson.TypeNull {
		switch string(f.GetStringBytes()) {
		case "float":
		case "base64":
			base64Out = true
		default:
			return nil, false, fmt.Errorf("'encoding_format' must be \"float\" or \"base64\", got %s", f)
		}
	}
	in := v.Get("input")
	ids := func(arr []*fastjson.Value) []int {
		out := make([]int, len(arr))
		for i, x := range arr {
			out[i] = x.GetInt()
		}
		return out
	}
	if in.Type() == fastjson.TypeString {
		return []embeddingInput{{text: string(in.GetStringBytes())}}, base64Out, nil
	}
	items, _ := in.Array()
	if items[0].Type() == fastjson.TypeNumber {
		return []embeddingInput{{ids: ids(items)}}, base64Out, nil
	}
	out := make([]embeddingInput, len(items))
	for i, it := range items {
		if it.Type() == fastjson.TypeString {
			out[i].text = string(it.GetStringBytes())
		} else {
			arr, _ := it.Array()
			out[i].ids = ids(arr)
		}
	}
	return out, base64Out, nil
}

// embedding fills vec with a unit vector determined by the input, so equal inputs embed
// equally and different ones differently.
func (s *Server) embedding(vec []float32, in embeddingInput) {
	d := xxhash.New()
	_, _ = d.WriteString(in.text)
	for _, id := range in.ids {
		_, _ = d.Write(binary.LittleEndian.AppendUint32(nil, uint32(id)))
	}
	seed := d.Sum64()
	var norm float64
	for i := range vec {
		x := xxhash.Sum64(binary.LittleEndian.AppendUint64(nil, seed+uint64(i)))
		vec[i] = float32(x%2000)/1000 - 1
		norm += float64(vec[i]) * float64(vec[i])
	}
	norm = math.Sqrt(norm)
	for i := range vec {
		vec[i] = float32(float64(vec[i]) / norm)
	}
}

// clientGone reports whether the connection's peer hung up.
func clientGone(c net.Conn) bool { return c != nil && connwatch.PeerClosed(c) }

// priority reads a request's priority field (vLLM's OpenAI request models: an integer,
// default 0, lower handled earlier) and refuses one other than 0 without priority
// scheduling, as vLLM's engine does (vllm/v1/engine/processor.py: "Got priority … but
// Priority scheduling is not enabled.").
func (s *Server) priority(v *fastjson.Value) (int, error) {
	// The last "priority" key, as Python's json keeps the last of duplicate keys.
	var f *fastjson.Value
	if o, err := v.Object(); err == nil {
		o.Visit(func(k []byte, x *fastjson.Value) {
			if string(k) == "priority" {
				f = x
			}
		})
	}
	if f == nil {
		return 0, nil
	}
	n, err := f.Int()
	if err != nil {
		return 0, fmt.Errorf("priority: Input should be a valid integer, got %s", f)
	}
	if n != 0 && !s.cfg.PriorityScheduling {
		return 0, fmt.Errorf("Got priority %d but Priority scheduling is not enabled.", n)
	}
	return n, nil
}
