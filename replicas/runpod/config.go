package runpod

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"
)

// ProviderName is the provider's name in specs (arbiter.providers: [runpod]).
const ProviderName = "runpod"

// DefaultEndpoint is RunPod's GraphQL API (https://graphql-spec.runpod.io/). Its REST API
// v1 was retired on 2026-11-15 and v2 is in beta; the GraphQL API is the one that rents
// interruptible (spot) pods with a bid and reports each GPU type's minimum bid and stock.
const DefaultEndpoint = "https://api.runpod.io/graphql"

// DefaultImage runs replicas whose spec names no container image: RunPod's PyTorch image,
// which has no entrypoint of its own, so the pod's start command (the replica's script)
// runs as given.
const DefaultImage = "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04"

// DefaultPort is the replica port when the spec names none (service.ports).
const DefaultPort = 8000

// Account is the providers file's runpod section. The API key is never in it: it comes
// from the environment variable APIKeyEnv (default RUNPOD_API_KEY).
type Account struct {
	APIKeyEnv string `yaml:"api_key_env"`
	// Endpoint replaces DefaultEndpoint (a local fake in tests).
	Endpoint string `yaml:"endpoint"`
	// CloudType is SECURE (RunPod's data centers), COMMUNITY (hosts' machines) or ALL
	// (default).
	CloudType string `yaml:"cloud_type"`
	// DataCenters, if set, are the only data centers pods may run in (e.g. US-TX-3).
	DataCenters []string `yaml:"data_centers"`
	// Image runs replicas whose spec names no resources.image_id (default DefaultImage).
	// It must run the start command it is given (no entrypoint of its own).
	Image string `yaml:"image"`
	// ContainerDiskGiB is the pod's disk when the spec gives no resources.disk_size
	// (default 50).
	ContainerDiskGiB int `yaml:"container_disk_gib"`
	// BidMargin is how far above the minimum bid a spot pod bids (default 0.10: 10 %); a
	// bid at the minimum is the first to be outbid.
	BidMargin *float64 `yaml:"bid_margin"`
	// GPUTypes adds or replaces the RunPod GPU type ids an accelerator name (SkyPilot's,
	// as in resources.accelerators) maps to.
	GPUTypes map[string][]string `yaml:"gpu_types"`
	// PollSeconds is how often pods are polled for interruptions (default 5).
	PollSeconds float64 `yaml:"poll_seconds"`
	// StartSeconds bounds how long a pod may take to run with its port mapped (default 900).
	StartSeconds float64 `yaml:"start_seconds"`
}

// Check reports an account section that cannot work.
func (a *Account) Check() error {
	if a.Endpoint != "" {
		u, err := url.Parse(a.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("endpoint: %q is not an http(s) URL", a.Endpoint)
		}
	}
	if a.CloudType != "" && !slices.Contains([]string{"SECURE", "COMMUNITY", "ALL"}, a.CloudType) {
		return fmt.Errorf("cloud_type: want SECURE, COMMUNITY or ALL, got %q", a.CloudType)
	}
	if a.BidMargin != nil && (*a.BidMargin < 0 || *a.BidMargin > 10) {
		return fmt.Errorf("bid_margin: want a fraction ≥ 0 (0.1 bids 10 %% above the minimum), got %g", *a.BidMargin)
	}
	if a.ContainerDiskGiB < 0 || a.PollSeconds < 0 || a.StartSeconds < 0 {
		return errors.New("container_disk_gib, poll_seconds and start_seconds must be ≥ 0")
	}
	return nil
}

// Config is what New needs beyond the account.
type Config struct {
	Account
	// Owner is the control plane's id, set in every pod's environment: RunPod pods carry
	// no tags, so List finds this control plane's pods by it.
	Owner string
	// APIKey overrides the environment (tests).
	APIKey string
	// PollInterval is how often a launch or termination asks for the pod (default 2 s).
	PollInterval time.Duration
	Now          func() time.Time
	Log          *slog.Logger
}

func (c *Config) defaults() error {
	if c.APIKey == "" {
		env := c.APIKeyEnv
		if env == "" {
			env = "RUNPOD_API_KEY"
		}
		c.APIKey = os.Getenv(env)
		if c.APIKey == "" {
			return fmt.Errorf("runpod provider: no API key: set %s (an API key from RunPod's console, Settings → API Keys)", env)
		}
	}
	if c.Endpoint == "" {
		c.Endpoint = DefaultEndpoint
	}
	if c.CloudType == "" {
		c.CloudType = "ALL"
	}
	if c.Image == "" {
		c.Image = DefaultImage
	}
	if c.ContainerDiskGiB == 0 {
		c.ContainerDiskGiB = 50
	}
	if c.BidMargin == nil {
		m := 0.10
		c.BidMargin = &m
	}
	if c.PollSeconds == 0 {
		c.PollSeconds = 5
	}
	if c.StartSeconds == 0 {
		c.StartSeconds = 900
	}
	if c.PollInterval <= 0 {
		c.PollInterval = 2 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// gpuTypes maps SkyPilot's accelerator names to RunPod's GPU type ids, as RunPod lists
// them (https://docs.runpod.io/references/gpu-types), most preferred first.
var gpuTypes = map[string][]string{
	"H100":      {"NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL"},
	"H100-SXM":  {"NVIDIA H100 80GB HBM3"},
	"H100-NVL":  {"NVIDIA H100 NVL"},
	"H200":      {"NVIDIA H200"},
	"B200":      {"NVIDIA B200"},
	"A100-80GB": {"NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"},
	"A100":      {"NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"},
	"L40S":      {"NVIDIA L40S"},
	"L40":       {"NVIDIA L40"},
	"L4":        {"NVIDIA L4"},
	"A40":       {"NVIDIA A40"},
	"A6000":     {"NVIDIA RTX A6000"},
	"RTX6000":   {"NVIDIA RTX 6000 Ada Generation"},
	"RTX4090":   {"NVIDIA GeForce RTX 4090"},
	"RTX3090":   {"NVIDIA GeForce RTX 3090"},
	"RTX5090":   {"NVIDIA GeForce RTX 5090"},
	"MI300X":    {"AMD Instinct MI300X OAM"},
}

// typesFor is the RunPod GPU type ids for an accelerator name (case-insensitive).
func (c *Config) typesFor(accelerator string) []string {
	for name, ids := range c.GPUTypes {
		if strings.EqualFold(name, accelerator) {
			return ids
		}
	}
	for name, ids := range gpuTypes {
		if strings.EqualFold(name, accelerator) {
			return ids
		}
	}
	return nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
