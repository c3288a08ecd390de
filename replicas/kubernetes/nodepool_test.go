package kubernetes

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/coreclient"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/kubetest"
	"github.com/arbiter-serve/arbiter/spec"
)

// karpenterCRD is the path of one of Karpenter's own CRD files, as scripts/kube-bins.sh
// copied them from its module (not a copy in this repository).
func karpenterCRD(t *testing.T, name string) string {
	t.Helper()
	return filepath.Join(kubetest.Bins(t), "karpenter", name)
}

// nodePoolProvider is the provider for cluster c (pods in namespace arbiter, unschedulable
// after 1 s, provisionSeconds for a node a NodePool creates, the node pools given), synced,
// and a service of one L4 replica that may run on spot.
func nodePoolProvider(ctx context.Context, t *testing.T, c *kubetest.Cluster, provisionSeconds float64, pools ...NodePool) (*Provider, *spec.Service) {
	t.Helper()
	p, err := New(ctx, Config{Cluster: Cluster{Name: c.Name, Namespace: "arbiter", UnschedulableSeconds: 1, ProvisionSeconds: provisionSeconds, GraceSeconds: 1, NodePools: pools},
		Owner: "arbiter-test", Rest: rest.CopyConfig(c.AdminRest), HealthEvery: time.Second, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the provider to sync", func() bool { _, err := p.List(ctx); return err == nil })
	sp, err := spec.Parse("svc.yaml", []byte(`run: sleep infinity
resources: {accelerators: {L4: 1}, use_spot: true, image_id: "docker:example/replicasim:1"}
service: {readiness_probe: /health, replicas: 1}
arbiter: {providers: [kubernetes]}
`))
	if err != nil {
		t.Fatal(err)
	}
	return p, sp
}

// A cluster whose GPU nodes exist only once a pod asks (issue 47): Karpenter's own NodePool
// CRD on a real apiserver, a NodePool as EKS users write one (spot and on-demand, the g6
// family, sizes up to 2xlarge, two zones, a GPU limit) and one CPU node. Arbiter offers
// the machines the NodePool would create, each priced from the AWS catalog (the zone the
// node's labels map to its AZ id at that AZ's price; the other at the region's median),
// nothing it excludes; a replica placed there is a pod pinned to the NodePool, its
// capacity type, machine type and zone, which waits ProvisionSeconds (not
// UnschedulableSeconds) for Karpenter's node before the launch counts as refused. A
// NodePool at its GPU limit offers nothing, and says so.
func TestKarpenterNodePoolOffersOnARealCluster(t *testing.T) {
	c := kubetest.Start(t, kubetest.Options{Name: "nodepools", PodCIDR: "127.0.44.1/24"})
	crd := karpenterCRD(t, "karpenter.sh_nodepools.yaml")
	c.Namespace("arbiter")
	if out, err := c.Kubectl("apply", "--server-side", "-f", crd); err != nil {
		t.Fatalf("kubectl apply %s: %v\n%s", crd, err, out)
	}
	if out, err := c.Kubectl("wait", "--for", "condition=established", "--timeout", "60s", "crd/nodepools.karpenter.sh"); err != nil {
		t.Fatalf("the NodePool CRD: %v\n%s", err, out)
	}
	// The cluster's one node: a system node, no GPU.
	c.AddNode(kubetest.AWSNode("system", "m7i.large", "us-east-1", "us-east-1a", "use1-az4"))
	c.Apply("nodepools", `apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: gpu
spec:
  template:
    spec:
      requirements:
        - key: karpenter.sh/capacity-type
          operator: In
          values: ["spot", "on-demand"]
        - key: karpenter.k8s.aws/instance-family
          operator: In
          values: ["g6"]
        - key: karpenter.k8s.aws/instance-size
          operator: In
          values: ["xlarge", "2xlarge"]
        - key: topology.kubernetes.io/zone
          operator: In
          values: ["us-east-1a", "us-east-1b"]
        - key: kubernetes.io/arch
          operator: In
          values: ["amd64"]
      nodeClassRef:
        group: karpenter.k8s.aws
        kind: EC2NodeClass
        name: default
      taints:
        - key: nvidia.com/gpu
          effect: NoSchedule
  limits:
    nvidia.com/gpu: 4
  disruption:
    consolidationPolicy: WhenEmpty
    consolidateAfter: 5m
---
apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: h100
spec:
  template:
    spec:
      requirements:
        - key: karpenter.k8s.aws/instance-gpu-name
          operator: In
          values: ["h100"]
      nodeClassRef:
        group: karpenter.k8s.aws
        kind: EC2NodeClass
        name: default
  limits:
    nvidia.com/gpu: 0
`)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, sp := nodePoolProvider(ctx, t, c, 5)
	quotes, err := p.Quote(ctx, "svc", sp)
	if err != nil {
		t.Fatalf("quote with no GPU node: %v; want the NodePool's machines", err)
	}
	got := map[string]replicas.Quote{}
	for _, q := range quotes {
		got[strings.Join([]string{string(q.Capacity), q.InstanceType, q.Zone}, " ")] = q
	}
	spotA, file := offerPrice(t, "aws", "use1-az4", "g6.xlarge", fleet.Spot)
	od, _ := offerPrice(t, "aws", "use1-az4", "g6.xlarge", fleet.OnDemand)
	for key, w := range map[string]struct {
		price  float64
		source string
	}{
		"spot g6.xlarge us-east-1a":      {spotA, "aws catalog via Karpenter NodePool gpu (" + file + ", use1-az4)"},
		"on_demand g6.xlarge us-east-1a": {od, "aws catalog via Karpenter NodePool gpu (" + file + ", use1-az4)"},
		"on_demand g6.xlarge us-east-1b": {od, "aws catalog via Karpenter NodePool gpu (" + file + ", us-east-1 median)"},
	} {
		q, ok := got[key]
		if !ok || q.Unpriced != "" || q.PricePerHour != w.price || q.PriceSource != w.source || q.Accelerator != "L4" {
			t.Errorf("%s: %+v; want L4 at $%v/h priced by %q", key, q, w.price, w.source)
		}
	}
	if _, ok := got["spot g6.xlarge us-east-1b"]; !ok {
		t.Errorf("no spot offer in us-east-1b (its AZ id unknown: priced at the region's median): %v", slices.Collect(maps.Keys(got)))
	}
	for key, q := range got {
		if !strings.HasPrefix(q.InstanceType, "g6.") || strings.Contains(key, "us-east-1c") || q.InstanceType != "g6.xlarge" && q.InstanceType != "g6.2xlarge" {
			t.Errorf("offered %s, which the NodePool excludes", key)
		}
	}
	t.Logf("%d offers from the NodePool: %v", len(got), slices.Sorted(maps.Keys(got)))
	_, notes := p.allPools(ctx)
	if !slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, "NodePool h100 is at its nvidia.com/gpu limit") }) {
		t.Errorf("notes %q; want the h100 NodePool at its limit", notes)
	}

	// A replica there: a pod pinned to what Karpenter must create. No Karpenter runs in
	// this test, so no node comes: refused after ProvisionSeconds, not UnschedulableSeconds.
	q := got["spot g6.xlarge us-east-1a"]
	type result struct {
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		_, err := p.Launch(ctx, replicas.LaunchSpec{ReplicaID: "svc-1", Service: "svc", Version: 1, Run: sp.Run, Capacity: q.Capacity, Region: q.Region, Zone: q.Zone,
			Accelerator: q.Accelerator, AcceleratorCount: 1, InstanceType: q.InstanceType, PricePerHour: &q.PricePerHour, PriceSource: q.PriceSource})
		done <- result{err, time.Since(start)}
	}()
	waitFor(t, "the replica's pod", func() bool { return len(c.Pods("arbiter", LabelReplica+"=svc-1")) == 1 })
	pod := c.Pods("arbiter", LabelReplica+"=svc-1")[0]
	if pod.Annotations[annKarpenterDoNotDisrupt] != "true" {
		t.Errorf("the pod's annotations %v; want karpenter.sh/do-not-disrupt: \"true\"", pod.Annotations)
	}
	want := map[string]string{labelKarpenterPool: "gpu", labelKarpenterCap: "spot", labelInstanceType: "g6.xlarge", labelZone: "us-east-1a"}
	terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 {
		t.Fatalf("node affinity %+v; want one term", terms)
	}
	for _, e := range terms[0].MatchExpressions {
		if e.Key == labelRegion {
			t.Errorf("the pod pins the region (%v), which Karpenter's providers do not all label", e.Values)
		}
		if w, ok := want[e.Key]; ok && e.Operator == "In" && slices.Equal(e.Values, []string{w}) {
			delete(want, e.Key)
		}
	}
	if len(want) > 0 {
		t.Errorf("the pod's node affinity %+v lacks %v", terms[0].MatchExpressions, want)
	}
	r := <-done
	if !errors.Is(r.err, replicas.ErrNoCapacity) || r.took < 5*time.Second {
		t.Errorf("the launch with no node created: %v after %v; want ErrNoCapacity after the 5 s provision budget", r.err, r.took.Round(time.Millisecond))
	}
	t.Logf("refused after %v: %v", r.took.Round(time.Millisecond), r.err)
}

// Karpenter's own controller (its KWOK provider) on a cluster with no GPU node (issue 47):
// Arbiter offers what the NodePool would create, and a replica placed on the spot g6.xlarge
// in us-east-1a becomes a pending pod for which Karpenter makes exactly that node (the
// NodePool, capacity type, machine type and zone Arbiter chose), on which the replica runs.
func TestKarpenterCreatesTheNodeArbiterChose(t *testing.T) {
	types, err := kubetest.CatalogInstanceTypes("aws", []string{"g6.xlarge"}, map[string]string{"us-east-1a": "use1-az4", "us-east-1b": "use1-az6"})
	if err != nil {
		t.Fatal(err)
	}
	c := kubetest.Start(t, kubetest.Options{Name: "karpenter", PodCIDR: "127.0.46.1/24", Karpenter: &kubetest.Karpenter{InstanceTypes: types}})
	c.Namespace("arbiter")
	c.AddNode(kubetest.AWSNode("system", "m7i.large", "us-east-1", "us-east-1a", "use1-az4"))
	c.Apply("nodepool", kubetest.KWOKNodePool("gpu", []string{"spot", "on-demand"}, 4))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, sp := nodePoolProvider(ctx, t, c, 120)
	quotes, err := p.Quote(ctx, "svc", sp)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(quotes, func(q replicas.Quote) bool {
		return q.Capacity == fleet.Spot && q.Zone == "us-east-1a" && q.InstanceType == "g6.xlarge"
	})
	if i < 0 || len(quotes) != 4 {
		t.Fatalf("quotes %+v; want g6.xlarge spot and on-demand in us-east-1a and us-east-1b", quotes)
	}
	q := quotes[i]
	start := time.Now()
	inst, err := p.Launch(ctx, replicas.LaunchSpec{ReplicaID: "svc-1", Service: "svc", Version: 1, Run: sp.Run, Capacity: q.Capacity, Region: q.Region, Zone: q.Zone,
		Accelerator: q.Accelerator, AcceleratorCount: 1, InstanceType: q.InstanceType, PricePerHour: &q.PricePerHour, PriceSource: q.PriceSource})
	if err != nil {
		t.Fatalf("launch on the NodePool's spot g6.xlarge: %v\nkarpenter log:\n%s", err, c.Log("karpenter-kwok"))
	}
	running := time.Since(start)
	pods := c.Pods("arbiter", LabelReplica+"=svc-1")
	if len(pods) != 1 || pods[0].Spec.NodeName == "" {
		t.Fatalf("the replica's pod: %+v", pods)
	}
	node := &corev1.Node{}
	if err := c.Admin.Get(ctx, coreclient.Nodes, "", pods[0].Spec.NodeName, node); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{labelKarpenterPool: "gpu", labelKarpenterCap: "spot", labelInstanceType: "g6.xlarge", labelZone: "us-east-1a"} {
		if node.Labels[k] != v {
			t.Errorf("Karpenter's node %s has %s=%q; want %q (what Arbiter chose)", node.Name, k, node.Labels[k], v)
		}
	}
	if inst.PricePerHour != q.PricePerHour {
		t.Errorf("the replica runs at $%v/h; want the quote's $%v/h", inst.PricePerHour, q.PricePerHour)
	}
	t.Logf("KARPENTER: node %s created %v after the launch, the replica running after %v",
		node.Name, node.CreationTimestamp.Sub(start).Round(time.Second), running.Round(100*time.Millisecond))

	// (Its consolidation once Arbiter ends the replica: e2e TestKubernetesKarpenterScaleFromZero.)
}
