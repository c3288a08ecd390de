package kubernetes

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/kubetest"
)

func TestCanonicalAccelerator(t *testing.T) {
	for in, want := range map[string]string{
		"nvidia-h100-80gb":      "H100", // GKE
		"NVIDIA-H100-80GB-HBM3": "H100", // GPU feature discovery
		"h100":                  "H100", // Karpenter
		"nvidia-h100-mega-80gb": "H100-MEGA",
		"nvidia-a100-80gb":      "A100-80GB",
		"NVIDIA-A100-SXM4-80GB": "A100-80GB",
		"nvidia-tesla-a100":     "A100", // SkyPilot's A100 is the 40 GB card
		"NVIDIA-A100-SXM4-40GB": "A100",
		"nvidia-tesla-t4":       "T4",
		"Tesla-T4":              "T4",
		"nvidia-l4":             "L4",
		"NVIDIA-L40S":           "L40S",
		"a10g":                  "A10G",
		"nvidia-h200-141gb":     "H200",
		"nvidia-tesla-v100":     "V100",
		"Tesla-V100-SXM2-32GB":  "V100-32GB",
		"nvidia-b200":           "B200",
		"something-else":        "SOMETHING-ELSE",
		// GPU feature discovery's nvidia.com/gpu.product: the product name nvidia-smi
		// reports, spaces as dashes.
		"NVIDIA-L4":             "L4",
		"NVIDIA-A10G":           "A10G",
		"NVIDIA-A10":            "A10",
		"NVIDIA-H100-NVL":       "H100",
		"NVIDIA-H100-PCIe":      "H100",
		"NVIDIA-A100-80GB-PCIe": "A100-80GB",
		"NVIDIA-A100-PCIE-40GB": "A100",
		"NVIDIA-H200":           "H200",
		"NVIDIA-B200":           "B200",
		"NVIDIA-GH200-480GB":    "GH200",
		"Tesla-V100-SXM2-16GB":  "V100",
		// A MIG slice or a time-shared GPU (GFD's mig strategy "single" and sharing
		// renames the product) is not the whole GPU the catalogs price.
		"NVIDIA-A100-SXM4-40GB-MIG-1g.5gb":  "NVIDIA-A100-SXM4-40GB-MIG-1G.5GB",
		"NVIDIA-H100-80GB-HBM3-MIG-3g.40gb": "NVIDIA-H100-80GB-HBM3-MIG-3G.40GB",
		"NVIDIA-A100-SXM4-40GB-MIG-INVALID": "NVIDIA-A100-SXM4-40GB-MIG-INVALID",
		"Tesla-T4-SHARED":                   "TESLA-T4-SHARED",
		// GKE's cloud.google.com/gke-accelerator.
		"nvidia-tesla-p100":   "P100",
		"nvidia-tesla-p4":     "P4",
		"nvidia-tesla-k80":    "K80",
		"nvidia-tesla-t4-vws": "T4",
	} {
		if got := canonicalAccelerator(in); got != want {
			t.Errorf("canonicalAccelerator(%q) = %q, want %q", in, got, want)
		}
	}
}

func node(labels map[string]string, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels}, Spec: corev1.NodeSpec{Taints: taints},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Allocatable: corev1.ResourceList{resourceGPU: resource.MustParse("8")}}}
}

func TestDescribeNodeReadsEachPlatform(t *testing.T) {
	cases := []struct {
		name   string
		labels map[string]string
		cloud  string
		cap    fleet.Capacity
		accel  string
	}{
		{"GKE spot", map[string]string{labelGKESpot: "true", labelGKEAccelerator: "nvidia-h100-80gb"}, "gcp", fleet.Spot, "H100"},
		{"GKE preemptible", map[string]string{labelGKEPreemptible: "true", labelGKENodePool: "p"}, "gcp", fleet.Spot, ""},
		{"GKE on-demand", map[string]string{labelGKENodePool: "p", labelGKEAccelerator: "nvidia-l4"}, "gcp", fleet.OnDemand, "L4"},
		{"EKS spot", map[string]string{labelEKSCapacity: "SPOT", labelGFDProduct: "NVIDIA-A10G"}, "aws", fleet.Spot, "A10G"},
		{"EKS on-demand", map[string]string{labelEKSCapacity: "ON_DEMAND"}, "aws", fleet.OnDemand, ""},
		{"Karpenter spot", map[string]string{labelKarpenterCap: "spot", labelKarpenterGPU: "h100"}, "aws", fleet.Spot, "H100"},
		{"Karpenter reserved", map[string]string{labelKarpenterCap: "reserved", labelKarpenterGPU: "h100"}, "aws", fleet.Reserved, "H100"},
		{"AKS spot", map[string]string{labelAKSPriority: "spot"}, "azure", fleet.Spot, ""},
		{"on-prem", map[string]string{labelGFDProduct: "NVIDIA-H100-80GB-HBM3"}, "", fleet.OnDemand, "H100"},
	}
	for _, c := range cases {
		ni := describeNode(node(c.labels), "", nil)
		if ni.cloud != c.cloud || ni.capacity != c.cap || ni.accel != c.accel || !ni.schedulable || ni.gpus != 8 {
			t.Errorf("%s: got cloud %q capacity %q accel %q schedulable %v gpus %d; want %q %q %q", c.name, ni.cloud, ni.capacity, ni.accel, ni.schedulable, ni.gpus, c.cloud, c.cap, c.accel)
		}
	}
	// A label the user names comes first, and a mapping renames its values.
	ni := describeNode(node(map[string]string{"example.com/gpu": "h100-sxm", labelGFDProduct: "NVIDIA-A100-SXM4-80GB"}), "example.com/gpu", map[string]string{"h100-sxm": "H100"})
	if ni.accel != "H100" || ni.accelKey != "example.com/gpu" {
		t.Errorf("user accelerator label: got %q from %q", ni.accel, ni.accelKey)
	}
	// The provider ID wins over labels.
	n := node(map[string]string{labelGKESpot: "true"})
	n.Spec.ProviderID = "aws:///us-east-1a/i-0abc"
	if got, by := cloudOf(n); got != "aws" || by != "provider ID" {
		t.Errorf("cloudOf with an aws:// provider ID = %q by %q", got, by)
	}
}

func TestTerminationTaints(t *testing.T) {
	taint := func(k string) corev1.Taint { return corev1.Taint{Key: k, Effect: corev1.TaintEffectNoSchedule} }
	spot := map[string]string{labelGKESpot: "true"}
	cases := []struct {
		name   string
		n      *corev1.Node
		want   int
		notice time.Duration
	}{
		{"GKE impending termination", node(spot, taint(taintGKETermination)), 1, 30 * time.Second},
		{"AWS NTH spot ITN", node(map[string]string{labelEKSCapacity: "SPOT"}, taint("aws-node-termination-handler/spot-itn")), 1, 2 * time.Minute},
		{"Karpenter disrupted", node(nil, taint(taintKarpenterDisrupt)), 1, 30 * time.Second},
		{"cordoned spot node", node(spot, taint(taintUnschedulable)), 1, 30 * time.Second},
		{"cordoned on-demand node", node(nil, taint(taintUnschedulable)), 0, 0},
		{"GPU taint only", node(spot, taint("nvidia.com/gpu")), 0, 0},
	}
	for _, c := range cases {
		got := terminationTaints(c.n)
		if len(got) != c.want {
			t.Errorf("%s: termination taints %v, want %d", c.name, got, c.want)
		}
		if c.want > 0 && noticeFor(got) != c.notice {
			t.Errorf("%s: notice %s, want %s", c.name, noticeFor(got), c.notice)
		}
		if c.want > 0 && describeNode(c.n, "", nil).schedulable {
			t.Errorf("%s: a node about to go is still offered", c.name)
		}
	}
}

func TestPodAffinityPinsCapacityZoneAndGPU(t *testing.T) {
	ls := replicas.LaunchSpec{ReplicaID: "svc-12", Service: "svc", Version: 2, Run: "vllm serve m", Setup: "pip install x",
		Capacity: fleet.Spot, Region: "us-central1", Zone: "us-central1-b", Accelerator: "H100", AcceleratorCount: 1, InstanceType: "a3-highgpu-1g",
		Envs: map[string]string{"B": "2", "A": "1"}}
	ps := podSpec{namespace: "ns", owner: "arbiter-abc", image: "vllm/vllm-openai:v1", port: 8000, grace: 30,
		accelKey: labelGKEAccelerator, accelValues: []string{"nvidia-h100-80gb"}}
	pod := buildPod(ls, ps, 6.3, 0)
	terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != len(spotLabels) {
		t.Fatalf("spot: %d terms, want one per platform's spot label (%d)", len(terms), len(spotLabels))
	}
	for _, term := range terms {
		keys := map[string]corev1.NodeSelectorRequirement{}
		for _, e := range term.MatchExpressions {
			keys[e.Key] = e
		}
		for k, v := range map[string]string{labelZone: "us-central1-b", labelRegion: "us-central1", labelGKEAccelerator: "nvidia-h100-80gb", labelInstanceType: "a3-highgpu-1g"} {
			if e, ok := keys[k]; !ok || e.Operator != corev1.NodeSelectorOpIn || !slices.Equal(e.Values, []string{v}) {
				t.Errorf("term %v: want %s In [%s]", term.MatchExpressions, k, v)
			}
		}
	}
	if got := pod.Spec.Containers[0].Resources.Limits[resourceGPU]; got.Value() != 1 {
		t.Errorf("GPU limit %v, want 1", got)
	}
	var tolerates []string
	for _, tol := range pod.Spec.Tolerations {
		tolerates = append(tolerates, tol.Key)
	}
	for _, k := range []string{"nvidia.com/gpu", labelGKESpot, labelAKSPriority} {
		if !slices.Contains(tolerates, k) {
			t.Errorf("spot GPU pod does not tolerate %s (tolerates %v)", k, tolerates)
		}
	}
	env := map[string]string{}
	var order []string
	for _, e := range pod.Spec.Containers[0].Env {
		env[e.Name] = e.Value
		order = append(order, e.Name)
		if e.Name == "POD_IP" && (e.ValueFrom == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP") {
			t.Errorf("POD_IP is not the downward API's status.podIP: %+v", e)
		}
	}
	if env["ARBITER_RUN"] != "vllm serve m" || env["ARBITER_SETUP"] != "pip install x" || env["PORT"] != "8000" || env["SKYPILOT_SERVE_REPLICA_ID"] != "12" {
		t.Errorf("env %v", env)
	}
	if slices.Index(order, "A") > slices.Index(order, "B") {
		t.Errorf("envs not in a stable order: %v", order)
	}
	if pod.Labels[LabelOwner] != "arbiter-abc" || pod.Annotations[annReplicaID] != "svc-12" || pod.Annotations[annPrice] != "6.3" {
		t.Errorf("labels %v annotations %v", pod.Labels, pod.Annotations)
	}

	// On-demand excludes every platform's spot label; NotIn admits nodes without it.
	ls.Capacity = fleet.OnDemand
	od := buildPod(ls, ps, 11, 0).Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(od) != 1 {
		t.Fatalf("on-demand: %d terms, want 1", len(od))
	}
	not := 0
	for _, e := range od[0].MatchExpressions {
		if e.Operator == corev1.NodeSelectorOpNotIn {
			not++
		}
	}
	if not != len(spotLabels) {
		t.Errorf("on-demand term %v: want a NotIn for each spot label", od[0].MatchExpressions)
	}
	for _, tol := range buildPod(ls, ps, 11, 0).Spec.Tolerations {
		if tol.Key == labelAKSPriority {
			t.Errorf("an on-demand pod tolerates the AKS spot taint")
		}
	}
}

func TestPodNames(t *testing.T) {
	a, b := PodName("owner-1", "svc-1"), PodName("owner-2", "svc-1")
	if a == b {
		t.Errorf("two owners' replica svc-1 share pod name %s", a)
	}
	long := PodName("o", "a-very-long-service-name-that-goes-on-and-on-and-on-for-ever-and-ever-7")
	if len(long) > 63 {
		t.Errorf("pod name %q is %d characters", long, len(long))
	}
	if v := labelValue("x" + string(make([]byte, 70))); len(v) > 63 {
		t.Errorf("label value %q too long", v)
	}
}

func TestPriceLookup(t *testing.T) {
	cat, err := pricing.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	idx := newPriceIndex(cat)
	var want float64
	for _, o := range cat.Offers(time.Time{}) {
		if o.Provider == "gcp" && o.Zone == "us-central1-a" && o.InstanceType == "a3-highgpu-1g" && o.Capacity == fleet.Spot {
			want = o.PricePerGPUHour
		}
	}
	if want == 0 {
		t.Fatal("the catalog has no a3-highgpu-1g spot price in us-central1-a")
	}
	got, src, why := idx.lookup(nodeInfo{cloud: "gcp", region: "us-central1", zone: "us-central1-a", instanceType: "a3-highgpu-1g", capacity: fleet.Spot})
	if why != "" || got != want || src == "" {
		t.Errorf("GKE zone price: %v from %q (%s), want %v", got, src, why, want)
	}
	// EKS: zone names are per-account; without the AZ id label the region's median stands in.
	p, src, why := idx.lookup(nodeInfo{cloud: "aws", region: "us-east-1", zone: "us-east-1a", instanceType: "p5.48xlarge", capacity: fleet.Spot})
	if why != "" || p <= 0 || src == "" {
		t.Errorf("EKS region median: %v %q %q", p, src, why)
	}
	// With the AZ id the zone's own price.
	var az3 float64
	for _, o := range cat.Offers(time.Time{}) {
		if o.Provider == "aws" && o.Zone == "use1-az3" && o.InstanceType == "p5.48xlarge" && o.Capacity == fleet.Spot {
			az3 = o.PricePerGPUHour
		}
	}
	pz, _, _ := idx.lookup(nodeInfo{cloud: "aws", region: "us-east-1", zone: "us-east-1a", zoneID: "use1-az3", instanceType: "p5.48xlarge", capacity: fleet.Spot})
	if az3 == 0 || pz != az3 {
		t.Errorf("EKS zone id price %v, want the catalog's use1-az3 %v (region median %v)", pz, az3, p)
	}
	if _, _, why := idx.lookup(nodeInfo{cloud: "gcp", region: "us-central1", instanceType: "n2-standard-8", capacity: fleet.OnDemand}); why == "" {
		t.Error("a machine no catalog lists got a price")
	}
	if _, _, why := idx.lookup(nodeInfo{region: "dc1", instanceType: "dgx-h100", capacity: fleet.OnDemand}); why == "" {
		t.Error("an on-prem node got a price")
	}
}

func TestWantsAdmitPools(t *testing.T) {
	h100x8 := &pool{key: poolKey{accel: "H100", zone: "z1", region: "r"}, cloud: "gcp", gpusPerNode: 8}
	h100x1 := &pool{key: poolKey{accel: "H100", zone: "z2", region: "r"}, cloud: "gcp", gpusPerNode: 1}
	cpu := &pool{key: poolKey{zone: "z1", region: "r"}, cloud: "gcp"}
	cases := []struct {
		w    want
		pl   *pool
		want bool
	}{
		{want{accel: "H100", count: 2}, h100x8, true},
		{want{accel: "h100", count: 2}, h100x1, false}, // two GPUs do not fit a one-GPU node
		{want{accel: "A100", count: 1}, h100x8, false},
		{want{accel: "H100", count: 1, zone: "z2"}, h100x8, false},
		{want{accel: "H100", count: 1, cloud: "aws"}, h100x1, false},
		{want{}, cpu, true},
		{want{}, h100x8, false}, // a CPU replica never takes a GPU node
	}
	for _, c := range cases {
		if got := c.w.admits(c.pl); got != c.want {
			t.Errorf("%+v admits %+v = %v, want %v", c.w, c.pl.key, got, c.want)
		}
	}
}

// A node that does not say which cloud it is in takes its node pool siblings' word, else
// the one cloud whose catalog lists its instance type; the GPU comes from the catalog when
// no label names it; and the price says which rule gave it. The Karpenter pair is issue
// 34's: the on-demand node has neither a provider ID nor karpenter.k8s.aws/* labels.
func TestCloudFromPoolSiblingsAndInstanceType(t *testing.T) {
	cat, err := pricing.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	idx := newPriceIndex(cat)
	kube := func(n kubetest.Node) *corev1.Node {
		nn := node(n.Labels, n.Taints...)
		nn.Name, nn.Spec.ProviderID = n.Name, n.ProviderID
		return nn
	}
	spot := kube(kubetest.KarpenterNode("spot", "gpu", "us-east-1a", "spot", false))
	od := kube(kubetest.KarpenterNode("od", "gpu", "us-east-1a", "on-demand", true))
	other := kube(kubetest.KarpenterNode("other", "cpu", "us-east-1a", "on-demand", true))
	other.Labels[labelInstanceType] = "dgx-h100"
	aks := kube(kubetest.AKSNode("aks", "spotpool", "eastus", 1, 0, true))
	gce := node(map[string]string{labelInstanceType: "a3-highgpu-1g", labelRegion: "us-central1", labelZone: "us-central1-a"})
	onPrem := node(map[string]string{labelInstanceType: "dgx-h100", labelGFDProduct: "NVIDIA-H100-80GB-HBM3"})
	var infos []nodeInfo
	for _, n := range []*corev1.Node{spot, od, other, aks, gce, onPrem} {
		infos = append(infos, describeNode(n, "", nil))
	}
	siblings := poolClouds(infos)
	for i := range infos {
		idx.infer(&infos[i], siblings)
	}
	cases := []struct {
		ni           nodeInfo
		cloud, accel string
		source       string // "": no price
	}{
		{infos[0], "aws", "L4", "aws catalog via provider ID (aws_gpu_vms_subset.csv, use1-az1)"},
		{infos[1], "aws", "L4", "aws catalog via node pool sibling karpenter.sh/nodepool=gpu (aws_gpu_vms_subset.csv, us-east-1 median)"},
		{infos[2], "", "", ""}, // its pool says nothing, and no catalog lists dgx-h100
		{infos[3], "azure", "H100", "azure catalog via provider ID (gpu_price_changelog.csv, eastus)"},
		{infos[4], "gcp", "H100", "gcp catalog via instance type a3-highgpu-1g (gcp_gpu_vm_price_changelog.csv, us-central1-a)"},
		{infos[5], "", "H100", ""},
	}
	for _, c := range cases {
		price, src, why := idx.lookup(c.ni)
		if c.ni.cloud != c.cloud || c.ni.accel != c.accel || src != c.source || (src == "") != (why != "") || (price > 0) != (src != "") {
			t.Errorf("%s: cloud %q (by %q), GPU %q, priced %v by %q (%s); want %q, %q, by %q", c.ni.name, c.ni.cloud, c.ni.cloudBy, c.ni.accel, price, src, why,
				c.cloud, c.accel, c.source)
		}
	}
	if _, _, why := idx.lookup(infos[5]); !strings.Contains(why, "no catalog lists dgx-h100 for exactly one cloud") {
		t.Errorf("an on-prem node's reason: %s", why)
	}
	// A pool whose nodes name two clouds lends neither.
	mixed := poolClouds([]nodeInfo{{pool: "p=x", cloud: "aws"}, {pool: "p=x", cloud: "gcp"}, {pool: "p=y", cloud: "gcp"}})
	if _, ok := mixed["p=x"]; ok || mixed["p=y"] != "gcp" {
		t.Errorf("pool clouds %v: want p=y only", mixed)
	}
}

// A place the node does not name is left out of a message, never printed blank.
func TestWhereNamesOnlyWhatIsKnown(t *testing.T) {
	for _, c := range [][3]string{{"r", "z", " in z"}, {"r", "", " in r"}, {"", "", ""}} {
		if got := where(c[0], c[1]); got != c[2] {
			t.Errorf("where(%q, %q) = %q, want %q", c[0], c[1], got, c[2])
		}
	}
}
