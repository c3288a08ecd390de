package inferencepool

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes"
)

func parse(t *testing.T, y string) (Pool, error) {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(y), &u.Object); err != nil {
		t.Fatal(err)
	}
	return ParsePool(u)
}

const poolYAML = `
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: llama, namespace: arbiter}
spec:
  selector: {matchLabels: {app: llama}}
  targetPorts: [{number: 8000}]
  endpointPickerRef: {name: arbiter-picker, port: {number: 9002}}
`

func TestParsePool(t *testing.T) {
	p, err := parse(t, poolYAML)
	if err != nil || p.Selector["app"] != "llama" || len(p.TargetPorts) != 1 || p.TargetPorts[0] != 8000 || p.Namespace != "arbiter" {
		t.Fatalf("ParsePool: %+v, %v", p, err)
	}
	for _, c := range []struct{ edit, want string }{
		{"  targetPorts: [{number: 8000}]\n", "spec.targetPorts is missing"},
		{"{number: 8000}", "spec.targetPorts[0].number"},
		{"{matchLabels: {app: llama}}", "spec.selector.matchLabels is missing or empty"},
	} {
		y := strings.Replace(poolYAML, c.edit, map[string]string{"{number: 8000}": "{number: 0}", "{matchLabels: {app: llama}}": "{}"}[c.edit], 1)
		if _, err := parse(t, y); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "arbiter/llama") {
			t.Errorf("a pool edited %q: got %v, want an error naming the pool and %q", c.edit, err, c.want)
		}
	}
}

func readyPod(name, node, ip string, gpus int, labels map[string]string) *corev1.Pod {
	res := corev1.ResourceList{}
	if gpus > 0 {
		res[resourceGPU] = resource.MustParse(string(rune('0' + gpus)))
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "arbiter", Labels: labels, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "vllm", Resources: corev1.ResourceRequirements{Limits: res}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
}

func gpuNode(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{resourceGPU: resource.MustParse("8")},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
}

// The pool's endpoints: its ready pods on its ports, each priced and named a GPU from its
// node (an L4 on Karpenter spot, an H100 on GKE on-demand, as the catalogs price them); an
// unready pod, a pod of another app and a pod with no model are left out; a node nothing
// prices gives its pod the pool's highest price and a line that says why.
func TestEndpointsPricedFromNodes(t *testing.T) {
	cat, err := pricing.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	pricer := kubernetes.NewNodePricer(cat, nil, kubernetes.Cluster{})
	l4 := gpuNode("l4-spot", map[string]string{"karpenter.sh/capacity-type": "spot", "karpenter.k8s.aws/instance-gpu-name": "l4",
		"node.kubernetes.io/instance-type": "g6.xlarge", "topology.kubernetes.io/zone": "us-east-1a", "topology.kubernetes.io/region": "us-east-1",
		"topology.k8s.aws/zone-id": "use1-az1"})
	h100 := gpuNode("h100", map[string]string{"topology.kubernetes.io/zone": "us-central1-a", "topology.kubernetes.io/region": "us-central1",
		"node.kubernetes.io/instance-type": "a3-highgpu-1g", "cloud.google.com/gke-accelerator": "nvidia-h100-80gb"})
	onprem := gpuNode("dgx", map[string]string{"nvidia.com/gpu.product": "NVIDIA-B300-SXM6-288GB", "node.kubernetes.io/instance-type": "dgx-b300"})
	nodes := []*corev1.Node{l4, h100, onprem}
	app := map[string]string{"app": "llama"}
	a := readyPod("a", "l4-spot", "10.0.0.1", 1, app)
	b := readyPod("b", "h100", "10.0.0.2", 1, app)
	c := readyPod("c", "dgx", "10.0.0.3", 1, app)
	unready := readyPod("d", "h100", "10.0.0.4", 1, app)
	unready.Status.Conditions[0].Status = corev1.ConditionFalse
	other := readyPod("e", "h100", "10.0.0.5", 1, map[string]string{"app": "other"})
	p, err := parse(t, poolYAML)
	if err != nil {
		t.Fatal(err)
	}
	set, problems := Endpoints(p, []*corev1.Pod{a, b, c, unready, other}, nodes, pricer, "llama-3.1-8b")
	if len(set) != 3 {
		t.Fatalf("endpoints %+v, want the three ready pods of the pool", set)
	}
	ea, eb, ec := set[0], set[1], set[2]
	if ea.ID != "arbiter/a:8000" || ea.Address != "10.0.0.1:8000" || ea.Accelerator != "L4" || ea.Capacity != fleet.Spot || ea.Model != "llama-3.1-8b" || ea.PricePerHour <= 0 {
		t.Errorf("the L4 spot pod: %+v", ea)
	}
	if eb.Accelerator != "H100" || eb.Capacity != fleet.OnDemand || eb.PricePerHour <= ea.PricePerHour {
		t.Errorf("the H100 on-demand pod: %+v; want dearer than the L4 spot one (%v)", eb, ea.PricePerHour)
	}
	if ec.PricePerHour != eb.PricePerHour || ec.Accelerator != "" {
		t.Errorf("the pod on an unpriced node with a GPU Arbiter does not model: %+v; want the pool's top price %v and no accelerator", ec, eb.PricePerHour)
	}
	joined := strings.Join(problems, "\n")
	for _, want := range []string{"pod arbiter/c: node dgx is unpriced", `GPU "B300"`} {
		if !strings.Contains(joined, want) {
			t.Errorf("problems %q: want one saying %q", joined, want)
		}
	}

	// A price annotation wins over the node's; a pod with no model is said, not served.
	c.Annotations[AnnotationPrice] = "0.5"
	set, _ = Endpoints(p, []*corev1.Pod{a, b, c}, nodes, pricer, "llama-3.1-8b")
	if set[2].PricePerHour != 0.5 {
		t.Errorf("annotated %s=0.5: got %v", AnnotationPrice, set[2].PricePerHour)
	}
	set, problems = Endpoints(p, []*corev1.Pod{a}, nodes, pricer, "")
	if len(set) != 0 || len(problems) != 1 || !strings.Contains(problems[0], "no model") {
		t.Errorf("no model anywhere: %+v, %q", set, problems)
	}
	a.Annotations[AnnotationModel] = "qwen"
	if set, _ = Endpoints(p, []*corev1.Pod{a}, nodes, pricer, ""); len(set) != 1 || set[0].Model != "qwen" {
		t.Errorf("annotated %s: %+v", AnnotationModel, set)
	}

	// A selector that matches nothing is said.
	set, problems = Endpoints(p, []*corev1.Pod{other}, nodes, pricer, "m")
	if len(set) != 0 || len(problems) != 1 || !strings.Contains(problems[0], "app=llama matches no pod") {
		t.Errorf("a selector matching nothing: %+v, %q", set, problems)
	}
}
