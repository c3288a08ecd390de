package pricing

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/spec"
)

func acc(name string, count int) []spec.Accelerator {
	return []spec.Accelerator{{Name: name, Count: count}}
}

func quote(t *testing.T, r spec.Resources, at time.Time) []Offer {
	t.Helper()
	offers, err := catalog(t).Quote(r, at)
	if err != nil {
		t.Fatalf("Quote(%+v): %v", r, err)
	}
	return offers
}

// sortedWithin checks that offers come cheapest first within each preference rank.
func sortedWithin(t *testing.T, offers []Offer) {
	t.Helper()
	for i := 1; i < len(offers); i++ {
		a, b := offers[i-1], offers[i]
		if a.Preference > b.Preference || (a.Preference == b.Preference && a.PricePerHour > b.PricePerHour) {
			t.Fatalf("offers %d and %d out of order: %+v then %+v", i-1, i, a, b)
		}
	}
}

func TestQuoteSpotAndOnDemand(t *testing.T) {
	// p5.48xlarge in us-east-1 before the June 2025 cut: 98.32 on-demand in six AZs, spot
	// from 20.9934 (use1-az3) to 30.326 (use1-az1).
	r := spec.Resources{Accelerators: acc("H100", 8), Cloud: "aws", Region: "us-east-1", InstanceType: "p5.48xlarge"}
	at := day("2025-01-01T00:00:00Z")
	od := quote(t, r, at)
	if len(od) != 6 {
		t.Fatalf("%d on-demand offers, want 6 (one per AZ)", len(od))
	}
	for _, o := range od {
		if o.Capacity != fleet.OnDemand || o.PricePerHour != 98.32 || !near(o.PricePerGPUHour, 12.29) {
			t.Errorf("without use_spot: %+v", o)
		}
	}
	r.UseSpot = true
	both := quote(t, r, at)
	if len(both) != 12 {
		t.Fatalf("use_spot: %d offers, want 6 spot + 6 on-demand", len(both))
	}
	sortedWithin(t, both)
	first := both[0]
	if first.Capacity != fleet.Spot || first.Zone != "use1-az3" || first.PricePerHour != 20.9934 {
		t.Errorf("cheapest with use_spot = %+v, want spot use1-az3 at 20.9934", first)
	}
	if last := both[len(both)-1]; last.Capacity != fleet.OnDemand {
		t.Errorf("dearest = %+v, want an on-demand offer kept for the spot/on-demand ratio", last)
	}
}

func TestQuoteAnyOfPicksCheapest(t *testing.T) {
	// us-east-1 on-demand: g6.xlarge (L4) 0.8048 is cheaper than g5.xlarge (A10G) 1.006,
	// whichever comes first in any_of.
	for _, order := range [][]string{{"A10G", "L4"}, {"L4", "A10G"}} {
		var cands []spec.Resources
		for _, a := range order {
			cands = append(cands, spec.Resources{Accelerators: acc(a, 1), Cloud: "aws", Region: "us-east-1"})
		}
		offers := quote(t, spec.Resources{AnyOf: cands}, time.Time{})
		sortedWithin(t, offers)
		if o := offers[0]; o.InstanceType != "g6.xlarge" || o.PricePerHour != 0.8048 || o.Preference != 0 {
			t.Errorf("any_of %v: first offer %+v, want g6.xlarge at 0.8048", order, o)
		}
		if i := slices.IndexFunc(offers, func(o Offer) bool { return o.InstanceType == "g5.xlarge" }); i < 0 || offers[i].Preference != 0 {
			t.Errorf("any_of %v: A10G offers missing or ranked below L4", order)
		}
	}
	// The accelerators map form {A10G: 1, L4: 1} means the same.
	offers := quote(t, spec.Resources{Accelerators: []spec.Accelerator{{Name: "A10G", Count: 1}, {Name: "L4", Count: 1}}, Cloud: "aws", Region: "us-east-1"}, time.Time{})
	if offers[0].InstanceType != "g6.xlarge" {
		t.Errorf("accelerator map: first offer %+v, want g6.xlarge", offers[0])
	}
}

func TestQuoteOrderedKeepsPreference(t *testing.T) {
	// A10G first although L4 is cheaper: every A10G offer precedes every L4 offer.
	check := func(name string, offers []Offer) {
		t.Helper()
		sortedWithin(t, offers)
		if o := offers[0]; o.Accelerator != "A10G" || o.InstanceType != "g5.xlarge" || o.PricePerHour != 1.006 {
			t.Errorf("%s: first offer %+v, want g5.xlarge at 1.006", name, o)
		}
		seenL4 := false
		for _, o := range offers {
			switch o.Accelerator {
			case "L4":
				seenL4 = true
				if o.Preference != 1 {
					t.Fatalf("%s: L4 offer with preference %d, want 1", name, o.Preference)
				}
			case "A10G":
				if seenL4 || o.Preference != 0 {
					t.Fatalf("%s: A10G offer after an L4 one or with preference %d", name, o.Preference)
				}
			}
		}
		if !seenL4 {
			t.Errorf("%s: the less preferred L4 offers are missing", name)
		}
	}
	base := spec.Resources{Cloud: "aws", Region: "us-east-1"}
	ordered := base
	ordered.Ordered = []spec.Resources{
		{Accelerators: acc("A10G", 1), Cloud: "aws", Region: "us-east-1"},
		{Accelerators: acc("L4", 1), Cloud: "aws", Region: "us-east-1"},
	}
	check("ordered", quote(t, ordered, time.Time{}))
	list := base
	list.Accelerators, list.AcceleratorsOrdered = []spec.Accelerator{{Name: "A10G", Count: 1}, {Name: "L4", Count: 1}}, true
	check("accelerator list", quote(t, list, time.Time{}))
}

func TestQuoteLocationConstraints(t *testing.T) {
	offers := quote(t, spec.Resources{Accelerators: acc("L4", 1), Cloud: "aws", Region: "us-east-1", Zone: "use1-az2", UseSpot: true}, time.Time{})
	for _, o := range offers {
		if o.Provider != "aws" || o.Region != "us-east-1" || o.Zone != "use1-az2" || o.Accelerator != "L4" || o.AcceleratorCount != 1 {
			t.Fatalf("offer outside the constraints: %+v", o)
		}
	}
	// g6.2xlarge,L4,1.0,8.0,32.0,0.9776,0.368900,us-east-1,use1-az2: in this AZ the
	// bigger host's spot price undercuts g6.xlarge's 0.3879.
	if o := offers[0]; o.InstanceType != "g6.2xlarge" || o.Capacity != fleet.Spot || o.PricePerHour != 0.3689 {
		t.Errorf("cheapest = %+v, want g6.2xlarge spot 0.3689", o)
	}
	// Region only: every zone of it; GCP zones from anycloud's list for the machine.
	gcp := quote(t, spec.Resources{Accelerators: acc("L4", 1), Cloud: "gcp", Region: "us-central1", InstanceType: "g2-standard-4"}, time.Time{})
	var zones []string
	for _, o := range gcp {
		zones = append(zones, o.Zone)
	}
	slices.Sort(zones)
	if want := []string{"us-central1-a", "us-central1-b", "us-central1-c"}; !slices.Equal(zones, want) {
		t.Errorf("g2-standard-4 us-central1 zones %v, want %v", zones, want)
	}
	// infra: gcp/*/us-central1-b leaves Region empty and names the zone.
	for _, o := range quote(t, spec.Resources{Accelerators: acc("L4", 1), Cloud: "gcp", Zone: "us-central1-b"}, time.Time{}) {
		if o.Zone != "us-central1-b" || o.Region != "us-central1" {
			t.Fatalf("zone-only constraint: %+v", o)
		}
	}
}

func TestQuoteMatchesCaseInsensitivelyAndExactly(t *testing.T) {
	lower := quote(t, spec.Resources{Accelerators: acc("a100-80gb", 8), Cloud: "AWS"}, time.Time{})
	for _, o := range lower {
		if o.Accelerator != "A100-80GB" || o.InstanceType != "p4de.24xlarge" {
			t.Fatalf("a100-80gb on aws: %+v, want p4de.24xlarge", o)
		}
	}
	// p4de.24xlarge,A100-80GB,8.0,…,40.96575 — on-demand, listed twice in some AZs, once.
	if o := lower[0]; o.PricePerHour != 40.96575 {
		t.Errorf("p4de.24xlarge = %v, want 40.96575", o.PricePerHour)
	}
	seen := map[where]bool{}
	for _, o := range lower {
		w := where{o.Provider, o.Region, o.Zone, o.InstanceType, o.Capacity}
		if seen[w] {
			t.Errorf("duplicate offer %+v", w)
		}
		seen[w] = true
	}
	for _, o := range quote(t, spec.Resources{Accelerators: acc("A100", 8), Cloud: "aws"}, time.Time{}) {
		if o.Accelerator != "A100" || o.InstanceType != "p4d.24xlarge" {
			t.Fatalf("A100 must not match A100-80GB: %+v", o)
		}
	}
}

func TestQuoteHostConstraints(t *testing.T) {
	r := spec.Resources{Accelerators: acc("L4", 1), Cloud: "aws", Region: "us-east-1", CPUs: "16+", Memory: "128GB"}
	offers := quote(t, r, time.Time{})
	for _, o := range offers {
		if o.VCPUs < 16 || o.MemoryGiB != 128 {
			t.Fatalf("cpus 16+, memory 128: %+v", o)
		}
	}
	// g6.8xlarge,L4,1.0,32.0,128.0,2.0144,…
	if offers[0].InstanceType != "g6.8xlarge" {
		t.Errorf("first = %s, want g6.8xlarge", offers[0].InstanceType)
	}
	// Instance type alone picks its GPUs.
	for _, o := range quote(t, spec.Resources{InstanceType: "p5.48xlarge", Region: "us-east-1"}, time.Time{}) {
		if o.Accelerator != "H100" || o.AcceleratorCount != 8 || o.PricePerHour != 55.04 {
			t.Fatalf("p5.48xlarge latest: %+v, want H100:8 at 55.04", o)
		}
	}
}

func TestQuoteErrors(t *testing.T) {
	c := catalog(t)
	for _, tc := range []struct {
		name string
		r    spec.Resources
		at   time.Time
		want string // the whole message, or its start when it ends in "…"
	}{{
		name: "unknown accelerator",
		r:    spec.Resources{Accelerators: acc("A10O", 1)},
		want: `unknown accelerator "A10O"; closest known: A100, A10G, A10`,
	}, {
		name: "every candidate unknown",
		r: spec.Resources{AnyOf: []spec.Resources{
			{Accelerators: acc("L40", 1)}, {Accelerators: acc("H10", 8)},
		}},
		want: "unknown accelerator \"L40\"; closest known: L4, L40S, A10…",
	}, {
		name: "region",
		r:    spec.Resources{Accelerators: acc("L4", 1), Cloud: "aws", Region: "us-west-9"},
		want: "no L4:1 offers in region us-west-9 of aws; regions with L4:1 on aws: ap-northeast-1, ap-northeast-2, ap-south-1, ap-southeast-2, ca-central-1, eu-central-1, eu-north-1, eu-west-2, eu-west-3, us-east-1, us-east-2, us-west-2",
	}, {
		name: "count",
		r:    spec.Resources{Accelerators: acc("L4", 3)},
		want: "no L4:3 offers; L4 comes in counts 1, 2, 4, 8",
	}, {
		name: "cloud without the GPU",
		r:    spec.Resources{Accelerators: acc("T4", 1), Cloud: "gcp"},
		want: "no T4:1 offers on gcp; clouds with T4:1: aws, azure (gcp lists T4 only as a price for GPUs attached to an N1 VM; the N1 VM's own price is not in these catalogs)",
	}, {
		name: "known but never priced",
		r:    spec.Resources{Accelerators: acc("p100", 1)},
		want: "no p100:1 offers: gcp lists P100 only as a price for GPUs attached to an N1 VM; the N1 VM's own price is not in these catalogs",
	}, {
		name: "zone where prices are per region",
		r:    spec.Resources{Accelerators: acc("H100", 8), Cloud: "azure", Zone: "eastus-1"},
		want: "no H100:8 offers in zone eastus-1 of azure; the catalogs price H100:8 on azure per region, without zones (leave zone out)",
	}, {
		name: "AWS zone by name",
		r:    spec.Resources{Accelerators: acc("H100", 8), Cloud: "aws", Region: "us-east-1", Zone: "us-east-1a"},
		want: "no H100:8 offers in zone us-east-1a (region us-east-1) of aws; zones with H100:8 in region us-east-1 of aws: use1-az1, use1-az2, use1-az3, use1-az4, use1-az5, use1-az6 (AWS zones are AZ ids such as use1-az1)",
	}, {
		name: "spot only",
		r:    spec.Resources{Accelerators: acc("H200", 8), Cloud: "aws", InstanceType: "p5e.48xlarge"},
		want: "no on-demand price for H200:8 on aws, only spot; set use_spot: true to consider spot",
	}, {
		name: "before the machine existed",
		r:    spec.Resources{Accelerators: acc("H100", 8), Cloud: "gcp", Region: "us-central1", InstanceType: "a3-highgpu-8g"},
		at:   day("2023-06-01T00:00:00Z"),
		want: "no H100:8 offers in region us-central1 of gcp have a price in force at 2023-06-01T00:00:00Z; the catalogs list them only at other times",
	}, {
		name: "every ordered candidate fails",
		r: spec.Resources{Ordered: []spec.Resources{
			{Accelerators: acc("H100", 8), Cloud: "lambda", Region: "mars-1"},
			{Accelerators: acc("L4", 1), Cloud: "kubernetes"},
		}},
		want: "no candidate has an offer: ordered[0]: no H100:8 offers in region mars-1 of lambda; regions with H100:8 on lambda: …",
	}, {
		name: "nothing to price",
		r:    spec.Resources{Cloud: "aws"},
		want: "resources: names no accelerators and no instance_type; the price catalogs list GPU machines only",
	}, {
		name: "unknown instance type",
		r:    spec.Resources{InstanceType: "p5.48xlarg"},
		want: "no offers for instance_type p5.48xlarg; closest instance types there: p5.48xlarge, g5.48xlarge, p5e.48xlarge",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			offers, err := c.Quote(tc.r, tc.at)
			if err == nil {
				t.Fatalf("no error; %d offers", len(offers))
			}
			got := err.Error()
			if prefix, ok := strings.CutSuffix(tc.want, "…"); ok {
				if !strings.HasPrefix(got, prefix) {
					t.Errorf("error\n%s\nwant prefix\n%s", got, prefix)
				}
			} else if got != tc.want {
				t.Errorf("error\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
	_, err := c.Quote(spec.Resources{Accelerators: acc("A10O", 1)}, time.Time{})
	var unknown *UnknownAcceleratorError
	if !errors.As(err, &unknown) || unknown.Name != "A10O" || !slices.Equal(unknown.Closest, []string{"A100", "A10G", "A10"}) {
		t.Errorf("errors.As UnknownAcceleratorError: %+v", unknown)
	}
	_, err = c.Quote(spec.Resources{Accelerators: acc("L4", 3)}, time.Time{})
	var none *NoOffersError
	if !errors.As(err, &none) || len(none.Reasons) != 1 {
		t.Errorf("errors.As NoOffersError: %v", err)
	}
}

func TestReservedOffers(t *testing.T) {
	got := ReservedOffers([]spec.ReservedCapacity{{Provider: "aws", Region: "us-east-1", Accelerator: "H100", Count: 8, PricePerHour: 55.04}})
	want := Offer{Provider: "aws", Region: "us-east-1", Accelerator: "H100", AcceleratorCount: 8, Capacity: fleet.Reserved,
		PricePerHour: 55.04, PricePerGPUHour: 6.88, Source: "spec: arbiter.reserved"}
	if len(got) != 1 || got[0] != want {
		t.Errorf("ReservedOffers = %+v, want %+v", got, want)
	}
}

func TestClosest(t *testing.T) {
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"A10O", []string{"A100", "A10G", "A10"}},
		{"h100mega", []string{"H100-MEGA", "H100", "A100"}},
		{"RTX-PRO6000", []string{"RTX-PRO-6000", "RTXPRO6000WS", "RTX6000"}},
	} {
		if got := closest(tc.name, []string{"A10", "A100", "A10G", "H100", "H100-MEGA", "H200", "RTX-PRO-6000", "RTX6000", "RTXPRO6000WS"}, 3); !slices.Equal(got, tc.want) {
			t.Errorf("closest(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}
