// Package replicas launches and terminates replicas through providers and defines a
// replica's life cycle and readiness probe.
package replicas

import (
	"context"
	"errors"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/spec"
)

// LaunchSpec is everything a provider needs to start one replica.
type LaunchSpec struct {
	ReplicaID string // also the provider-side tag that finds the replica again after a crash
	Service   string
	Version   int
	Run       string // shell command
	// Setup is the spec's setup command. Providers whose replicas share this machine run it
	// once per version (Setup); one whose replicas each start on a fresh machine or
	// container (kubernetes) runs it in each before Run.
	Setup   string
	Workdir string
	// Image is the container image the spec names (resources.image_id without "docker:");
	// "" for the provider's default. Only container providers use it.
	Image    string
	Envs     map[string]string
	Capacity fleet.Capacity
	Region   string
	Zone     string
	// Accelerator (SkyPilot's name, e.g. H100) × AcceleratorCount is the GPU the quote
	// launched on offered; InstanceType the machine type it priced. Empty: whatever the
	// provider runs (the local machine).
	Accelerator      string
	AcceleratorCount int
	InstanceType     string
	// PricePerHour, if set, is what the replica is billed (the local provider's
	// arbiter.local.price_per_hour); nil: the provider's own price.
	PricePerHour *float64
	// PriceSource says where PricePerHour came from (the quote's), for the instance to carry.
	PriceSource string
	// Port is the replica port the spec names (service.ports); 0 if none.
	Port int
	// DiskGiB is the spec's resources.disk_size; 0: the provider's default. Only VM
	// providers use it.
	DiskGiB int
	// NumNodes is how many nodes the replica spans (num_nodes; 0 reads as 1). The nodes
	// are one replica: launched together, one Instance whose Address is the head's (rank
	// 0), gone when any node is gone, terminated together. Each node's run: sees
	// SkyPilot's SKYPILOT_NODE_RANK, SKYPILOT_NUM_NODES and SKYPILOT_NODE_IPS (one address
	// a line, the head's first).
	NumNodes int
	// FileMounts, Volumes and the pod labels and annotations are the spec's file_mounts,
	// volumes and config.kubernetes.custom_metadata; spec validation has refused what the
	// provider cannot honour.
	FileMounts                []spec.FileMount
	Volumes                   []spec.Volume
	PodLabels, PodAnnotations map[string]string
}

// Nodes is NumNodes, at least 1.
func (s LaunchSpec) Nodes() int { return max(1, s.NumNodes) }

// Instance is a replica as a provider sees it.
type Instance struct {
	ReplicaID    string
	Handle       string // the provider's own name for it
	Address      string // host:port of its HTTP server
	Capacity     fleet.Capacity
	Region, Zone string
	PricePerHour float64
	// PriceSource says where PricePerHour came from (a catalog file, a provider's price
	// API); "" where the provider does not say.
	PriceSource string
}

// Status is what a provider says about one handle.
type Status string

const (
	StatusRunning Status = "running"
	StatusGone    Status = "gone" // exited, deleted or reclaimed
)

// Notice is a provider's warning that it will reclaim an instance (spot preemption).
type Notice struct {
	ReplicaID string
	Handle    string
	Deadline  time.Time
	// Reason is what announced it, in the provider's words (a node's termination taint);
	// "" if the provider cannot say.
	Reason string
}

// Quote is a price the provider offers for one replica.
type Quote struct {
	Provider, Region, Zone string
	Capacity               fleet.Capacity
	PricePerHour           float64
	// Accelerator × AcceleratorCount and InstanceType say what the offer runs on, for the
	// launch that takes it; empty where the provider has one kind of machine.
	Accelerator      string
	AcceleratorCount int
	InstanceType     string
	// Unpriced, when not empty, says why the provider knows no price for capacity it could
	// launch on (a node pool whose machine type no catalog lists): placement leaves such an
	// offer out rather than take it as free, and reports it.
	Unpriced string
	// PriceSource says where PricePerHour comes from (a catalog file, a provider's price
	// API), for decision logs; "" where the provider does not say.
	PriceSource string
}

// Provider is where replicas run.
type Provider interface {
	Name() string
	// Setup runs a version's setup command once before its first replica.
	Setup(ctx context.Context, service string, version int, setup, workdir string, envs map[string]string) error
	Launch(ctx context.Context, spec LaunchSpec) (Instance, error)
	// Terminate stops an instance and returns once it is gone (idempotent).
	Terminate(ctx context.Context, handle string) error
	// List returns every instance this provider runs for this control plane, found by the
	// provider's own tags, so that a restarted control plane can find what it launched.
	List(ctx context.Context) ([]Instance, error)
	// Status says whether an instance still runs; for one gone, reason says why in the
	// provider's own words (a pod's CrashLoopBackOff, a node reclaimed), or "" if it cannot.
	Status(ctx context.Context, handle string) (st Status, reason string, err error)
	// Notices delivers preemption warnings.
	Notices() <-chan Notice
	// Quote lists the offers at which the provider would run one replica of the service
	// now, for placement to choose from; none means the provider is not a market (the
	// local machine) and launches take the spec's labels.
	Quote(ctx context.Context, service string, sp *spec.Service) ([]Quote, error)
}

// Bounded is a provider that can hold only so many replicas at once (the local machine's
// CPUs and memory). The control plane refuses a service that could never fit.
type Bounded interface {
	// MaxReplicas is the most replicas the provider runs at once (0: no known bound).
	MaxReplicas() int
}

// ErrNoCapacity is a launch refused for want of capacity where it was asked for (a spot
// pool that is empty now): not the replica's fault, so not a crash loop, and a reason to
// try another zone.
var ErrNoCapacity = errors.New("no capacity")
