package providers

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "providers.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadReadsBothSectionsStrictly(t *testing.T) {
	f, err := Load(write(t, "kubernetes:\n  - {name: gke, context: gke, node_pools: [{selector: {cloud.google.com/gke-nodepool: l4-spot}, capacity: spot, instance_type: g2-standard-8, zones: [us-central1-a, us-central1-c], max_nodes: 4}]}\naws:\n  regions: [us-east-1, eu-west-1]\n  subnets: {use1-az4: subnet-0abc}\n  public_ip: true\nrunpod:\n  cloud_type: SECURE\n  bid_margin: 0.2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f.RunPod == nil || f.RunPod.CloudType != "SECURE" || *f.RunPod.BidMargin != 0.2 {
		t.Fatalf("runpod section %+v", f.RunPod)
	}
	if len(f.Kubernetes) != 1 || f.AWS == nil || len(f.AWS.Regions) != 2 || f.AWS.Subnets["use1-az4"] != "subnet-0abc" || !f.AWS.PublicIP {
		t.Fatalf("%+v %+v", f, f.AWS)
	}
	for body, want := range map[string]string{
		"aws:\n  region: us-east-1\n":        "field region not found",
		"aws:\n  regions: [US East]\n":       "not an AWS region name",
		"gcp: {}\n":                          "field gcp not found",
		"kubernetes:\n  - {}\n  - {}\n":      "configured twice",
		"aws:\n  endpoint: 127.0.0.1:4566\n": "not an http(s) URL",
		// A GKE node pool scaled to zero must say what its nodes would be.
		"kubernetes:\n  - node_pools:\n      - {selector: {cloud.google.com/gke-nodepool: l4}, instance_type: g2-standard-8, zones: [us-central1-a], max_nodes: 2}\n":   "say the pool's capacity",
		"kubernetes:\n  - node_pools:\n      - {selector: {cloud.google.com/gke-nodepool: l4}, capacity: spot, instance_type: g2-standard-8, max_nodes: 2}\n":           "list the zones",
		"kubernetes:\n  - node_pools:\n      - {selector: {cloud.google.com/gke-nodepool: l4}, capacity: spot, instance_type: g2-standard-8, zones: [us-central1-a]}\n": "max_nodes",
		"kubernetes:\n  - node_pools:\n      - {selector: {cloud.google.com/gke-nodepool: l4}, zones: [us-central1-a], max_nodes: 2}\n":                                 "give its instance_type too",
	} {
		if _, err := Load(write(t, body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
}
