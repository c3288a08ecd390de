// Package inferencepool gives the endpoint picker its endpoints from a Gateway API
// Inference Extension InferencePool (inference.networking.k8s.io/v1): the ready pods its
// selector matches, on each of its target ports, each priced from the node it runs on by
// the kubernetes provider's reading of node labels and the price catalogs, so that
// slo_cheapest knows each endpoint's GPU and $/h. The pool, its pods and the nodes are
// watched: a pod added, removed or turning unready changes the picker's endpoints at once.
//
// It links client-go, which the router binary does not: it runs in cmd/picker.
package inferencepool

import (
	"cmp"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes"
)

// GVR is the InferencePool resource: GIE v1.0's group and version.
var GVR = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// Annotations (or labels) a pod may carry for the picker.
const (
	// AnnotationModel names the model a pod serves, the name clients ask for; without it
	// the picker's -model.
	AnnotationModel = "arbiter.dev/model"
	// AnnotationPrice sets a pod's price in USD per hour, ahead of its node's: a pod on a
	// machine no catalog lists (on-prem), or at a negotiated price.
	AnnotationPrice = "arbiter.dev/price-per-hour"
)

const resourceGPU = corev1.ResourceName("nvidia.com/gpu")

// Pool is what the picker reads of an InferencePool.
type Pool struct {
	Namespace, Name string
	Selector        map[string]string
	TargetPorts     []int
}

// ParsePool reads an InferencePool; a pool that cannot select endpoints is an error that
// says which field.
func ParsePool(u *unstructured.Unstructured) (Pool, error) {
	p := Pool{Namespace: u.GetNamespace(), Name: u.GetName()}
	where := "InferencePool " + p.Namespace + "/" + p.Name
	sel, found, err := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	if err != nil {
		return p, fmt.Errorf("%s: spec.selector.matchLabels: %w", where, err)
	}
	if !found || len(sel) == 0 {
		return p, fmt.Errorf("%s: spec.selector.matchLabels is missing or empty: the pool selects no pods", where)
	}
	p.Selector = sel
	ports, found, err := unstructured.NestedSlice(u.Object, "spec", "targetPorts")
	if err != nil {
		return p, fmt.Errorf("%s: spec.targetPorts: %w", where, err)
	}
	if !found || len(ports) == 0 {
		return p, fmt.Errorf("%s: spec.targetPorts is missing or empty: no port to send requests to", where)
	}
	for i, tp := range ports {
		m, _ := tp.(map[string]any)
		var n int64
		switch v := m["number"].(type) {
		case int64: // as the apiserver's JSON decodes into an Unstructured
			n = v
		case float64:
			if v == float64(int64(v)) {
				n = int64(v)
			}
		}
		if n < 1 || n > 65535 {
			return p, fmt.Errorf("%s: spec.targetPorts[%d].number: want a port 1-65535, got %v", where, i, m["number"])
		}
		if !slices.Contains(p.TargetPorts, int(n)) {
			p.TargetPorts = append(p.TargetPorts, int(n))
		}
	}
	return p, nil
}

// Selects says whether the pool's selector matches pod.
func (p Pool) Selects(pod *corev1.Pod) bool {
	if pod.Namespace != p.Namespace || len(p.Selector) == 0 {
		return false
	}
	for k, v := range p.Selector {
		if got, ok := pod.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Ready says whether a pod serves: running, with an IP, its Ready condition true, not
// being deleted.
func Ready(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Endpoints are the pool's endpoints: each ready pod it selects on each target port,
// priced from its node. problems say, one line each, what kept a pod out or left it
// unpriced or unmodelled; none of them stops the others.
//
// A pod without a price (its node's machine type in no catalog, no node) is priced at the
// highest price among the pool's priced endpoints, so that slo_cheapest sends it work
// last rather than first (0 would be "free").
func Endpoints(p Pool, pods []*corev1.Pod, nodes []*corev1.Node, pricer *kubernetes.NodePricer, model string) (set []fleet.Replica, problems []string) {
	byName := make(map[string]*corev1.Node, len(nodes))
	for _, n := range nodes {
		byName[n.Name] = n
	}
	siblings := pricer.Siblings(nodes)
	quotes := map[string]kubernetes.NodeQuote{}
	selected, unready := 0, 0
	var unpriced []int
	for _, pod := range pods {
		if !p.Selects(pod) {
			continue
		}
		selected++
		if !Ready(pod) {
			unready++
			continue
		}
		where := "pod " + pod.Namespace + "/" + pod.Name
		m := cmp.Or(pod.Annotations[AnnotationModel], pod.Labels[AnnotationModel], model)
		if m == "" {
			problems = append(problems, where+": no model: annotate it "+AnnotationModel+" or give the picker -model")
			continue
		}
		r := fleet.Replica{Model: m, Provider: "kubernetes", Service: pod.Labels[kubernetes.LabelService], Capacity: fleet.OnDemand}
		gpus := podGPUs(pod)
		priced := false
		if n := byName[pod.Spec.NodeName]; n == nil {
			problems = append(problems, where+": its node "+strconv.Quote(pod.Spec.NodeName)+" is not known: unpriced")
		} else {
			q, ok := quotes[n.Name]
			if !ok {
				q = pricer.Quote(n, siblings)
				quotes[n.Name] = q
			}
			r.Region, r.Zone, r.Capacity = q.Region, q.Zone, q.Capacity
			switch {
			case q.Accelerator == "":
			case knownGPU(q.Accelerator):
				r.Accelerator = q.Accelerator
			default:
				problems = append(problems, fmt.Sprintf("%s: node %s: GPU %q (label %s) is not one Arbiter models: predicted with the default profile, corrected by traffic",
					where, n.Name, q.Accelerator, cmp.Or(q.AcceleratorLabel, "none")))
			}
			if gpus == 0 {
				gpus = 1
				if q.Accelerator != "" {
					problems = append(problems, where+": requests no "+string(resourceGPU)+": priced as one of its node's GPUs")
				}
			}
			if q.Unpriced == "" {
				r.PricePerHour, priced = q.PricePerGPUHour*float64(gpus), true
			} else if pod.Annotations[AnnotationPrice] == "" {
				problems = append(problems, where+": node "+n.Name+" is unpriced ("+q.Unpriced+"): annotate the pod "+AnnotationPrice+" or price the node")
			}
		}
		if s := pod.Annotations[AnnotationPrice]; s != "" {
			if v, err := strconv.ParseFloat(s, 64); err != nil || v < 0 {
				problems = append(problems, fmt.Sprintf("%s: annotation %s=%q: want a price in USD per hour >= 0; ignored", where, AnnotationPrice, s))
			} else {
				r.PricePerHour, priced = v, true
			}
		}
		for _, port := range p.TargetPorts {
			e := r
			e.ID = pod.Namespace + "/" + pod.Name + ":" + strconv.Itoa(port)
			e.Address = net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(port))
			if !priced {
				unpriced = append(unpriced, len(set))
			}
			set = append(set, e)
		}
	}
	if len(unpriced) > 0 {
		top := 0.0
		for _, e := range set {
			top = max(top, e.PricePerHour)
		}
		for _, i := range unpriced {
			set[i].PricePerHour = top
		}
	}
	if selected == 0 {
		problems = append(problems, fmt.Sprintf("InferencePool %s/%s: its selector %s matches no pod in namespace %s", p.Namespace, p.Name, selectorString(p.Selector), p.Namespace))
	} else if len(set) == 0 && unready > 0 {
		problems = append(problems, fmt.Sprintf("InferencePool %s/%s: none of the %d pods it selects is ready", p.Namespace, p.Name, selected))
	}
	slices.SortFunc(set, func(a, b fleet.Replica) int { return strings.Compare(a.ID, b.ID) })
	return set, problems
}

// podGPUs is how many GPUs a pod's containers ask for.
func podGPUs(pod *corev1.Pod) int64 {
	var n int64
	for _, c := range pod.Spec.Containers {
		q, ok := c.Resources.Limits[resourceGPU]
		if !ok {
			q = c.Resources.Requests[resourceGPU]
		}
		n += q.Value()
	}
	return n
}

func knownGPU(name string) bool {
	_, err := engine.LookupGPU(name)
	return err == nil
}

func selectorString(sel map[string]string) string {
	keys := make([]string, 0, len(sel))
	for k, v := range sel {
		keys = append(keys, k+"="+v)
	}
	slices.Sort(keys)
	return strings.Join(keys, ",")
}
