package e2e

import (
	"fmt"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/kubetest"
	"github.com/arbiter-serve/arbiter/state"
)

// catalogPerGPU is the embedded catalog's price per GPU-hour of one machine type and
// capacity kind in a place (a zone or AZ id, or a region where the catalog prices per
// region), and the file that says so.
func catalogPerGPU(t *testing.T, cloud, place, instanceType string, c fleet.Capacity) (float64, string) {
	t.Helper()
	cat, err := pricing.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range cat.Offers(time.Time{}) {
		if o.Provider == cloud && (o.Zone == place || o.Zone == "" && o.Region == place) && o.InstanceType == instanceType && o.Capacity == c {
			return o.PricePerGPUHour, path.Base(o.Source)
		}
	}
	t.Fatalf("no catalog price for %s %s %s in %s", cloud, instanceType, c, place)
	return 0, ""
}

// Node pools as Karpenter on EKS and AKS make them. An EKS cluster whose Karpenter
// NodePool "gpu" holds a spot g6.xlarge and an on-demand one that carries neither a
// provider ID nor karpenter.k8s.aws/* labels (issue 34), both tainted nvidia.com/gpu; and an
// AKS cluster with a spot pool and an on-demand pool of Standard_NC40ads_H100_v5, the spot
// nodes tainted kubernetes.azure.com/scalesetpriority=spot. An L4 service of two replicas
// takes the one spot GPU and falls back to the on-demand sibling; an H100 service takes
// AKS spot; every replica is priced from its cloud's catalog and serve status says by which
// rule; serve down leaves no pod.
func TestKubernetesKarpenterAndAKSPools(t *testing.T) {
	t.Parallel() // each has its own clusters, home and ports; most of their time is waiting
	eks := startKube(t, "eks", "127.0.55.1/24")
	aks := startKube(t, "aks", "127.0.56.1/24")
	eks.AddNode(kubetest.KarpenterNode("karp-spot", "gpu", "us-east-1a", "spot", false))
	eks.AddNode(kubetest.KarpenterNode("karp-od", "gpu", "us-east-1a", "on-demand", true))
	aks.AddNode(kubetest.AKSNode("aks-spotpool-0", "spotpool", "eastus", 1, 0, true))
	aks.AddNode(kubetest.AKSNode("aks-spotpool-1", "spotpool", "eastus", 2, 1, true))
	aks.AddNode(kubetest.AKSNode("aks-gpupool-0", "gpupool", "eastus", 1, 0, false))
	c := newCluster(t)
	useClusters(t, c, eks, aks)

	l4 := strings.Replace(kubeSpec("l4-model", `replica_policy: {min_replicas: 2, max_replicas: 2, dynamic_ondemand_fallback: true}`),
		"accelerators: H100:1", "accelerators: L4:1", 1)
	h100 := kubeSpec("h100-model", `replica_policy: {min_replicas: 2, max_replicas: 2}`)
	c.up("l4", l4, "--detach")
	c.up("h100", h100, "--detach")

	byNode := func(k *kubetest.Cluster, rs []state.Replica) map[string]state.Replica {
		out := map[string]state.Replica{}
		for _, r := range rs {
			if r.State == "ready" {
				if pods := k.Pods("arbiter", "arbiter.dev/replica="+r.ID); len(pods) == 1 {
					out[pods[0].Spec.NodeName] = r
				}
			}
		}
		return out
	}
	var onEKS, onAKS map[string]state.Replica
	c.waitFor("L4 replicas on the Karpenter spot node and its on-demand sibling, H100 on both AKS spot nodes", 120*time.Second, func() bool {
		onEKS, onAKS = byNode(eks, c.status("l4").Replicas), byNode(aks, c.status("h100").Replicas)
		_, spot := onEKS["karp-spot"]
		_, od := onEKS["karp-od"]
		_, a0 := onAKS["aks-spotpool-0"]
		_, a1 := onAKS["aks-spotpool-1"]
		return spot && od && a0 && a1
	})

	l4Spot, awsFile := catalogPerGPU(t, "aws", "use1-az1", "g6.xlarge", fleet.Spot)
	l4OD, _ := catalogPerGPU(t, "aws", "use1-az1", "g6.xlarge", fleet.OnDemand)
	h100Spot, azureFile := catalogPerGPU(t, "azure", "eastus", "Standard_NC40ads_H100_v5", fleet.Spot)
	for _, w := range []struct {
		r        state.Replica
		capacity string
		price    float64
		source   string
	}{
		{onEKS["karp-spot"], "spot", l4Spot, "aws catalog via provider ID (" + awsFile + ", use1-az1)"},
		{onEKS["karp-od"], "on_demand", l4OD, "aws catalog via node pool sibling karpenter.sh/nodepool=gpu (" + awsFile + ", us-east-1 median)"},
		{onAKS["aks-spotpool-0"], "spot", h100Spot, "azure catalog via provider ID (" + azureFile + ", eastus)"},
		{onAKS["aks-spotpool-1"], "spot", h100Spot, "azure catalog via provider ID (" + azureFile + ", eastus)"},
	} {
		if w.r.Capacity != w.capacity || w.r.PricePerHour != w.price || w.r.PriceSource != w.source {
			t.Errorf("replica %s: %s at $%v/h priced by %q; want %s at $%v/h priced by %q", w.r.ID, w.r.Capacity, w.r.PricePerHour, w.r.PriceSource,
				w.capacity, w.price, w.source)
		}
	}
	table := c.serve("status")
	t.Logf("serve status:\n%s", table)
	for _, want := range []string{"kubernetes:eks", "us-east-1/us-east-1a", "kubernetes:aks", "eastus/eastus-2",
		"aws catalog via node pool sibling karpenter.sh/nodepool=gpu", "aws catalog via provider ID", "azure catalog via provider ID"} {
		if !strings.Contains(table, want) {
			t.Errorf("serve status does not show %q:\n%s", want, table)
		}
	}
	// The L4 service's second spot replica was refused by the full spot node, and the
	// on-demand sibling took it.
	if logs := c.serve("logs", "l4"); !strings.Contains(logs, "Insufficient nvidia.com/gpu") {
		t.Errorf("the l4 service's log does not say the spot node was full:\n%s", logs)
	}
	for _, k := range []*kubetest.Cluster{eks, aks} {
		for _, p := range ownerPods(k, c) {
			if p.Status.Phase != "Running" {
				t.Errorf("pod %s on %s is %s", p.Name, p.Spec.NodeName, p.Status.Phase)
			}
		}
	}
	t.Logf("replicas: l4 %s; h100 %s", fmt.Sprint(describe(c.status("l4").Replicas)), fmt.Sprint(describe(c.status("h100").Replicas)))

	c.serve("down", "l4", "--wait", "60s")
	c.serve("down", "h100", "--wait", "60s")
	if left := len(ownerPods(eks, c)) + len(ownerPods(aks, c)); left != 0 {
		t.Fatalf("serve down left %d pods", left)
	}
}
