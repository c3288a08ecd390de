package engine_test

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/pricing"
)

// The cheapest GPU per token that the model names, against the public data's (issue 48):
// in every set of GPUs one source measured alike (one engine, precision, model, shape and
// load), each GPU priced at the cheapest on-demand one-GPU offer of the clouds Arbiter
// launches on (aws, gcp, azure; catalogs of 2026-08-01, as `simulate capacity` quotes
// them), the GPU with the least $ per token by the model's throughputs is compared with
// the one the published throughputs make cheapest. Issue 48's goal is agreement in 80 % of
// the sets; the test holds it where it stands. GPUs no catalog prices (the A100 80GB PCIe,
// the H200 on one GPU) are left out of their sets.
func TestCheapestGPUAgreesWithPublicData(t *testing.T) {
	engine.SkipUnderRace(t)
	if testing.Short() {
		t.Skip("replays the public measurements")
	}
	all, err := pricing.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	cat, err := all.Only(pricing.Launchable...)
	if err != nil {
		t.Fatal(err)
	}
	offers := cat.Offers(time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC))
	price := map[string]float64{} // by GPU profile name; 0: no one-GPU on-demand offer
	sets := map[string][]engine.PubTput{}
	var order []string
	for _, p := range engine.PublicThroughputs(t) {
		if _, ok := price[p.GPU]; !ok {
			g, err := engine.LookupGPU(p.GPU)
			if err != nil {
				t.Fatal(err)
			}
			o, _ := pricing.CheapestOnDemand(offers, g.Catalog, 1)
			price[p.GPU] = o.PricePerHour
		}
		if price[p.GPU] == 0 {
			continue
		}
		if _, ok := sets[p.Set]; !ok {
			order = append(order, p.Set)
		}
		sets[p.Set] = append(sets[p.Set], p)
	}
	// cheapest is the GPU of set with the least $ per token by tput, and how much dearer
	// the next is (a fraction).
	cheapest := func(set []engine.PubTput, tput func(engine.PubTput) float64) (string, float64) {
		type c struct {
			gpu string
			usd float64
		}
		var cs []c
		for _, p := range set {
			cs = append(cs, c{p.GPU, price[p.GPU] / tput(p)})
		}
		slices.SortFunc(cs, func(a, b c) int { return cmp.Compare(a.usd, b.usd) })
		return cs[0].gpu, cs[1].usd/cs[0].usd - 1
	}
	agree, n, decisive, decisiveAgree := 0, 0, 0, 0
	for _, name := range order {
		set := sets[name]
		if len(set) < 2 {
			continue
		}
		n++
		model, _ := cheapest(set, func(p engine.PubTput) float64 { return p.Model })
		published, margin := cheapest(set, func(p engine.PubTput) float64 { return p.Published })
		var gpus []string
		for _, p := range set {
			gpus = append(gpus, fmt.Sprintf("%s $%.2f", p.GPU, price[p.GPU]))
		}
		mark := "agrees"
		if model == published {
			agree++
		} else {
			mark = "DIFFERS"
		}
		if margin >= 0.10 {
			decisive++
			if model == published {
				decisiveAgree++
			}
		}
		t.Logf("%-36s %-28s published: %-10s (next %3.0f %% dearer) model: %-10s %s", name, strings.Join(gpus, ", "), published, 100*margin, model, mark)
	}
	t.Logf("cheapest GPU agrees in %d of %d sets; in %d of the %d where the published next-cheapest is 10 %% dearer or more", agree, n, decisiveAgree, decisive)
	if n < 10 {
		t.Fatalf("%d sets of GPUs measured alike: the public rows were not all read", n)
	}
	// Held where it stands (2026-12-01, with TensorRT-LLM 0.17's sets of the H100 and L40S
	// in FP8 beside the A100 in FP16: 63 of 91, 25 of the 31 decisive; before them, with
	// INFBENCH's A100 read as the 40 GB card its script asks Modal for: 52 of 75, 18 of 23; 2026-11-30, with Argonne's 40
	// sets of vLLM static batches on the 40 GB A100 and the H100 and each card's measured
	// bandwidth share: 51 and 17; before the shares, 49 and 15; before Argonne's sets, 19 of
	// 35 and 11 of 14); issue 48's goal is 80 % of all sets.
	if agree < 63 || decisiveAgree < 25 {
		t.Errorf("the model names the cheapest GPU the public data names in %d of %d sets (%d of %d decisive); held at 63 and 25, the goal is 80 %%", agree, n, decisiveAgree, decisive)
	}
}
