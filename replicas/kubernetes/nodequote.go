package kubernetes

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
)

// NodeQuote is what one node's labels, provider ID and the price catalogs say it costs:
// the reading the provider places and prices by, for callers that price pods they did not
// place (the endpoint picker, pricing the pods of an InferencePool).
type NodeQuote struct {
	Node, Cloud, Region, Zone, InstanceType string
	Capacity                                fleet.Capacity
	// Accelerator is the GPU in the catalogs' spelling (L4, H100, A100-80GB); "" when
	// nothing on the node names one. AcceleratorLabel is the label that said so ("" when
	// the catalog's row for the machine type did).
	Accelerator, AcceleratorLabel string
	// GPUs is the node's allocatable nvidia.com/gpu.
	GPUs int64
	// PricePerGPUHour is the catalog's (or a configured node pool's) price, with
	// PriceSource the rule that gave it; Unpriced says why there is none (then 0).
	PricePerGPUHour float64
	PriceSource     string
	Unpriced        string
}

// NodePricer prices nodes as a cluster entry of the providers file would (its
// accelerator_label, accelerator_names and node_pools), from the catalogs.
type NodePricer struct {
	cluster Cluster
	idx     priceIndex
	err     error
}

// NewNodePricer prices with catalog c (an error loading it is given back by every quote
// as the reason it is unpriced); cluster may be the zero Cluster.
func NewNodePricer(c *pricing.Catalog, err error, cluster Cluster) *NodePricer {
	np := &NodePricer{cluster: cluster, err: err}
	if err == nil {
		np.idx = newPriceIndex(c)
	}
	return np
}

// Siblings is what a cluster's node pools say about the cloud they run in, for nodes that
// do not say it themselves.
type Siblings struct{ clouds map[string]string }

// Siblings reads the cluster's nodes once, for the quotes of any of them.
func (np *NodePricer) Siblings(all []*corev1.Node) Siblings {
	infos := make([]nodeInfo, 0, len(all))
	for _, o := range all {
		infos = append(infos, describeNode(o, np.cluster.AcceleratorLabel, np.cluster.AcceleratorNames))
	}
	return Siblings{poolClouds(infos)}
}

// Quote reads node n; s are its cluster's node pools (np.Siblings).
func (np *NodePricer) Quote(n *corev1.Node, s Siblings) NodeQuote {
	ni := describeNode(n, np.cluster.AcceleratorLabel, np.cluster.AcceleratorNames)
	np.idx.infer(&ni, s.clouds)
	q := NodeQuote{Node: n.Name, Cloud: ni.cloud, Region: ni.region, Zone: ni.zone, InstanceType: ni.instanceType,
		Capacity: ni.capacity, Accelerator: ni.accel, AcceleratorLabel: ni.accelKey, GPUs: ni.gpus}
	p := &Provider{cfg: Config{Cluster: np.cluster}}
	pool, _ := p.nodePool(n)
	if pool != nil && pool.Capacity != "" {
		q.Capacity, ni.capacity = pool.Capacity, pool.Capacity
	}
	switch {
	case pool != nil && pool.PricePerGPUHour != nil:
		q.PricePerGPUHour, q.PriceSource = *pool.PricePerGPUHour, "node_pools price_per_gpu_hour"
	case np.err != nil:
		q.Unpriced = "the price catalogs did not load: " + np.err.Error()
	default:
		q.PricePerGPUHour, q.PriceSource, q.Unpriced = np.idx.lookup(ni)
	}
	return q
}
