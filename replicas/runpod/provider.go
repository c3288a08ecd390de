// Package runpod is the provider that runs replicas as RunPod GPU pods, on-demand or
// interruptible (RunPod's spot, rented with a bid), through RunPod's GraphQL API with
// plain net/http: RunPod publishes no Go client.
//
// Pods carry no tags, so every pod this provider starts has the control plane's id and
// the replica's id in its environment, which is how List finds them after a crash; the
// pod's name says the same for people. RunPod gives no warning before it stops an
// interruptible pod: the provider polls its pods and reports one that stopped on its own
// as a preemption notice due now.
package runpod

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/spec"
)

// Environment variables every pod carries.
const (
	EnvOwner    = "ARBITER_OWNER"
	EnvReplica  = "ARBITER_REPLICA_ID"
	EnvService  = "ARBITER_SERVICE"
	EnvCapacity = "ARBITER_CAPACITY"
	EnvPrice    = "ARBITER_PRICE_PER_HOUR"
	envSetup    = "ARBITER_SETUP"
	envSource   = "ARBITER_PRICE_SOURCE"
	envRun      = "ARBITER_RUN"
)

// startCommand is every pod's start command (dockerArgs): the spec's setup, then its run,
// both given as environment variables so no quoting of the spec's scripts is needed.
// ARBITER_HOST is the address to bind (0.0.0.0 in a pod; the test double gives each pod a
// loopback address of its own).
const startCommand = `bash -c 'export ARBITER_HOST="${ARBITER_HOST:-0.0.0.0}"; cd "${ARBITER_DIR:-/workspace}" 2>/dev/null || true; bash -c "$ARBITER_SETUP" && exec bash -c "$ARBITER_RUN"'`

// The pod fields every call reads (https://graphql-spec.runpod.io/#definition-Pod).
const podFields = `id name desiredStatus costPerHr env runtime { uptimeInSeconds ports { ip isIpPublic privatePort publicPort type } }`

const (
	qDeployOnDemand = `mutation Deploy($input: PodFindAndDeployOnDemandInput!) { podFindAndDeployOnDemand(input: $input) { ` + podFields + ` } }`
	qRentSpot       = `mutation Rent($input: PodRentInterruptableInput!) { podRentInterruptable(input: $input) { ` + podFields + ` } }`
	qTerminate      = `mutation Terminate($input: PodTerminateInput!) { podTerminate(input: $input) }`
	qPod            = `query Pod($input: PodFilter!) { pod(input: $input) { ` + podFields + ` } }`
	qPods           = `query Pods { myself { pods { ` + podFields + ` } } }`
	qGPUTypes       = `query GpuTypes($price: GpuLowestPriceInput!) { gpuTypes { id displayName memoryInGb lowestPrice(input: $price) { minimumBidPrice uninterruptablePrice stockStatus } } }`
)

type pod struct {
	ID            string   `json:"id"`
	Name          string   `json:"name"`
	DesiredStatus string   `json:"desiredStatus"`
	CostPerHr     float64  `json:"costPerHr"`
	Env           []string `json:"env"`
	Runtime       *struct {
		Ports []struct {
			IP          string `json:"ip"`
			IsIPPublic  bool   `json:"isIpPublic"`
			PrivatePort int    `json:"privatePort"`
			PublicPort  int    `json:"publicPort"`
			Type        string `json:"type"`
		} `json:"ports"`
	} `json:"runtime"`
}

// Provider runs replicas as RunPod pods. It implements replicas.Provider.
type Provider struct {
	cfg     Config
	api     *client
	notices *replicas.Notifier

	mu sync.Mutex
	// prices by GPU count, with when they were asked.
	prices map[int]priceList
	// ending: pods this provider is terminating (their stop is not an interruption);
	// ending: pods this provider is terminating (not interrupted).
	ending map[string]bool
}

type priceList struct {
	at    time.Time
	types []gpuType
}

type gpuType struct {
	ID          string `json:"id"`
	DisplayName string `json:"displayName"`
	Lowest      struct {
		MinimumBidPrice      float64 `json:"minimumBidPrice"`
		UninterruptablePrice float64 `json:"uninterruptablePrice"`
		StockStatus          string  `json:"stockStatus"`
	} `json:"lowestPrice"`
}

var _ replicas.Provider = (*Provider)(nil)

// New returns the provider and starts watching its pods for interruptions until ctx ends.
func New(ctx context.Context, cfg Config) (*Provider, error) {
	if cfg.Owner == "" {
		return nil, errors.New("runpod provider: an owner is required")
	}
	if err := cfg.Account.Check(); err != nil {
		return nil, fmt.Errorf("runpod provider: %w", err)
	}
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	p := &Provider{cfg: cfg, notices: replicas.NewNotifier(64), prices: map[int]priceList{},
		ending: map[string]bool{}}
	p.api = &client{endpoint: cfg.Endpoint, key: cfg.APIKey, http: &http.Client{Timeout: time.Minute}, log: cfg.Log.Warn}
	go p.watch(ctx)
	return p, nil
}

// Name implements replicas.Provider.
func (p *Provider) Name() string { return ProviderName }

// Setup implements replicas.Provider: each pod runs the setup in its start command.
func (p *Provider) Setup(context.Context, string, int, string, string, map[string]string) error {
	return nil
}

// Notices implements replicas.Provider.
func (p *Provider) Notices() <-chan replicas.Notice { return p.notices.C() }

func (p *Provider) pod(ctx context.Context, id string) (*pod, error) {
	var out struct {
		Pod *pod `json:"pod"`
	}
	if err := p.api.call(ctx, qPod, map[string]any{"input": map[string]any{"podId": id}}, &out); err != nil {
		return nil, err
	}
	return out.Pod, nil
}

func (p *Provider) pods(ctx context.Context) ([]pod, error) {
	var out struct {
		Myself struct {
			Pods []pod `json:"pods"`
		} `json:"myself"`
	}
	if err := p.api.call(ctx, qPods, nil, &out); err != nil {
		return nil, err
	}
	return out.Myself.Pods, nil
}

// mine reports whether a pod is this control plane's.
func (p *Provider) mine(pd *pod) bool { return envMap(pd.Env)[EnvOwner] == p.cfg.Owner }

// instance is a replica as the provider reports it; its address is the pod's public IP
// and the public port its replica port maps to ("" until the pod runs).
func (p *Provider) instance(pd *pod) replicas.Instance {
	env := envMap(pd.Env)
	in := replicas.Instance{ReplicaID: env[EnvReplica], Handle: pd.ID, Capacity: fleet.Capacity(env[EnvCapacity]), Region: strings.ToLower(p.cfg.CloudType)}
	in.PricePerHour, _ = strconv.ParseFloat(env[EnvPrice], 64)
	in.PriceSource = env[envSource]
	if pd.CostPerHr > 0 {
		in.PricePerHour, in.PriceSource = pd.CostPerHr, SourcePodCost // what RunPod bills: the bid won, or the on-demand rate
	}
	port, _ := strconv.Atoi(env["PORT"])
	if pd.Runtime != nil {
		for _, pt := range pd.Runtime.Ports {
			if pt.PrivatePort == port && pt.IsIPPublic && pt.Type == "tcp" && pt.IP != "" {
				in.Address = net.JoinHostPort(pt.IP, strconv.Itoa(pt.PublicPort))
			}
		}
	}
	return in
}

// Launch implements replicas.Provider: an on-demand pod, or an interruptible one bidding
// the quote's price, on the quote's GPU type; then waits until it runs with its port mapped.
// A pod of this replica that already runs (a launch retried after a crash: RunPod has no
// idempotency token) is returned instead of a second.
func (p *Provider) Launch(ctx context.Context, ls replicas.LaunchSpec) (replicas.Instance, error) {
	what := fmt.Sprintf("runpod: launch %s (%s %s×%d)", ls.ReplicaID, ls.Capacity, cmp.Or(ls.InstanceType, "?"), max(ls.AcceleratorCount, 1))
	if ls.InstanceType == "" || ls.PricePerHour == nil {
		return replicas.Instance{}, fmt.Errorf("%s: launches on runpod come from a quote (a GPU type and a price)", what)
	}
	if existing, err := p.find(ctx, ls.ReplicaID); err != nil {
		return replicas.Instance{}, classify(err, what)
	} else if existing != nil {
		p.cfg.Log.Info("runpod pod of this replica already exists; adopting it", "replica", ls.ReplicaID, "pod", existing.ID)
		return p.awaitRunning(ctx, existing.ID)
	}
	port := cmp.Or(ls.Port, DefaultPort)
	count := max(ls.AcceleratorCount, 1)
	env := map[string]string{}
	maps.Copy(env, ls.Envs)
	maps.Copy(env, map[string]string{EnvOwner: p.cfg.Owner, EnvReplica: ls.ReplicaID, EnvService: ls.Service, EnvCapacity: string(ls.Capacity),
		EnvPrice: formatPrice(*ls.PricePerHour), envSource: ls.PriceSource, "PORT": strconv.Itoa(port), "SKYPILOT_NUM_GPUS_PER_NODE": strconv.Itoa(count),
		envSetup: cmp.Or(ls.Setup, "true"), envRun: ls.Run})
	input := map[string]any{
		"cloudType": p.cfg.CloudType, "gpuCount": count, "gpuTypeId": ls.InstanceType,
		"name": podName(ls.Service, ls.ReplicaID), "imageName": cmp.Or(ls.Image, p.cfg.Image), "dockerArgs": startCommand,
		"ports": strconv.Itoa(port) + "/tcp", "containerDiskInGb": cmp.Or(ls.DiskGiB, p.cfg.ContainerDiskGiB), "volumeInGb": 0,
		"supportPublicIp": true, "env": envList(env),
	}
	if len(p.cfg.DataCenters) == 1 {
		input["dataCenterId"] = p.cfg.DataCenters[0]
	}
	var created struct {
		Deploy *pod `json:"podFindAndDeployOnDemand"`
		Rent   *pod `json:"podRentInterruptable"`
	}
	query := qDeployOnDemand
	if ls.Capacity == fleet.Spot {
		query = qRentSpot
		input["bidPerGpu"] = *ls.PricePerHour / float64(count)
	}
	if err := p.api.call(ctx, query, map[string]any{"input": input}, &created); err != nil {
		return replicas.Instance{}, classify(err, what)
	}
	pd := cmp.Or(created.Deploy, created.Rent)
	if pd == nil || pd.ID == "" {
		return replicas.Instance{}, fmt.Errorf("%s: RunPod answered no pod", what)
	}
	p.cfg.Log.Info("runpod pod created", "replica", ls.ReplicaID, "pod", pd.ID, "gpu", ls.InstanceType, "capacity", ls.Capacity)
	in, err := p.awaitRunning(ctx, pd.ID)
	if err != nil {
		p.terminateQuietly(pd.ID)
		return replicas.Instance{}, fmt.Errorf("%s: pod %s: %w", what, pd.ID, err)
	}
	return in, nil
}

// podName is what people see in RunPod's console.
func podName(service, replicaID string) string { return "arbiter-" + service + "-" + replicaID }

// find returns this control plane's live pod of a replica, if any.
func (p *Provider) find(ctx context.Context, replicaID string) (*pod, error) {
	pods, err := p.pods(ctx)
	if err != nil {
		return nil, err
	}
	for i := range pods {
		if p.mine(&pods[i]) && envMap(pods[i].Env)[EnvReplica] == replicaID && pods[i].DesiredStatus == "RUNNING" {
			return &pods[i], nil
		}
	}
	return nil, nil
}

func (p *Provider) awaitRunning(ctx context.Context, id string) (replicas.Instance, error) {
	ctx, cancel := context.WithTimeout(ctx, seconds(p.cfg.StartSeconds))
	defer cancel()
	for {
		pd, err := p.pod(ctx, id)
		switch {
		case err != nil && ctx.Err() == nil:
			p.cfg.Log.Warn("runpod: cannot read a starting pod", "pod", id, "err", err)
		case err == nil && pd == nil:
			return replicas.Instance{}, errors.New("the pod is gone")
		case err == nil && pd.DesiredStatus != "RUNNING":
			err := fmt.Errorf("the pod is %s before it ran", pd.DesiredStatus)
			if envMap(pd.Env)[EnvCapacity] == string(fleet.Spot) {
				err = fmt.Errorf("%w: %v (outbid or reclaimed at once)", replicas.ErrNoCapacity, err)
			}
			return replicas.Instance{}, err
		case err == nil:
			if in := p.instance(pd); in.Address != "" {
				return in, nil
			}
		}
		select {
		case <-ctx.Done():
			return replicas.Instance{}, fmt.Errorf("not running with its port mapped in time: %w", ctx.Err())
		case <-time.After(p.cfg.PollInterval):
		}
	}
}

// List implements replicas.Provider: this control plane's pods that are not terminated.
func (p *Provider) List(ctx context.Context) ([]replicas.Instance, error) {
	pods, err := p.pods(ctx)
	if err != nil {
		return nil, classify(err, "runpod: list pods")
	}
	var out []replicas.Instance
	for i := range pods {
		if p.mine(&pods[i]) && pods[i].DesiredStatus != "TERMINATED" {
			out = append(out, p.instance(&pods[i]))
		}
	}
	return out, nil
}

// Status implements replicas.Provider.
func (p *Provider) Status(ctx context.Context, handle string) (replicas.Status, string, error) {
	pd, err := p.pod(ctx, handle)
	if err != nil {
		return "", "", classify(err, "runpod: status of "+handle)
	}
	switch {
	case pd == nil:
		return replicas.StatusGone, "RunPod no longer knows the pod", nil
	case pd.DesiredStatus == "RUNNING":
		return replicas.StatusRunning, "", nil
	case pd.DesiredStatus == "EXITED" && envMap(pd.Env)[EnvCapacity] == string(fleet.Spot):
		return replicas.StatusGone, interrupted, nil
	}
	return replicas.StatusGone, "pod " + strings.ToLower(pd.DesiredStatus), nil
}

// Terminate implements replicas.Provider: podTerminate, then waits until the pod is gone.
func (p *Provider) Terminate(ctx context.Context, handle string) error {
	p.mu.Lock()
	p.ending[handle] = true
	p.mu.Unlock()
	if err := p.api.call(ctx, qTerminate, map[string]any{"input": map[string]any{"podId": handle}}, nil); err != nil && !strings.Contains(strings.ToLower(err.Error()), "not found") {
		return classify(err, "runpod: terminate "+handle)
	}
	for {
		pd, err := p.pod(ctx, handle)
		if err == nil && (pd == nil || pd.DesiredStatus == "TERMINATED") {
			p.mu.Lock()
			delete(p.ending, handle)
			p.mu.Unlock()
			p.notices.Forget(handle)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("runpod: terminate %s: not gone yet: %w", handle, ctx.Err())
		case <-time.After(p.cfg.PollInterval):
		}
	}
}

func (p *Provider) terminateQuietly(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.api.call(ctx, qTerminate, map[string]any{"input": map[string]any{"podId": id}}, nil); err != nil {
		p.cfg.Log.Error("runpod: cannot terminate a pod whose launch failed; List will find it by its environment", "pod", id, "err", err)
	}
}

// watch polls this control plane's pods and reports an interruptible one that RunPod
// stopped as a preemption notice due now: RunPod warns no one before it does.
func (p *Provider) watch(ctx context.Context) {
	t := time.NewTicker(seconds(p.cfg.PollSeconds))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pods, err := p.pods(ctx)
		if err != nil {
			if ctx.Err() == nil {
				p.cfg.Log.Warn("runpod: cannot poll pods for interruptions", "err", err)
			}
			continue
		}
		for i := range pods {
			pd := &pods[i]
			env := envMap(pd.Env)
			if !p.mine(pd) || env[EnvCapacity] != string(fleet.Spot) || pd.DesiredStatus != "EXITED" {
				continue
			}
			p.mu.Lock()
			ending := p.ending[pd.ID]
			p.mu.Unlock()
			if ending || p.notices.Sent(pd.ID) {
				continue
			}
			n := replicas.Notice{ReplicaID: env[EnvReplica], Handle: pd.ID, Deadline: p.cfg.Now(), Reason: interrupted}
			if p.notices.Send(n) { // else said again at the next poll
				p.cfg.Log.Info("runpod interruption", "replica", n.ReplicaID, "pod", pd.ID)
			}
		}
	}
}

// interrupted says why an interruptible pod is gone, in the notice and in Status alike:
// whichever sees it first, the control plane's log reads the same.
const interrupted = "RunPod stopped the interruptible pod (outbid, or its host reclaimed it)"

// priceTTL: RunPod's bids and stock move by the minute.
const priceTTL = time.Minute

func (p *Provider) gpuPrices(ctx context.Context, count int) ([]gpuType, error) {
	p.mu.Lock()
	pl, ok := p.prices[count]
	p.mu.Unlock()
	if ok && p.cfg.Now().Sub(pl.at) < priceTTL {
		return pl.types, nil
	}
	price := map[string]any{"gpuCount": count}
	switch p.cfg.CloudType {
	case "SECURE":
		price["secureCloud"] = true
	case "COMMUNITY":
		price["secureCloud"] = false
	}
	if len(p.cfg.DataCenters) == 1 {
		price["dataCenterId"] = p.cfg.DataCenters[0]
	}
	var out struct {
		GPUTypes []gpuType `json:"gpuTypes"`
	}
	if err := p.api.call(ctx, qGPUTypes, map[string]any{"price": price}, &out); err != nil {
		return nil, classify(err, "runpod: GPU prices")
	}
	p.mu.Lock()
	p.prices[count] = priceList{at: p.cfg.Now(), types: out.GPUTypes}
	p.mu.Unlock()
	return out.GPUTypes, nil
}

// Where prices come from: quotes from gpuTypes, a running pod's from what RunPod bills it.
const (
	SourceGPUTypes = "runpod:gpuTypes.lowestPrice"
	SourcePodCost  = "runpod:pod.costPerHr"
)

// Quote implements replicas.Provider: for each accelerator the spec accepts that RunPod
// has, its on-demand price and, with use_spot, its minimum bid plus BidMargin, from the
// API now; a GPU type out of stock is not offered.
func (p *Provider) Quote(ctx context.Context, service string, sp *spec.Service) ([]replicas.Quote, error) {
	var out []replicas.Quote
	var unknown []string
	for _, cand := range candidates(sp.Resources) {
		if cand.cloud != "" && cand.cloud != ProviderName {
			continue
		}
		ids := p.cfg.typesFor(cand.acc.Name)
		if len(ids) == 0 {
			unknown = append(unknown, cand.acc.Name)
			continue
		}
		types, err := p.gpuPrices(ctx, cand.acc.Count)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			i := slices.IndexFunc(types, func(g gpuType) bool { return g.ID == id })
			if i < 0 {
				continue
			}
			g := types[i]
			if g.Lowest.StockStatus == "" || strings.EqualFold(g.Lowest.StockStatus, "none") {
				continue // none to rent now
			}
			region := strings.ToLower(p.cfg.CloudType)
			if g.Lowest.UninterruptablePrice > 0 {
				out = append(out, replicas.Quote{Provider: ProviderName, Region: region, Capacity: fleet.OnDemand,
					PricePerHour: g.Lowest.UninterruptablePrice * float64(cand.acc.Count), Accelerator: cand.acc.Name,
					AcceleratorCount: cand.acc.Count, InstanceType: g.ID, PriceSource: SourceGPUTypes})
			}
			if cand.spot && g.Lowest.MinimumBidPrice > 0 {
				bid := g.Lowest.MinimumBidPrice * (1 + *p.cfg.BidMargin)
				out = append(out, replicas.Quote{Provider: ProviderName, Region: region, Capacity: fleet.Spot,
					PricePerHour: bid * float64(cand.acc.Count), Accelerator: cand.acc.Name, AcceleratorCount: cand.acc.Count,
					InstanceType: g.ID, PriceSource: SourceGPUTypes + " (minimum bid + bid_margin)"})
			}
		}
	}
	if len(out) == 0 {
		why := "no GPU type the spec accepts is in stock on RunPod now"
		if len(unknown) > 0 {
			why = fmt.Sprintf("RunPod has no GPU type known for %s (map it with gpu_types in the providers file)", strings.Join(unknown, ", "))
		}
		return nil, fmt.Errorf("runpod: %s: %s", service, why)
	}
	return out, nil
}

type candidate struct {
	acc   spec.Accelerator
	cloud string
	spot  bool
}

// candidates lists the accelerators a spec's resources accept, with the cloud each is
// pinned to ("" for any).
func candidates(r spec.Resources) []candidate {
	var out []candidate
	add := func(r spec.Resources) {
		for _, a := range r.Accelerators {
			out = append(out, candidate{acc: a, cloud: r.Cloud, spot: r.UseSpot})
		}
	}
	if len(r.AnyOf)+len(r.Ordered) == 0 {
		add(r)
	}
	for _, c := range append(slices.Clone(r.AnyOf), r.Ordered...) {
		add(c)
	}
	return out
}
