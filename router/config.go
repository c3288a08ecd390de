package router

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/arbiter-serve/arbiter/fleet"
)

// Config is the router's configuration. Zero values take the defaults in Defaults.
type Config struct {
	// Policy is the default routing policy: slo_cheapest, least_load or round_robin. A
	// request may pick another with the X-Arbiter-Policy header (for experiments).
	Policy string `yaml:"policy"`
	// SLOs per model name; "*" applies to models without their own.
	SLOs map[string]SLO `yaml:"slos"`

	MaxRequestBodyBytes int `yaml:"max_request_body_bytes"`
	// MaxParseBytes bounds the memory that parsing large request bodies (over 1 MiB of
	// estimated parse memory, oai.ParseCost: about twice the body plus 550 bytes per JSON
	// value) takes at once; one beyond it is answered 503 with Retry-After (one body of the
	// largest size always fits).
	MaxParseBytes int `yaml:"max_parse_bytes"`
	// MaxBodyBufferBytes bounds the request bodies over 64 KiB held in memory at once
	// (read, parsed, forwarded); a request whose body does not fit within 2 s is answered
	// 503 with Retry-After, its body unread. A chunked body past 64 KiB holds max_request_body_bytes
	// until it is read. Bodies are read only after the request is authenticated.
	MaxBodyBufferBytes int `yaml:"max_body_buffer_bytes"`
	// MemoryLimitBytes is the Go runtime's soft memory limit (debug.SetMemoryLimit): near it
	// the garbage collector runs sooner, so the garbage of large bodies does not double the
	// router's footprint. 0: the two body budgets above plus 256 MiB for connections and
	// streams; negative: none. The GOMEMLIMIT environment variable, when set, wins.
	MemoryLimitBytes     int64 `yaml:"memory_limit_bytes"`
	MaxResponseBodyBytes int   `yaml:"max_response_body_bytes"`
	// MaxAttempts bounds tries per request, each on a different replica.
	MaxAttempts int `yaml:"max_attempts"`
	// Queue orders requests by priority band and tenant while the fleet is saturated
	// (queue.go; off by default).
	Queue QueueConfig `yaml:"queue"`
	// MaxHeld bounds the requests held while their service has no ready replica (scale
	// from zero); beyond it they are answered 503. Only with a control plane.
	MaxHeld int `yaml:"max_held_requests"`

	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// FirstByteTimeout bounds the wait for a replica's response header. Where the request's
	// expected latency is known (a stream's TTFT; a whole response with max_tokens set, its
	// E2E), the wait is FirstByteSLOMultiple times the larger of its SLO target and the
	// replica's prediction, at least FirstByteTimeoutMin: a replica that accepts and never
	// answers then costs seconds, the attempt is retried elsewhere, and passive health ejects
	// the replica. 0 for the multiple: always FirstByteTimeout. When it runs out while the
	// replica's engine is still progressing (its scraped vllm:prompt_tokens_total and
	// vllm:generation_tokens_total moved since the wait began), the wait is extended by as
	// much again, as often as that holds: only a replica that stalled is cut. Replicas
	// without those counters get no extension.
	FirstByteTimeout     time.Duration `yaml:"first_byte_timeout"`
	FirstByteSLOMultiple float64       `yaml:"first_byte_slo_multiple"`
	FirstByteTimeoutMin  time.Duration `yaml:"first_byte_timeout_min"`
	// StreamIdleTimeout bounds the gap between two events of a streamed response: bytes
	// that complete no event (a replica trickling one that never ends) are no progress.
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
	// RequestTimeout bounds the wait for a replica to take a request: held while its
	// service starts from zero (a vLLM cold start takes 30 s to minutes; a hold that runs
	// out is answered 503 with Retry-After), then tried and retried. Once a replica has the
	// request, progress bounds it instead: a stream runs while chunks keep coming
	// (stream_idle_timeout), a whole response while the replica's engine keeps generating
	// (first_byte_timeout, extended), so a 20-minute generation is never cut. A client's
	// X-Arbiter-Deadline-Ms bounds the whole answer, and this wait, when it is shorter.
	RequestTimeout time.Duration `yaml:"request_timeout"`
	// UpstreamIdleTimeout drops pooled replica connections idle this long (below vLLM's 5 s).
	UpstreamIdleTimeout    time.Duration `yaml:"upstream_idle_timeout"`
	MaxIdleConnsPerReplica int           `yaml:"max_idle_conns_per_replica"`

	Probe          ProbeConfig   `yaml:"probe"`
	Ejection       EjectConfig   `yaml:"ejection"`
	ScrapeInterval time.Duration `yaml:"scrape_interval"`

	// Tokenizer counts prompt tokens for prediction: approx (default; BPE costs ~0.2 ms per
	// KB of prompt on the hot path) or bpe.
	Tokenizer string `yaml:"tokenizer"`
	// DefaultOutputTokens is the expected completion length when a request sets no max_tokens.
	DefaultOutputTokens int `yaml:"default_output_tokens"`
	// AffinitySize is the number of prefix blocks remembered; 0 disables prefix affinity.
	AffinitySize int `yaml:"affinity_size"`
	// ResampleEvery: slo_cheapest sends one request this often to a replica cheaper than
	// its choice that is predicted to miss the SLO, so a replica that recovers is used
	// again (0 disables).
	ResampleEvery time.Duration `yaml:"resample_every"`
	// RoutingHeaders adds X-Arbiter-Replica and the prediction that chose it
	// (X-Arbiter-Predicted-Ttft-Ms, X-Arbiter-Predicted-Tpot-Ms) to every response: for
	// checking predictions against what clients see. Off by default: it tells clients
	// which replica served them.
	RoutingHeaders bool `yaml:"routing_headers"`
	// Adapters are LoRA adapters the replicas' vLLM serves on their models, for a router
	// without a control plane (which otherwise publishes its services' own): each by name,
	// the model of the replicas that serve it (base) and its lora_path, loaded through
	// /v1/load_lora_adapter on a replica the first time a request goes there (unless
	// static: given to vLLM's --lora-modules). MaxLoRAs is the replicas' --max-loras.
	Adapters []fleet.Adapter `yaml:"adapters"`
	MaxLoRAs int             `yaml:"max_loras"`
	// APIKeysFile lists client API keys (see KeySpec), reloaded when it changes. With
	// neither it nor ARBITER_API_KEYS, the router takes requests without a key.
	APIKeysFile string `yaml:"api_keys_file"`
	// TLSCertFile and TLSKeyFile, given together, serve the client endpoint over HTTPS
	// with this PEM certificate chain and key (SkyServe's service.tls certfile/keyfile).
	// Both files are watched: a changed pair is read again within a second and new
	// connections get it (SIGHUP reloads at once); a pair that does not load, such as one
	// half-written during a rotation, keeps the previous certificate until it does.
	TLSCertFile string `yaml:"tls_cert_file"`
	TLSKeyFile  string `yaml:"tls_key_file"`
	// PassHeaders names client headers forwarded to replicas that are otherwise stripped
	// (Authorization, Proxy-Authorization, Cookie: the client's Arbiter key and session are
	// not the replica's to read). Pass Authorization only to replicas that check the
	// client's own key.
	PassHeaders []string `yaml:"pass_headers"`
	// Pprof serves /debug/pprof on the admin port. Off by default: profiles show the
	// process's memory, and the admin port takes no key.
	Pprof bool `yaml:"pprof"`

	// Client connection limits: headers (also the read buffer), time to read a request
	// (slow clients cannot hold a connection open: slowloris), keep-alive idle time, and
	// open connections.
	MaxHeaderBytes int           `yaml:"max_header_bytes"`
	ReadTimeout    time.Duration `yaml:"read_timeout"`
	IdleTimeout    time.Duration `yaml:"idle_timeout"`
	MaxConnections int           `yaml:"max_connections"`
	// MaxConnectionsPerIP caps one client address's open connections (0: no cap beyond
	// max_connections). max_connections itself is lowered at start to what the process's
	// file-descriptor limit leaves room for (fdlimit.ClientBudget).
	MaxConnectionsPerIP int `yaml:"max_connections_per_ip"`
}

// QueueConfig is the router's queue for a saturated fleet (queue.go).
type QueueConfig struct {
	// Enabled: a request no replica has room for (none predicted to meet its SLO) waits
	// in the router, by band and tenant, rather than queueing on the least loaded replica.
	// It takes effect under the slo_cheapest policy, whose predictions judge the room.
	Enabled bool `yaml:"enabled"`
	// MaxWaiting bounds the requests waiting, all services and bands together; a request
	// beyond it takes the place of the newest of a lower band, or is answered 429.
	MaxWaiting int `yaml:"max_waiting"`
	// MaxWait bounds a sheddable request's wait, and any request's when its SLO sets no
	// TTFT target (with one, a critical or standard request's wait ends at the target:
	// past it the request would miss its SLO anyway).
	MaxWait time.Duration `yaml:"max_wait"`
	// SheddableFill is the share of the SLO up to which sheddable requests fill replicas
	// (1: as far as the other bands; 0.8: they stop at 80 % of the TTFT and TPOT targets,
	// leaving room for critical and standard requests to start at once).
	SheddableFill float64 `yaml:"sheddable_fill"`
	// EnginePriority gives each request its band as vLLM's priority field (critical 0,
	// standard 1, sheddable 2; the client's own is replaced), for replicas whose vLLM runs
	// with --scheduling-policy priority. It works with or without Enabled.
	EnginePriority bool `yaml:"engine_priority"`
}

// ProbeConfig is the active readiness probe.
type ProbeConfig struct {
	Path     string        `yaml:"path"`
	Interval time.Duration `yaml:"interval"`
	Timeout  time.Duration `yaml:"timeout"`
	// FailureThreshold consecutive failures mark a replica not ready, and as many
	// consecutive passes make it ready again (a /health that flaps does not move it in and
	// out of routing on every few probes).
	FailureThreshold int `yaml:"failure_threshold"`
}

// EjectConfig is passive ejection after consecutive request failures.
type EjectConfig struct {
	MaxFails    int           `yaml:"max_fails"`
	BaseBackoff time.Duration `yaml:"base_backoff"`
	MaxBackoff  time.Duration `yaml:"max_backoff"`
}

// Defaults returns the default configuration.
func Defaults() Config {
	return Config{
		Policy:                 "slo_cheapest",
		SLOs:                   map[string]SLO{"*": {TTFT: 2, TPOT: 0.1, Percentile: 0.9}},
		MaxRequestBodyBytes:    8 << 20,
		MaxParseBytes:          256 << 20,
		MaxBodyBufferBytes:     64 << 20,
		MaxResponseBodyBytes:   64 << 20,
		MaxAttempts:            3,
		MaxHeld:                1024,
		Queue:                  QueueConfig{MaxWaiting: 1024, MaxWait: 30 * time.Second, SheddableFill: 1},
		ConnectTimeout:         2 * time.Second,
		FirstByteTimeout:       60 * time.Second,
		FirstByteSLOMultiple:   4,
		FirstByteTimeoutMin:    5 * time.Second,
		StreamIdleTimeout:      60 * time.Second,
		RequestTimeout:         10 * time.Minute,
		UpstreamIdleTimeout:    4 * time.Second,
		MaxIdleConnsPerReplica: 512,
		Probe:                  ProbeConfig{Path: "/health", Interval: 2 * time.Second, Timeout: time.Second, FailureThreshold: 2},
		Ejection:               EjectConfig{MaxFails: 3, BaseBackoff: time.Second, MaxBackoff: 30 * time.Second},
		ScrapeInterval:         250 * time.Millisecond,
		Tokenizer:              "approx",
		DefaultOutputTokens:    256,
		AffinitySize:           100_000,
		ResampleEvery:          10 * time.Second,
		MaxHeaderBytes:         8 << 10,
		ReadTimeout:            30 * time.Second,
		IdleTimeout:            90 * time.Second,
		MaxConnections:         256 << 10,
	}
}

// LoadConfig reads a YAML config over the defaults; unknown keys are errors.
func LoadConfig(path string) (Config, error) {
	cfg := Defaults()
	if path == "" {
		return cfg, cfg.Validate()
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("router config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) { // empty file: defaults
		return cfg, fmt.Errorf("router config %s: %w", path, err)
	}
	return cfg, cfg.Validate()
}

// Validate checks every field and names the one that is wrong.
func (c *Config) Validate() error {
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return fmt.Errorf("tls_cert_file and tls_key_file: give both (a certificate and its key) or neither, got cert %q and key %q", c.TLSCertFile, c.TLSKeyFile)
	}
	if _, err := NewPolicy(c.Policy, nil, 0); err != nil {
		return fmt.Errorf("policy: %w", err)
	}
	names := map[string]bool{}
	for i, a := range c.Adapters {
		switch {
		case a.Name == "" || a.Base == "" || (a.Path == "" && !a.Static):
			return fmt.Errorf("adapters[%d]: give name, base (the replicas' model) and path (vLLM's lora_path)", i)
		case fleet.CheckAdapterName(a.Name) != nil:
			return fmt.Errorf("adapters[%d]: %w", i, fleet.CheckAdapterName(a.Name))
		case names[a.Name]:
			return fmt.Errorf("adapters[%d]: %q is listed twice", i, a.Name)
		}
		names[a.Name] = true
	}
	if q := c.Queue; q.MaxWaiting <= 0 || q.MaxWait <= 0 || !(q.SheddableFill > 0 && q.SheddableFill <= 1) {
		return fmt.Errorf("queue: max_waiting (%d) and max_wait (%s) must be positive and sheddable_fill (%v) in (0, 1]", q.MaxWaiting, q.MaxWait, q.SheddableFill)
	}
	if c.MaxLoRAs < 0 {
		return fmt.Errorf("max_loras %d: want the replicas' --max-loras (vLLM's default 1)", c.MaxLoRAs)
	}
	for m, s := range c.SLOs {
		if s.TTFT < 0 || s.TPOT < 0 || s.E2E < 0 {
			return fmt.Errorf("slos[%q]: targets must be >= 0 seconds", m)
		}
		if s.Percentile < 0 || s.Percentile > 1 {
			return fmt.Errorf("slos[%q].percentile %v: want a fraction in [0, 1], e.g. 0.9", m, s.Percentile)
		}
	}
	positive := map[string]int64{
		"max_request_body_bytes": int64(c.MaxRequestBodyBytes), "max_response_body_bytes": int64(c.MaxResponseBodyBytes),
		"max_parse_bytes": int64(c.MaxParseBytes), "max_body_buffer_bytes": int64(c.MaxBodyBufferBytes),
		"max_attempts": int64(c.MaxAttempts), "max_held_requests": int64(c.MaxHeld), "connect_timeout": int64(c.ConnectTimeout),
		"first_byte_timeout": int64(c.FirstByteTimeout), "stream_idle_timeout": int64(c.StreamIdleTimeout),
		"request_timeout": int64(c.RequestTimeout), "upstream_idle_timeout": int64(c.UpstreamIdleTimeout),
		"max_idle_conns_per_replica": int64(c.MaxIdleConnsPerReplica), "probe.interval": int64(c.Probe.Interval),
		"probe.timeout": int64(c.Probe.Timeout), "probe.failure_threshold": int64(c.Probe.FailureThreshold),
		"ejection.max_fails": int64(c.Ejection.MaxFails), "ejection.base_backoff": int64(c.Ejection.BaseBackoff),
		"ejection.max_backoff": int64(c.Ejection.MaxBackoff), "scrape_interval": int64(c.ScrapeInterval),
		"default_output_tokens": int64(c.DefaultOutputTokens), "max_header_bytes": int64(c.MaxHeaderBytes),
		"read_timeout": int64(c.ReadTimeout), "idle_timeout": int64(c.IdleTimeout), "max_connections": int64(c.MaxConnections),
	}
	for k, v := range positive {
		if v <= 0 {
			return fmt.Errorf("%s: must be > 0 (durations are written like 2s or 250ms)", k)
		}
	}
	if c.MaxBodyBufferBytes < c.MaxRequestBodyBytes {
		return fmt.Errorf("max_body_buffer_bytes %d: must be >= max_request_body_bytes (%d), or the largest body could never be read", c.MaxBodyBufferBytes, c.MaxRequestBodyBytes)
	}
	if c.ScrapeInterval > 250*time.Millisecond {
		return fmt.Errorf("scrape_interval %v: must be <= 250ms, or queue predictions go stale", c.ScrapeInterval)
	}
	if c.Probe.Path == "" || c.Probe.Path[0] != '/' {
		return fmt.Errorf("probe.path %q: must start with /", c.Probe.Path)
	}
	if c.Tokenizer != "approx" && c.Tokenizer != "bpe" {
		return fmt.Errorf("tokenizer %q: want approx or bpe", c.Tokenizer)
	}
	if c.ResampleEvery < 0 {
		return fmt.Errorf("resample_every %v: must be >= 0 (0 disables re-sampling)", c.ResampleEvery)
	}
	if c.MaxConnectionsPerIP < 0 {
		return fmt.Errorf("max_connections_per_ip %d: must be >= 0 (0: no cap per address)", c.MaxConnectionsPerIP)
	}
	if c.AffinitySize < 0 {
		return fmt.Errorf("affinity_size %d: must be >= 0 (0 disables prefix affinity)", c.AffinitySize)
	}
	if c.FirstByteSLOMultiple < 0 || math.IsNaN(c.FirstByteSLOMultiple) || math.IsInf(c.FirstByteSLOMultiple, 0) {
		return fmt.Errorf("first_byte_slo_multiple %v: must be a finite number >= 0 (0: always first_byte_timeout)", c.FirstByteSLOMultiple)
	}
	if c.FirstByteSLOMultiple > 0 && (c.FirstByteTimeoutMin <= 0 || c.FirstByteTimeoutMin > c.FirstByteTimeout) {
		return fmt.Errorf("first_byte_timeout_min %v: must be > 0 and <= first_byte_timeout (%v)", c.FirstByteTimeoutMin, c.FirstByteTimeout)
	}
	return nil
}

// SLOFor returns the SLO of a model.
func (c *Config) SLOFor(model string) SLO {
	if s, ok := c.SLOs[model]; ok {
		return s
	}
	return c.SLOs["*"]
}
