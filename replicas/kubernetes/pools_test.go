package kubernetes

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/kubetest"
	"github.com/arbiter-serve/arbiter/spec"
)

// offerPrice is the catalog's price per GPU-hour of one machine type, capacity kind and
// place (a zone, an AZ id, or a region for the catalogs that price per region), and the
// file it came from.
func offerPrice(t *testing.T, cloud, place, instanceType string, c fleet.Capacity) (float64, string) {
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

// A Karpenter node pool on AWS (a spot and an on-demand g6.xlarge, the on-demand one with
// neither a provider ID nor karpenter.k8s.aws/* labels, both tainted nvidia.com/gpu) and an
// AKS spot pool of Standard_NC40ads_H100_v5, as the platforms label and taint them, against
// a real apiserver and scheduler: every pool is quoted at its catalog price with the rule
// that priced it, replicas schedule on each (tolerating the taints), the on-demand node
// takes the replica the full spot node refuses, and a node that names no place and no
// cloud is reported without blanks.
func TestKarpenterAndAKSPoolsOnARealCluster(t *testing.T) {
	c := kubetest.Start(t, kubetest.Options{Name: "pools", PodCIDR: "127.0.43.1/24"})
	c.Namespace("arbiter")
	c.AddNode(kubetest.KarpenterNode("karp-spot", "gpu", "us-east-1a", "spot", false))
	// Karpenter registers its nodes tainted karpenter.sh/unregistered:NoExecute and removes
	// the taint once the node is synced: until then it is no capacity.
	od := kubetest.KarpenterNode("karp-od", "gpu", "us-east-1a", "on-demand", true)
	od.Taints = append(od.Taints, corev1.Taint{Key: taintKarpenterUnreg, Effect: corev1.TaintEffectNoExecute})
	c.AddNode(od)
	c.AddNode(kubetest.AKSNode("aks-spotpool-0", "spotpool", "eastus", 1, 0, true))
	// An EKS managed node group's g5.xlarge whose GPU only NVIDIA GPU feature discovery
	// names (nvidia.com/gpu.product, the product as nvidia-smi reports it, spaces as dashes).
	c.AddNode(kubetest.Node{Name: "eks-a10g", GPUs: 1, ProviderID: "aws:///us-east-1b/i-0a10a10a10a10a10a",
		Labels: map[string]string{labelInstanceType: "g5.xlarge", labelZone: "us-east-1b", labelRegion: "us-east-1", labelAWSZoneID: "use1-az2",
			labelEKSNodeGroup: "a10g", labelGFDProduct: "NVIDIA-A10G"}})
	// On-prem: a machine type no catalog lists, no zone, no region, no cloud.
	c.AddNode(kubetest.Node{Name: "dgx", GPUs: 8, Labels: map[string]string{labelInstanceType: "dgx-h100", labelGFDProduct: "NVIDIA-H100-80GB-HBM3"}})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := New(ctx, Config{Cluster: Cluster{Name: "pools", Namespace: "arbiter", UnschedulableSeconds: 3, GraceSeconds: 1},
		Owner: "arbiter-test", Rest: rest.CopyConfig(c.AdminRest), HealthEvery: time.Second, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the provider to sync", func() bool { _, err := p.List(ctx); return err == nil })
	sp, err := spec.Parse("svc.yaml", []byte(`run: sleep infinity
resources: {accelerators: {L4: 1, A10G: 1, H100: 1}, use_spot: true, image_id: "docker:example/replicasim:1"}
service: {readiness_probe: /health, replicas: 1}
arbiter: {providers: [kubernetes]}
`))
	if err != nil {
		t.Fatal(err)
	}
	quotes, err := p.Quote(ctx, "svc", sp)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range quotes {
		if q.Capacity == fleet.OnDemand && q.Accelerator == "L4" {
			t.Errorf("an unregistered Karpenter node is quoted: %+v", q)
		}
	}
	c.Untaint("karp-od", taintKarpenterUnreg)
	waitFor(t, "the registered on-demand node to be quoted", func() bool {
		quotes, err = p.Quote(ctx, "svc", sp)
		return err == nil && slices.ContainsFunc(quotes, func(q replicas.Quote) bool { return q.Capacity == fleet.OnDemand && q.Accelerator == "L4" })
	})
	l4Spot, awsFile := offerPrice(t, "aws", "use1-az1", "g6.xlarge", fleet.Spot)
	l4OD, _ := offerPrice(t, "aws", "use1-az1", "g6.xlarge", fleet.OnDemand)
	a10gOD, _ := offerPrice(t, "aws", "use1-az2", "g5.xlarge", fleet.OnDemand)
	h100Spot, azureFile := offerPrice(t, "azure", "eastus", "Standard_NC40ads_H100_v5", fleet.Spot)
	type priced struct {
		price  float64
		source string
	}
	want := map[string]priced{
		"spot L4 g6.xlarge us-east-1a":                {l4Spot, "aws catalog via provider ID (" + awsFile + ", use1-az1)"},
		"on_demand L4 g6.xlarge us-east-1a":           {l4OD, "aws catalog via node pool sibling karpenter.sh/nodepool=gpu (" + awsFile + ", us-east-1 median)"},
		"on_demand A10G g5.xlarge us-east-1b":         {a10gOD, "aws catalog via provider ID (" + awsFile + ", use1-az2)"},
		"spot H100 Standard_NC40ads_H100_v5 eastus-1": {h100Spot, "azure catalog via provider ID (" + azureFile + ", eastus)"},
	}
	got := map[string]replicas.Quote{}
	for _, q := range quotes {
		got[strings.Join([]string{string(q.Capacity), q.Accelerator, q.InstanceType, q.Zone}, " ")] = q
	}
	for k, w := range want {
		q, ok := got[k]
		if !ok || q.Unpriced != "" || q.PricePerHour != w.price || q.PriceSource != w.source {
			t.Errorf("%s: quote %+v; want $%v/h priced by %q", k, q, w.price, w.source)
		}
	}
	dgx, ok := got["on_demand H100 dgx-h100 "]
	if !ok || dgx.Unpriced == "" || strings.Contains(dgx.Unpriced, "  ") || strings.Contains(dgx.Unpriced, " in ") {
		t.Errorf("the on-prem node's quote %+v: want it unpriced, with no place it does not have", dgx)
	}
	t.Logf("on-prem: %s", dgx.Unpriced)

	launch := func(id, key string) (replicas.Instance, error) {
		q := got[key]
		return p.Launch(ctx, replicas.LaunchSpec{ReplicaID: id, Service: "svc", Version: 1, Run: sp.Run, Capacity: q.Capacity, Region: q.Region, Zone: q.Zone,
			Accelerator: q.Accelerator, AcceleratorCount: 1, InstanceType: q.InstanceType, PricePerHour: &q.PricePerHour, PriceSource: q.PriceSource})
	}
	for _, l := range []struct{ id, key, node string }{
		{"svc-1", "spot L4 g6.xlarge us-east-1a", "karp-spot"},
		{"svc-3", "on_demand L4 g6.xlarge us-east-1a", "karp-od"},
		{"svc-4", "spot H100 Standard_NC40ads_H100_v5 eastus-1", "aks-spotpool-0"},
		{"svc-6", "on_demand A10G g5.xlarge us-east-1b", "eks-a10g"},
	} {
		inst, err := launch(l.id, l.key)
		if err != nil {
			t.Fatalf("launch on %s: %v", l.node, err)
		}
		if pods := c.Pods("arbiter", LabelReplica+"="+l.id); len(pods) != 1 || pods[0].Spec.NodeName != l.node {
			t.Fatalf("%s's pod is not on %s: %+v", l.id, l.node, pods)
		}
		if inst.PricePerHour != want[l.key].price || inst.PriceSource != want[l.key].source {
			t.Errorf("%s runs at $%v/h priced by %q; want the quote's", l.id, inst.PricePerHour, inst.PriceSource)
		}
		if l.id == "svc-1" {
			// The spot node's one GPU is taken: the next spot replica is refused, which is
			// what sends placement to the on-demand sibling.
			if _, err := launch("svc-2", l.key); !errors.Is(err, replicas.ErrNoCapacity) || !strings.Contains(err.Error(), "nvidia.com/gpu") {
				t.Fatalf("a second spot replica on the full spot node: %v; want ErrNoCapacity", err)
			}
		}
	}
	// A control plane that reattaches reads the rule back from the pods.
	list, err := p.List(ctx)
	if err != nil || len(list) != 4 {
		t.Fatalf("list: %v %+v", err, list)
	}
	for _, in := range list {
		if !strings.Contains(in.PriceSource, " catalog via ") {
			t.Errorf("listed %s priced by %q", in.ReplicaID, in.PriceSource)
		}
	}
	// A node the quote no longer finds is refused without blanks.
	_, err = p.Launch(ctx, replicas.LaunchSpec{ReplicaID: "svc-5", Service: "svc", Version: 1, Run: sp.Run, Capacity: fleet.OnDemand, Accelerator: "A100", AcceleratorCount: 1})
	if !errors.Is(err, replicas.ErrNoCapacity) || strings.Contains(err.Error(), "  ") || strings.Contains(err.Error(), "/ ") {
		t.Errorf("launch on a pool that is not there: %v", err)
	}
	t.Logf("no such pool: %v", err)
}
