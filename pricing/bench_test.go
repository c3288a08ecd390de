package pricing

import (
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/spec"
)

func BenchmarkQuote(b *testing.B) {
	c := catalog(b)
	at := day("2025-06-05T12:00:00Z")
	for _, bc := range []struct {
		name string
		r    spec.Resources
	}{
		{"L4:1 any cloud, spot", spec.Resources{Accelerators: acc("L4", 1), UseSpot: true}},
		{"H100:8 aws us-east-1", spec.Resources{Accelerators: acc("H100", 8), Cloud: "aws", Region: "us-east-1"}},
		{"any_of A100-80GB:8 H100:8 H200:8", spec.Resources{UseSpot: true, AnyOf: []spec.Resources{
			{Accelerators: acc("A100-80GB", 8), UseSpot: true},
			{Accelerators: acc("H100", 8), UseSpot: true},
			{Accelerators: acc("H200", 8), UseSpot: true},
		}}},
		{"instance_type only", spec.Resources{InstanceType: "g6.xlarge"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Quote(bc.r, at); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkOffers(b *testing.B) {
	c := catalog(b)
	b.ReportAllocs()
	for b.Loop() {
		c.Offers(time.Time{})
	}
}

func BenchmarkEmbedded(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Embedded(); err != nil {
			b.Fatal(err)
		}
	}
}
