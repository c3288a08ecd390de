package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/arbiter-serve/arbiter/replicas/kubernetes/coreclient"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/kubetest"
	"github.com/arbiter-serve/arbiter/state"
)

// A cluster whose GPU nodes exist only once a pod asks (issue 47), with Karpenter's own
// controller (its KWOK provider) and one CPU node: a service at zero replicas, and two
// NodePools of g6.xlarge in two zones, spot (at most one GPU) and on-demand. Requests sent at
// zero are held; Arbiter places the replica on the cheapest offer (spot), Karpenter creates
// that node, the replica starts on it and every held request is answered. Idle, the service
// scales to zero and Karpenter consolidates the empty node away. Updated to two replicas,
// both go to spot; Karpenter makes one node and refuses the other (the NodePool's limit),
// which Arbiter reads as a refusal at once and places on on-demand; serve down leaves no
// pod.
func TestKubernetesKarpenterScaleFromZero(t *testing.T) {
	t.Parallel() // its own cluster, home and ports; most of its time is waiting
	types, err := kubetest.CatalogInstanceTypes("aws", []string{"g6.xlarge"}, map[string]string{"us-east-1a": "use1-az4", "us-east-1b": "use1-az6"})
	if err != nil {
		t.Fatal(err)
	}
	k := startKubeWith(t, kubetest.Options{Name: "karpenter", PodCIDR: "127.0.57.1/24", Karpenter: &kubetest.Karpenter{InstanceTypes: types}})
	k.AddNode(kubetest.AWSNode("system", "m7i.large", "us-east-1", "us-east-1a", "use1-az4"))
	// Two NodePools as a team splits them: spot, limited to one GPU, and on-demand.
	k.Apply("nodepools", kubetest.KWOKNodePool("spot", []string{"spot"}, 1)+"---\n"+kubetest.KWOKNodePool("od", []string{"on-demand"}, 4))
	c := newCluster(t)
	useClusters(t, c, k)
	const name, model = "karp", "karp-model"
	l4 := func(policy string) string {
		return strings.Replace(kubeSpec(model, policy), "accelerators: H100:1", "accelerators: L4:1", 1)
	}
	spec := l4(`replica_policy: {min_replicas: 0, max_replicas: 1, dynamic_ondemand_fallback: true}`)
	out := c.up(name, spec)
	if !strings.Contains(out, "scaled to zero") || len(ownerPods(k, c)) != 0 {
		t.Fatalf("serve up did not park the service at zero pods:\n%s", out)
	}

	// Held at zero, then answered: 0 failed.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	errs := make(chan error, 3)
	start := time.Now()
	for range 3 {
		go func() { errs <- c.requestOK(ctx, model) }()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatalf("a request held at zero replicas failed: %v\n%s\nkarpenter:\n%s", err, c.daemonLog(), k.Log("karpenter-kwok"))
		}
	}
	held := time.Since(start)
	st := c.status(name)
	i := slices.IndexFunc(st.Replicas, func(r state.Replica) bool { return r.State == "ready" })
	if i < 0 {
		t.Fatalf("no ready replica after the held requests: %+v", st.Replicas)
	}
	r := st.Replicas[i]
	_, nodeName := podNode(t, k, r.ID)
	node := &corev1.Node{}
	if err := k.Admin.Get(ctx, coreclient.Nodes, "", nodeName, node); err != nil {
		t.Fatal(err)
	}
	if node.Labels["karpenter.sh/nodepool"] != "spot" || node.Labels["node.kubernetes.io/instance-type"] != "g6.xlarge" ||
		node.Labels["topology.kubernetes.io/zone"] != r.Zone || node.Labels["karpenter.sh/capacity-type"] != map[string]string{"spot": "spot", "on_demand": "on-demand"}[r.Capacity] {
		t.Errorf("replica %s (%s %s) runs on node %s labelled %v: not the node Arbiter chose", r.ID, r.Capacity, r.Zone, nodeName, node.Labels)
	}
	t.Logf("kube-bench karpenter: requests held %v; node created %v after the first request; replica launch → ready %v; %s %s at $%.4f/h priced by %s",
		held.Round(100*time.Millisecond), node.CreationTimestamp.Sub(start).Round(time.Second), r.ReadyAt.Sub(r.LaunchedAt).Round(100*time.Millisecond),
		r.Capacity, r.Zone, r.PricePerHour, r.PriceSource)

	// Idle: to zero, and the empty node consolidated away.
	c.waitFor("the service back at zero pods", 2*time.Minute, func() bool { return len(ownerPods(k, c)) == 0 })
	idle := time.Now()
	c.waitFor("Karpenter to remove the empty node", 3*time.Minute, func() bool {
		return k.Admin.Get(ctx, coreclient.Nodes, "", nodeName, &corev1.Node{}) != nil
	})
	t.Logf("kube-bench karpenter: the empty node gone %v after the last pod", time.Since(idle).Round(time.Second))

	// Two replicas at once: both placed on spot (two zones), the spot NodePool makes one
	// node and says it will not make the second (its GPU limit); Arbiter takes that as a
	// refusal at once and falls back to on-demand, which the other NodePool creates.
	path := filepath.Join(c.home, "karp-2.yaml")
	if err := os.WriteFile(path, []byte(l4(`replica_policy: {min_replicas: 2, max_replicas: 2, dynamic_ondemand_fallback: true}`)), 0o644); err != nil {
		t.Fatal(err)
	}
	fallback := time.Now()
	c.serve("update", name, path, "--detach")
	c.waitFor("one spot and one on-demand replica ready, on nodes of each NodePool", 3*time.Minute, func() bool {
		ready, _ := kubeReplicas(c.status(name))
		return ready["spot"] == 1 && ready["on_demand"] == 1
	})
	logs := c.serve("logs", name)
	if !strings.Contains(logs, "Karpenter: Failed to schedule pod") {
		t.Errorf("the service's log does not show Karpenter's refusal:\n%s", logs)
	}
	for _, r := range c.status(name).Replicas {
		if r.State != "ready" {
			continue
		}
		_, n := podNode(t, k, r.ID)
		got := &corev1.Node{}
		if err := k.Admin.Get(ctx, coreclient.Nodes, "", n, got); err != nil {
			t.Fatal(err)
		}
		if want := map[string]string{"spot": "spot", "on_demand": "od"}[r.Capacity]; got.Labels["karpenter.sh/nodepool"] != want {
			t.Errorf("%s replica %s on node %s of NodePool %q; want %q", r.Capacity, r.ID, n, got.Labels["karpenter.sh/nodepool"], want)
		}
	}
	t.Logf("kube-bench karpenter: spot at its NodePool's limit, refused by Karpenter and replaced on on-demand: both ready %v after the update",
		time.Since(fallback).Round(100*time.Millisecond))
	c.serve("down", name, "--wait", "60s")
	if left := len(ownerPods(k, c)); left != 0 {
		t.Fatalf("serve down left %d pods", left)
	}
}
