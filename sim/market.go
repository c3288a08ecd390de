package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/spec"
	"github.com/arbiter-serve/arbiter/traces"
)

// market is the outside world's capacity and prices: catalog quotes for the service's
// resources, and a spot trace saying where spot capacity exists over time.
type market struct {
	catalog *pricing.Catalog
	res     spec.Resources
	start   time.Time
	spot    *traces.SpotTrace
	offset  time.Duration
	// traceZone maps a catalog place (provider/region/zone) to the trace zone that drives it.
	traceZone map[string]string
	// byTrace lists the catalog places each trace zone drives.
	byTrace map[string][]string

	quotedAt time.Duration
	offers   []scaling.Offer
}

func place(provider, region, zone string) string { return provider + "/" + region + "/" + zone }

func newMarket(in *Inputs) (*market, error) {
	m := &market{catalog: in.Catalog, res: in.Spec.Resources, start: in.Start, spot: in.Spot, offset: in.SpotOffset,
		traceZone: map[string]string{}, byTrace: map[string][]string{}}
	quotes, err := m.catalog.Quote(m.res, m.start)
	if err != nil {
		return nil, fmt.Errorf("sim: quote at %s: %w", m.start.Format(time.DateOnly), err)
	}
	// Spot offers quoted per zone are the failure domains the trace's zones map onto;
	// a region-level quote (no zone) is its own domain named by the region.
	var zones []string
	byZone := map[string][]string{}
	for _, o := range quotes {
		if o.Capacity != fleet.Spot {
			continue
		}
		z := o.Zone
		if z == "" {
			z = o.Region
		}
		p := place(o.Provider, o.Region, o.Zone)
		if !slices.Contains(byZone[z], p) {
			byZone[z] = append(byZone[z], p)
		}
		zones = append(zones, z)
	}
	if len(zones) > 0 {
		mapping, err := m.spot.MapZones(zones)
		if err != nil {
			return nil, fmt.Errorf("sim: map spot trace zones: %w", err)
		}
		for tz, cz := range mapping {
			for _, p := range byZone[cz] {
				m.traceZone[p] = tz
				m.byTrace[tz] = append(m.byTrace[tz], p)
			}
		}
	}
	m.offers = m.convert(quotes)
	return m, nil
}

// convert keeps on-demand offers and the spot offers some trace zone drives.
func (m *market) convert(quotes []pricing.Offer) []scaling.Offer {
	var out []scaling.Offer
	for _, o := range quotes {
		if o.Capacity == fleet.Spot {
			if _, ok := m.traceZone[place(o.Provider, o.Region, o.Zone)]; !ok {
				continue
			}
		}
		out = append(out, scaling.Offer{Provider: o.Provider, Region: o.Region, Zone: o.Zone, InstanceType: o.InstanceType,
			Capacity: o.Capacity, PricePerHour: o.PricePerHour})
	}
	return out
}

// Offers returns the quotes at t, refreshed from the catalog once a simulated hour.
func (m *market) Offers(t time.Duration) []scaling.Offer {
	if t-m.quotedAt >= time.Hour {
		m.quotedAt = t.Truncate(time.Hour)
		if q, err := m.catalog.Quote(m.res, m.start.Add(m.quotedAt)); err == nil {
			m.offers = m.convert(q)
		}
	}
	return m.offers
}

// spotCapacity reports whether a spot replica can be obtained at the place at t.
func (m *market) spotCapacity(p string, t time.Duration) bool {
	tz, ok := m.traceZone[p]
	if !ok {
		return false
	}
	n, ok := m.spot.Available(tz, m.offset+t)
	return ok && n > 0
}

// drop is a fall in a trace zone's capacity: at At the share Share of the service's spot
// replicas there are gone.
type drop struct {
	At    time.Duration
	Zone  string // trace zone
	Share float64
}

// drops lists the capacity falls in [0, d), in time order.
func (m *market) drops(d time.Duration) []drop {
	var out []drop
	for _, e := range m.spot.Events(m.offset, m.offset+d) {
		if (e.Kind != traces.KindPreempted && e.Kind != traces.KindUnavailable) || len(m.byTrace[e.Zone]) == 0 {
			continue
		}
		share := 1.0
		if before := e.Count + e.Delta; e.Count > 0 {
			share = float64(e.Delta) / float64(before)
		}
		out = append(out, drop{At: e.At - m.offset, Zone: e.Zone, Share: share})
	}
	return out
}

// notice is how long before a spot VM is taken back its provider says so.
func notice(provider string) time.Duration {
	if provider == "aws" {
		return 2 * time.Minute
	}
	return 30 * time.Second // GCP; Azure's minimum; others unknown, assumed like GCP
}
