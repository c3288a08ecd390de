package kubernetes

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/kubetest"
)

// gkeL4Node is a node of a GKE node pool of g2-standard-8 (one L4) as GKE labels and taints
// it: its node pool, GPU (cloud.google.com/gke-accelerator), machine type, zone and region,
// gke-spot on a spot pool, the nvidia.com/gpu=present:NoSchedule taint GKE puts on GPU
// nodes, and a gce:// provider ID.
func gkeL4Node(name, pool, zone string, spot bool) kubetest.Node {
	l := map[string]string{labelGKENodePool: pool, labelGKEAccelerator: "nvidia-l4", labelInstanceType: "g2-standard-8",
		labelZone: zone, labelRegion: "us-central1"}
	if spot {
		l[labelGKESpot] = "true"
	}
	return kubetest.Node{Name: name, Labels: l, GPUs: 1, ProviderID: "gce://arbiter-test/" + zone + "/" + name,
		Taints: []corev1.Taint{{Key: string(resourceGPU), Value: "present", Effect: corev1.TaintEffectNoSchedule}}}
}

// A GKE cluster whose GPU node pools are scaled to zero (issue 47), declared in the providers
// file as a user writes them: a spot pool of g2-standard-8 in two zones, at most one node,
// and an on-demand pool in one zone. Arbiter offers both with no node of theirs in the
// cluster, priced from the GCP catalog; a replica placed on the spot pool is a pod that
// selects the pool, zone and machine type and waits for the cluster autoscaler's node. No
// cluster autoscaler runs here (its module is not served to this build): the test does what
// its documented behaviour does, creating the node a pending pod selects (as GKE labels
// it), and answering NotTriggerScaleUp, with the message it writes, for a pod its node
// group cannot grow for. The first launch runs on the node made for it; at max_nodes the
// pool offers only its node and says why; the refused pod is refused at once, not after
// provision_seconds.
func TestNodePoolScalesFromZeroOnARealCluster(t *testing.T) {
	c := kubetest.Start(t, kubetest.Options{Name: "gkezero", PodCIDR: "127.0.47.1/24"})
	c.Namespace("arbiter")
	c.AddNode(kubetest.Node{Name: "system", ProviderID: "gce://arbiter-test/us-central1-a/system",
		Labels: map[string]string{labelGKENodePool: "default-pool", labelInstanceType: "e2-standard-4", labelZone: "us-central1-a", labelRegion: "us-central1"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pools := []NodePool{
		{Selector: map[string]string{labelGKENodePool: "l4-spot"}, Capacity: fleet.Spot, InstanceType: "g2-standard-8", Zones: []string{"us-central1-a", "us-central1-c"}, MaxNodes: 1},
		{Selector: map[string]string{labelGKENodePool: "l4"}, Capacity: fleet.OnDemand, InstanceType: "g2-standard-8", Zones: []string{"us-central1-a"}, MaxNodes: 1},
	}
	p, sp := nodePoolProvider(ctx, t, c, 120, pools...)
	quotes, err := p.Quote(ctx, "svc", sp)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]replicas.Quote{}
	for _, q := range quotes {
		got[string(q.Capacity)+" "+q.InstanceType+" "+q.Zone] = q
	}
	for _, k := range []string{"spot g2-standard-8 us-central1-a", "spot g2-standard-8 us-central1-c", "on_demand g2-standard-8 us-central1-a"} {
		q, ok := got[k]
		if !ok {
			t.Fatalf("quotes %+v; want %s from the pools scaled to zero", quotes, k)
		}
		want, file := offerPrice(t, "gcp", q.Zone, "g2-standard-8", q.Capacity)
		if q.Accelerator != "L4" || q.PricePerHour != want || !strings.Contains(q.PriceSource, file) {
			t.Errorf("%s: %s at $%v/h priced by %q; want L4 at the GCP catalog's $%v/h (%s)", k, q.Accelerator, q.PricePerHour, q.PriceSource, want, file)
		}
	}
	if len(quotes) != 3 {
		t.Errorf("%d quotes %+v; want the 3 the pools declare", len(quotes), quotes)
	}

	// The spot pool's node, made for the pending pod as the autoscaler would.
	launch := func(id string, q replicas.Quote) chan error {
		done := make(chan error, 1)
		go func() {
			_, err := p.Launch(ctx, replicas.LaunchSpec{ReplicaID: id, Service: "svc", Version: 1, Run: sp.Run, Capacity: q.Capacity, Region: q.Region, Zone: q.Zone,
				Accelerator: q.Accelerator, AcceleratorCount: 1, InstanceType: q.InstanceType, PricePerHour: &q.PricePerHour, PriceSource: q.PriceSource})
			done <- err
		}()
		return done
	}
	pending := func(id string) corev1.Pod {
		waitFor(t, "the replica's pod "+id, func() bool { return len(c.Pods("arbiter", LabelReplica+"="+id)) == 1 })
		return c.Pods("arbiter", LabelReplica+"="+id)[0]
	}
	done := launch("svc-1", got["spot g2-standard-8 us-central1-a"])
	pod := pending("svc-1")
	want := map[string]string{labelGKENodePool: "l4-spot", labelInstanceType: "g2-standard-8", labelZone: "us-central1-a"}
	for _, e := range pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions {
		if w, ok := want[e.Key]; ok && e.Operator == "In" && slices.Equal(e.Values, []string{w}) {
			delete(want, e.Key)
		}
	}
	if len(want) > 0 {
		t.Fatalf("the pod's node affinity %+v lacks %v: the autoscaler would not know which pool to grow", pod.Spec.Affinity, want)
	}
	c.AddNode(gkeL4Node("gke-l4-spot-a-1", "l4-spot", "us-central1-a", true))
	if err := <-done; err != nil {
		t.Fatalf("the launch onto the node the autoscaler made: %v", err)
	}

	// The spot pool at its max_nodes: only its node is offered, and a note says why.
	if _, notes := p.allPools(ctx); !slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, "has 1 of its max_nodes 1 nodes") }) {
		t.Errorf("notes %q; want the spot pool at its max_nodes", notes)
	}
	quotes, err = p.Quote(ctx, "svc", sp)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(quotes, func(q replicas.Quote) bool { return q.Zone == "us-central1-c" }) {
		t.Errorf("quotes %+v: the spot pool at its max_nodes still offers us-central1-c", quotes)
	}

	// The on-demand pool: the autoscaler says it will not grow it (its NotTriggerScaleUp
	// event on the pod, as it writes them), and the launch is refused at once.
	start := time.Now()
	done = launch("svc-2", got["on_demand g2-standard-8 us-central1-a"])
	pod = pending("svc-2")
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: pod.Name + ".ca", Namespace: "arbiter"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "arbiter", Name: pod.Name, UID: pod.UID, APIVersion: "v1"},
		Reason:         "NotTriggerScaleUp", Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: "cluster-autoscaler"},
		Message:        "pod didn't trigger scale-up: 2 node(s) didn't match Pod's node affinity/selector, 1 max node group size reached",
		FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1}
	if err := c.Admin.Create(ctx, "events", "arbiter", ev, &corev1.Event{}); err != nil {
		t.Fatal(err)
	}
	err = <-done
	if !errors.Is(err, replicas.ErrNoCapacity) || !strings.Contains(err.Error(), "cluster autoscaler: pod didn't trigger scale-up") || time.Since(start) > 60*time.Second {
		t.Errorf("the launch the autoscaler refused: %v after %v; want ErrNoCapacity with its message, well before provision_seconds", err, time.Since(start).Round(time.Millisecond))
	}
}
