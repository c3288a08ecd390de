package pricing

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// gcpPart is one piece of a GCP price: a host VM without its GPUs, the GPUs alone (both
// per zone, from anycloud), or a whole VM (per region, from the billing-catalog history).
type gcpPart struct {
	region        string
	name          string // the GPU's name, for anycloud's GPU-only rows
	od, spot      *series
	vcpus, memGiB float64
}

type gcpGPUKey struct {
	accelerator string // lower-cased
	count       int
	zone        string
}

// gcpFamilyGPU says which GPU a GCP machine family carries (GCP's machine-family
// documentation). The catalogs need it because anycloud's host-VM rows name no GPU, and
// the history labels early a2-ultragpu versions "a100" though the family is A100 80GB.
// Names are the catalogs' spellings; RTX-PRO-6000 is spec's spelling of the G4 family's
// RTX PRO 6000 ("rtx6000" in the history).
func gcpFamilyGPU(family string) string {
	switch family {
	case "a2-highgpu", "a2-megagpu":
		return "A100"
	case "a2-ultragpu":
		return "A100-80GB"
	case "a3-highgpu", "a3-edgegpu":
		return "H100"
	case "a3-megagpu":
		return "H100-MEGA"
	case "a3-ultragpu":
		return "H200"
	case "a4-highgpu":
		return "B200"
	case "g2-standard":
		return "L4"
	case "g4-standard":
		return "RTX-PRO-6000"
	}
	return ""
}

// gcpStandardGPUs gives the GPU count of g2/g4 machine types, whose names count vCPUs,
// not GPUs; the counts are the history file's gpu_count for each type (a test checks).
func gcpStandardGPUs(machine string) (float64, bool) {
	switch machine {
	case "g2-standard-4", "g2-standard-8", "g2-standard-12", "g2-standard-16", "g2-standard-32", "g4-standard-48":
		return 1, true
	case "g2-standard-24", "g4-standard-96":
		return 2, true
	case "g2-standard-48", "g4-standard-192":
		return 4, true
	case "g2-standard-96", "g4-standard-384":
		return 8, true
	case "g4-standard-6":
		return 0.125, true
	case "g4-standard-12":
		return 0.25, true
	case "g4-standard-24":
		return 0.5, true
	}
	return 0, false
}

// gcpMachineGPUs says which GPUs, and how many, a GCP machine type carries: the family is
// the first two parts of the name; a2/a3/a4 names end in the GPU count (a3-highgpu-8g,
// a3-ultragpu-8g-nolssd).
func gcpMachineGPUs(machine string) (accelerator string, count float64, ok bool) {
	parts := strings.Split(strings.TrimSuffix(machine, "-nolssd"), "-")
	if len(parts) != 3 {
		return "", 0, false
	}
	acc := gcpFamilyGPU(parts[0] + "-" + parts[1])
	if acc == "" {
		return "", 0, false
	}
	if n, ok := gcpStandardGPUs(machine); ok {
		return acc, n, true
	}
	n, err := strconv.Atoi(strings.TrimSuffix(parts[2], "g"))
	if err != nil || !strings.HasSuffix(parts[2], "g") || n < 1 {
		return "", 0, false
	}
	return acc, float64(n), true
}

// assembleGCP builds GCP GPU-VM lines once every file is read. For a machine type in a
// region:
//   - the history's whole-VM price wins wherever the history lists the machine at the time
//     asked: it is GCP's list price (a3-highgpu-8g us-central1 on-demand 88.49 USD/h, as
//     GCP publishes), while anycloud's GPU rows in some regions carry a different SKU
//     (the same machine sums to 43.07 there, yet 87.83 in us-east4);
//   - elsewhere, anycloud's host-VM price plus its price for the same GPUs in that zone,
//     which is how SkyPilot prices these families.
//
// The history is per region; its price is spread over the zones where anycloud lists the
// machine type (GCP prices a region's zones alike), or kept region-level (no zone) where
// anycloud lists none.
func (b *builder) assembleGCP() {
	type mr struct{ machine, region string }
	zones := map[mr][]string{}
	for k, h := range b.gcpHost {
		key := mr{k[0], h.region}
		zones[key] = append(zones[key], k[1])
	}
	for k := range b.gcpHist {
		key := mr{k[0], k[1]}
		if _, ok := zones[key]; !ok {
			zones[key] = nil
		}
	}
	composedGPUs := map[string]bool{}
	for key, zs := range zones {
		acc, count, ok := gcpMachineGPUs(key.machine)
		if !ok {
			continue // a family gcpFamilyGPU does not know; a test keeps the table complete
		}
		hist := b.gcpHist[[2]string{key.machine, key.region}]
		composedGPUs[lowerName(acc)] = true
		n := int(count)
		if count < 1 || count != math.Trunc(count) {
			b.note(acc, "gcp", fmt.Sprintf("%s carries a fraction of a GPU (%g)", key.machine, count))
			continue
		}
		slices.Sort(zs)
		if len(zs) == 0 {
			zs = []string{""}
		}
		for _, z := range zs {
			l := line{provider: "gcp", region: key.region, zone: z, instanceType: key.machine, accelerator: acc, count: n}
			var od, spot []pricer // in order of precedence
			if hist != nil {
				od, spot = append(od, hist.od), append(spot, hist.spot)
				l.vcpus, l.memGiB = hist.vcpus, hist.memGiB
			}
			host := b.gcpHost[[2]string{key.machine, z}]
			gpus := b.gcpGPU[gcpGPUKey{lowerName(acc), n, z}]
			if host != nil && gpus != nil {
				src := host.od.source + " (host VM + GPUs)"
				hod, hspot, god, gspot := host.od, host.spot, gpus.od, gpus.spot
				if hist != nil {
					// Where the history covers the machine, anycloud's 2026 prices stand in
					// only from anycloud's own first observation on, not back over years the
					// history shows the machine absent (a3-highgpu-8g before 2024-05).
					hod, hspot, god, gspot = hod.noBackfill(), hspot.noBackfill(), god.noBackfill(), gspot.noBackfill()
				}
				od = append(od, sum{hod, god, src})
				spot = append(spot, sum{hspot, gspot, src})
				if l.vcpus == 0 {
					l.vcpus, l.memGiB = host.vcpus, host.memGiB
				}
			}
			if l.vcpus == 0 {
				a := b.gcpAttrs[key.machine]
				l.vcpus, l.memGiB = a[0], a[1]
			}
			b.addSeries(l, chain(od), chain(spot))
		}
	}
	for k, g := range b.gcpGPU {
		if !composedGPUs[k.accelerator] {
			b.note(g.name, "gcp", fmt.Sprintf("gcp lists %s only as a price for GPUs attached to an N1 VM; the N1 VM's own price is not in these catalogs", g.name))
		}
	}
}

// chain joins pricers by precedence; nil when there are none.
func chain(ps []pricer) pricer {
	switch len(ps) {
	case 0:
		return nil
	case 1:
		return ps[0]
	}
	return overlay{ps[0], chain(ps[1:])}
}

func lowerName(s string) string { return strings.ToLower(s) }

// wholeNumber reads a catalog count such as "8", "8.0"; false for fractions and junk.
func wholeNumber(s string) (int, bool) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || v < 1 || v != math.Trunc(v) || v > 1<<16 {
		return 0, false
	}
	return int(v), true
}
