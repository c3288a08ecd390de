package scaling

import (
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
)

// gpuOffers are one on-demand offer of each GPU at the embedded catalogs' cheapest
// on-demand one-GPU price (2026-08-01, as `simulate capacity` prints them), each with what
// it sustains serving Llama-3.1-8B at a p90 TPOT of 100 ms and TTFT of 2 s for prompts of
// 1,024 tokens and answers of 256, from its engine profile.
func gpuOffers(t *testing.T) []Offer {
	t.Helper()
	var out []Offer
	for _, g := range []struct {
		acc, zone string
		price     float64
	}{{"L4", "z-l4", 0.7045}, {"A10G", "z-a10g", 1.006}, {"A100-80GB", "z-a100", 3.673}, {"H100", "z-h100", 1.80}} {
		prof, err := engine.ProfileOn(g.acc, "llama-3.1-8b")
		if err != nil {
			t.Fatal(err)
		}
		s, err := engine.SustainedRate(prof, 1024, 256, 100*time.Millisecond, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, Offer{Provider: "cloud", Region: "r", Zone: g.zone, Capacity: fleet.OnDemand, PricePerHour: g.price,
			Accelerator: g.acc, AcceleratorCount: 1, Sustains: Sustains{Known: true, TokensPerSecond: s.TokensPerSecond}})
	}
	return out
}

func accelerators(ls []Launch) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Offer.Accelerator)
	}
	return out
}

// Ranked per hour the L4 is cheapest ($0.70/h); ranked per token at the SLO the H100 is (at
// $1.80/h it serves some 30 times the L4's tokens within the SLO), then the A100-80GB, the
// L4 and the A10G: a different order from the hourly one (L4, A10G, H100, A100-80GB).
func TestOffersRankByDollarsPerTokenAtTheSLO(t *testing.T) {
	offers := gpuOffers(t)
	var order []string
	rest := offers
	for len(rest) > 0 {
		best, _ := cheapest(rest, fleet.OnDemand, nil)
		order = append(order, best.Accelerator)
		rest = removeOffer(rest, best)
	}
	eq(t, "per-token order", order, "H100", "A100-80GB", "L4", "A10G")
	unknown := make([]Offer, len(offers))
	for i, o := range offers {
		o.Sustains = Sustains{}
		unknown[i] = o
	}
	pl := policy(func(p *PlacementPolicy) { p.UseSpot = false })
	eq(t, "launch with throughput unknown (per hour)", accelerators(pl.Plan(p0, 1, nil, unknown).Launch), "L4")
	plan := pl.Plan(p0, 2, nil, offers)
	eq(t, "launches per token", accelerators(plan.Launch), "H100", "H100")
	if r := plan.Launch[0].Reason; !strings.Contains(r, "H100 at $1.80/h ($0.021/M tokens at the SLO)") {
		t.Fatalf("reason %q: want the H100's hourly price and its $/M tokens at the SLO", r)
	}
}

// A type that cannot be had falls to the next cheapest per token, and the launch's reason
// says which cheaper one was refused.
func TestRefusedTypeFallsToTheNextCheapestPerToken(t *testing.T) {
	offers := gpuOffers(t)
	pl := policy(func(p *PlacementPolicy) { p.UseSpot = false; p.RefusalBackoff = time.Minute })
	h100 := offers[3]
	pl.Refused(h100, p0)
	plan := pl.Plan(p0.Add(10*time.Second), 1, nil, offers)
	eq(t, "launch after the H100 was refused", accelerators(plan.Launch), "A100-80GB")
	if r := plan.Launch[0].Reason; !strings.Contains(r, "the cheaper H100 at $1.80/h ($0.021/M tokens at the SLO) in cloud/r/z-h100 refused a launch 10s ago") {
		t.Fatalf("reason %q: want it to name the refused H100", r)
	}
	// Once the backoff is over the H100 is tried again.
	eq(t, "launch after the backoff", accelerators(pl.Plan(p0.Add(2*time.Minute), 1, nil, offers).Launch), "H100")
	// A refusal keeps out that GPU only: the other types in its zone stay.
	mixed := []Offer{h100, offers[0]}
	mixed[1].Zone = h100.Zone
	pl.Refused(h100, p0.Add(3*time.Minute))
	eq(t, "same zone, other GPU", accelerators(pl.Plan(p0.Add(3*time.Minute), 1, nil, mixed).Launch), "L4")
}

// A GPU that cannot meet the SLO at all (a known 0) ranks after every one that can, however
// cheap its hour.
func TestAGPUThatCannotMeetTheSLORanksLast(t *testing.T) {
	offers := gpuOffers(t)
	offers[0].Sustains.TokensPerSecond = 0 // the L4, say, under a TTFT target it cannot meet
	pl := policy(func(p *PlacementPolicy) { p.UseSpot = false })
	offers = offers[:2] // the L4 and the A10G
	eq(t, "L4 (no throughput at the SLO) vs A10G", accelerators(pl.Plan(p0, 1, nil, offers).Launch), "A10G")
}

func removeOffer(os []Offer, o Offer) []Offer {
	var out []Offer
	for _, x := range os {
		if x != o {
			out = append(out, x)
		}
	}
	return out
}
