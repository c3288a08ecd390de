package kubernetes

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Node pools that scale from zero, declared in the providers file (issue 47): a GKE node
// pool with autoscaling, an AKS node pool or an EKS managed node group under the cluster
// autoscaler. The platform creates their nodes when a pod is pending that one of their
// nodes would hold, and removes them when idle; while none exists, only the providers file
// says what they would be. Each is offered as the node its template would make, read by
// the same rules as a real node's labels (its cloud, GPU and price), in each of its zones,
// while it has fewer than max_nodes nodes.

// groupPools returns the pools the declared scale-from-zero node pools can create where no
// existing node of theirs offers one already, and notes on those that offer nothing. An
// existing pool of theirs with room to grow is marked as created on demand: a pod that does
// not fit its nodes waits for the autoscaler's next node as one on an empty zone does.
func (p *Provider) groupPools(existing []*pool, nodes []*corev1.Node, infos []nodeInfo) (out []*pool, notes []string) {
	have := map[poolKey]*pool{}
	for _, pl := range existing {
		have[pl.key] = pl
	}
	idx, idxErr := p.prices()
	region := p.cfg.Region
	for _, ni := range infos {
		region = cmp.Or(region, ni.region)
	}
	siblings := poolClouds(infos)
	count := map[int]int{} // nodes of each configured node pool, by its index
	for _, n := range nodes {
		if _, i := p.nodePool(n); i >= 0 {
			count[i]++
		}
	}
	for i := range p.cfg.NodePools {
		np := &p.cfg.NodePools[i]
		if !np.scalesFromZero() {
			continue
		}
		name := describeSelector(np.Selector)
		if count := count[i]; count >= np.MaxNodes {
			notes = append(notes, fmt.Sprintf("node pool %s has %d of its max_nodes %d nodes: the autoscaler makes no more", name, count, np.MaxNodes))
			continue
		}
		if region == "" {
			notes = append(notes, fmt.Sprintf("node pool %s: no region to price it in (no node says one; set region: in the providers file)", name))
			continue
		}
		// The node the pool's template makes, as the platform would label it (its zone
		// set for each of the pool's zones below).
		labels := maps.Clone(np.Selector)
		labels[labelInstanceType], labels[labelRegion] = np.InstanceType, region
		tmpl := describeNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, p.cfg.AcceleratorLabel, p.cfg.AcceleratorNames)
		tmpl.capacity = np.Capacity
		idx.infer(&tmpl, siblings)
		gpusPer := 0
		for _, o := range idx.gpuOffers {
			if o.InstanceType == np.InstanceType && (tmpl.cloud == "" || o.Provider == tmpl.cloud) {
				gpusPer = o.AcceleratorCount
				tmpl.accel = cmp.Or(tmpl.accel, o.Accelerator)
				break
			}
		}
		if gpusPer == 0 {
			notes = append(notes, fmt.Sprintf("node pool %s: no catalog lists %s with a GPU; it is offered for replicas that ask for none", name, np.InstanceType))
		}
		for _, z := range np.Zones {
			ni := tmpl
			ni.zone = z
			k := poolKey{region: region, zone: z, accel: ni.accel, instanceType: np.InstanceType, capacity: np.Capacity, nodePool: i}
			if pl := have[k]; pl != nil {
				pl.creator = "node pool " + name
				continue
			}
			pl := &pool{key: k, cloud: ni.cloud, gpusPerNode: int64(gpusPer), accelKey: ni.accelKey, poolLabels: np.Selector,
				configuredCap: true, creator: "node pool " + name}
			if ni.accelValue != "" {
				pl.accelValues = []string{ni.accelValue}
			}
			pl.setPrice(np, idx, idxErr, ni)
			out = append(out, pl)
		}
	}
	return out, notes
}

// describeSelector writes a node pool's selector as label=value pairs, in order.
func describeSelector(sel map[string]string) string {
	parts := make([]string, 0, len(sel))
	for _, k := range slices.Sorted(maps.Keys(sel)) {
		parts = append(parts, k+"="+sel[k])
	}
	return strings.Join(parts, ",")
}
