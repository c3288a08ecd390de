package kubetest

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
)

// CatalogInstanceTypes is the machine types Karpenter's KWOK provider may create, in its
// JSON: each of the given machine types of cloud, spot and on-demand, in each zone (by name,
// as nodes label it) at the catalog's price for the AZ or region it maps to (zones: zone
// name → the catalog's place), with its GPUs; prices from the embedded catalogs, not written
// here. Each of out ("zone/spot", "zone/on-demand") is an offering the cloud has no capacity
// for: left out, as Karpenter leaves an offering out once the cloud has answered
// InsufficientInstanceCapacity for it (its KWOK provider takes every offering listed as
// available).
func CatalogInstanceTypes(cloud string, types []string, zones map[string]string, out ...string) (string, error) {
	cat, err := pricing.Embedded()
	if err != nil {
		return "", err
	}
	type req struct {
		Key      string   `json:"key"`
		Operator string   `json:"operator"`
		Values   []string `json:"values"`
	}
	type offering struct {
		Price        float64
		Available    bool
		Requirements []req
	}
	type machine struct {
		Name             string            `json:"name"`
		Offerings        []offering        `json:"offerings"`
		Architecture     string            `json:"architecture"`
		OperatingSystems []string          `json:"operatingSystems"`
		Resources        map[string]string `json:"resources"`
	}
	names := make([]string, 0, len(zones))
	for z := range zones {
		names = append(names, z)
	}
	slices.Sort(names)
	var machines []machine
	for _, name := range types {
		m := machine{Name: name, Architecture: "amd64", OperatingSystems: []string{"linux"}}
		gpus, vcpus, mem := 0, 0.0, 0.0
		for _, zone := range names {
			for _, c := range []fleet.Capacity{fleet.Spot, fleet.OnDemand} {
				i := slices.IndexFunc(cat.Offers(time.Time{}), func(o pricing.Offer) bool {
					return o.Provider == cloud && o.InstanceType == name && o.Capacity == c && (o.Zone == zones[zone] || o.Zone == "" && o.Region == zones[zone])
				})
				if i < 0 {
					return "", fmt.Errorf("no %s catalog price for %s %s in %s", cloud, name, c, zones[zone])
				}
				o := cat.Offers(time.Time{})[i]
				gpus, vcpus, mem = o.AcceleratorCount, o.VCPUs, o.MemoryGiB
				capacity := "on-demand"
				if c == fleet.Spot {
					capacity = "spot"
				}
				if slices.Contains(out, zone+"/"+capacity) {
					continue
				}
				m.Offerings = append(m.Offerings, offering{Price: o.PricePerHour, Available: true, Requirements: []req{
					{"karpenter.sh/capacity-type", "In", []string{capacity}}, {"topology.kubernetes.io/zone", "In", []string{zone}}}})
			}
		}
		m.Resources = map[string]string{"cpu": fmt.Sprint(max(vcpus, 1)), "memory": fmt.Sprintf("%gGi", max(mem, 1)), "pods": "110",
			"nvidia.com/gpu": fmt.Sprint(gpus)}
		machines = append(machines, m)
	}
	b, err := json.Marshal(machines)
	return string(b), err
}

// AWSNode is a node without a GPU (a cluster's system node) as EKS labels it: machine type,
// zone, region and AZ id, and an aws:///<zone>/<instance id> provider ID. On a cluster whose
// GPU nodes Karpenter makes, it is what says the cluster's region and which AZ id each zone
// name maps to.
func AWSNode(name, instanceType, region, zone, zoneID string) Node {
	return Node{Name: name, ProviderID: "aws:///" + zone + "/i-0" + hex.EncodeToString([]byte(name)),
		Labels: map[string]string{"node.kubernetes.io/instance-type": instanceType, "topology.kubernetes.io/zone": zone,
			"topology.kubernetes.io/region": region, "topology.k8s.aws/zone-id": zoneID}}
}

// KWOKNodePool is a Karpenter NodePool of g6.xlarge in us-east-1a and us-east-1b, made
// through the test cluster's KWOKNodeClass, of the given capacity types (spot, on-demand),
// at most gpus GPUs, its empty nodes consolidated at once. It names the region, which a
// KWOK node is not labelled with otherwise. A node it deletes (an interruption, an expiry)
// has at most 2 minutes for its pods to leave (terminationGracePeriod: EC2's spot notice),
// which Karpenter writes on the NodeClaim as the time it ends.
func KWOKNodePool(name string, capacities []string, gpus int) string {
	quoted := make([]string, len(capacities))
	for i, c := range capacities {
		quoted[i] = strconv.Quote(c)
	}
	return fmt.Sprintf(`apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: %s
spec:
  template:
    spec:
      requirements:
        - key: karpenter.sh/capacity-type
          operator: In
          values: [%s]
        - key: topology.kubernetes.io/region
          operator: In
          values: ["us-east-1"]
        - key: topology.kubernetes.io/zone
          operator: In
          values: ["us-east-1a", "us-east-1b"]
        - key: node.kubernetes.io/instance-type
          operator: In
          values: ["g6.xlarge"]
      terminationGracePeriod: 2m
      nodeClassRef:
        group: karpenter.kwok.sh
        kind: KWOKNodeClass
        name: default
  limits:
    nvidia.com/gpu: %d
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 0s
`, name, strings.Join(quoted, ", "), gpus)
}
