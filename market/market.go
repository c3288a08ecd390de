// Package market is the outside world's GPU capacity and prices as real data describes
// them: catalog quotes for a service's resources (pricing), and a spot trace (traces) saying
// where spot capacity exists over time, its zones mapped onto the catalog's. It is pure:
// time is an offset into the trace, so the simulator runs it in virtual time and the
// control plane's sim provider in (scaled) wall-clock time.
package market

import (
	"errors"
	"fmt"
	"math"
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
	// Reading is how a trace's values limit spot capacity (default ReadAvailability).
	Reading Reading
}

// Reading is how a spot trace's values say how much spot capacity a zone has.
type Reading string

const (
	// ReadAvailability reads a value > 0 as "spot can be had here", without limit: the
	// availability bit a 1-node trace records (a probe got one instance).
	ReadAvailability Reading = "availability"
	// ReadCount reads a value as what its source documents it to be: the number of spot
	// instances obtainable (availability traces) or running (preemption traces) in the
	// zone, so no more spot replicas than that run there, and a fall from n to m takes
	// back all but m of them.
	ReadCount Reading = "count"
)

// ParseReading accepts the names of the two readings.
func ParseReading(s string) (Reading, error) {
	switch r := Reading(s); r {
	case ReadAvailability, ReadCount:
		return r, nil
	case "":
		return ReadAvailability, nil
	}
	return "", fmt.Errorf("market: capacity reading %q: want %q or %q", s, ReadAvailability, ReadCount)
}

// Market answers where and at what price a replica can be bought at a time t.
type Market struct {
	catalog *pricing.Catalog
	res     spec.Resources
	start   time.Time
	spot    *traces.SpotTrace
	offset  time.Duration
	reading Reading
	// zoneOf maps a catalog place (provider/region/zone) that a trace zone drives to its
	// catalog zone; zonePlaces lists each catalog zone's places, which share its capacity.
	zoneOf     map[string]string
	zonePlaces map[string][]string
	// drivers maps a catalog zone to the trace zones that drive it (sorted; more than one
	// where a catalog has fewer zones than the trace): their values add up.
	drivers map[string][]string
	// byTrace lists the catalog zones each trace zone drives.
	byTrace map[string][]string
	mapping []traces.ZoneMapping

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
	reading, err := ParseReading(string(cfg.Reading))
	if err != nil {
		return nil, err
	}
	m := &Market{catalog: cfg.Catalog, res: cfg.Resources, start: cfg.Start, spot: cfg.Spot, offset: cfg.Offset, reading: reading,
		zoneOf: map[string]string{}, drivers: map[string][]string{}, byTrace: map[string][]string{}}
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
	m.zonePlaces = byZone
	if len(zones) > 0 {
		if m.mapping, err = m.spot.ExplainZones(zones); err != nil {
			return nil, fmt.Errorf("market: map spot trace zones: %w", err)
		}
		for _, zm := range m.mapping { // sorted by trace zone, so drivers are too
			m.byTrace[zm.Trace] = append(m.byTrace[zm.Trace], zm.Catalog)
			m.drivers[zm.Catalog] = append(m.drivers[zm.Catalog], zm.Trace)
			for _, p := range byZone[zm.Catalog] {
				m.zoneOf[p] = zm.Catalog
			}
		}
	}
	m.offers = m.convert(quotes)
	return m, nil
}

// Mapping is how the trace's zones were mapped onto the catalog's, each with its rule.
func (m *Market) Mapping() []traces.ZoneMapping { return m.mapping }

// Reading is how the market reads the trace's values.
func (m *Market) Reading() Reading { return m.reading }

// convert keeps on-demand offers and the spot offers some trace zone drives.
func (m *Market) convert(quotes []pricing.Offer) []scaling.Offer {
	var out []scaling.Offer
	for _, o := range quotes {
		if o.Capacity == fleet.Spot {
			if _, ok := m.zoneOf[Place(o.Provider, o.Region, o.Zone)]; !ok {
				continue
			}
		}
		out = append(out, scaling.Offer{Provider: o.Provider, Region: o.Region, Zone: o.Zone, InstanceType: o.InstanceType,
			Capacity: o.Capacity, PricePerHour: o.PricePerHour, Accelerator: o.Accelerator, AcceleratorCount: o.AcceleratorCount})
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

// SpotCapacity reports whether a spot replica can be obtained at the place at t, were
// none running there.
func (m *Market) SpotCapacity(p string, t time.Duration) bool { return m.SpotLimit(p, t) > 0 }

// SpotLimit is how many spot replicas the place's domain (its catalog zone: every
// instance type and provider quoted there) can hold at t: the sum of its trace zones'
// values when the market reads counts, unlimited (math.MaxInt) where any is > 0 when it
// reads availability, 0 where the trace says nothing.
func (m *Market) SpotLimit(p string, t time.Duration) int {
	cz, ok := m.zoneOf[p]
	if !ok {
		return 0
	}
	n, any := m.driven(m.drivers[cz], "", 0, m.offset+t)
	if m.reading == ReadAvailability && any {
		return math.MaxInt
	}
	return n
}

// Domain lists the places that share p's spot capacity (p's catalog zone).
func (m *Market) Domain(p string) []string {
	if cz, ok := m.zoneOf[p]; ok {
		return m.zonePlaces[cz]
	}
	return nil
}

// driven sums the trace zones' values at trace time at, with zone except's value taken as
// exceptN instead (the value an event has just changed it to); any says one is > 0.
func (m *Market) driven(zones []string, except string, exceptN int, at time.Duration) (n int, any bool) {
	for _, tz := range zones {
		v, ok := m.spot.Available(tz, at)
		if tz == except {
			v, ok = exceptN, true
		}
		if ok && v > 0 {
			n += v
			any = true
		}
	}
	return n, any
}

// Drop is a fall in a catalog zone's spot capacity: at At the share Share of the spot
// replicas in its places are gone (the availability reading), or all but Remaining (the
// count reading).
type Drop struct {
	At     time.Duration
	Zone   string   // the trace zone whose fall it is
	Places []string // the catalog places that lose capacity
	Share  float64
	// Remaining is the domain's capacity after the fall.
	Remaining int
	// Notice is how long before At the places' provider warns (Notice).
	Notice time.Duration
}

// Drops lists the capacity falls in [from, to), in time order.
func (m *Market) Drops(from, to time.Duration) []Drop {
	var out []Drop
	for _, e := range m.spot.Events(m.offset+from, m.offset+to) {
		if e.Kind != traces.KindPreempted && e.Kind != traces.KindUnavailable {
			continue
		}
		for _, cz := range m.byTrace[e.Zone] {
			places := m.zonePlaces[cz]
			if len(places) == 0 {
				continue
			}
			before, _ := m.driven(m.drivers[cz], e.Zone, e.Count+e.Delta, e.At)
			after, _ := m.driven(m.drivers[cz], e.Zone, e.Count, e.At)
			if after >= before {
				continue
			}
			share := float64(before-after) / float64(before)
			provider, _, _ := strings.Cut(places[0], "/")
			out = append(out, Drop{At: e.At - m.offset, Zone: e.Zone, Places: places, Share: share, Remaining: after, Notice: Notice(provider)})
		}
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
