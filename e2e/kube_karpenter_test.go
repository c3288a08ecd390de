package e2e

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
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
// controller (its KWOK provider, a node joining 30 s after Karpenter creates it) and one CPU
// node: a service at zero replicas whose replicas take a real vLLM cold start (46.5 s), and
// two NodePools of g6.xlarge in two zones, spot (at most one GPU) and on-demand, both with
// EC2's 2-minute spot notice as their terminationGracePeriod. The cloud has no spot g6.xlarge
// left in us-east-1a, the cheapest spot zone (its offering is out: what Karpenter does after
// an InsufficientInstanceCapacity answer).
//
// Requests sent at zero are held; Arbiter places the replica on spot in us-east-1a,
// Karpenter says it cannot make that node, Arbiter moves to spot in us-east-1b, Karpenter
// creates it, the replica starts on it and every held request is answered. Under load, the
// spot node is interrupted (its NodeClaim deleted, as Karpenter's interruption handling
// does on EC2's warning): Arbiter reads the end from the NodeClaim, keeps the replica
// serving while a replacement starts on on-demand (the spot NodePool is at its limit
// until the node is gone), then ends it; no request fails. Idle, the service scales to zero
// and Karpenter consolidates the empty node away. Updated to two replicas, both go to spot;
// Karpenter makes one node and refuses the other (the NodePool's limit, the zone with no
// capacity), which Arbiter reads as a refusal at once and places on on-demand; serve down
// leaves no pod.
func TestKubernetesKarpenterScaleFromZero(t *testing.T) {
	t.Parallel() // its own cluster, home and ports; most of its time is waiting
	types, err := kubetest.CatalogInstanceTypes("aws", []string{"g6.xlarge"}, map[string]string{"us-east-1a": "use1-az4", "us-east-1b": "use1-az6"},
		"us-east-1a/spot")
	if err != nil {
		t.Fatal(err)
	}
	k := startKubeWith(t, kubetest.Options{Name: "karpenter", PodCIDR: "127.0.62.1/24",
		Karpenter: &kubetest.Karpenter{InstanceTypes: types, NodeRegistrationDelay: 30 * time.Second}})
	k.AddNode(kubetest.AWSNode("system", "m7i.large", "us-east-1", "us-east-1a", "use1-az4"))
	// Two NodePools as a team splits them: spot, limited to one GPU, and on-demand.
	k.Apply("nodepools", kubetest.KWOKNodePool("spot", []string{"spot"}, 1)+"---\n"+kubetest.KWOKNodePool("od", []string{"on-demand"}, 4))
	c := newCluster(t)
	useClusters(t, c, k)
	// The default zone cooldown, not the other tests' 20 s: the interrupted and the refused
	// zone stay cooling, so the on-demand replacement is not swapped back to spot (a cold
	// start with no replica, at max_replicas 1) as soon as it is ready.
	c.extraDaemonFlags = append(c.extraDaemonFlags, "--zone-cooldown", "10m")
	const name, model = "karp", "karp-model"
	l4 := func(policy string) string {
		s := strings.Replace(kubeSpec(model, policy), "accelerators: H100:1", "accelerators: L4:1", 1)
		s = strings.Replace(s, "initial_delay_seconds: 30", "initial_delay_seconds: 300", 1)
		return strings.Replace(s, "-log-level warn", "-log-level warn "+coldStart, 1)
	}
	spec := l4(`replica_policy: {min_replicas: 0, max_replicas: 1, dynamic_ondemand_fallback: true}`)
	out := c.up(name, spec)
	if !strings.Contains(out, "scaled to zero") || len(ownerPods(k, c)) != 0 {
		t.Fatalf("serve up did not park the service at zero pods:\n%s", out)
	}

	// Held at zero through a refused zone, a node's creation and a cold start, then
	// answered: 0 failed.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	if err := c.requestsOK(ctx, model, 3); err != nil {
		t.Fatalf("a request held at zero replicas failed: %v\n%s\nkarpenter:\n%s", err, c.daemonLog(), k.Log("karpenter-kwok"))
	}
	held := time.Since(start)
	st := c.status(name)
	i := slices.IndexFunc(st.Replicas, func(r state.Replica) bool { return r.State == "ready" })
	if i < 0 {
		t.Fatalf("no ready replica after the held requests: %+v", st.Replicas)
	}
	r := st.Replicas[i]
	node := karpenterNode(t, k, r, "spot")
	if r.Zone != "us-east-1b" {
		t.Errorf("replica %s runs in %s; want us-east-1b, the spot zone with capacity", r.ID, r.Zone)
	}
	if logs := c.serve("logs", name); !strings.Contains(logs, "Karpenter: Failed to schedule pod") {
		t.Errorf("the service's log does not show Karpenter's answer for the zone without capacity:\n%s", logs)
	}
	if r.ReadyAt.Sub(r.LaunchedAt) < coldStartMin {
		t.Errorf("replica %s ready %s after its launch: shorter than its cold start", r.ID, r.ReadyAt.Sub(r.LaunchedAt))
	}
	t.Logf("kube-bench karpenter: requests held %v (a zone refused, a node made, a cold start); node created %v after the first request; replica launch → ready %v; %s %s at $%.4f/h priced by %s",
		held.Round(100*time.Millisecond), node.CreationTimestamp.Sub(start).Round(time.Second), r.ReadyAt.Sub(r.LaunchedAt).Round(100*time.Millisecond),
		r.Capacity, r.Zone, r.PricePerHour, r.PriceSource)

	// A spot interruption under load: Karpenter deletes the NodeClaim, taints the node and
	// waits for the replica's pod (karpenter.sh/do-not-disrupt) until the NodeClaim's end.
	load := c.startLoad(model, 2, 40, false)
	c.waitFor("requests answered before the interruption", time.Minute, func() bool { return load.ok.Load() >= 5 })
	claim := ""
	for _, o := range node.OwnerReferences {
		if o.Kind == "NodeClaim" {
			claim = o.Name
		}
	}
	if claim == "" {
		t.Fatalf("node %s has no NodeClaim owner: %+v", node.Name, node.OwnerReferences)
	}
	interrupted := time.Now()
	if out, err := k.Kubectl("delete", "nodeclaim", claim, "--wait=false"); err != nil {
		t.Fatalf("delete nodeclaim %s: %v\n%s", claim, err, out)
	}
	var replacement state.Replica
	c.waitFor("a ready on-demand replacement and the interrupted replica gone", 3*time.Minute, func() bool {
		st := c.status(name)
		for _, x := range st.Replicas {
			if x.ID == r.ID && x.State != "terminated" {
				return false
			}
			if x.State == "ready" && x.Capacity == "on_demand" {
				replacement = x
			}
		}
		return replacement.ID != ""
	})
	moved := time.Since(interrupted)
	load.finish(t, "requests through a spot interruption by Karpenter")
	odNode := karpenterNode(t, k, replacement, "od")
	// Karpenter deletes the node before it taints it: the notice comes from the deletion,
	// and ends when the NodeClaim says (2 minutes after it was deleted), not after the 2 s
	// grace_seconds of a node deleted by anyone else.
	if logs := c.serve("logs", name); !regexp.MustCompile(`preemption kubernetes:karpenter will reclaim it in (1m5\d|2m0)s: its node \S+ is being deleted`).MatchString(logs) {
		t.Errorf("the service's log does not give the interrupted replica the NodeClaim's 2 minutes:\n%s", logs)
	}
	t.Logf("kube-bench karpenter: spot interruption → on-demand replacement ready and the interrupted replica ended %v later (its NodeClaim's end: 2m); %d requests, %d failed",
		moved.Round(100*time.Millisecond), load.ok.Load(), load.failed.Load())

	// Idle: to zero, and the empty node consolidated away.
	c.waitFor("the service back at zero pods", 2*time.Minute, func() bool { return len(ownerPods(k, c)) == 0 })
	idle := time.Now()
	c.waitFor("Karpenter to remove the empty node", 3*time.Minute, func() bool {
		return k.Admin.Get(ctx, coreclient.Nodes, "", odNode.Name, &corev1.Node{}) != nil
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
	c.waitFor("one spot and one on-demand replica ready, on nodes of each NodePool", 5*time.Minute, func() bool {
		ready, _ := kubeReplicas(c.status(name))
		return ready["spot"] == 1 && ready["on_demand"] == 1
	})
	for _, r := range c.status(name).Replicas {
		if r.State == "ready" {
			karpenterNode(t, k, r, map[string]string{"spot": "spot", "on_demand": "od"}[r.Capacity])
		}
	}
	t.Logf("kube-bench karpenter: spot at its NodePool's limit, refused by Karpenter and replaced on on-demand: both ready %v after the update",
		time.Since(fallback).Round(100*time.Millisecond))
	c.serve("down", name, "--wait", "60s")
	if left := len(ownerPods(k, c)); left != 0 {
		t.Fatalf("serve down left %d pods", left)
	}
}

// karpenterNode is the node replica r runs on, which must be the one Arbiter chose: made by
// NodePool pool, of r's machine type, zone and capacity type.
func karpenterNode(t *testing.T, k *kubetest.Cluster, r state.Replica, pool string) *corev1.Node {
	t.Helper()
	_, name := podNode(t, k, r.ID)
	node := &corev1.Node{}
	if err := k.Admin.Get(context.Background(), coreclient.Nodes, "", name, node); err != nil {
		t.Fatal(err)
	}
	if node.Labels["karpenter.sh/nodepool"] != pool || node.Labels["node.kubernetes.io/instance-type"] != "g6.xlarge" ||
		node.Labels["topology.kubernetes.io/zone"] != r.Zone || node.Labels["karpenter.sh/capacity-type"] != map[string]string{"spot": "spot", "on_demand": "on-demand"}[r.Capacity] {
		t.Errorf("replica %s (%s %s) runs on node %s labelled %v: not the node Arbiter chose (NodePool %s)", r.ID, r.Capacity, r.Zone, name, node.Labels, pool)
	}
	return node
}
