package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/replicas"
)

// DefaultImage runs replicas whose spec names no image (resources.image_id).
const DefaultImage = "vllm/vllm-openai:latest"

// ProviderPrefix starts every cluster's provider name: kubernetes:<name>. A spec that
// names plain "kubernetes" runs on every configured cluster.
const ProviderPrefix = "kubernetes"

// Cluster is one cluster as the daemon's providers file describes it.
type Cluster struct {
	// Name makes the provider kubernetes:<name>; default: the context, or "in-cluster".
	Name string `yaml:"name"`
	// Kubeconfig is the file (default: $KUBECONFIG, else ~/.kube/config); Context the
	// context in it (default: its current context). InCluster uses the pod's service
	// account instead (Arbiter itself running in the cluster).
	Kubeconfig string `yaml:"kubeconfig"`
	Context    string `yaml:"context"`
	InCluster  bool   `yaml:"in_cluster"`
	// Namespace the replica pods go in (default "default").
	Namespace string `yaml:"namespace"`
	// Image runs replicas whose spec names no resources.image_id (default DefaultImage).
	Image string `yaml:"image"`
	// ImagePullSecrets are secrets in Namespace the replica pods pull with.
	ImagePullSecrets []string `yaml:"image_pull_secrets"`
	// ServiceAccount the replica pods run as (default: the namespace's default).
	ServiceAccount string `yaml:"service_account"`
	// UnschedulableSeconds: a pod the scheduler cannot place for this long is a launch
	// refused for want of capacity (placement tries the next zone, then on-demand).
	// Default 120.
	UnschedulableSeconds float64 `yaml:"unschedulable_seconds"`
	// ProvisionSeconds: a pod placed on capacity the cluster creates on demand (a
	// Karpenter NodePool) may wait this long for its node (created, booted, registered)
	// before the launch counts as refused. Default 600.
	ProvisionSeconds float64 `yaml:"provision_seconds"`
	// Region is the cluster's region, for the capacity it can create (Karpenter
	// NodePools) where no node's topology.kubernetes.io/region label says.
	Region string `yaml:"region"`
	// StartSeconds bounds how long a scheduled pod may take to run (pulling a vLLM image
	// of 10 GB or more included). Default 1200.
	StartSeconds float64 `yaml:"start_seconds"`
	// PullSeconds is how long an image pull may keep failing (ErrImagePull,
	// ImagePullBackOff) before the launch gives up: a registry hiccup heals, a wrong image
	// name does not. Default 120.
	PullSeconds float64 `yaml:"pull_seconds"`
	// GraceSeconds is the pods' termination grace period (default 30).
	GraceSeconds float64 `yaml:"grace_seconds"`
	// AcceleratorLabel is a node label that names the GPU, read before the platforms' own
	// (cloud.google.com/gke-accelerator, nvidia.com/gpu.product,
	// karpenter.k8s.aws/instance-gpu-name); AcceleratorNames maps a label value to
	// SkyPilot's accelerator name where the built-in reading gets it wrong.
	AcceleratorLabel string            `yaml:"accelerator_label"`
	AcceleratorNames map[string]string `yaml:"accelerator_names"`
	// NodePools set the price (and, optionally, the capacity kind) of the nodes their
	// selector matches, ahead of the catalogs: an on-prem pool, a committed-use discount,
	// a machine type no catalog lists.
	NodePools []NodePool `yaml:"node_pools"`
}

// NodePool prices the nodes whose labels include all of Selector.
type NodePool struct {
	Selector        map[string]string `yaml:"selector"`
	PricePerGPUHour *float64          `yaml:"price_per_gpu_hour"`
	// Capacity overrides the capacity kind read from the labels: reserved (already paid
	// for: placement fills it first), spot or on_demand.
	Capacity fleet.Capacity `yaml:"capacity"`
	// InstanceType, Zones and MaxNodes declare a node pool that scales from zero (a GKE
	// node pool with autoscaling, an AKS node pool or an EKS managed node group under the
	// cluster autoscaler): while fewer than MaxNodes of its nodes exist, it offers
	// InstanceType (of Capacity) in each of Zones, priced from the catalogs (or
	// PricePerGPUHour), although none of its nodes may exist. A replica placed there is a
	// pod that selects the pool (Selector), zone and machine type, and waits
	// provision_seconds for the autoscaler to create its node, unless the autoscaler says
	// it will not (its NotTriggerScaleUp or FailedScaleUp event).
	InstanceType string   `yaml:"instance_type"`
	Zones        []string `yaml:"zones"`
	MaxNodes     int      `yaml:"max_nodes"`
}

// scalesFromZero says whether the entry declares nodes the cluster creates on demand.
func (np *NodePool) scalesFromZero() bool { return np.InstanceType != "" }

// CheckClusters reports a cluster entry that cannot work, or two that would have the same
// provider name; path names the file for the error.
func CheckClusters(path string, clusters []Cluster) error {
	seen := map[string]bool{}
	for i := range clusters {
		c := &clusters[i]
		if err := c.check(); err != nil {
			return fmt.Errorf("%s: kubernetes[%d]: %w", path, i, err)
		}
		if seen[c.ProviderName()] {
			return fmt.Errorf("%s: kubernetes[%d]: %s is configured twice; give one of them a name:", path, i, c.ProviderName())
		}
		seen[c.ProviderName()] = true
	}
	return nil
}

func (c *Cluster) check() error {
	if c.InCluster && (c.Kubeconfig != "" || c.Context != "") {
		return errors.New("in_cluster: true uses the pod's service account; drop kubeconfig and context")
	}
	if c.UnschedulableSeconds < 0 || c.StartSeconds < 0 || c.GraceSeconds < 0 || c.PullSeconds < 0 || c.ProvisionSeconds < 0 {
		return errors.New("unschedulable_seconds, provision_seconds, start_seconds, pull_seconds and grace_seconds must be ≥ 0")
	}
	if name := strings.TrimPrefix(c.ProviderName(), ProviderPrefix+":"); !clusterName.MatchString(name) {
		return fmt.Errorf("the cluster's name %q cannot be written in a spec's arbiter.providers (kubernetes:NAME): give it a name: of letters, digits, '-', '_' and '.'", name)
	}
	for i, p := range c.NodePools {
		if len(p.Selector) == 0 {
			return fmt.Errorf("node_pools[%d]: a selector of node labels is required, e.g. {cloud.google.com/gke-nodepool: h100-spot}", i)
		}
		if p.PricePerGPUHour != nil && *p.PricePerGPUHour < 0 {
			return fmt.Errorf("node_pools[%d].price_per_gpu_hour: must be ≥ 0", i)
		}
		if p.Capacity != "" && !p.Capacity.Valid() {
			return fmt.Errorf("node_pools[%d].capacity: %q: want reserved, spot or on_demand", i, p.Capacity)
		}
		if err := p.checkScaleFromZero(); err != nil {
			return fmt.Errorf("node_pools[%d]: %w", i, err)
		}
	}
	return nil
}

// checkScaleFromZero reports a declared scale-from-zero pool that says too little for its
// nodes to be offered, or the scale-from-zero fields on a pool that declares none.
func (p *NodePool) checkScaleFromZero() error {
	if !p.scalesFromZero() {
		if len(p.Zones) > 0 || p.MaxNodes != 0 {
			return errors.New("zones and max_nodes declare a pool that scales from zero: give its instance_type too")
		}
		return nil
	}
	switch {
	case p.Capacity == "":
		return fmt.Errorf("instance_type %s: say the pool's capacity (spot, on_demand or reserved): no node of it may exist to say", p.InstanceType)
	case len(p.Zones) == 0:
		return fmt.Errorf("instance_type %s: list the zones the autoscaler creates its nodes in (zones: [us-central1-a]; GKE's node locations)", p.InstanceType)
	case p.MaxNodes < 1:
		return fmt.Errorf("instance_type %s: max_nodes (the autoscaler's maximum for the pool) must be ≥ 1", p.InstanceType)
	}
	return nil
}

// clusterName is what spec accepts after "kubernetes:".
var clusterName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// ProviderName is the name specs and `serve status` know the cluster by.
func (c Cluster) ProviderName() string {
	switch {
	case c.Name != "":
		return ProviderPrefix + ":" + c.Name
	case c.Context != "":
		return ProviderPrefix + ":" + c.Context
	case c.InCluster:
		return ProviderPrefix + ":in-cluster"
	}
	return ProviderPrefix + ":default"
}

// restConfig loads the client configuration the cluster entry names.
func (c Cluster) restConfig() (*rest.Config, error) {
	if c.InCluster {
		return rest.InClusterConfig()
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if c.Kubeconfig != "" {
		rules.ExplicitPath = c.Kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: c.Context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("%s: kubeconfig: %w", c.ProviderName(), err)
	}
	return cfg, nil
}

// Config is everything a Provider needs besides its cluster entry.
type Config struct {
	Cluster
	// Owner identifies this control plane; its pods carry it as a label, and pods of another
	// owner are never listed or touched.
	Owner string
	// Rest, if set, is used instead of the entry's kubeconfig (tests).
	Rest *rest.Config
	// Catalog prices nodes by instance type; nil: the embedded catalogs.
	Catalog func() (*pricing.Catalog, error)
	// HealthEvery is how often the apiserver is checked (default 5 s): a cluster that does
	// not answer quotes and launches nothing until it does.
	HealthEvery time.Duration
	Log         *slog.Logger
	Now         func() time.Time
	// forceAfter: see the constant; tests shorten it.
	forceAfter time.Duration
}

func (c *Config) defaults() {
	if c.Namespace == "" {
		c.Namespace = "default"
	}
	if c.Image == "" {
		c.Image = DefaultImage
	}
	if c.ProvisionSeconds == 0 {
		c.ProvisionSeconds = 600
	}
	if c.UnschedulableSeconds == 0 {
		c.UnschedulableSeconds = 120
	}
	if c.StartSeconds == 0 {
		c.StartSeconds = 1200
	}
	if c.PullSeconds == 0 {
		c.PullSeconds = 120
	}
	if c.GraceSeconds == 0 {
		c.GraceSeconds = 30
	}
	if c.forceAfter <= 0 {
		c.forceAfter = forceAfter
	}
	if c.HealthEvery <= 0 {
		c.HealthEvery = 5 * time.Second
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

func secondsOf(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Providers builds a provider for each cluster, for owner. A cluster that cannot be
// reached is not an error here (it is reported and skipped until it answers), but a
// kubeconfig that does not load is.
func Providers(ctx context.Context, path string, clusters []Cluster, owner string, log *slog.Logger) ([]replicas.Provider, error) {
	var out []replicas.Provider
	for _, c := range clusters {
		p, err := New(ctx, Config{Cluster: c, Owner: owner, Log: log})
		if err != nil {
			return nil, fmt.Errorf("providers file %s: %w", path, err)
		}
		log.Info("kubernetes cluster configured", "provider", p.Name(), "namespace", p.Namespace())
		out = append(out, p)
	}
	return out, nil
}
