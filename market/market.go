// Package market is the outside world's GPU capacity and prices as real data describes
// them: catalog quotes for a service's resources (pricing), and a spot trace (traces) saying
// where spot capacity exists over time, its zones mapped onto the catalog's. It is pure:
// time is an offset into the trace, so the simulator runs it in virtual time and the
// control plane's sim provider in (scaled) wall-clock time.
package market

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/spec"
	"github.com/arbiter-serve/arbiter/traces"
)

// Config is what a market is built from.
type Config struct {
	Catalog   *pricing.Catalog
	Resources spec.Resources
	// Start is the wall-clock time of t=0, at which prices are quoted (and re-quoted hourly).
	Start time.Time
	Spot  *traces.SpotTrace
	// Offset is where in the spot trace t=0 falls.
	Offset time.Duration
}

// Market answers where and at what price a replica can be bought at a time t.
type Market struct {
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

// Place names a failure domain: provider/region/zone.
func Place(provider, region, zone string) string { return provider + "/" + region + "/" + zone }

// New builds a market: quotes the resources at Start and maps the trace's zones onto the
// zones that quote spot.
func New(cfg Config) (*Market, error) {
	if cfg.Catalog == nil || cfg.Spot == nil {
		return nil, errors.New("market: a catalog and a spot trace are required")
	}
	m := &Market{catalog: cfg.Catalog, res: cfg.Resources, start: cfg.Start, spot: cfg.Spot, offset: cfg.Offset,
		traceZone: map[string]string{}, byTrace: map[string][]string{}}
	quotes, err := m.catalog.Quote(m.res, m.start)
	if err != nil {
		return nil, fmt.Errorf("market: quote at %s: %w", m.start.Format(time.DateOnly), err)
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
		p := Place(o.Provider, o.Region, o.Zone)
		if !slices.Contains(byZone[z], p) {
			byZone[z] = append(byZone[z], p)
		}
		zones = append(zones, z)
	}
	if len(zones) > 0 {
		mapping, err := m.spot.MapZones(zones)
		if err != nil {
			return nil, fmt.Errorf("market: map spot trace zones: %w", err)
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
func (m *Market) convert(quotes []pricing.Offer) []scaling.Offer {
	var out []scaling.Offer
	for _, o := range quotes {
		if o.Capacity == fleet.Spot {
			if _, ok := m.traceZone[Place(o.Provider, o.Region, o.Zone)]; !ok {
				continue
			}
		}
		out = append(out, scaling.Offer{Provider: o.Provider, Region: o.Region, Zone: o.Zone, InstanceType: o.InstanceType,
			Capacity: o.Capacity, PricePerHour: o.PricePerHour})
	}
	return out
}

// Offers returns the quotes at t, refreshed from the catalog once an hour of t. Not safe
// for concurrent use.
func (m *Market) Offers(t time.Duration) []scaling.Offer {
	if t-m.quotedAt >= time.Hour {
		m.quotedAt = t.Truncate(time.Hour)
		if q, err := m.catalog.Quote(m.res, m.start.Add(m.quotedAt)); err == nil {
			m.offers = m.convert(q)
		}
	}
	return m.offers
}

// Length is how much market time the spot trace covers from its offset: past it the trace
// says nothing (no capacity, no drops).
func (m *Market) Length() time.Duration {
	var end time.Duration
	for tz := range m.byTrace {
		end = max(end, m.spot.ZoneEnd(tz))
	}
	return max(end-m.offset, 0)
}

// SpotCapacity reports whether a spot replica can be obtained at the place at t.
func (m *Market) SpotCapacity(p string, t time.Duration) bool {
	tz, ok := m.traceZone[p]
	if !ok {
		return false
	}
	n, ok := m.spot.Available(tz, m.offset+t)
	return ok && n > 0
}

// Drop is a fall in a trace zone's capacity: at At the share Share of the spot replicas
// in the places it drives are gone.
type Drop struct {
	At     time.Duration
	Zone   string   // trace zone
	Places []string // the catalog places it drives
	Share  float64
	// Notice is how long before At the places' provider warns (Notice).
	Notice time.Duration
}

// Drops lists the capacity falls in [from, to), in time order.
func (m *Market) Drops(from, to time.Duration) []Drop {
	var out []Drop
	for _, e := range m.spot.Events(m.offset+from, m.offset+to) {
		if (e.Kind != traces.KindPreempted && e.Kind != traces.KindUnavailable) || len(m.byTrace[e.Zone]) == 0 {
			continue
		}
		share := 1.0
		if before := e.Count + e.Delta; e.Count > 0 {
			share = float64(e.Delta) / float64(before)
		}
		provider, _, _ := strings.Cut(m.byTrace[e.Zone][0], "/")
		out = append(out, Drop{At: e.At - m.offset, Zone: e.Zone, Places: m.byTrace[e.Zone], Share: share, Notice: Notice(provider)})
	}
	return out
}

// Notice is how long before a spot VM is taken back its provider says so
// (shared/data/README.md).
func Notice(provider string) time.Duration {
	if provider == "aws" {
		return 2 * time.Minute
	}
	return 30 * time.Second // GCP; Azure's minimum; others unknown, assumed like GCP
}
