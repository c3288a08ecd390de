package main

import (
	"strings"
	"testing"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/spec"
)

// serve up's preview names only the place an offer has: an on-prem Kubernetes pool whose
// nodes carry no zone or region labels prints its provider alone.
func TestPreviewPrintsNoEmptyPlace(t *testing.T) {
	sp := &spec.Service{}
	sp.Arbiter.Providers = []string{"kubernetes"}
	pv := &control.Preview{Market: true, MinReplicas: 1, MaxReplicas: 2, Offers: 2, Launches: []scaling.Launch{
		{Offer: scaling.Offer{Provider: "kubernetes:x", Capacity: fleet.OnDemand, InstanceType: "dgx-h100", PricePerHour: 4, PriceSource: "node_pools price_per_gpu_hour"}},
		{Offer: scaling.Offer{Provider: "kubernetes:gke", Region: "us-central1", Zone: "us-central1-a", Capacity: fleet.Spot, InstanceType: "a3-highgpu-1g", PricePerHour: 6}},
	}}
	var b strings.Builder
	printPreview(&b, "svc", sp, pv)
	out := b.String()
	for _, want := range []string{"dgx-h100 in kubernetes:x at $4.0000/h, priced by node_pools", "in kubernetes:gke us-central1/us-central1-a at $6.0000/h"} {
		if !strings.Contains(out, want) {
			t.Errorf("preview does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, " / ") || strings.Contains(out, "  at") || strings.Contains(out, ": \n") {
		t.Errorf("preview prints an empty place:\n%s", out)
	}
}
