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
//     AWS's AZ-id prefix (us-east-1 → use1, ap-northeast-2 → apse2) and GCP
//     zone names (us-central1-a → us-central1).
//  3. A zone whose region the catalog lacks takes, in the same manner, the
//     catalog zones of the same country (AWS "us-…" and GCP "us…" alike), or
//     failing that of the same continent (see Geography): an AWS us-east-1
//     trace drives a GCP us-central1 price, never an Asian one.
//  4. Only a zone with no catalog zone on its continent, or whose name says
//     nothing of where it is (UnknownZone), takes the whole catalog. Such a
//     mapping keeps the number of distinct failure domains but not their
//     geography, and ZoneMapping.Rule says so.
//
// Catalog entries are deduplicated and empty ones ignored, so a catalog
// column with one row per instance type can be passed as is. The result
// depends only on the two sets of names, not on their order.
func (t *SpotTrace) MapZones(catalogZones []string) (map[string]string, error) {
	ms, err := t.ExplainZones(catalogZones)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(ms))
	for _, m := range ms {
		out[m.Trace] = m.Catalog
	}
	return out, nil
}

// ZoneMapping is one trace zone's catalog zone and the rule of MapZones that chose it.
type ZoneMapping struct {
	Trace, Catalog string
	// Rule: "same zone", "same region", "same country", "same continent", or
	// "anywhere (…)" when rule 4 had to cross continents.
	Rule string
}

func (m ZoneMapping) String() string { return m.Trace + " → " + m.Catalog + " (" + m.Rule + ")" }

// ExplainZones is MapZones with the rule behind each choice, sorted by trace zone: what a
// simulation prints so that nobody reads a result without knowing whose prices drove it.
func (t *SpotTrace) ExplainZones(catalogZones []string) ([]ZoneMapping, error) {
	return mapZones(t.Zones, catalogZones)
}

func mapZones(traceZones, catalogZones []string) ([]ZoneMapping, error) {
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

	out := make(map[string]ZoneMapping, len(zones))
	taken := make(map[string]bool)
	var pending []string
	for _, z := range zones {
		if _, ok := slices.BinarySearch(catalog, z); ok {
			out[z] = ZoneMapping{Trace: z, Catalog: z, Rule: "same zone"}
			taken[z] = true
		} else {
			pending = append(pending, z)
		}
	}
	// Each wider tier takes the zones the narrower one left homeless; the last takes all.
	tiers := []struct {
		rule string
		key  func(string) string
	}{
		{"same region", regionKey},
		{"same country", countryKey},
		{"same continent", Geography},
		{"anywhere (no catalog zone on its continent)", func(string) string { return "anywhere" }},
	}
	for _, tier := range tiers {
		pending = assignByKey(out, taken, pending, catalog, tier.rule, tier.key)
	}
	ms := make([]ZoneMapping, 0, len(out))
	for _, z := range zones {
		ms = append(ms, out[z])
	}
	return ms, nil
}

// assignByKey maps the zones whose key (region, country, continent) some catalog zone
// shares onto those catalog zones, and returns the zones left without one.
func assignByKey(out map[string]ZoneMapping, taken map[string]bool, zones, catalog []string, rule string, key func(string) string) []string {
	byKey := make(map[string][]string)
	for _, c := range catalog {
		if k := key(c); k != "" {
			byKey[k] = append(byKey[k], c)
		}
	}
	var homeless, keys []string
	pendingByKey := make(map[string][]string)
	for _, z := range zones {
		k := key(z)
		if k == "" || len(byKey[k]) == 0 {
			homeless = append(homeless, z)
			continue
		}
		if pendingByKey[k] == nil {
			keys = append(keys, k)
		}
		pendingByKey[k] = append(pendingByKey[k], z)
	}
	slices.Sort(keys)
	for _, k := range keys {
		assignRoundRobin(out, taken, pendingByKey[k], byKey[k], rule)
	}
	return homeless
}

// assignRoundRobin maps zones (sorted) onto candidates (sorted), untaken
// candidates first so that distinct trace zones stay distinct while they can.
func assignRoundRobin(out map[string]ZoneMapping, taken map[string]bool, zones, candidates []string, rule string) {
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
		out[z] = ZoneMapping{Trace: z, Catalog: c, Rule: rule}
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

// countryKey is the country an AWS AZ name or id or a GCP zone is in, where its name says:
// the two-letter prefix both clouds share for the United States ("us-east-1a", "use1-az4",
// "us-central1-a"), or the whole prefix elsewhere ("eu", "europe"), which Geography then
// groups by continent. "" when the name is neither.
func countryKey(zone string) string {
	if regionKey(zone) == "" {
		return ""
	}
	if strings.HasPrefix(zone, "us") {
		return "us"
	}
	return ""
}

// Geography is the continent a zone name of AWS (AZ name or id) or GCP is on: "north
// america", "south america", "europe", "asia pacific", "middle east", "africa"; "" when
// the name says nothing (UnknownZone) or the prefix is not one of theirs.
func Geography(zone string) string {
	if regionKey(zone) == "" {
		return ""
	}
	prefix := zone
	if i := strings.IndexFunc(zone, func(r rune) bool { return r == '-' || (r >= '0' && r <= '9') }); i > 0 {
		prefix = zone[:i]
	}
	// AWS AZ ids glue the direction to the country (use1, apne2, euc1): two letters name it.
	if awsAZID.MatchString(zone) && len(prefix) > 2 {
		prefix = prefix[:2]
	}
	switch prefix {
	case "us", "ca", "mx", "northamerica":
		return "north america"
	case "sa", "southamerica":
		return "south america"
	case "eu", "europe":
		return "europe"
	case "ap", "asia", "australia":
		return "asia pacific"
	case "me", "il":
		return "middle east"
	case "af", "africa":
		return "africa"
	}
	return ""
}
