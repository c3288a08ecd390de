package spec

import (
	"fmt"
	"github.com/arbiter-serve/arbiter/fleet"
	"io"
	"maps"
	"os"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
)

// Service is a validated service.yaml with every default filled in, so that its users never
// repeat a default or re-check a rule.
type Service struct {
	Name    string // may be empty: the CLI's -n names the service then
	Workdir string
	Envs    map[string]string
	// Secrets are envs that SkyPilot keeps out of logs and dashboards; replicas get them as
	// environment variables like Envs.
	Secrets map[string]string
	// Missing are the envs and secrets the file leaves null and no override fills
	// ("envs.HF_TOKEN", "secrets.HF_TOKEN"), when parsed with Overrides.DeferMissing; they
	// must be given when the service is launched.
	Missing []string
	Setup   string
	Run     string
	// NumNodes is how many nodes one replica spans (num_nodes; 1 unless given): the nodes
	// of a replica are launched, probed through its head (rank 0), billed, preempted and
	// terminated together.
	NumNodes   int
	FileMounts []FileMount
	Volumes    []Volume
	Config     TaskConfig
	Resources  Resources
	Service    ServiceSection
	Arbiter    Arbiter

	// accPos is where each accelerator name (lower-cased) is written in the file, for the
	// messages of steps after parsing (AcceleratorPositions).
	accPos map[string][]Pos
	// warnings are Warnings().
	warnings ErrorList
	// workdirPos is where workdir is written, for CheckWorkdir.
	workdirPos Pos
}

// ServiceSection is the service: block.
type ServiceSection struct {
	ReadinessProbe ReadinessProbe
	// ReplicaPolicy is always filled: a fixed size n reads as min = max = n.
	ReplicaPolicy ReplicaPolicy
	// Fixed is true for "replicas: n", and when neither replicas nor replica_policy is given
	// (one replica), so that ResolvedYAML writes the file back in the form it was written.
	Fixed bool
	// LoadBalancingPolicy is SkyServe's key, lower-cased; Arbiter routes by
	// Arbiter.RoutingPolicy, which it only seeds.
	LoadBalancingPolicy string
	// Port is the replica port: service.ports, else the single port of resources.ports; 0
	// when neither names one and the provider picks it (the local provider exports $PORT).
	Port int
	// TLS, when set, is the key and certificate the endpoint serves HTTPS with (SkyServe
	// terminates TLS at its load balancer; here the router does); nil: plain HTTP.
	TLS *TLS
}

// TLS is service.tls: PEM files, paths as written (~ for the home directory allowed;
// relative paths are relative to where serve up runs).
type TLS struct {
	KeyFile, CertFile string
}

// ReadinessProbe says how to tell that a replica can take traffic.
type ReadinessProbe struct {
	Path                string
	InitialDelaySeconds float64
	TimeoutSeconds      float64
	// PostData is the probe's JSON body with $VARS from envs and secrets substituted; ""
	// means the probe is a GET.
	PostData string
	Headers  map[string]string

	// tmpl holds path, headers and post_data as written, when substituting $VARS changed
	// them, so that ResolvedYAML writes what the user wrote and a re-parse substitutes once.
	tmpl *probeTemplate
}

type probeTemplate struct {
	path     string
	postData string
	headers  map[string]string
}

// ReplicaPolicy is how many replicas to run, and SkyServe's knobs for scaling and spot.
type ReplicaPolicy struct {
	MinReplicas, MaxReplicas int
	TargetQPSPerReplica      float64            // 0 when not set
	TargetQPSByAccelerator   map[string]float64 // the map form of target_qps_per_replica
	UpscaleDelaySeconds      float64
	DownscaleDelaySeconds    float64
	NumOverprovision         int
	// The spot knobs below need resources.use_spot.
	BaseOndemandFallbackReplicas int
	DynamicOndemandFallback      bool
	SpotPlacer                   string
}

// Resources is what one replica runs on.
type Resources struct {
	Accelerators []Accelerator
	// AcceleratorsOrdered is true for the list form: earlier entries are preferred. The map
	// and string forms mean "any of these".
	AcceleratorsOrdered bool
	// Infra is the "cloud/region/zone" shorthand as written; Cloud, Region and Zone are
	// filled from it as well (a "*" part means any and reads as "").
	Infra, Cloud, Region, Zone string
	UseSpot                    bool
	Ports                      []string // "8080" or "8080-8090"
	CPUs, Memory               string   // "4", "4+", "16GB+"
	DiskSize                   int      // GB
	DiskTier                   string
	InstanceType               string
	ImageID                    string
	NetworkTier                string
	Labels                     map[string]string
	// AnyOf and Ordered are the candidates, each an entry of any_of or ordered already
	// merged over the base keys; at most one of them is set.
	AnyOf   []Resources
	Ordered []Resources
}

// Accelerator is a GPU type and how many of it one replica needs.
type Accelerator struct {
	Name  string // as written: A100, A100-80GB, RTX-PRO-6000
	Count int    // ≥ 1
}

// Arbiter holds Arbiter's own keys, kept under arbiter: so that a file stays a valid
// SkyServe file and SkyServe's keys keep their meaning.
type Arbiter struct {
	Models []string // names clients send in "model"; empty means any
	// Adapters are the LoRA adapters served on the model: the run: command's
	// --lora-modules, then arbiter.adapters (with Path where the replicas read each).
	Adapters []Adapter
	// LoRA is what the run: command tells vLLM about adapters.
	LoRA LoRA
	// Tenants are each tenant's band and weight on this service (arbiter.tenants), which
	// outrank the routers' keys file for its requests.
	Tenants       []fleet.TenantBand
	RoutingPolicy string
	// Profile is the replicas' performance profile (engine.ProfileNames, or a GPU-MODEL
	// pair engine.LoadProfile generates, such as l4-llama-3.1-8b) that routers
	// predict latency with; empty: their default, corrected by traffic.
	Profile string
	// Tasks are what the service's model serves, by vLLM's names (fleet.TaskNames:
	// generate, embed, classify, score, transcription): routers send its replicas only
	// those requests. Empty: unknown; routers learn it from the replicas' refusals.
	Tasks []string
	SLO   SLO
	// Workload is the request mix to expect before any traffic (arbiter.workload): what
	// the control plane sizes each GPU's throughput by until the routers have reported
	// enough requests. Zero: the default, 1,024 prompt and 256 output tokens.
	Workload   Workload
	SpotPolicy SpotPolicy
	// Availability is the share of time the service keeps a replica ready that spot
	// purchasing must meet (arbiter.availability; a fraction: 0.999 for 99.9 %): the
	// placement buys the cheapest hedge its model predicts meets it (scaling/availability.go).
	// 0: no target.
	Availability float64
	// Queue is how routers queue the service's requests while no replica has room for
	// them (arbiter.queue).
	Queue                   Queue
	Reserved                []ReservedCapacity
	Providers               []string
	ScaleToZeroAfterSeconds float64
	Autoscaling             Autoscaling
	Readiness               Readiness
	Local                   Local
	Sim                     Sim
}

// SLO is the latency target the router and autoscaler keep. A zero target is no target.
type SLO struct {
	TTFTSeconds, TPOTSeconds, E2ESeconds float64
	Percentile                           float64 // a fraction: 0.9 for p90
}

// Queue is the routers' queue for a saturated fleet: requests wait in the router by
// priority band and tenant rather than in the least loaded replica's engine.
type Queue struct {
	Enabled bool
	// MaxWaitSeconds bounds a sheddable request's wait, and any request's when the SLO
	// sets no TTFT target.
	MaxWaitSeconds float64
	// SheddableFill is the share of the SLO up to which sheddable requests fill replicas.
	SheddableFill float64
	// EnginePriority: the routers give each request its band as vLLM's priority field
	// (critical 0, standard 1, sheddable 2), for replicas whose vLLM runs with
	// --scheduling-policy priority, so that an engine's own queue serves the bands in order
	// too. It works with or without Enabled.
	EnginePriority bool
}

// Workload is a typical request: its prompt and output lengths in tokens (0: not given).
type Workload struct {
	PromptTokens, OutputTokens int
}

// SpotPolicy decides between spot and on-demand capacity.
type SpotPolicy struct {
	// MaxPriceRatio: buy spot only while its price is under this fraction of the on-demand
	// or reserved price.
	MaxPriceRatio float64
	// RebalanceMinSaving: a ready spot replica moves to another zone (its replacement
	// first, then it drains) when that zone's spot price is at least this fraction below
	// its own; 0 never moves one (unless RebalanceWhenItPays).
	RebalanceMinSaving float64
	// RebalanceWhenItPays (rebalance_min_saving: auto, the default): a ready spot replica
	// moves to another zone whenever the move pays for its cold start, its preemptions
	// priced in (scaling.PlacementPolicy.RebalanceWhenItPays).
	RebalanceWhenItPays bool
	// MinZones spreads the spot fleet: no zone holds more than ⌈spot replicas ÷ MinZones⌉
	// of them, so one zone's preemption never takes more than that share; and with 2 or
	// more, a target of one replica served by spot alone runs a second spot replica in
	// another zone, so that one preemption never leaves the service with no ready replica
	// for a cold start, while the pair costs at most MaxPriceRatio × on-demand. 1: neither.
	MinZones int
}

// ReservedCapacity is capacity already paid for, which Arbiter fills first.
type ReservedCapacity struct {
	Provider, Region, Zone string
	Accelerator            string
	Count                  int
	PricePerHour           float64
}

// Autoscaling is how the target replica count follows load.
type Autoscaling struct {
	Signal                          string // qps, concurrency or tokens_per_second
	TargetConcurrencyPerReplica     float64
	TargetTokensPerSecondPerReplica float64
	StableWindowSeconds             float64
	PanicWindowSeconds              float64
	// PanicThreshold: scale up at once when demand over the panic window reaches this many
	// times the ready capacity.
	PanicThreshold float64
	// MaxScaleUpRate bounds a scale-up to this multiple of the ready replicas (Knative's
	// max-scale-up-rate), so a backlog held through a cold start does not launch a fleet.
	MaxScaleUpRate          float64
	DecisionIntervalSeconds float64
}

// Readiness is how Arbiter probes replicas, beyond SkyServe's readiness_probe.
type Readiness struct {
	ProbeIntervalSeconds float64
	FailureThreshold     int
	// ReadyBudgetSeconds: a replica not ready this long after launch is replaced.
	ReadyBudgetSeconds float64
}

// Local is how the local provider's replicas are labelled and billed.
type Local struct {
	Capacity     string // reserved, spot or on_demand
	PricePerHour float64
	Region, Zone string
}

// Sim configures the sim provider: a simulated cloud market that replays real catalog
// prices and a real spot-capacity trace in scaled wall-clock time, running replicas as
// local processes. It is how placement, spot preemptions and their routing are exercised
// end to end without a cloud account.
type Sim struct {
	// Cloud is the catalog provider whose offers make the market (gcp, aws, azure, lambda,
	// …); empty: the resources' cloud, else gcp.
	Cloud string
	// SpotTrace names an embedded spot trace (traces.SpotNames); its zones are mapped onto
	// the cloud's zones that quote spot.
	SpotTrace string
	// Speedup is trace seconds per wall-clock second (60: a trace hour a minute).
	Speedup float64
	// StartHours is where in the trace the market starts.
	StartHours float64
	// PricesAt is the catalog date (YYYY-MM-DD) prices are quoted at.
	PricesAt string
	// NoticeSeconds is the preemption warning in wall-clock seconds; 0: the cloud's own
	// (AWS 120 s, GCP 30 s).
	NoticeSeconds float64
}

// Overrides are values given on the command line, which take precedence over the file.
type Overrides struct {
	Name string
	// Envs and Secrets add to or replace the file's; they also give values to keys the
	// file leaves null, which SkyServe files do for tokens ("HF_TOKEN: null").
	Envs, Secrets map[string]string
	// DeferMissing accepts null envs and secrets that nothing fills, listing them in
	// Service.Missing (serve validate: the values are given only at launch).
	DeferMissing bool
}

// Load reads and validates a service.yaml. An unreadable file gives the os error; an invalid
// one a *ErrorList.
func Load(path string) (*Service, error) { return LoadWith(path, Overrides{}) }

// LoadWith is Load with command-line overrides.
func LoadWith(path string, o Overrides) (*Service, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// Read one byte past the limit so that Parse can say the file is too large, without
	// reading all of a multi-gigabyte file passed by mistake.
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, err
	}
	return ParseWith(path, data, o)
}

// Parse validates a service.yaml held in memory; filename only labels the errors. It
// returns a *ErrorList holding every problem found when the file is invalid.
func Parse(filename string, data []byte) (*Service, error) {
	return ParseWith(filename, data, Overrides{})
}

// ParseWith is Parse with command-line overrides.
func ParseWith(filename string, data []byte, o Overrides) (*Service, error) {
	d := newDecoder(filename)
	root := d.document(data)
	if root == nil {
		return nil, d.result()
	}
	s := d.service(root, o)
	if err := d.result(); err != nil {
		return nil, err
	}
	return s, nil
}

var topKeys = []string{
	"name", "workdir", "num_nodes", "resources", "envs", "secrets", "volumes",
	"file_mounts", "setup", "run", "service", "config", "arbiter",
}

// service decodes the whole file. Sections are read in dependency order: envs before the
// probe (which substitutes them), and all sections before the rules that span them.
func (d *decoder) service(root *yaml.Node, o Overrides) *Service {
	top := d.block("", root, root, topKeys)
	s := &Service{}

	top.str("name", &s.Name)
	if o.Name != "" {
		s.Name = o.Name
		if err := CheckName(o.Name); err != nil {
			d.errorf(nil, "name %s", err)
		}
	} else if s.Name != "" {
		if err := CheckName(s.Name); err != nil {
			d.errorf(top.get("name"), "name: %s", err)
		}
	}
	top.str("workdir", &s.Workdir)
	if n := top.get("workdir"); n != nil {
		s.workdirPos = Pos{File: d.file, Line: n.Line, Column: n.Column}
	}
	s.NumNodes = 1
	top.integer("num_nodes", "an integer ≥ 1 (the nodes one replica spans)", atLeast(1), &s.NumNodes)
	if n := top.get("volumes"); n != nil {
		s.Volumes = d.volumes(n)
	}
	if n := top.get("config"); n != nil {
		s.Config = d.config(n)
	}
	d.deferMissing = o.DeferMissing
	s.Envs = d.vars("envs", top.get("envs"), o.Envs, "--env")
	s.Secrets = d.vars("secrets", top.get("secrets"), o.Secrets, "--secret")
	s.Missing = d.missing
	if n := top.get("file_mounts"); n != nil {
		s.FileMounts = d.fileMounts(n, s.Envs) // after envs, which it substitutes
	}
	top.str("setup", &s.Setup)
	if top.has("run") {
		top.str("run", &s.Run)
		if strings.TrimSpace(s.Run) == "" && top.get("run").Kind == yaml.ScalarNode {
			d.errorf(top.get("run"), "run: is empty; give the command that starts one replica, e.g. run: vllm serve $MODEL_NAME --port 8000")
		}
	} else {
		at := top.key("run")
		if at == nil {
			at = root
		}
		d.errorf(at, "run: missing; give the command that starts one replica, e.g. run: vllm serve $MODEL_NAME --port 8000")
	}

	if n := top.get("resources"); n != nil {
		s.Resources = d.resources(n, top.key("resources"))
	}

	// SkyServe substitutes envs and secrets into the service section; secrets win, as there.
	vars := maps.Clone(s.Envs)
	if vars == nil {
		vars = map[string]string{}
	}
	maps.Copy(vars, s.Secrets)

	if n := top.get("service"); n != nil {
		s.Service = d.serviceSection(n, top.key("service"), vars)
	} else {
		at := top.key("service")
		if at == nil {
			at = root
		}
		d.errorf(at, "this file has no service: section; add one, e.g. service: {readiness_probe: /health, replicas: 1}")
		s.Service = defaultServiceSection()
	}

	s.Arbiter = defaultArbiter()
	if n := top.get("arbiter"); n != nil {
		d.arbiter(n, top.key("arbiter"), &s.Arbiter)
	}
	d.crossCheck(s)
	d.checkMounts(s)
	rf, err := runVLLM(s.Run, vars)
	if err != nil {
		d.errorAt("run", "%v", err)
	}
	d.checkAdapters(s, rf)
	d.checkEnginePriority(&s.Arbiter, rf.SchedulingPolicy)
	if len(d.warns) > 0 {
		s.warnings = d.warns
	}
	if len(d.accPos) > 0 {
		s.accPos = d.accPos
	}
	return s
}

var varName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// vars reads envs or secrets. Values may be any scalar (PORT: 8000 is common); a null value
// must be given on the command line, as in SkyServe.
func (d *decoder) vars(path string, n *yaml.Node, override map[string]string, flag string) map[string]string {
	out := map[string]string{}
	var missing []pair
	if n != nil {
		ps, _ := d.pairs(path, n, "a mapping of variable names to values")
		for _, p := range ps {
			if !varName.MatchString(p.name) {
				d.errorf(p.key, "%s: %s is not a variable name; use letters, digits and _, not starting with a digit", path, quote(p.name))
				continue
			}
			switch {
			case isNull(p.val):
				missing = append(missing, p)
			case p.val.Kind != yaml.ScalarNode:
				d.errorf(p.val, "%s.%s: want a string, got %s", path, p.name, describe(p.val))
			default:
				if v, ok := d.str(join(path, p.name), p.val); ok {
					out[p.name] = v
				}
			}
		}
	}
	for k, v := range override {
		if !varName.MatchString(k) {
			d.errorf(nil, "%s %s=…: %s is not a variable name", flag, clip(k), quote(k))
			continue
		}
		out[k] = v
	}
	for _, p := range missing {
		if _, ok := out[p.name]; !ok {
			if d.deferMissing {
				d.missing = append(d.missing, path+"."+p.name)
				continue
			}
			d.errorf(p.val, "%s.%s: no value; give one here or with %s %s=…", path, p.name, flag, p.name)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

var nameRE = regexp.MustCompile(`^[a-zA-Z]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?$`)

// CheckName reports whether name can name a service. The rule is SkyPilot's for cluster
// and service names; it also keeps names safe as file and log names.
func CheckName(name string) error {
	const maxLen = 63
	if len(name) > maxLen {
		return fmt.Errorf("%s is longer than %d characters", quote(name), maxLen)
	}
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%s is not a valid service name; start with a letter and use letters, digits, -, _ and .", quote(name))
	}
	return nil
}
