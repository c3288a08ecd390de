package kubernetes

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/spec"
)

// pool is a set of schedulable nodes that are one offer: the same capacity kind, place,
// GPU and machine type.
type pool struct {
	key         poolKey
	cloud       string
	zoneID      string
	gpusPerNode int64
	nodes       int
	accelKey    string
	accelValues []string
	poolLabels  map[string]string // the configured node pool that matched, if any
	pricePerGPU float64
	priced      bool
	// priceSource says which rule priced the pool, for PRICED BY: the configured node
	// pool's price, or the catalog of the cloud a rule named (provider ID, a platform
	// label, a node pool sibling, an instance type only one cloud lists).
	priceSource   string
	unpricedWhy   string
	configuredCap bool
	// creator names what creates this pool's nodes when a pod asks (none may exist yet): a
	// Karpenter NodePool, a node pool that scales from zero. Its pods are pinned to it and
	// wait ProvisionSeconds for a node, unless the creator says it will not make one.
	creator string
}

type poolKey struct {
	region, zone, accel, instanceType string
	capacity                          fleet.Capacity
	// nodePool is the index of the configured node pool its nodes match (-1: none), so
	// that nodes priced differently are never one offer.
	nodePool int
}

// pools groups the schedulable nodes into offers, each priced, and returns every node and
// how it was described (a cordoned or tainted one too: it still says where its pool runs).
func (p *Provider) pools() ([]*pool, []*corev1.Node, []nodeInfo) {
	byKey := map[poolKey]*pool{}
	var prices priceIndex
	var priceErr error
	if idx, err := p.prices(); err == nil {
		prices = idx
	} else {
		priceErr = err
	}
	var nodes []*corev1.Node
	var infos []nodeInfo
	for _, obj := range p.nodes.GetStore().List() {
		if n, ok := obj.(*corev1.Node); ok {
			nodes = append(nodes, n)
			infos = append(infos, describeNode(n, p.cfg.AcceleratorLabel, p.cfg.AcceleratorNames))
		}
	}
	// Every node counts as a sibling, a tainted or cordoned one too: it still says where
	// its pool runs.
	siblings := poolClouds(infos)
	for i, n := range nodes {
		ni := infos[i]
		if !ni.schedulable {
			continue
		}
		prices.infer(&ni, siblings)
		np, npIndex := p.nodePool(n)
		if np != nil && np.Capacity != "" {
			ni.capacity = np.Capacity
		}
		k := poolKey{region: ni.region, zone: ni.zone, accel: ni.accel, instanceType: ni.instanceType, capacity: ni.capacity, nodePool: npIndex}
		pl := byKey[k]
		if pl == nil {
			pl = &pool{key: k, cloud: ni.cloud, zoneID: ni.zoneID, accelKey: ni.accelKey}
			if np != nil {
				pl.poolLabels, pl.configuredCap = np.Selector, np.Capacity != ""
			}
			pl.setPrice(np, prices, priceErr, ni)
			byKey[k] = pl
		}
		pl.nodes++
		pl.gpusPerNode = max(pl.gpusPerNode, ni.gpus)
		if ni.accelKey == pl.accelKey && ni.accelValue != "" && !slices.Contains(pl.accelValues, ni.accelValue) {
			pl.accelValues = append(pl.accelValues, ni.accelValue)
		}
	}
	out := slices.Collect(maps.Values(byKey))
	slices.SortFunc(out, func(a, b *pool) int {
		return cmp.Or(strings.Compare(a.key.region, b.key.region), strings.Compare(a.key.zone, b.key.zone), strings.Compare(string(a.key.capacity), string(b.key.capacity)),
			strings.Compare(a.key.accel, b.key.accel), strings.Compare(a.key.instanceType, b.key.instanceType), a.key.nodePool-b.key.nodePool)
	})
	return out, nodes, infos
}

// setPrice prices the pool as its node ni: at the configured node pool's price if np has
// one, else from the catalogs (idx, or why they did not load).
func (pl *pool) setPrice(np *NodePool, idx priceIndex, idxErr error, ni nodeInfo) {
	switch {
	case np != nil && np.PricePerGPUHour != nil:
		pl.pricePerGPU, pl.priced, pl.priceSource = *np.PricePerGPUHour, true, "node_pools price_per_gpu_hour"
	case idxErr != nil:
		pl.unpricedWhy = "the price catalogs did not load: " + idxErr.Error()
	default:
		pl.pricePerGPU, pl.priceSource, pl.unpricedWhy = idx.lookup(ni)
		pl.priced = pl.unpricedWhy == ""
	}
}

// nodePool is the first configured node pool whose selector the node matches, and its
// index (-1: none).
func (p *Provider) nodePool(n *corev1.Node) (*NodePool, int) {
	for i := range p.cfg.NodePools {
		np := &p.cfg.NodePools[i]
		match := true
		for k, v := range np.Selector {
			if n.Labels[k] != v {
				match = false
				break
			}
		}
		if match {
			return np, i
		}
	}
	return nil, -1
}

// slots is how many pods asking for count GPUs each the pool's nodes hold when empty;
// any number for pods that ask for none.
func (pl *pool) slots(count int) int {
	if count <= 0 || pl.creator != "" {
		return int(^uint(0) >> 1) // the creator makes as many nodes as the pods ask for, within its limits
	}
	return pl.nodes * int(pl.gpusPerNode/int64(count))
}

func gpus(n int) string {
	if n == 1 {
		return "1 GPU"
	}
	return strconv.Itoa(n) + " GPUs"
}

// allPools is the pools of the nodes that exist, then those the cluster can create: the
// declared node pools that scale from zero, and its Karpenter NodePools (what no existing
// node offers already); notes say what one of them could not offer.
func (p *Provider) allPools(ctx context.Context) ([]*pool, []string) {
	pools, nodes, infos := p.pools()
	groups, notes := p.groupPools(pools, nodes, infos)
	pools = append(pools, groups...)
	nps, err := p.readNodePools(ctx)
	if err != nil {
		return pools, append(notes, err.Error())
	}
	if len(nps) == 0 {
		return pools, notes
	}
	have := map[poolKey]bool{}
	for _, pl := range pools {
		k := pl.key
		k.nodePool = -1
		have[k] = true
	}
	created, npNotes := p.nodePoolPools(nps, infos, have)
	return append(pools, created...), append(notes, npNotes...)
}

// poolFor finds the pool a launch's offer came from.
func (p *Provider) poolFor(ctx context.Context, ls replicas.LaunchSpec) (*pool, bool) {
	pools, _ := p.allPools(ctx)
	for _, pl := range pools {
		k := pl.key
		if k.capacity == ls.Capacity && k.zone == ls.Zone && k.region == ls.Region && k.instanceType == ls.InstanceType &&
			(ls.Accelerator == "" || strings.EqualFold(k.accel, ls.Accelerator)) {
			return pl, true
		}
	}
	return nil, false
}

// want is one accelerator a spec accepts, with where.
type want struct {
	accel               string
	count               int
	cloud, region, zone string
}

// wants lists what a spec's resources accept: each accelerator of the base or of each
// any_of/ordered candidate (no accelerator: any node, no GPU).
func wants(r spec.Resources) []want {
	cands := append(slices.Clone(r.AnyOf), r.Ordered...)
	if len(cands) == 0 {
		cands = []spec.Resources{r}
	}
	var out []want
	for _, c := range cands {
		if len(c.Accelerators) == 0 {
			out = append(out, want{cloud: c.Cloud, region: c.Region, zone: c.Zone})
		}
		for _, a := range c.Accelerators {
			out = append(out, want{accel: a.Name, count: a.Count, cloud: c.Cloud, region: c.Region, zone: c.Zone})
		}
	}
	return out
}

// admits reports whether a pool can hold one replica of w. A replica that asks for no GPU
// goes only to nodes without one: a GPU node would bill its GPU for nothing.
func (w want) admits(pl *pool) bool {
	gpuOK := strings.EqualFold(w.accel, pl.key.accel) && pl.gpusPerNode >= int64(w.count)
	if w.accel == "" {
		gpuOK = pl.key.accel == "" && pl.gpusPerNode == 0
	}
	return gpuOK &&
		(w.cloud == "" || pl.cloud == "" || strings.EqualFold(w.cloud, pl.cloud)) &&
		(w.region == "" || w.region == pl.key.region) && (w.zone == "" || w.zone == pl.key.zone)
}

// Quote implements replicas.Provider: one offer per pool of schedulable nodes that has a
// GPU the spec accepts, in the place it asks for, of a capacity kind it may use (spot
// only with use_spot; reserved and on-demand always, for the fallback), priced per
// replica (the node's price per GPU × the GPUs one replica takes). Free GPUs are not
// counted: other tenants' pods use them too, and a cluster autoscaler adds nodes for a
// pending pod; the scheduler is the judge, and a pod it cannot place is a refusal.
func (p *Provider) Quote(ctx context.Context, service string, sp *spec.Service) ([]replicas.Quote, error) {
	if err := p.usable(); err != nil {
		return nil, err
	}
	ws := wants(sp.Resources)
	var out []replicas.Quote
	pools, notes := p.allPools(ctx)
	for _, pl := range pools {
		if pl.key.capacity == fleet.Spot && !sp.Resources.UseSpot && !anySpot(sp.Resources) {
			continue
		}
		for _, w := range ws {
			// A multi-node replica's pods all go to one pool (one zone, one machine type):
			// one whose nodes could not hold the group even empty is no offer.
			if !w.admits(pl) || pl.slots(w.count) < max(1, sp.NumNodes) {
				continue
			}
			if pl.creator != "" && pl.nodes == 0 && int64(w.count) != pl.gpusPerNode {
				// A node created for one replica is paid whole: only a machine the replica
				// fills is priced right by its share of GPUs.
				continue
			}
			q := replicas.Quote{Provider: p.Name(), Region: pl.key.region, Zone: pl.key.zone, Capacity: pl.key.capacity,
				Accelerator: pl.key.accel, AcceleratorCount: w.count, InstanceType: pl.key.instanceType}
			if pl.priced {
				q.PricePerHour, q.PriceSource = pl.pricePerGPU*float64(max(w.count, 1)), pl.priceSource
			} else {
				q.Unpriced = fmt.Sprintf("%s: %s %s nodes (%s)%s have no known price: %s", p.Name(), pl.key.capacity, cmp.Or(pl.key.accel, "CPU"),
					cmp.Or(pl.key.instanceType, "no instance-type label"), where(pl.key.region, pl.key.zone), pl.unpricedWhy)
			}
			out = append(out, q)
			break
		}
	}
	if len(out) == 0 {
		seen := make([]string, 0, len(pools))
		for _, pl := range pools {
			seen = append(seen, fmt.Sprintf("%d %s %s×%d%s", pl.nodes, pl.key.capacity, cmp.Or(pl.key.accel, "CPU"), pl.gpusPerNode, where(pl.key.region, pl.key.zone)))
		}
		wanted := describeWants(ws)
		if n := sp.NumNodes; n > 1 {
			wanted = fmt.Sprintf("%s, on each of %d nodes in one pool", wanted, n)
		}
		err := fmt.Errorf("%s: no schedulable node fits %s's resources (%s); the cluster has: %s", p.Name(), service, wanted,
			cmp.Or(strings.Join(seen, ", "), "no schedulable node"))
		if len(notes) > 0 {
			err = fmt.Errorf("%w; %s", err, strings.Join(notes, "; "))
		}
		return nil, err
	}
	return out, nil
}

// where is " in <zone>" (or the region when no zone label says), or "" for a node that
// names neither: a message never prints an empty place.
func where(region, zone string) string {
	if z := cmp.Or(zone, region); z != "" {
		return " in " + z
	}
	return ""
}

func anySpot(r spec.Resources) bool {
	for _, c := range append(slices.Clone(r.AnyOf), r.Ordered...) {
		if c.UseSpot {
			return true
		}
	}
	return false
}

func describeWants(ws []want) string {
	var parts []string
	for _, w := range ws {
		s := "no GPU"
		if w.accel != "" {
			s = fmt.Sprintf("%s:%d", w.accel, w.count)
		}
		if loc := strings.Trim(strings.Join([]string{w.cloud, w.region, w.zone}, "/"), "/"); loc != "" {
			s += " in " + loc
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " or ")
}

// priceIndex prices a node from the catalogs by its cloud, region, zone, machine type and
// capacity kind, per GPU, and names the cloud and GPU of a machine type the node's labels
// do not.
type priceIndex struct {
	byZone   map[string]pricing.Offer   // cloud|zone|type|capacity
	byRegion map[string][]pricing.Offer // cloud|region|type|capacity
	// clouds are the clouds whose catalogs list each machine type; accels the GPU of each
	// cloud|type ("" where rows disagree).
	clouds map[string][]string
	accels map[string]string
	// gpuOffers are the catalogs' GPU machines with a machine type, for the capacity a
	// cluster can create (karpenter.go).
	gpuOffers []pricing.Offer
}

func newPriceIndex(c *pricing.Catalog) priceIndex {
	idx := priceIndex{byZone: map[string]pricing.Offer{}, byRegion: map[string][]pricing.Offer{}, clouds: map[string][]string{}, accels: map[string]string{}}
	for _, o := range c.Offers(time.Time{}) {
		if o.InstanceType == "" || o.AcceleratorCount == 0 {
			continue
		}
		idx.gpuOffers = append(idx.gpuOffers, o)
		if !slices.Contains(idx.clouds[o.InstanceType], o.Provider) {
			idx.clouds[o.InstanceType] = append(idx.clouds[o.InstanceType], o.Provider)
		}
		ct := o.Provider + "|" + o.InstanceType
		if a, seen := idx.accels[ct]; !seen {
			idx.accels[ct] = o.Accelerator
		} else if a != o.Accelerator {
			idx.accels[ct] = ""
		}
		if o.Zone != "" {
			idx.byZone[o.Provider+"|"+o.Zone+"|"+o.InstanceType+"|"+string(o.Capacity)] = o
		}
		k := o.Provider + "|" + o.Region + "|" + o.InstanceType + "|" + string(o.Capacity)
		idx.byRegion[k] = append(idx.byRegion[k], o)
	}
	return idx
}

// infer fills in what a node does not say itself. Its cloud: from its node pool's
// siblings (a Karpenter on-demand node often carries neither a provider ID nor
// karpenter.k8s.aws/* labels while its spot sibling does), else from its machine type
// when only one cloud's catalog lists it (g6.xlarge: AWS; Standard_NC40ads_H100_v5:
// Azure; a3-highgpu-1g: GCP; the clouds name machines each in their own way). Its GPU:
// the catalog's for that cloud and machine type, when no label names it.
func (idx priceIndex) infer(ni *nodeInfo, siblings map[string]string) {
	if ni.cloud == "" && ni.pool != "" && siblings[ni.pool] != "" {
		ni.cloud, ni.cloudBy = siblings[ni.pool], "node pool sibling "+ni.pool
	}
	if cs := idx.clouds[ni.instanceType]; ni.cloud == "" && len(cs) == 1 {
		ni.cloud, ni.cloudBy = cs[0], "instance type "+ni.instanceType
	}
	if ni.accel == "" && ni.cloud != "" {
		ni.accel = idx.accels[ni.cloud+"|"+ni.instanceType]
	}
}

// lookup returns the price per GPU-hour and which rule gave it, or why there is none. Reserved
// capacity (a Karpenter capacity reservation) is billed at the on-demand rate whether used
// or not. The zone's own price first (GKE labels zones by name, as the catalog does; EKS
// nodes carry their AZ id, which is how the AWS catalog keys zones); else the region's
// median, because EKS zone names map to AZ ids differently in every account.
func (idx priceIndex) lookup(ni nodeInfo) (float64, string, string) {
	switch {
	case ni.instanceType == "":
		return 0, "", "the node has no " + labelInstanceType + " label"
	case ni.cloud == "":
		return 0, "", "nothing says which cloud the node is in: no provider ID, no platform label, no node pool sibling that says, " +
			"and no catalog lists " + ni.instanceType + " for exactly one cloud"
	}
	capacity := ni.capacity
	if capacity == fleet.Reserved {
		capacity = fleet.OnDemand
	}
	tail := "|" + ni.instanceType + "|" + string(capacity)
	source := func(file, which string) string {
		return fmt.Sprintf("%s catalog via %s (%s, %s)", ni.cloud, ni.cloudBy, path.Base(file), which)
	}
	for _, z := range []string{ni.zone, ni.zoneID} {
		if o, ok := idx.byZone[ni.cloud+"|"+z+tail]; ok && z != "" {
			return o.PricePerGPUHour, source(o.Source, z), ""
		}
	}
	if os := idx.byRegion[ni.cloud+"|"+ni.region+tail]; len(os) > 0 {
		ps := make([]float64, len(os))
		for i, o := range os {
			ps[i] = o.PricePerGPUHour
		}
		slices.Sort(ps)
		which := ni.region
		if len(os) > 1 {
			which += " median" // EKS zone names map to AZ ids differently in every account
		}
		return ps[len(ps)/2], source(os[0].Source, which), ""
	}
	return 0, "", fmt.Sprintf("no catalog lists %s %s in %s %s", ni.instanceType, capacity, ni.cloud, cmp.Or(ni.region, "(no region label)"))
}
