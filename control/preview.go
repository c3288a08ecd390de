package control

import (
	"context"
	"fmt"
	"time"

	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/spec"
)

// quoteAll asks each provider for its offers; market says whether any is a market (a
// provider that failed to quote counts as one: placement must wait for it, not launch as
// if none were).
func quoteAll(ctx context.Context, ps []replicas.Provider, service string, sp *spec.Service) (quotes []replicas.Quote, market bool, problems []string) {
	for _, p := range ps {
		qs, err := p.Quote(ctx, service, sp)
		if err != nil {
			market = true
			problems = append(problems, err.Error())
			continue
		}
		market = market || len(qs) > 0
		// A provider quotes one node; a replica of num_nodes nodes is billed for all of
		// them, and placement ranks offers by what the whole group costs.
		if n := sp.NumNodes; n > 1 {
			for i := range qs {
				qs[i].PricePerHour *= float64(n)
			}
		}
		quotes = append(quotes, qs...)
	}
	return quotes, market, problems
}

// offersOf turns priced quotes into placement's offers, each ranked in the order the spec's
// resources give (ordered, or a list of accelerators), and says which were left out.
func offersOf(sp *spec.Service, quotes []replicas.Quote, problems []string) ([]scaling.Offer, []string) {
	offers := make([]scaling.Offer, 0, len(quotes))
	for _, q := range quotes {
		if q.Unpriced != "" {
			problems = append(problems, "left out for want of a price: "+q.Unpriced)
			continue
		}
		offers = append(offers, scaling.Offer{Provider: q.Provider, Region: q.Region, Zone: q.Zone, Capacity: q.Capacity, PricePerHour: q.PricePerHour,
			InstanceType: q.InstanceType, Accelerator: q.Accelerator, AcceleratorCount: q.AcceleratorCount, PriceSource: q.PriceSource,
			Preference: sp.Resources.Preference(q.Provider, q.Region, q.Zone, q.InstanceType, q.Accelerator, q.AcceleratorCount)})
	}
	return offers, problems
}

// Preview is what a service would launch first, and at what price, from the providers'
// live quotes (serve up's confirmation on a paid provider).
type Preview struct {
	// Market is false where no provider quotes (the local machine): the replicas take
	// arbiter.local's labels and price.
	Market      bool   `json:"market"`
	MinReplicas int    `json:"min_replicas"`
	MaxReplicas int    `json:"max_replicas"`
	Reason      string `json:"reason,omitempty"`
	// Launches are the placer's own plan, each offer with its rule.
	Launches []scaling.Launch `json:"launches,omitempty"`
	// Offers counts the priced offers placement chose among.
	Offers   int      `json:"offers"`
	Problems []string `json:"problems,omitempty"`
}

// Preview quotes a spec as the control plane would place its first replicas (min_replicas,
// at least one), without launching anything.
func (c *Controller) Preview(ctx context.Context, name, text string, vars Vars) (*Preview, error) {
	sp, err := c.parseSpec(name, text, vars)
	if err != nil {
		return nil, err
	}
	rp := sp.Service.ReplicaPolicy
	pv := &Preview{MinReplicas: rp.MinReplicas, MaxReplicas: rp.MaxReplicas}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	quotes, market, problems := quoteAll(ctx, c.providersFor(sp), name, sp)
	pv.Market = market
	if !market {
		return pv, nil
	}
	offers, problems := offersOf(sp, quotes, problems)
	mix, what := sizingMix(sp, nil, 0)
	if note := sustain(sp, mix, what, offers); note != "" {
		problems = append(problems, note)
	}
	pv.Offers, pv.Problems = len(offers), problems
	pl, err := scaling.NewPlacer(scaling.PlacementFromSpec(sp, c.cfg.ZoneCooldown))
	if err != nil {
		return nil, fmt.Errorf("%w: placement: %v", errBadRequest, err)
	}
	plan := pl.Plan(c.cfg.Now(), max(rp.MinReplicas, 1), nil, offers)
	pv.Reason, pv.Launches = plan.Reason, plan.Launch
	return pv, nil
}
