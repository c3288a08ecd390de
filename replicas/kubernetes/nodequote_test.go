package kubernetes

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
)

// NodePricer reads a node as placement does: the GPU from the platform's label, spot from
// the capacity label, the price from the catalog's row for its cloud, zone and machine
// type; a configured node pool's price comes first; a node nothing prices says why.
func TestNodePricerQuotesAsPlacementDoes(t *testing.T) {
	cat, err := pricing.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	var want float64
	for _, o := range cat.Offers(time.Time{}) {
		if o.Provider == "gcp" && o.Zone == "us-central1-a" && o.InstanceType == "a3-highgpu-1g" && o.Capacity == fleet.Spot {
			want = o.PricePerGPUHour
		}
	}
	gke := node(map[string]string{"topology.kubernetes.io/zone": "us-central1-a", "topology.kubernetes.io/region": "us-central1",
		"node.kubernetes.io/instance-type": "a3-highgpu-1g", "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
		"cloud.google.com/gke-spot": "true"})
	pr := NewNodePricer(cat, nil, Cluster{})
	q := pr.Quote(gke, pr.Siblings([]*corev1.Node{gke}))
	if q.Accelerator != "H100" || q.Capacity != fleet.Spot || q.Cloud != "gcp" || q.PricePerGPUHour != want || want == 0 || q.Unpriced != "" || q.GPUs != 8 {
		t.Errorf("GKE spot H100: %+v, want H100 spot gcp at %v", q, want)
	}

	onprem := node(map[string]string{"node.kubernetes.io/instance-type": "dgx-h100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "dc": "one"})
	q = pr.Quote(onprem, Siblings{})
	if q.Accelerator != "H100" || q.PricePerGPUHour != 0 || q.Unpriced == "" {
		t.Errorf("an on-prem node without a configured price: %+v, want H100 unpriced with a reason", q)
	}
	price := 1.25
	q = NewNodePricer(cat, nil, Cluster{NodePools: []NodePool{{Selector: map[string]string{"dc": "one"}, PricePerGPUHour: &price, Capacity: fleet.Reserved}}}).Quote(onprem, Siblings{})
	if q.PricePerGPUHour != price || q.Capacity != fleet.Reserved || q.Unpriced != "" || q.PriceSource == "" {
		t.Errorf("an on-prem node in a configured node pool: %+v, want reserved at %v", q, price)
	}
}
