package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/coreclient"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/kubetest"
)

// Two replicas of num_nodes: 2 on the kubernetes provider: each is two pods in one zone
// running replicasim as head and worker, each started only once it knows both nodes' IPs
// (SKYPILOT_NODE_IPS, head first); the router talks to the head pod; each replica is
// billed two nodes at GCP's spot price. Someone deleting one worker pod (an eviction, a
// reclaimed node's pod) replaces the whole group, while a non-streaming load sees no
// request fail; serve down leaves no pod.
func TestKubernetesMultiNodeGroupReplacedWhole(t *testing.T) {
	t.Parallel() // each has its own clusters, home and ports; most of their time is waiting
	testKubeMultiNode(t, startKube(t, "gke-mn", "127.0.57.1/24"), false)
}

// The same on a cluster that serves the LeaderWorkerSet API, as the control plane's
// ServiceAccount (deploy/kubernetes/rbac.yaml): each replica is one LeaderWorkerSet, whose
// controller makes the pods, and the deleted worker makes the controller recreate the
// group while Arbiter replaces the replica by a new LeaderWorkerSet; serve down leaves no
// LeaderWorkerSet and no pod.
//
// NOTE: the LeaderWorkerSet CRD is a STAND-IN written from the API's reference, and its
// controller a TEST-ONLY SIMULATION (kubetest.LWSController): the sigs.k8s.io/lws module is
// not served by the module proxy this project uses.
func TestKubernetesMultiNodeLeaderWorkerSetReplacedWhole(t *testing.T) {
	t.Parallel()
	k := startKube(t, "gke-lws", "127.0.59.1/24")
	k.InstallLeaderWorkerSet()
	k.StartLWSController("arbiter")
	testKubeMultiNode(t, k, true)
}

func testKubeMultiNode(t *testing.T, k *kubetest.Cluster, lws bool) {
	for _, z := range []string{"us-central1-a", "us-central1-b"} {
		for i := range 4 {
			k.AddNode(kubetest.GKENode(fmt.Sprintf("spot-%s-%d", z[len(z)-1:], i), "us-central1", z, true, 1))
		}
	}
	c := newCluster(t)
	useClusters(t, c, k)
	name, model := "mnk", "mnk-model"
	if lws {
		name, model = "mnl", "mnl-model"
	}
	yaml := strings.Replace(kubeSpec(model, `replicas: 2`), "run: exec replicasim",
		`num_nodes: 2
run: test "$SKYPILOT_NUM_NODES" = 2 && test "$(echo "$SKYPILOT_NODE_IPS" | wc -l)" = 2 && test "$(echo "$SKYPILOT_NODE_IPS" | sed -n "$((SKYPILOT_NODE_RANK+1))p")" = "$POD_IP" && exec replicasim`, 1)
	c.up(name, yaml)
	c.waitFor("2 ready replicas", 90*time.Second, func() bool { return c.status(name).Ready == 2 })
	st := c.status(name)
	for _, r := range st.Replicas {
		// GCP's a3-highgpu-1g spot price is $6.33/h a node in these zones (the single-pod
		// test's range, doubled).
		if r.State == "ready" && (r.PricePerHour < 2*6 || r.PricePerHour > 2*7) {
			t.Errorf("replica %s billed $%.2f/h; want two nodes at a3-highgpu-1g's spot price", r.ID, r.PricePerHour)
		}
	}
	victim := st.Replicas[0]
	pods := k.Pods("arbiter", kubernetes.LabelReplica+"="+victim.ID)
	if len(pods) != 2 {
		t.Fatalf("replica %s has %d pods; want 2", victim.ID, len(pods))
	}
	var worker string
	zones := map[string]bool{}
	for _, p := range pods {
		zones[strings.TrimRight(p.Spec.NodeName, "0123456789")] = true // spot-a-, spot-b-
		rank := p.Labels[kubernetes.LabelNodeRank]
		if lws {
			owner, err := control.ProviderOwner(c.home)
			if err != nil {
				t.Fatal(err)
			}
			if p.Labels[kubernetes.LabelLWSName] != kubernetes.LWSName(owner, victim.ID) {
				t.Errorf("pod %s is not its LeaderWorkerSet's: labels %v", p.Name, p.Labels)
			}
			rank = p.Labels[kubernetes.LabelLWSWorkerIndex]
		}
		switch rank {
		case "0":
			if want := net.JoinHostPort(p.Status.PodIP, "8000"); victim.Address != want {
				t.Errorf("replica %s's address is %s; want its head pod's, %s", victim.ID, victim.Address, want)
			}
		case "1":
			worker = p.Name
		}
	}
	if worker == "" || len(zones) != 1 {
		t.Fatalf("replica %s's pods %v: want a head and a worker in one zone (zones %v)", victim.ID, podNames(pods), zones)
	}
	// Waited for, not sampled: a worker's process may still be starting when its head
	// answers.
	c.waitFor("4 pod processes (2 replicas × 2 nodes)", 30*time.Second, func() bool { return len(k.Processes()) == 4 })

	l := c.startLoad(model, 4, 60, false)
	time.Sleep(time.Second) // traffic on both replicas before the fault
	deleted := time.Now()
	if err := k.Admin.Delete(context.Background(), coreclient.Pods, "arbiter", worker, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the group replaced whole", 90*time.Second, func() bool {
		st := c.status(name)
		return st.Ready == 2 && !slices.Contains(replicaIDs(st), victim.ID)
	})
	replaced := time.Since(deleted)
	l.finish(t, "non-streaming load through a worker pod's deletion")
	c.waitFor("the old group's pods gone", 60*time.Second, func() bool {
		return len(k.Pods("arbiter", kubernetes.LabelReplica+"="+victim.ID)) == 0
	})
	if ev := c.serve("logs", name); !strings.Contains(ev, "node 1 of 2") {
		t.Errorf("no event naming the lost node:\n%s", ev)
	}
	if n := len(ownerPods(k, c)); n != 4 {
		t.Errorf("%d pods after the replacement; want 4", n)
	}
	rows, _ := c.stateRows(name)
	c.serve("down", name, "--wait", "60s")
	left := len(ownerPods(k, c))
	if left != 0 {
		t.Fatalf("serve down left %d pods", left)
	}
	if lws {
		var sets struct{ Items []kubernetes.LeaderWorkerSet }
		if err := k.Admin.ListJSON(context.Background(), "leaderworkerset.x-k8s.io/v1", "leaderworkersets", "arbiter", &sets); err != nil || len(sets.Items) != 0 {
			t.Fatalf("serve down left LeaderWorkerSets: %d (%v)", len(sets.Items), err)
		}
	}
	what := "worker pod of a 2-node replica deleted under load"
	if lws {
		what = "worker pod of a 2-node LeaderWorkerSet replica deleted under load"
	}
	benchLine(t, what, rows, l, replaced, left)
}

func podNames(ps []corev1.Pod) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name+" on "+p.Spec.NodeName)
	}
	return out
}
