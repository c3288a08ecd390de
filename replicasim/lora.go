package replicasim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/internal/loramodule"
)

// LoRAConfig serves LoRA adapters on the base model, as vLLM's --enable-lora (0.10–0.11).
type LoRAConfig struct {
	// MaxLoRAs, MaxCPULoRAs: vLLM's --max-loras (GPU slots, default 1) and --max-cpu-loras
	// (adapters kept in CPU memory, default MaxLoRAs).
	MaxLoRAs, MaxCPULoRAs int
	// MaxLoRARank is vLLM's --max-lora-rank (default 16): a larger adapter fails to load.
	MaxLoRARank int
	// Modules are vLLM's --lora-modules, loaded at start; one that fails stops the start.
	Modules []LoRAModule
	// RuntimeUpdates serves /v1/load_lora_adapter and /v1/unload_lora_adapter, as vLLM does
	// with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (without it they are 404s).
	RuntimeUpdates bool
	// LoadGiBPerSecond is the rate an adapter's weights are read from disk (default
	// DefaultLoadGiBPerSecond, the rate the cold start reads the base model's at).
	LoadGiBPerSecond float64
}

// LoRAModule is one --lora-modules entry: name=path, or vLLM's JSON form with a parent
// (Base: base_model_name, /v1/models' parent; default: the served model).
type LoRAModule = loramodule.Module

// ParseLoRAModule reads one --lora-modules value as vLLM does (loramodule.Parse).
func ParseLoRAModule(v string) (LoRAModule, error) { return loramodule.Parse(v) }

// loraLayerCopy is the copy of one layer of an adapter into GPU memory, as LoRAX measured it
// (about 20 ms a layer, 500 ms to over 1 s an adapter: predibase/lorax#433; vLLM publishes no
// figure). An adapter's load is its files read at LoadGiBPerSecond plus this per layer.
const loraLayerCopy = 20 * time.Millisecond

// adapter is one loaded adapter.
type adapter struct {
	id         uint32 // vLLM's lora_int_id: 1, 2, … in load order, never reused
	name, path string
	parent     string
	rank       int
	bytes      int64
	load       time.Duration // read from disk into CPU memory
	// modelled: a Hugging Face id this machine cannot download, sized from the model.
	modelled bool
}

// loras is a server's adapters.
type loras struct {
	cfg    LoRAConfig
	layers int
	mu     sync.Mutex
	byName map[string]*adapter
	order  []*adapter        // /v1/models lists them in load order
	names  map[uint32]string // every id ever loaded: an unloaded adapter's requests still run
	nextID uint32
	info   *prometheus.GaugeVec
	// loading serialises loads and unloads of one name, as vLLM's per-name lock does.
	loading map[string]*sync.Mutex
}

func newLoRAs(cfg LoRAConfig, prof *engine.Profile, reg prometheus.Registerer) *loras {
	if cfg.MaxLoRAs == 0 {
		cfg.MaxLoRAs = 1
	}
	if cfg.MaxLoRARank == 0 {
		cfg.MaxLoRARank = 16
	}
	if cfg.LoadGiBPerSecond <= 0 {
		cfg.LoadGiBPerSecond = DefaultLoadGiBPerSecond
	}
	l := &loras{cfg: cfg, layers: 32, byName: map[string]*adapter{}, names: map[uint32]string{}, loading: map[string]*sync.Mutex{}}
	if prof != nil {
		if m, err := engine.LookupModel(prof.Model); err == nil {
			l.layers = m.Layers
		}
	}
	// vLLM's gauge (vllm/v1/metrics/loggers.py): its value is the time it was set, each
	// engine step, for the label set of that step; an older set keeps its older time, so a
	// reader takes the series with the largest value, as the Gateway API Inference
	// Extension's picker does.
	l.info = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:lora_requests_info", Help: "Running stats on lora requests."},
		[]string{"max_lora", "waiting_lora_adapters", "running_lora_adapters"})
	reg.MustRegister(l.info)
	return l
}

// validRanks are the ranks vLLM's LoRAConfig accepts for max_lora_rank.
var validRanks = []int{8, 16, 32, 64, 128, 256, 320, 512}

func (c LoRAConfig) validate() error {
	if c.MaxLoRAs < 0 {
		return fmt.Errorf("max_loras (%d) must be >= 1", c.MaxLoRAs)
	}
	if c.MaxLoRARank != 0 && !slices.Contains(validRanks, c.MaxLoRARank) {
		return fmt.Errorf("max_lora_rank (%d) must be one of %v", c.MaxLoRARank, validRanks)
	}
	if c.MaxCPULoRAs != 0 && c.MaxCPULoRAs < max(c.MaxLoRAs, 1) {
		return fmt.Errorf("max_cpu_loras (%d) must be >= max_loras (%d)", c.MaxCPULoRAs, max(c.MaxLoRAs, 1))
	}
	seen := map[string]bool{}
	for _, m := range c.Modules {
		if seen[m.Name] {
			return fmt.Errorf("--lora-modules: %s is given twice", m.Name)
		}
		seen[m.Name] = true
	}
	return nil
}

// loadError is a failed load as vLLM answers it.
type loadError struct {
	status int
	typ    string
	msg    string
}

func (e *loadError) Error() string { return e.msg }

// resolve reads an adapter's files as vLLM's worker does: a local folder must hold PEFT's
// adapter_config.json (its rank "r") and the weights. Anything else is taken for a Hugging
// Face id, which this machine cannot download: it is modelled as an adapter of rank
// max_lora_rank on the attention projections, and logged as such.
func (l *loras) resolve(name, path string) (rank int, size int64, modelled bool, err error) {
	notFound := &loadError{fasthttp.StatusNotFound, "NotFoundError", fmt.Sprintf("Loading lora %s failed: No adapter found for %s", name, path)}
	local := filepath.IsAbs(path) || strings.HasPrefix(path, ".") || strings.Count(path, "/") != 1
	if !local {
		if _, err := os.Stat(path); err == nil {
			local = true
		}
	}
	if !local {
		// q, k, v and o projections: A (r × hidden) and B (hidden × r) each, bf16.
		return l.cfg.MaxLoRARank, int64(4 * 2 * l.cfg.MaxLoRARank * 4096 * 2 * l.layers), true, nil
	}
	raw, err := os.ReadFile(filepath.Join(path, "adapter_config.json"))
	if err != nil {
		return 0, 0, false, notFound
	}
	var conf struct {
		R int `json:"r"`
	}
	if err := json.Unmarshal(raw, &conf); err != nil || conf.R <= 0 {
		return 0, 0, false, &loadError{fasthttp.StatusBadRequest, "BadRequestError", fmt.Sprintf("Loading lora %s failed: %s/adapter_config.json has no rank r", name, path)}
	}
	if conf.R > l.cfg.MaxLoRARank {
		return 0, 0, false, &loadError{fasthttp.StatusBadRequest, "BadRequestError", fmt.Sprintf("LoRA rank %d is greater than max_lora_rank %d.", conf.R, l.cfg.MaxLoRARank)}
	}
	for _, f := range []string{"adapter_model.safetensors", "adapter_model.bin"} {
		if st, err := os.Stat(filepath.Join(path, f)); err == nil {
			return conf.R, st.Size(), false, nil
		}
	}
	return 0, 0, false, notFound
}

// add registers an adapter and returns it, or vLLM's error for the load.
func (l *loras) add(name, path, parent string) (*adapter, error) {
	l.mu.Lock()
	_, dup := l.byName[name]
	l.mu.Unlock()
	if dup {
		return nil, &loadError{fasthttp.StatusBadRequest, "InvalidUserInput", fmt.Sprintf("The lora adapter '%s' has already been loaded.", name)}
	}
	rank, size, modelled, err := l.resolve(name, path)
	if err != nil {
		return nil, err
	}
	a := &adapter{name: name, path: path, parent: parent, rank: rank, bytes: size, modelled: modelled,
		load: time.Duration(float64(size)/(l.cfg.LoadGiBPerSecond*(1<<30))*float64(time.Second)) + time.Duration(l.layers)*loraLayerCopy}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, dup := l.byName[name]; dup {
		return nil, &loadError{fasthttp.StatusBadRequest, "InvalidUserInput", fmt.Sprintf("The lora adapter '%s' has already been loaded.", name)}
	}
	l.nextID++
	a.id = l.nextID
	l.byName[name], l.names[a.id] = a, name
	l.order = append(l.order, a)
	return a, nil
}

// remove unloads an adapter by name: its requests in flight finish, new ones are 404s, as
// in vLLM 0.10–0.11, whose unload only forgets the name.
func (l *loras) remove(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.byName[name]
	if !ok {
		return false
	}
	delete(l.byName, name)
	l.order = slices.DeleteFunc(l.order, func(x *adapter) bool { return x == a })
	return true
}

func (l *loras) get(name string) *adapter {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byName[name]
}

func (l *loras) list() []*adapter {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.order)
}

// lock returns the lock of one adapter name.
func (l *loras) lock(name string) *sync.Mutex {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.loading[name]
	if m == nil {
		m = &sync.Mutex{}
		l.loading[name] = m
	}
	return m
}

// record sets the gauge for a step's adapters, as vLLM does each engine step.
func (l *loras) record(running, waiting []uint32) {
	l.mu.Lock()
	names := func(ids []uint32) string {
		parts := make([]string, len(ids))
		for i, id := range ids {
			parts[i] = l.names[id]
		}
		return strings.Join(parts, ",")
	}
	r, w := names(running), names(waiting)
	l.mu.Unlock()
	l.info.WithLabelValues(fmt.Sprint(l.cfg.MaxLoRAs), w, r).SetToCurrentTime()
}

// loadAdapterHTTP answers POST /v1/load_lora_adapter (vllm/entrypoints/openai/api_server.py
// and serving_models.py, 0.10.1–0.11): 200 with a plain-text success, or vLLM's error.
func (s *Server) loadAdapterHTTP(ctx *fasthttp.RequestCtx) {
	name, path, ok := s.loraBody(ctx)
	if !ok {
		return
	}
	if name == "" || path == "" {
		vllmTypedError(ctx, fasthttp.StatusBadRequest, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided.")
		return
	}
	mu := s.lora.lock(name)
	mu.Lock()
	defer mu.Unlock()
	a, err := s.lora.add(name, path, s.cfg.Model)
	if err != nil {
		var le *loadError
		if errors.As(err, &le) {
			vllmTypedError(ctx, le.status, le.typ, le.msg)
		} else {
			vllmError(ctx, fasthttp.StatusBadRequest, err.Error())
		}
		return
	}
	// add_lora preloads it: the answer comes once it is read, and the engine, which runs the
	// load between its steps, is busy for as long.
	if s.drv != nil {
		time.Sleep(time.Until(s.drv.preload(a.id, a.load))) // after the loads queued before it
	}
	s.logLoaded(a)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetBodyString(fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", name))
}

// unloadAdapterHTTP answers POST /v1/unload_lora_adapter.
func (s *Server) unloadAdapterHTTP(ctx *fasthttp.RequestCtx) {
	name, _, ok := s.loraBody(ctx)
	if !ok {
		return
	}
	if name == "" {
		vllmTypedError(ctx, fasthttp.StatusBadRequest, "InvalidUserInput", "'lora_name' needs to be provided to unload a LoRA adapter.")
		return
	}
	mu := s.lora.lock(name)
	mu.Lock()
	defer mu.Unlock()
	if !s.lora.remove(name) {
		vllmTypedError(ctx, fasthttp.StatusNotFound, "NotFoundError", fmt.Sprintf("The lora adapter '%s' cannot be found.", name))
		return
	}
	s.cfg.Logger.Info("unloaded LoRA adapter", "name", name)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetBodyString(fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", name))
}

// logLoaded says what was loaded, and loudly when its size is modelled.
func (s *Server) logLoaded(a *adapter) {
	if a.modelled {
		s.cfg.Logger.Warn("LoRA adapter from a Hugging Face id: replicasim cannot download it, so it is modelled as a rank max_lora_rank adapter on the attention projections",
			"name", a.name, "path", a.path, "rank", a.rank, "bytes", a.bytes, "load", a.load)
		return
	}
	s.cfg.Logger.Info("loaded LoRA adapter", "name", a.name, "path", a.path, "rank", a.rank, "bytes", a.bytes, "load", a.load)
}

// loraBody reads a load or unload request's body after vLLM's checks: POST, JSON content
// (validate_json_request: 415 otherwise), a JSON object.
func (s *Server) loraBody(ctx *fasthttp.RequestCtx) (name, path string, ok bool) {
	if !ctx.IsPost() {
		vllmError(ctx, fasthttp.StatusMethodNotAllowed, "Method Not Allowed")
		return "", "", false
	}
	if ct, _, _ := strings.Cut(string(ctx.Request.Header.ContentType()), ";"); strings.TrimSpace(strings.ToLower(ct)) != "application/json" {
		vllmError(ctx, fasthttp.StatusUnsupportedMediaType, "Unsupported Media Type: Only 'application/json' is allowed")
		return "", "", false
	}
	jp := s.parsers.Get()
	defer s.parsers.Put(jp)
	v, err := jp.ParseBytes(ctx.PostBody())
	if err != nil || v.Type() != fastjson.TypeObject {
		vllmError(ctx, fasthttp.StatusBadRequest, "the body must be a JSON object with lora_name (and lora_path to load)")
		return "", "", false
	}
	return string(v.GetStringBytes("lora_name")), string(v.GetStringBytes("lora_path")), true
}

// startLoRA enables adapters on the engine and loads --lora-modules, as vLLM does before it
// serves (init_static_loras): one that fails to load stops the start with its message.
func (s *Server) startLoRA(eng *engine.Engine) error {
	s.lora = newLoRAs(*s.cfg.LoRA, s.cfg.Profile, s.reg)
	if eng != nil {
		if err := eng.SetLoRA(engine.LoRA{MaxLoRAs: s.lora.cfg.MaxLoRAs, MaxCPULoRAs: s.lora.cfg.MaxCPULoRAs}); err != nil {
			return err
		}
		s.drv.adapters = s.lora.record
	}
	for _, m := range s.cfg.LoRA.Modules {
		parent := m.Base
		if parent == "" {
			parent = s.cfg.Model
		}
		a, err := s.lora.add(m.Name, m.Path, parent)
		if err != nil {
			return fmt.Errorf("--lora-modules %s=%s: %w", m.Name, m.Path, err)
		}
		if eng != nil {
			_, _ = eng.Preload(a.id, 0) // read before the server answers
		}
		s.logLoaded(a)
	}
	return nil
}

// RuntimeLoRAUpdates reads VLLM_ALLOW_RUNTIME_LORA_UPDATING as vLLM does (vllm/envs.py: "1"
// or "true", any case, spaces trimmed).
func RuntimeLoRAUpdates(v string) bool {
	v = strings.ToLower(strings.TrimSpace(v))
	return v == "1" || v == "true"
}

// ExpandNargs rewrites a flag that takes several values after it, as vLLM's argparse
// nargs="+" flags do (--lora-modules a=x b=y), into the flag repeated once per value, which
// Go's flag package reads. Values run to the next argument that starts with "-".
func ExpandNargs(args []string, name string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		out = append(out, a)
		if a != "-"+name && a != "--"+name {
			continue
		}
		for n := 0; i+1 < len(args) && !strings.HasPrefix(args[i+1], "-"); n++ {
			if n > 0 {
				out = append(out, a)
			}
			i++
			out = append(out, args[i])
		}
	}
	return out
}
