package traces

import (
	"errors"
	"regexp"
	"slices"
	"strings"
)

// MapZones assigns every trace zone a zone of a price catalog, so that a
// simulation can price the capacity a trace zone offers. The rule, in order:
//
//  1. A trace zone whose exact name is in the catalog maps to itself.
//  2. Otherwise it maps to a catalog zone of the same region. AWS catalogs
//     list AZ ids ("use1-az4") while the SkyPilot traces list AZ names
//     ("us-east-1a"); AWS maps names to ids differently in every account and
//     the traces do not say which account recorded them, so no mapping within
//     a region is right. The assignment is only stable: the region's
//     remaining trace zones, sorted, take the region's catalog zones, sorted
//     with those not yet taken first, round robin. Regions are compared via
//     AWS's AZ-id prefix (us-east-1 → use1, ap-northeast-2 → apne2) and GCP
//     zone names (us-central1-a → us-central1).
//  3. Zones with no catalog zone in their region (UnknownZone, a region the
//     catalog lacks) take the whole catalog, sorted with untaken zones first,
//     round robin. Such a mapping keeps the number of distinct failure
//     domains but not their geography.
//
// Catalog entries are deduplicated and empty ones ignored, so a catalog
// column with one row per instance type can be passed as is. The result
// depends only on the two sets of names, not on their order.
func (t *SpotTrace) MapZones(catalogZones []string) (map[string]string, error) {
	return mapZones(t.Zones, catalogZones)
}

func mapZones(traceZones, catalogZones []string) (map[string]string, error) {
	catalog := make([]string, 0, len(catalogZones))
	for _, z := range catalogZones {
		if z != "" {
			catalog = append(catalog, z)
		}
	}
	slices.Sort(catalog)
	catalog = slices.Compact(catalog)
	if len(catalog) == 0 {
		return nil, errors.New("traces: MapZones: empty catalog zone list")
	}
	zones := slices.Clone(traceZones)
	slices.Sort(zones)
	zones = slices.Compact(zones)

	out := make(map[string]string, len(zones))
	taken := make(map[string]bool)
	var pending []string
	for _, z := range zones {
		if _, ok := slices.BinarySearch(catalog, z); ok {
			out[z] = z
			taken[z] = true
		} else {
			pending = append(pending, z)
		}
	}

	byRegion := make(map[string][]string)
	for _, c := range catalog {
		if r := regionKey(c); r != "" {
			byRegion[r] = append(byRegion[r], c)
		}
	}
	var homeless []string
	regionOrder := []string{}
	pendingByRegion := make(map[string][]string)
	for _, z := range pending {
		r := regionKey(z)
		if r == "" || len(byRegion[r]) == 0 {
			homeless = append(homeless, z)
			continue
		}
		if pendingByRegion[r] == nil {
			regionOrder = append(regionOrder, r)
		}
		pendingByRegion[r] = append(pendingByRegion[r], z)
	}
	slices.Sort(regionOrder)
	for _, r := range regionOrder {
		assignRoundRobin(out, taken, pendingByRegion[r], byRegion[r])
	}
	assignRoundRobin(out, taken, homeless, catalog)
	return out, nil
}

// assignRoundRobin maps zones (sorted) onto candidates (sorted), untaken
// candidates first so that distinct trace zones stay distinct while they can.
func assignRoundRobin(out map[string]string, taken map[string]bool, zones, candidates []string) {
	if len(zones) == 0 {
		return
	}
	order := make([]string, 0, len(candidates))
	for _, c := range candidates {
		if !taken[c] {
			order = append(order, c)
		}
	}
	for _, c := range candidates {
		if taken[c] {
			order = append(order, c)
		}
	}
	for i, z := range zones {
		c := order[i%len(order)]
		out[z] = c
		taken[c] = true
	}
}

var (
	// awsAZName: us-east-1a, ap-northeast-2c.
	awsAZName = regexp.MustCompile(`^([a-z]{2}(?:-[a-z]+)+-[0-9]+)[a-z]$`)
	// awsAZID: use1-az4, apne2-az1.
	awsAZID = regexp.MustCompile(`^([a-z]+[0-9]+)-az[0-9]+$`)
	// gcpZone: us-central1-a, europe-west4-b.
	gcpZone = regexp.MustCompile(`^([a-z]+-[a-z]+[0-9]+)-[a-z]$`)
)

// awsDirection abbreviates a middle word of an AWS region name the way AZ
// ids do (eu-central-1 → euc1, ap-southeast-2 → apse2).
func awsDirection(w string) (string, bool) {
	switch w {
	case "east", "west", "north", "south", "central":
		return w[:1], true
	case "northeast", "northwest", "southeast", "southwest":
		return w[:1] + w[5:6], true
	}
	return "", false
}

// regionKey names the region of an AWS AZ name or id or a GCP zone, so that
// the two AWS spellings compare equal; "" when the name is neither.
func regionKey(zone string) string {
	if m := awsAZID.FindStringSubmatch(zone); m != nil {
		return "aws:" + m[1]
	}
	if m := awsAZName.FindStringSubmatch(zone); m != nil {
		parts := strings.Split(m[1], "-")
		code := parts[0]
		for _, w := range parts[1 : len(parts)-1] {
			a, ok := awsDirection(w)
			if !ok {
				return "" // us-gov-west-1 and the like: no known id prefix
			}
			code += a
		}
		return "aws:" + code + parts[len(parts)-1]
	}
	if m := gcpZone.FindStringSubmatch(zone); m != nil {
		return "gcp:" + m[1]
	}
	return ""
}
