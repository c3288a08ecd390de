// Package fleet holds the small types the data plane and the control plane share:
// what a replica is (where it runs, what it costs) and the load a router reports.
// It must stay free of imports from either side.
package fleet

import (
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
)

// Capacity is how a replica's GPU is bought. It decides the marginal cost of a token:
// reserved capacity is paid whether used or not, so it should fill first.
type Capacity string

const (
	Reserved Capacity = "reserved"
	Spot     Capacity = "spot"
	OnDemand Capacity = "on_demand"
)

// Valid reports whether c is one of the known capacity kinds.
func (c Capacity) Valid() bool {
	switch c {
	case Reserved, Spot, OnDemand:
		return true
	}
	return false
}

// Replica describes one serving replica. The zero value is not usable: ID, Address and
// Model are required (see Validate).
type Replica struct {
	// ID is stable for the replica's life; routers key their per-replica state by it, never
	// by address, because a new replica may reuse a dead one's port.
	ID string `yaml:"id" json:"id"`
	// Address is host:port of the replica's OpenAI-compatible HTTP server.
	Address string `yaml:"address" json:"address"`
	Model   string `yaml:"model" json:"model"`
	// Service is the control plane's service the replica belongs to (empty standalone);
	// routers label token counts with it so they join the control plane's cost series.
	Service  string   `yaml:"service,omitempty" json:"service,omitempty"`
	Provider string   `yaml:"provider,omitempty" json:"provider,omitempty"`
	Region   string   `yaml:"region,omitempty" json:"region,omitempty"`
	Zone     string   `yaml:"zone,omitempty" json:"zone,omitempty"`
	Capacity Capacity `yaml:"capacity,omitempty" json:"capacity,omitempty"`
	// PricePerHour is the instance price in USD per hour; 0 means unknown/free.
	PricePerHour float64 `yaml:"price_per_hour,omitempty" json:"price_per_hour,omitempty"`
	// TokensPerSecond is the replica's expected token throughput at capacity (input +
	// output). 0 means unknown: the router then learns it from traffic.
	TokensPerSecond float64 `yaml:"tokens_per_second,omitempty" json:"tokens_per_second,omitempty"`
	Version         int     `yaml:"version,omitempty" json:"version,omitempty"`
	// Profile names the replica's performance profile (GPU and model shape: step times
	// measured on real GPUs, e.g. h100-llama-3.1-8b), which routers predict its latency
	// with. Empty: a default profile, corrected by what the replica's answers show.
	Profile string `yaml:"profile,omitempty" json:"profile,omitempty"`
	// Accelerator is the GPU the replica runs on, as the price catalogs name it (L4, H100,
	// A100-80GB): the control plane's placement, or a label in a router's replicas file.
	// Without a Profile, routers predict the replica with that GPU's profile of its model
	// (engine.ProfileOn). Empty: not known.
	Accelerator string `yaml:"accelerator,omitempty" json:"accelerator,omitempty"`
	// Tasks are what the replica's model serves (TaskNames: generate, embed, classify,
	// score, transcription); routers send it only requests for those. Empty: unknown, every
	// request may go to it, and a refusal (vLLM's "does not support") takes it off that
	// endpoint's candidates.
	Tasks []string `yaml:"tasks,omitempty" json:"tasks,omitempty"`
	// Draining replicas get no new requests; in-flight ones finish.
	Draining bool `yaml:"draining,omitempty" json:"draining,omitempty"`
	// Adapter names the LoRA adapter the replica serves merged into its weights, as one of
	// that adapter's own replicas (issue 51); its Model is then the adapter's name. Routers
	// send the adapter's requests there first, and the rest to its base model's replicas,
	// which load it. Empty: a replica of its model.
	Adapter string `yaml:"adapter,omitempty" json:"adapter,omitempty"`
}

// Validate checks the fields a router cannot do without and fills defaults.
func (r *Replica) Validate() error {
	if r.ID == "" {
		return errors.New("id: required (a stable name for the replica)")
	}
	if r.Address == "" {
		return fmt.Errorf("replica %q: address: required (host:port)", r.ID)
	}
	host, port, err := net.SplitHostPort(r.Address)
	if err != nil || host == "" {
		return fmt.Errorf("replica %q: address %q: want host:port, e.g. 127.0.0.1:8000", r.ID, r.Address)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("replica %q: address %q: port must be 1-65535", r.ID, r.Address)
	}
	if r.Model == "" {
		return fmt.Errorf("replica %q: model: required (the model name clients ask for)", r.ID)
	}
	if r.Capacity == "" {
		r.Capacity = OnDemand
	}
	if !r.Capacity.Valid() {
		return fmt.Errorf("replica %q: capacity %q: want one of reserved, spot, on_demand", r.ID, r.Capacity)
	}
	if r.PricePerHour < 0 {
		return fmt.Errorf("replica %q: price_per_hour %v: must be >= 0", r.ID, r.PricePerHour)
	}
	if r.TokensPerSecond < 0 {
		return fmt.Errorf("replica %q: tokens_per_second %v: must be >= 0", r.ID, r.TokensPerSecond)
	}
	if err := CheckTasks(r.Tasks); err != nil {
		return fmt.Errorf("replica %q: tasks: %w", r.ID, err)
	}
	if r.Adapter != "" && r.Adapter != r.Model {
		return fmt.Errorf("replica %q: adapter %q: an adapter's own replica serves it under its name, and this one serves %q", r.ID, r.Adapter, r.Model)
	}
	return nil
}

// ValidateSet validates every replica and rejects duplicate IDs.
func ValidateSet(rs []Replica) error {
	seen := make(map[string]bool, len(rs))
	for i := range rs {
		if err := rs[i].Validate(); err != nil {
			return fmt.Errorf("replicas[%d]: %w", i, err)
		}
		if seen[rs[i].ID] {
			return fmt.Errorf("replicas[%d]: duplicate id %q", i, rs[i].ID)
		}
		seen[rs[i].ID] = true
	}
	return nil
}

// Load is what a router reports about one replica (router → control plane).
type Load struct {
	ReplicaID string  `json:"replica_id"`
	InFlight  int     `json:"in_flight"`
	Waiting   int     `json:"waiting"`
	Running   int     `json:"running"`
	KVUsage   float64 `json:"kv_usage"`
	// RequestsPerSecond and TokensPerSecond are rates over the router's last report window.
	RequestsPerSecond float64 `json:"requests_per_second"`
	TokensPerSecond   float64 `json:"tokens_per_second"`
	// SLOJudged is the requests the replica answered since the router's previous report
	// whose latency the router judged against the service's SLO; SLOMisses those of them
	// that missed it. The control plane learns each GPU type's headroom from them.
	SLOJudged int64 `json:"slo_judged,omitempty"`
	SLOMisses int64 `json:"slo_misses"`
	// Progressing: the replica's engine made progress (its scraped vllm: token counters
	// moved) since the router's previous report. A draining replica's requests are waited
	// for while it holds: a long generation is not cut by the drain timeout.
	Progressing bool `json:"progressing,omitempty"`
}

// Service is what a router needs to know about a service that may have no replica yet:
// which model names it serves, so a request for one of them is held while the service
// wakes from zero instead of being refused.
type Service struct {
	Name string `json:"name"`
	// Models the service serves; empty when the spec names none and no replica has
	// answered /v1/models yet.
	Models []string `json:"models,omitempty"`
	// Policy is the service's routing policy (slo_cheapest, least_load, round_robin); empty
	// leaves the router's own default.
	Policy string `json:"policy,omitempty"`
	// SLO is the service's latency objective; nil leaves the router's configured one.
	SLO *SLO `json:"slo,omitempty"`
	// Adapters are the LoRA adapters the service serves on its replicas' model (each also
	// in Models); MaxLoRAs is how many one replica's batch may mix (vLLM's --max-loras).
	Adapters []Adapter `json:"adapters,omitempty"`
	MaxLoRAs int       `json:"max_loras,omitempty"`
	// Queue is the service's router queue for a saturated fleet (arbiter.queue); nil
	// leaves the router's own configuration.
	Queue *Queue `json:"queue,omitempty"`
	// Tenants are the service's own bands and weights for tenants (arbiter.tenants), which
	// outrank the routers' keys file for the service's requests.
	Tenants []TenantBand `json:"tenants,omitempty"`
}

// TenantBand is one tenant's priority band and share weight on one service.
type TenantBand struct {
	Name string `json:"name"`
	// Priority is the band's name (critical, standard or sheddable); "": the key's.
	Priority string `json:"priority,omitempty"`
	// Weight is the tenant's share within its band; 0: the key's.
	Weight float64 `json:"weight,omitempty"`
}

// TenantBands are the band names a TenantBand may give.
var TenantBands = []string{"critical", "standard", "sheddable"}

// MaxTenantWeight bounds a tenant's share weight.
const MaxTenantWeight = 1000

// CheckTenantBands says what is wrong with a service's tenants, or nil.
func CheckTenantBands(ts []TenantBand) error {
	seen := map[string]bool{}
	for _, t := range ts {
		if err := CheckTenantName(t.Name); err != nil {
			return err
		}
		if seen[t.Name] {
			return fmt.Errorf("tenant %q is listed twice", t.Name)
		}
		seen[t.Name] = true
		if t.Priority != "" && !slices.Contains(TenantBands, t.Priority) {
			return fmt.Errorf("tenant %q: priority %q: want one of %s", t.Name, t.Priority, strings.Join(TenantBands, ", "))
		}
		if t.Weight < 0 || t.Weight > MaxTenantWeight {
			return fmt.Errorf("tenant %q: weight %v: want a share weight from above 0 to %d", t.Name, t.Weight, MaxTenantWeight)
		}
	}
	return nil
}

// Queue is how routers queue a service's requests while no replica has room for them.
type Queue struct {
	Enabled bool `json:"enabled"`
	// MaxWaitSeconds bounds a sheddable request's wait, and any request's when the SLO
	// sets no TTFT target.
	MaxWaitSeconds float64 `json:"max_wait_seconds"`
	// SheddableFill is the share of the SLO up to which sheddable requests fill replicas.
	SheddableFill float64 `json:"sheddable_fill"`
	// EnginePriority: each request carries its band as vLLM's priority field.
	EnginePriority bool `json:"engine_priority,omitempty"`
}

// Validate says what is wrong with a queue's settings, or nil.
func (q *Queue) Validate() error {
	if q == nil {
		return nil
	}
	if !(q.MaxWaitSeconds > 0 && q.MaxWaitSeconds <= 3600) || !(q.SheddableFill > 0 && q.SheddableFill <= 1) {
		return fmt.Errorf("queue: max_wait_seconds %v must be in (0, 3600] and sheddable_fill %v in (0, 1]", q.MaxWaitSeconds, q.SheddableFill)
	}
	return nil
}

// Adapter is one LoRA adapter of a service, as routers need it: the name clients send, the
// model of the replicas that serve it, and where those replicas' vLLM loads it from.
type Adapter struct {
	Name string `json:"name" yaml:"name"`
	// Base is the model its replicas serve (their Replica.Model): routers pick among them.
	Base string `json:"base" yaml:"base"`
	// Path is vLLM's lora_path for /v1/load_lora_adapter.
	Path string `json:"path" yaml:"path"`
	// Parent is what /v1/models lists as its parent (vLLM's base_model_name; default Base).
	Parent string `json:"parent,omitempty" yaml:"parent,omitempty"`
	// Static: the replicas' vLLM loads it at start (--lora-modules); routers never load it.
	Static bool `json:"static,omitempty" yaml:"static,omitempty"`
}

// MaxAdapterName is the longest adapter name: what routers believe of the names in a
// replica's vllm:lora_requests_info.
const MaxAdapterName = 256

// CheckAdapterName says what is wrong with an adapter name clients would send, or nil:
// vLLM's vllm:lora_requests_info joins adapter names with commas, so a name with one (or a
// space) would read as two, and routers believe no longer name than MaxAdapterName.
func CheckAdapterName(name string) error {
	if strings.ContainsAny(name, ", \t\n") {
		return fmt.Errorf("%q has a comma or a space; vLLM's metrics list adapters comma-joined, so routers could not tell it apart", name)
	}
	if len(name) > MaxAdapterName {
		return fmt.Errorf("a name of %d bytes; at most %d, which routers believe of a replica's metrics", len(name), MaxAdapterName)
	}
	return nil
}

// AdapterOf returns the adapter a model name is in services, and whether it is one.
func AdapterOf(services []Service, model string) (Adapter, *Service, bool) {
	for i := range services {
		for _, a := range services[i].Adapters {
			if a.Name == model {
				return a, &services[i], true
			}
		}
	}
	return Adapter{}, nil, false
}

// SLO is a latency objective in seconds (0 = no target) met by a share of requests.
type SLO struct {
	TTFTSeconds float64 `json:"ttft_seconds"`
	TPOTSeconds float64 `json:"tpot_seconds"`
	E2ESeconds  float64 `json:"e2e_seconds"`
	Percentile  float64 `json:"percentile"`
}

// ReadySet is the control plane's view that routers follow: every service and the
// replicas routers may use (Draining ones finish what they have and take nothing new).
// Revision grows with every change.
type ReadySet struct {
	Revision uint64    `json:"revision"`
	Services []Service `json:"services"`
	Replicas []Replica `json:"replicas"`
}

// ModelLoad is one model's load as one router saw it. Requests and Tokens are counts since
// the router's previous report (so reports add up across routers); InFlight and Held are
// levels at the time of the report.
type ModelLoad struct {
	Model    string  `json:"model"`
	Requests float64 `json:"requests"`
	Tokens   float64 `json:"tokens"`
	InFlight float64 `json:"in_flight"`
	// Held requests wait in the router because no replica is ready (scale from zero).
	Held float64 `json:"held"`
	// Shed counts the requests the router's queue refused since the previous report for
	// want of room (its 429s at a deadline, or for a full queue), and ShedTokens the tokens
	// they would have had (prompt and expected output): demand the fleet did not serve,
	// which the autoscaler counts as if it had arrived and been served.
	Shed       float64 `json:"shed,omitempty"`
	ShedTokens float64 `json:"shed_tokens,omitempty"`
	// Mix is the model's request mix since the previous report: the generating requests
	// that finished with a usage, counted by prompt and output length class (MixCell).
	// Empty when none finished, or from a router that does not count it.
	Mix []MixCell `json:"mix,omitempty"`
}

// The request mix is counted in classes of prompt and output length, so that a report stays
// bounded whatever the traffic: a request of p prompt tokens is in the first prompt class
// whose bound exceeds p (the last class takes every longer one), and likewise its output.
// Bounds grow fourfold: short chats, RAG-sized prompts and long documents land apart.
var (
	MixPromptBounds = []int{128, 512, 2048, 8192, 32768}
	MixOutputBounds = []int{64, 256, 1024, 4096}
)

// MaxMixTokens bounds one request's prompt or output in a mix report: beyond any model's
// context (the longest are about 10M tokens), so a larger mean is a bug or a lie.
const MaxMixTokens = 1 << 24

// MixClasses is how many prompt and output classes there are.
func MixClasses() (prompt, output int) { return len(MixPromptBounds) + 1, len(MixOutputBounds) + 1 }

// MixClassOf returns the prompt and output classes of a request of prompt and output tokens.
func MixClassOf(prompt, output int) (p, o int) {
	return classOf(MixPromptBounds, prompt), classOf(MixOutputBounds, output)
}

func classOf(bounds []int, n int) int {
	for i, b := range bounds {
		if n < b {
			return i
		}
	}
	return len(bounds)
}

// classRange is the lengths class i of bounds holds: [lo, hi).
func classRange(bounds []int, i int) (lo, hi int) {
	if i > 0 {
		lo = bounds[i-1]
	}
	hi = MaxMixTokens + 1
	if i < len(bounds) {
		hi = bounds[i]
	}
	return lo, hi
}

// MixCell counts the requests of one prompt class and one output class (indices into
// MixPromptBounds and MixOutputBounds, see MixClassOf) and the tokens they had, so that
// their mean lengths are known, not only their class.
type MixCell struct {
	Prompt       int     `json:"prompt"`
	Output       int     `json:"output"`
	Requests     float64 `json:"requests"`
	PromptTokens float64 `json:"prompt_tokens"`
	OutputTokens float64 `json:"output_tokens"`
}

// Validate checks one cell: classes that exist, counts in bounds, and token sums whose means
// lie in the cell's classes (a cell of 10 requests of under 128 prompt tokens cannot hold
// 5,000 of them).
func (m MixCell) Validate() error {
	np, no := MixClasses()
	if m.Prompt < 0 || m.Prompt >= np || m.Output < 0 || m.Output >= no {
		return fmt.Errorf("class (%d, %d): want a prompt class 0 to %d and an output class 0 to %d", m.Prompt, m.Output, np-1, no-1)
	}
	var c checker
	c.check("requests", m.Requests, maxReportRequests)
	c.check("prompt_tokens", m.PromptTokens, maxReportTokens)
	c.check("output_tokens", m.OutputTokens, maxReportTokens)
	if len(c) > 0 {
		return errors.Join(c...)
	}
	for _, x := range []struct {
		what   string
		bounds []int
		class  int
		sum    float64
	}{{"prompt_tokens", MixPromptBounds, m.Prompt, m.PromptTokens}, {"output_tokens", MixOutputBounds, m.Output, m.OutputTokens}} {
		lo, hi := classRange(x.bounds, x.class)
		if x.sum < float64(lo)*m.Requests || x.sum >= float64(hi)*m.Requests && !(x.sum == 0 && m.Requests == 0) {
			c = append(c, fmt.Errorf("%s: %v over %v requests: want a mean from %d to %d tokens (the class's lengths)", x.what, x.sum, m.Requests, lo, hi-1))
		}
	}
	return errors.Join(c...)
}

// LoadReport is one router's periodic report to the control plane.
type LoadReport struct {
	Router   string      `json:"router"`
	Models   []ModelLoad `json:"models"`
	Replicas []Load      `json:"replicas"`
	// Tenants is what each tenant spent through this router since its last report that
	// the control plane took (issue 52): the control plane adds it to the tenant's spend,
	// which survives restarts and which every router's budgets read.
	Tenants []TenantUse `json:"tenants,omitempty"`
}

// TenantUse is one tenant's spend in one report: dollars at the replicas' price per token
// (PricePerHour over TokensPerSecond), the tokens and the requests.
type TenantUse struct {
	Tenant   string  `json:"tenant"`
	Dollars  float64 `json:"dollars"`
	Tokens   float64 `json:"tokens"`
	Requests float64 `json:"requests"`
}

// AddTenantUse adds u to its tenant's entry of m (made when nil) and returns m: how
// routers and the control plane add spend up by tenant.
func AddTenantUse(m map[string]TenantUse, u TenantUse) map[string]TenantUse {
	if m == nil {
		m = map[string]TenantUse{}
	}
	t := m[u.Tenant]
	t.Tenant = u.Tenant
	t.Dollars += u.Dollars
	t.Tokens += u.Tokens
	t.Requests += u.Requests
	m[u.Tenant] = t
	return m
}

// LoadAnswer is the control plane's answer to a load report: every tenant's spend so far in
// the UTC day and month Day falls in, this report's included.
type LoadAnswer struct {
	OK      bool          `json:"ok"`
	Day     string        `json:"day,omitempty"` // 2006-01-02, UTC
	Tenants []TenantSpend `json:"tenants,omitempty"`
}

// TenantSpend is a tenant's spend in a day and in the month it falls in.
type TenantSpend struct {
	Tenant       string  `json:"tenant"`
	DayDollars   float64 `json:"day_dollars"`
	MonthDollars float64 `json:"month_dollars"`
	DayTokens    float64 `json:"day_tokens"`
	MonthTokens  float64 `json:"month_tokens"`
}

// MaxTenantName is the longest tenant name routers report and the control plane keeps.
const MaxTenantName = 128

// CheckTenantName says what is wrong with a tenant's name, or nil: it labels metrics and
// rows, so it is short and printable.
func CheckTenantName(t string) error {
	if t == "" || len(t) > MaxTenantName {
		return fmt.Errorf("tenant %.20q: want a name of 1 to %d characters", t, MaxTenantName)
	}
	for _, r := range t {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("tenant %q: control characters are not allowed", t)
		}
	}
	return nil
}

// maxReportDollars bounds one tenant's spend in one report: far above any fleet's.
const maxReportDollars = 1e6

// Validate checks one tenant's entry of a load report.
func (u TenantUse) Validate() error {
	c := checker{}
	if err := CheckTenantName(u.Tenant); err != nil {
		c = append(c, err)
	}
	c.check("dollars", u.Dollars, maxReportDollars)
	c.check("tokens", u.Tokens, maxReportTokens)
	c.check("requests", u.Requests, maxReportRequests)
	return errors.Join(c...)
}

// Bounds on what one load report may say: far above any real router's figures for one
// report interval, low enough that no sum of reports overflows into +Inf.
const (
	maxReportEntries  = 100_000
	maxReportRequests = 1e9  // requests, or requests per second, in one report
	maxReportTokens   = 1e12 // tokens, or tokens per second, in one report
	maxReportLevel    = 1e7  // requests in flight, held, running or waiting
)

// Validate refuses a report the control plane must not add up: a number that is not finite,
// negative, or beyond any real router's (a report of 1e308 tokens once turned the totals
// into +Inf and broke every status after it).
func (r LoadReport) Validate() error {
	var errs []error
	if r.Router == "" || len(r.Router) > 256 {
		errs = append(errs, errors.New("router: want an ID of 1 to 256 characters"))
	}
	if len(r.Models) > maxReportEntries || len(r.Replicas) > maxReportEntries || len(r.Tenants) > maxReportEntries {
		errs = append(errs, fmt.Errorf("%d models, %d replicas and %d tenants: want at most %d of each", len(r.Models), len(r.Replicas), len(r.Tenants), maxReportEntries))
		return errors.Join(errs...)
	}
	seen := map[string]bool{}
	for i, u := range r.Tenants {
		if err := u.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("tenants[%d]: %w", i, err))
		} else if seen[u.Tenant] {
			errs = append(errs, fmt.Errorf("tenants[%d]: %q given twice", i, u.Tenant))
		}
		seen[u.Tenant] = true
	}
	for i, m := range r.Models {
		if err := m.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("models[%d] (%s): %w", i, m.Model, err))
		}
	}
	for i, l := range r.Replicas {
		if err := l.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("replicas[%d] (%s): %w", i, l.ReplicaID, err))
		}
	}
	return errors.Join(errs...)
}

// Validate checks one model's entry of a load report as LoadReport.Validate does: a router
// drops an entry that fails, rather than have the control plane refuse its whole report
// (and with it every other model's counts).
func (m ModelLoad) Validate() error {
	var c checker
	c.check("requests", m.Requests, maxReportRequests)
	c.check("tokens", m.Tokens, maxReportTokens)
	c.check("in_flight", m.InFlight, maxReportLevel)
	c.check("held", m.Held, maxReportLevel)
	c.check("shed", m.Shed, maxReportRequests)
	c.check("shed_tokens", m.ShedTokens, maxReportTokens)
	seen := map[[2]int]bool{}
	for i, cell := range m.Mix {
		if err := cell.Validate(); err != nil {
			c = append(c, fmt.Errorf("mix[%d]: %w", i, err))
			continue
		}
		if k := [2]int{cell.Prompt, cell.Output}; seen[k] {
			c = append(c, fmt.Errorf("mix[%d]: class (%d, %d) given twice", i, cell.Prompt, cell.Output))
		} else {
			seen[k] = true
		}
	}
	return errors.Join(c...)
}

// Validate checks one replica's entry of a load report as LoadReport.Validate does.
func (l Load) Validate() error {
	var c checker
	c.check("in_flight", float64(l.InFlight), maxReportLevel)
	c.check("waiting", float64(l.Waiting), maxReportLevel)
	c.check("running", float64(l.Running), maxReportLevel)
	c.check("kv_usage", l.KVUsage, 1)
	c.check("requests_per_second", l.RequestsPerSecond, maxReportRequests)
	c.check("tokens_per_second", l.TokensPerSecond, maxReportTokens)
	c.check("slo_misses", float64(l.SLOMisses), maxReportRequests)
	c.check("slo_judged", float64(l.SLOJudged), maxReportRequests)
	if l.SLOMisses > l.SLOJudged {
		c = append(c, fmt.Errorf("slo_misses %d: more than the %d requests judged", l.SLOMisses, l.SLOJudged))
	}
	return errors.Join(c...)
}

// checker collects the numbers of a report that are not finite, negative, or over limit.
type checker []error

func (c *checker) check(what string, v, limit float64) {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > limit {
		*c = append(*c, fmt.Errorf("%s: %v: want a finite number from 0 to %g", what, v, limit))
	}
}

// ServiceFor returns the index of the service that serves model: the first that lists it,
// else the only service when it has not said which models it serves; -1 when none does.
// Routers (deciding to hold a request) and the control plane (deciding whom to wake) must
// agree on this, so both call it.
func ServiceFor(services []Service, model string) int {
	for i, s := range services {
		for _, m := range s.Models {
			if m == model {
				return i
			}
		}
	}
	if len(services) == 1 && !services[0].namesModels() {
		return 0
	}
	return -1
}

// namesModels reports whether the service says which models it serves: names in Models
// beyond its adapters' (an adapter's name says nothing of its base model's).
func (s Service) namesModels() bool {
	for _, m := range s.Models {
		if !slices.ContainsFunc(s.Adapters, func(a Adapter) bool { return a.Name == m }) {
			return true
		}
	}
	return false
}

// The tasks a replica's model serves, by vLLM's names for them (its --task, now --runner
// and --convert, and the engine's get_supported_tasks, 0.11): which endpoints it answers.
// vLLM answers the others 400 "The model does not support … API" (404 in later versions,
// which leave their routes out).
const (
	TaskGenerate      = "generate"      // chat, completions, responses
	TaskEmbed         = "embed"         // embeddings, pooling, score and rerank (by similarity)
	TaskClassify      = "classify"      // classify, pooling
	TaskScore         = "score"         // score and rerank (a cross-encoder), classify, pooling
	TaskTranscription = "transcription" // audio transcriptions and translations (Whisper)
)

// TaskNames lists the tasks a replica or a service may declare.
var TaskNames = []string{TaskGenerate, TaskEmbed, TaskClassify, TaskScore, TaskTranscription}

// The APIs a request may need, one per family of endpoints.
const (
	APIGenerate      = "generate"
	APIEmbeddings    = "embeddings"
	APIPooling       = "pooling"
	APIScore         = "score" // score and rerank
	APIClassify      = "classify"
	APITranscription = "transcription"
)

// taskAPIs is what each task answers.
var taskAPIs = map[string][]string{
	TaskGenerate:      {APIGenerate},
	TaskEmbed:         {APIEmbeddings, APIPooling, APIScore},
	TaskClassify:      {APIClassify, APIPooling},
	TaskScore:         {APIScore, APIClassify, APIPooling},
	TaskTranscription: {APITranscription},
}

// Serves reports whether a replica declaring tasks answers api. No tasks declared: unknown,
// so true (the router then learns from the replica's own refusals).
func Serves(tasks []string, api string) bool {
	if len(tasks) == 0 {
		return true
	}
	for _, t := range tasks {
		for _, a := range taskAPIs[t] {
			if a == api {
				return true
			}
		}
	}
	return false
}

// CheckTasks checks declared task names.
func CheckTasks(tasks []string) error {
	for _, t := range tasks {
		if _, ok := taskAPIs[t]; !ok {
			return fmt.Errorf("task %q: want one of %v", t, TaskNames)
		}
	}
	return nil
}
