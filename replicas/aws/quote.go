package aws

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/spec"
)

// Where a quote's price came from, for decision logs and serve status.
const (
	SourceSpotPriceHistory = "ec2:DescribeSpotPriceHistory"
	sourceCatalog          = "catalog:"
)

// zoneMap is a region's zones that are available to the account, by AZ id and by name.
type zoneMap struct {
	at          time.Time
	idByName    map[string]string
	available   map[string]bool // AZ ids
	unavailable error           // why the region could not be asked
}

// zonesTTL: zones come and go rarely (an opt-in, an outage).
const zonesTTL = 10 * time.Minute

func (p *Provider) zoneMap(ctx context.Context, region string, c *ec2.Client) (zoneMap, error) {
	p.mu.Lock()
	zm, ok := p.zones[region]
	p.mu.Unlock()
	if ok && p.cfg.Now().Sub(zm.at) < zonesTTL {
		return zm, nil
	}
	out, err := c.DescribeAvailabilityZones(ctx, &ec2.DescribeAvailabilityZonesInput{Filters: []types.Filter{
		{Name: aws.String("zone-type"), Values: []string{"availability-zone"}},
	}})
	if err != nil {
		return zoneMap{}, classify(err, "aws: zones of "+region)
	}
	zm = zoneMap{at: p.cfg.Now(), idByName: map[string]string{}, available: map[string]bool{}}
	for _, z := range out.AvailabilityZones {
		id, name := aws.ToString(z.ZoneId), aws.ToString(z.ZoneName)
		zm.idByName[name] = id
		if z.State == types.AvailabilityZoneStateAvailable {
			zm.available[id] = true
		}
	}
	p.mu.Lock()
	p.zones[region] = zm
	p.mu.Unlock()
	return zm, nil
}

// spotPrices is a region's current spot prices, by instance type and AZ id.
type spotPrices struct {
	at     time.Time
	types  []string
	prices map[string]float64 // type|zone id
}

func spotKey(instanceType, zoneID string) string { return instanceType + "|" + zoneID }

// spotPrices asks DescribeSpotPriceHistory for the latest price of each instance type in
// each zone of the region, cached for SpotPriceSeconds. A StartTime of now returns each
// zone's price in force now
// (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeSpotPriceHistory.html).
func (p *Provider) spotPrices(ctx context.Context, region string, c *ec2.Client, zm zoneMap, want []string) (spotPrices, error) {
	p.mu.Lock()
	sp, ok := p.spot[region]
	p.mu.Unlock()
	if ok && p.cfg.Now().Sub(sp.at) < seconds(p.cfg.SpotPriceSeconds) && containsAll(sp.types, want) {
		return sp, nil
	}
	now := p.cfg.Now()
	sp = spotPrices{at: now, types: want, prices: map[string]float64{}}
	stamp := map[string]time.Time{}
	pages := ec2.NewDescribeSpotPriceHistoryPaginator(c, &ec2.DescribeSpotPriceHistoryInput{
		InstanceTypes:       toInstanceTypes(want),
		ProductDescriptions: []string{"Linux/UNIX"},
		StartTime:           aws.Time(now),
	})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return spotPrices{}, classify(err, "aws: spot prices in "+region)
		}
		for _, h := range page.SpotPriceHistory {
			zone := cmp.Or(aws.ToString(h.AvailabilityZoneId), zm.idByName[aws.ToString(h.AvailabilityZone)])
			v, err := strconv.ParseFloat(aws.ToString(h.SpotPrice), 64)
			if zone == "" || err != nil || v <= 0 {
				continue
			}
			k := spotKey(string(h.InstanceType), zone)
			if t := aws.ToTime(h.Timestamp); t.After(stamp[k]) || stamp[k].IsZero() {
				sp.prices[k], stamp[k] = v, t
			}
		}
	}
	p.mu.Lock()
	p.spot[region] = sp
	p.mu.Unlock()
	return sp, nil
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

func toInstanceTypes(s []string) []types.InstanceType {
	out := make([]types.InstanceType, len(s))
	for i, v := range s {
		out[i] = types.InstanceType(v)
	}
	return out
}

// Quote implements replicas.Provider: the catalogs' AWS offers for the service's
// resources in the provider's regions and in the zones the account has, spot priced from
// DescribeSpotPriceHistory (the catalog's spot price is a snapshot; EC2's is now), on-demand
// from the catalogs (EC2 has no price API; the Pricing API's list prices are what the
// catalogs hold).
func (p *Provider) Quote(ctx context.Context, service string, sp *spec.Service) ([]replicas.Quote, error) {
	cat, err := p.catalog()
	if err != nil {
		return nil, fmt.Errorf("aws: price catalog: %w", err)
	}
	offers, err := cat.Quote(sp.Resources, time.Time{})
	if err != nil {
		return nil, fmt.Errorf("aws: %s: %w", service, err)
	}
	var out []replicas.Quote
	var errs []error
	for _, region := range p.cfg.Regions {
		var mine []int
		var spotTypes []string
		for i, o := range offers {
			if o.Provider != ProviderName || o.Region != region {
				continue
			}
			mine = append(mine, i)
			if o.Capacity == fleet.Spot && !slices.Contains(spotTypes, o.InstanceType) {
				spotTypes = append(spotTypes, o.InstanceType)
			}
		}
		if len(mine) == 0 {
			continue
		}
		c, err := p.client(region)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		zm, err := p.zoneMap(ctx, region, c)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var spot spotPrices
		if len(spotTypes) > 0 {
			if spot, err = p.spotPrices(ctx, region, c, zm, spotTypes); err != nil {
				// Spot is priced from EC2 or not offered: a catalog snapshot may be far off.
				errs = append(errs, err)
			}
		}
		for _, i := range mine {
			o := offers[i]
			if o.Zone != "" && !zm.available[o.Zone] {
				continue // not a zone this account has, or not available now
			}
			q := replicas.Quote{Provider: ProviderName, Region: region, Zone: o.Zone, Capacity: o.Capacity, PricePerHour: o.PricePerHour,
				Accelerator: o.Accelerator, AcceleratorCount: o.AcceleratorCount, InstanceType: o.InstanceType, PriceSource: sourceCatalog + o.Source}
			if o.Capacity == fleet.Spot {
				v, ok := spot.prices[spotKey(o.InstanceType, o.Zone)]
				if !ok {
					continue // no spot market for it there now
				}
				q.PricePerHour, q.PriceSource = v, SourceSpotPriceHistory
			}
			out = append(out, q)
		}
	}
	if len(out) == 0 {
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		return nil, fmt.Errorf("aws: no offer for %s's resources in %v (the catalogs' AWS offers are in other regions, or in zones this account does not have)", service, p.cfg.Regions)
	}
	for _, err := range errs {
		p.cfg.Log.Warn("aws: part of the quote is missing", "service", service, "err", err)
	}
	return out, nil
}
