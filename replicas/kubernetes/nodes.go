package kubernetes

import (
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/arbiter-serve/arbiter/fleet"
)

// Node labels and taints the platforms set, and what Arbiter reads from them. Sources:
//   - topology.kubernetes.io/zone, /region, node.kubernetes.io/instance-type: Kubernetes'
//     well-known labels (kubernetes.io/docs/reference/labels-annotations-taints/).
//   - cloud.google.com/gke-spot, gke-preemptible, gke-accelerator, gke-nodepool: GKE's
//     Spot VMs, preemptible VMs and GPU docs (cloud.google.com/kubernetes-engine/docs).
//   - eks.amazonaws.com/capacityType (SPOT | ON_DEMAND), eks.amazonaws.com/nodegroup: EKS
//     managed node groups; topology.k8s.aws/zone-id: the AZ id EKS labels nodes with.
//   - karpenter.sh/capacity-type (spot | on-demand | reserved), karpenter.sh/disrupted taint,
//     karpenter.k8s.aws/instance-gpu-name: Karpenter's well-known labels and disruption docs.
//   - kubernetes.azure.com/scalesetpriority=spot (label and NoSchedule taint): AKS spot pools.
//   - nvidia.com/gpu.product: NVIDIA GPU feature discovery.
//   - cloud.google.com/impending-node-termination: GKE's taint on a node about to be
//     reclaimed (graceful node shutdown of Spot VMs).
//   - aws-node-termination-handler/spot-itn (and its rebalance/ASG/maintenance siblings): the
//     taints AWS Node Termination Handler puts on a node before it is reclaimed.
//   - ToBeDeletedByClusterAutoscaler: cluster-autoscaler's taint on a node it is removing.
//   - karpenter.sh/unregistered (NoExecute): the taint Karpenter registers its nodes with
//     and removes once it has synced the NodeClaim's labels and taints onto the node
//     (sigs.k8s.io/karpenter pkg/apis/v1: UnregisteredNoExecuteTaint; the node then gets
//     karpenter.sh/registered=true). Until then the node is not ready for pods.
const (
	labelZone         = "topology.kubernetes.io/zone"
	labelRegion       = "topology.kubernetes.io/region"
	labelInstanceType = "node.kubernetes.io/instance-type"
	labelAWSZoneID    = "topology.k8s.aws/zone-id"

	labelGKESpot        = "cloud.google.com/gke-spot"
	labelGKEPreemptible = "cloud.google.com/gke-preemptible"
	labelGKEAccelerator = "cloud.google.com/gke-accelerator"
	labelGKENodePool    = "cloud.google.com/gke-nodepool"
	labelEKSCapacity    = "eks.amazonaws.com/capacityType"
	labelEKSNodeGroup   = "eks.amazonaws.com/nodegroup"
	labelKarpenterCap   = "karpenter.sh/capacity-type"
	labelKarpenterPool  = "karpenter.sh/nodepool"
	labelKarpenterGPU   = "karpenter.k8s.aws/instance-gpu-name"
	labelAKSPriority    = "kubernetes.azure.com/scalesetpriority"
	labelAKSAgentPool   = "kubernetes.azure.com/agentpool"
	labelGFDProduct     = "nvidia.com/gpu.product"

	taintGKETermination   = "cloud.google.com/impending-node-termination"
	taintNTHPrefix        = "aws-node-termination-handler/"
	taintKarpenterDisrupt = "karpenter.sh/disrupted"
	taintUnschedulable    = "node.kubernetes.io/unschedulable"
	taintCAToBeDeleted    = "ToBeDeletedByClusterAutoscaler"
	taintKarpenterUnreg   = "karpenter.sh/unregistered"

	resourceGPU = corev1.ResourceName("nvidia.com/gpu")
)

// spotLabels are the node labels (and values) that mark spot capacity, one per platform.
// A spot replica's node affinity has one term per entry (any platform's spot pool); an
// on-demand replica's excludes all of them.
var spotLabels = []struct{ key, value string }{
	{labelGKESpot, "true"},
	{labelGKEPreemptible, "true"},
	{labelEKSCapacity, "SPOT"},
	{labelKarpenterCap, "spot"},
	{labelAKSPriority, "spot"},
}

// acceleratorLabels are the node labels that name a node's GPU, most specific first.
var acceleratorLabels = []string{labelGKEAccelerator, labelGFDProduct, labelKarpenterGPU}

// nodeInfo is what placement needs to know of one node.
type nodeInfo struct {
	name  string
	cloud string // gcp, aws, azure; "" when nothing says
	// cloudBy is the rule that named the cloud, for PRICED BY: "provider ID", "label
	// <key>", "node pool sibling <pool>", "instance type <type>"; "" with cloud.
	cloudBy      string
	region, zone string
	zoneID       string // the AWS AZ id, when labelled
	instanceType string
	capacity     fleet.Capacity
	// accel is the GPU in SkyPilot's spelling (H100, A100-80GB); accelKey and accelValue
	// are the label that said so, for the pod's node affinity.
	accel, accelKey, accelValue string
	gpus                        int64 // allocatable nvidia.com/gpu
	// pool is the platform's node pool as label=value (karpenter.sh/nodepool=gpu); ""
	// when no pool label is set.
	pool        string
	schedulable bool
}

// describeNode reads a node. accelLabel, if set, is a label the user named as the one that
// gives the GPU type (checked first); names maps its values (or any label's) to SkyPilot's
// accelerator names.
func describeNode(n *corev1.Node, accelLabel string, names map[string]string) nodeInfo {
	l := n.Labels
	ni := nodeInfo{name: n.Name, region: l[labelRegion], zone: l[labelZone], zoneID: l[labelAWSZoneID],
		instanceType: l[labelInstanceType], capacity: fleet.OnDemand}
	ni.cloud, ni.cloudBy = cloudOf(n)
	if isSpot(l) {
		ni.capacity = fleet.Spot
	} else if l[labelKarpenterCap] == "reserved" {
		ni.capacity = fleet.Reserved
	}
	keys := acceleratorLabels
	if accelLabel != "" {
		keys = append([]string{accelLabel}, keys...)
	}
	for _, k := range keys {
		if v := l[k]; v != "" {
			ni.accelKey, ni.accelValue = k, v
			if name, ok := names[v]; ok {
				ni.accel = name
			} else {
				ni.accel = canonicalAccelerator(v)
			}
			break
		}
	}
	if q, ok := n.Status.Allocatable[resourceGPU]; ok {
		ni.gpus = q.Value()
	}
	for _, k := range poolLabels {
		if v := l[k]; v != "" {
			ni.pool = k + "=" + v
			break
		}
	}
	unregistered := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == taintKarpenterUnreg })
	ni.schedulable = !n.Spec.Unschedulable && n.DeletionTimestamp == nil && nodeReady(n) && !unregistered && len(terminationTaints(n)) == 0
	return ni
}

func isSpot(l map[string]string) bool {
	for _, s := range spotLabels {
		if l[s.key] == s.value {
			return true
		}
	}
	return false
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// poolLabels are the labels that name a node's pool on each platform (GKE node pool, EKS
// managed node group, Karpenter NodePool, AKS agent pool): nodes of one pool run in one
// cloud, so a pool's nodes share what one of them says about it.
var poolLabels = []string{labelGKENodePool, labelEKSNodeGroup, labelKarpenterPool, labelAKSAgentPool}

// cloudOf infers the cloud from the node's provider ID (gce://, aws://, azure://), else from
// the platform's labels, and says which: "provider ID" or "label <key>". It returns ""
// twice when the node itself does not say.
func cloudOf(n *corev1.Node) (cloud, by string) {
	switch id := n.Spec.ProviderID; {
	case strings.HasPrefix(id, "gce://"):
		return "gcp", "provider ID"
	case strings.HasPrefix(id, "aws://"):
		return "aws", "provider ID"
	case strings.HasPrefix(id, "azure://"):
		return "azure", "provider ID"
	}
	keys := make([]string, 0, len(n.Labels))
	for k := range n.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys) // the same label named every time
	for _, k := range keys {
		switch {
		case strings.HasPrefix(k, "cloud.google.com/gke-"):
			return "gcp", "label " + k
		case strings.HasPrefix(k, "eks.amazonaws.com/"), strings.HasPrefix(k, "karpenter.k8s.aws/"), strings.HasPrefix(k, "topology.k8s.aws/"):
			return "aws", "label " + k
		case strings.HasPrefix(k, "kubernetes.azure.com/"):
			return "azure", "label " + k
		}
	}
	return "", ""
}

// poolClouds maps each node pool (label=value) to the cloud its nodes say they are in by
// themselves; a pool whose nodes name two clouds is left out.
func poolClouds(nodes []nodeInfo) map[string]string {
	out, mixed := map[string]string{}, map[string]bool{}
	for _, ni := range nodes {
		if ni.pool == "" || ni.cloud == "" {
			continue
		}
		if c, ok := out[ni.pool]; ok && c != ni.cloud {
			mixed[ni.pool] = true
		}
		out[ni.pool] = ni.cloud
	}
	for p := range mixed {
		delete(out, p)
	}
	return out
}

var (
	gpuModel  = regexp.MustCompile(`^(gb|gh|[abhklptv])\d+[a-z]*$`)
	gpuMemory = regexp.MustCompile(`^\d+gb$`)
)

// canonicalAccelerator turns a platform's GPU label value into SkyPilot's accelerator name:
// nvidia-h100-80gb (GKE) and NVIDIA-H100-80GB-HBM3 (GPU feature discovery) are H100,
// nvidia-a100-80gb and NVIDIA-A100-SXM4-80GB are A100-80GB (SkyPilot's A100 is the 40 GB
// card), nvidia-h100-mega-80gb is H100-MEGA, nvidia-tesla-t4 and Tesla-T4 are T4, h100
// (Karpenter) is H100; NVIDIA-H100-NVL and NVIDIA-H100-PCIe are H100 too, as the catalogs
// price them (Azure's Standard_NC40ads_H100_v5 is an H100 NVL). A value it cannot read is
// returned upper-cased, and so is a slice or a share of a GPU, which is not the GPU the
// catalogs price: GPU feature discovery names a MIG slice NVIDIA-A100-SXM4-40GB-MIG-1g.5gb
// (mig strategy single; -MIG-INVALID when misconfigured) and a time-sliced GPU Tesla-T4-SHARED
// (NVIDIA/k8s-device-plugin's README, "Shared Access to GPUs").
func canonicalAccelerator(v string) string {
	var model, memory string
	mega := false
	for _, t := range strings.FieldsFunc(strings.ToLower(v), func(r rune) bool { return r == '-' || r == '_' || r == ' ' }) {
		switch {
		case t == "mig" || t == "shared":
			return strings.ToUpper(v)
		case t == "mega":
			mega = true
		case gpuMemory.MatchString(t):
			memory = t
		case model == "" && gpuModel.MatchString(t):
			model = t
		}
	}
	if model == "" {
		return strings.ToUpper(v)
	}
	name := strings.ToUpper(model)
	if model == "a100" && memory == "80gb" || model == "v100" && memory == "32gb" {
		name += "-" + strings.ToUpper(memory)
	}
	if mega {
		name += "-MEGA"
	}
	return name
}

// terminationTaints lists the taints on a node that say it is about to be reclaimed or
// removed. A cordon (node.kubernetes.io/unschedulable) counts only on a spot node: on
// on-demand capacity it is usually maintenance, and the pod's own eviction says more.
func terminationTaints(n *corev1.Node) []string {
	var out []string
	for _, t := range n.Spec.Taints {
		switch {
		case t.Key == taintGKETermination, strings.HasPrefix(t.Key, taintNTHPrefix), t.Key == taintKarpenterDisrupt, t.Key == taintCAToBeDeleted:
			out = append(out, t.Key)
		case t.Key == taintUnschedulable && isSpot(n.Labels):
			out = append(out, t.Key)
		}
	}
	return out
}

// noticeFor is how long a node with these termination taints has before it goes: the
// platform's documented notice (GCE spot 30 s, EC2 spot 2 minutes), else 30 s.
func noticeFor(taints []string) time.Duration {
	for _, t := range taints {
		if strings.HasPrefix(t, taintNTHPrefix) {
			return 2 * time.Minute
		}
	}
	return 30 * time.Second
}
