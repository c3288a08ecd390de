package pricing

import (
	"cmp"
	"fmt"
	"io/fs"
	"slices"

	"github.com/arbiter-serve/arbiter/fleet"
)

// loadAWS reads SkyPilot's AWS vms.csv subset: one row per (instance type, AZ), the
// on-demand price of the region and the spot price of the AZ. The snapshot is undated
// (≈ Dec 2024 – Jun 2025 per its README), so its prices hold at every time unless a
// dated source overrides them (loadP5).
func loadAWS(fsys fs.FS, b *builder) error {
	recs, found, err := readCSV(fsys, fileAWS, []string{
		"InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB",
		"Price", "SpotPrice", "Region", "AvailabilityZone",
	})
	if err != nil || !found {
		return err
	}
	b.sources = append(b.sources, fileAWS)
	for _, r := range recs {
		acc := r.str("AcceleratorName")
		if acc == "" {
			continue
		}
		n, whole, err := r.wholeCount("AcceleratorCount")
		if err != nil {
			return err
		}
		if !whole {
			b.note(acc, "aws", fmt.Sprintf("%s carries a fraction of a GPU (%s)", r.str("InstanceType"), r.str("AcceleratorCount")))
			continue
		}
		vcpus, err := r.number("vCPUs")
		if err != nil {
			return err
		}
		mem, err := r.number("MemoryGiB")
		if err != nil {
			return err
		}
		l := line{
			provider: "aws", region: r.str("Region"), zone: r.str("AvailabilityZone"),
			instanceType: r.str("InstanceType"), accelerator: acc, count: n,
			vcpus: vcpus, memGiB: mem,
		}
		for _, p := range []struct {
			col string
			c   fleet.Capacity
		}{{"Price", fleet.OnDemand}, {"SpotPrice", fleet.Spot}} {
			usd, ok, err := r.price(p.col)
			if err != nil {
				return err
			}
			if ok {
				l.capacity, l.price = p.c, constant(fileAWS, usd)
				b.add(l)
			}
		}
	}
	return nil
}

// p5Region is where the p5 tracker prices: its script asks the AWS Price List API for
// US East (N. Virginia) (aws_p5_ondemand_history/README.md); the file has no region column.
const p5Region = "us-east-1"

// loadP5 replays the daily p5.48xlarge on-demand price over the AWS snapshot's price for
// the same instance type in us-east-1 (every AZ): from its first row on the history
// rules, before it the snapshot does. It prices nothing the AWS catalog does not list,
// because the file does not say which GPUs the instance has.
func loadP5(fsys fs.FS, b *builder) error {
	recs, found, err := readCSV(fsys, fileP5, []string{"timestamp", "instance", "price_usd"})
	if err != nil || !found {
		return err
	}
	b.sources = append(b.sources, fileP5)
	byType := map[string][]point{}
	for _, r := range recs {
		usd, ok, err := r.price("price_usd")
		if err != nil {
			return err
		}
		if !ok {
			continue // placeholder month starts and one failed run, per the README
		}
		at, err := r.when("timestamp")
		if err != nil {
			return err
		}
		byType[r.str("instance")] = append(byType[r.str("instance")], point{at: stampOf(at), usd: usd, st: priced})
	}
	for typ, pts := range byType {
		// Rows are written out of order near the top of the file.
		slices.SortStableFunc(pts, func(a, b point) int { return cmp.Compare(a.at, b.at) })
		// One point per change, so PricedSince says when the price took effect.
		pts = slices.CompactFunc(pts, func(a, b point) bool { return a.usd == b.usd })
		hist := &series{source: fileP5, pts: pts}
		for _, l := range b.lines {
			if l.provider == "aws" && l.region == p5Region && l.instanceType == typ && l.capacity == fleet.OnDemand {
				l.price = overlay{hist, l.price}
			}
		}
	}
	return nil
}

// loadAdvisor reads AWS's Spot Instance Advisor snapshot (Linux rows only: the catalogs'
// prices are Linux prices).
func loadAdvisor(fsys fs.FS, b *builder) error {
	recs, found, err := readCSV(fsys, fileAdvisor, []string{
		"region", "os", "instance_type", "savings_vs_ondemand_pct", "interruption_freq_label", "interruption_freq_upper_pct",
	})
	if err != nil || !found {
		return err
	}
	b.sources = append(b.sources, fileAdvisor)
	for _, r := range recs {
		if r.str("os") != "Linux" {
			continue
		}
		savings, err := r.signed("savings_vs_ondemand_pct")
		if err != nil {
			return err
		}
		upper, err := r.number("interruption_freq_upper_pct")
		if err != nil {
			return err
		}
		a := SpotAdvice{
			Region: r.str("region"), InstanceType: r.str("instance_type"),
			SavingsPct: savings, InterruptionFreq: r.str("interruption_freq_label"), InterruptionUpperPct: upper,
		}
		b.advice[[2]string{a.Region, a.InstanceType}] = a
	}
	return nil
}

// anyKey is a row's identity in the anycloud files (their README's key columns).
type anyKey struct {
	cloud, kind, instanceType, accelerator, count, region, zone string
}

// event is one change-log row reduced to what replay needs.
type event struct {
	at        stamp
	gone      bool
	od, spot  float64
	hasOD     bool
	hasSpot   bool
	vcpus     float64
	memGiB    float64
	goneFirst bool // sorts a disappearance before an appearance at the same time
}

// loadAnycloud reads the GCP/Azure/Lambda/Vast catalog. The change log holds the prices
// (replaying it to its end gives the snapshot exactly); the snapshot adds vCPUs and
// memory, which the log lacks, and stands alone as undated prices when the log is absent.
func loadAnycloud(fsys fs.FS, b *builder) error {
	keyCols := []string{"cloud", "row_kind", "InstanceType", "AcceleratorName", "AcceleratorCount", "Region", "AvailabilityZone", "Price", "SpotPrice"}
	snap, haveSnap, err := readCSV(fsys, fileAnySnapshot, slices.Concat(keyCols, []string{"vCPUs", "MemoryGiB"}))
	if err != nil {
		return err
	}
	logRecs, haveLog, err := readCSV(fsys, fileAnyLog, slices.Concat(keyCols, []string{"observed_at", "event"}))
	if err != nil {
		return err
	}
	if !haveSnap && !haveLog {
		return nil
	}
	keyOf := func(r record) anyKey {
		return anyKey{r.str("cloud"), r.str("row_kind"), r.str("InstanceType"), r.str("AcceleratorName"),
			r.str("AcceleratorCount"), r.str("Region"), r.str("AvailabilityZone")}
	}
	attrs := map[anyKey][2]float64{}
	if haveSnap {
		b.sources = append(b.sources, fileAnySnapshot)
		for _, r := range snap {
			v, err := r.number("vCPUs")
			if err != nil {
				return err
			}
			m, err := r.number("MemoryGiB")
			if err != nil {
				return err
			}
			attrs[keyOf(r)] = [2]float64{v, m}
		}
	}
	source, recs := fileAnySnapshot, snap
	if haveLog {
		b.sources = append(b.sources, fileAnyLog)
		source, recs = fileAnyLog, logRecs
	}
	events := map[anyKey][]event{}
	var order []anyKey
	commits := map[string][]stamp{} // cloud → times the collector ran, for smoothing
	for _, r := range recs {
		e := event{at: undated}
		var err error
		if haveLog {
			if e, err = r.logEvent(); err != nil {
				return err
			}
		}
		if err := r.prices(&e, "Price", "SpotPrice"); err != nil {
			return err
		}
		k := keyOf(r)
		if _, seen := events[k]; !seen {
			order = append(order, k)
		}
		events[k] = append(events[k], e)
		commits[k.cloud] = append(commits[k.cloud], e.at)
	}
	for cloud, ts := range commits {
		slices.Sort(ts)
		commits[cloud] = slices.Compact(ts)
	}
	for _, k := range order {
		// A snapshot (log absent) has one undated event per key: backfill makes it hold
		// at every time, like the AWS snapshot.
		od, spot := replay(source, events[k], commits[k.cloud][0])
		if k.cloud == "azure" && haveLog {
			od, spot = dailyMedian(od, commits["azure"]), dailyMedian(spot, commits["azure"])
		}
		a := attrs[k]
		if err := b.addAnycloud(k, od, spot, a[0], a[1]); err != nil {
			return err
		}
	}
	return nil
}

// replay turns one key's log rows into on-demand and spot series. logStart is when the
// key's log began: a key first seen then was probably there before, so it backfills.
func replay(source string, evs []event, logStart stamp) (od, spot *series) {
	slices.SortStableFunc(evs, func(a, b event) int {
		return cmp.Or(cmp.Compare(a.at, b.at), -cmp.Compare(boolInt(a.goneFirst), boolInt(b.goneFirst)))
	})
	od = &series{source: source, backfill: evs[0].at == logStart}
	spot = &series{source: source, backfill: od.backfill}
	for _, e := range evs {
		od.pts = append(od.pts, eventPoint(e, e.od, e.hasOD))
		spot.pts = append(spot.pts, eventPoint(e, e.spot, e.hasSpot))
	}
	// A row changes on-demand or spot; dropping the repeats of the other keeps each
	// series' points at the times its own price changed (PricedSince).
	same := func(a, b point) bool { return a.st == b.st && a.usd == b.usd }
	od.pts, spot.pts = slices.CompactFunc(od.pts, same), slices.CompactFunc(spot.pts, same)
	return od, spot
}

func eventPoint(e event, usd float64, has bool) point {
	switch {
	case e.gone:
		return point{at: e.at, st: unknown}
	case !has:
		return point{at: e.at, st: blank}
	}
	return point{at: e.at, usd: usd, st: priced}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// addAnycloud files one anycloud key: whole machines become lines now; GCP's split rows
// (GPU price only, host VM price only) wait for assembleGCP.
func (b *builder) addAnycloud(k anyKey, od, spot *series, vcpus, mem float64) error {
	switch k.kind {
	case "vm_with_accelerator", "tpu":
		l := line{
			provider: k.cloud, region: k.region, zone: k.zone, instanceType: k.instanceType,
			accelerator: k.accelerator, vcpus: vcpus, memGiB: mem,
		}
		n, ok := wholeNumber(k.count)
		if !ok {
			b.note(k.accelerator, k.cloud, fmt.Sprintf("%s carries a fraction of a GPU (%s)", k.instanceType, k.count))
			return nil
		}
		l.count = n
		b.addSeries(l, od, spot)
	case "gpu_attach_price_only":
		n, ok := wholeNumber(k.count)
		if !ok {
			return fmt.Errorf("%s: gcp GPU row %s in %s: count %q is not a whole number", fileAnyLog, k.accelerator, k.zone, k.count)
		}
		b.gcpGPU[gcpGPUKey{lowerName(k.accelerator), n, k.zone}] = &gcpPart{region: k.region, name: k.accelerator, od: od, spot: spot}
	case "gcp_gpu_host_vm_price_only":
		b.gcpHost[[2]string{k.instanceType, k.zone}] = &gcpPart{region: k.region, od: od, spot: spot, vcpus: vcpus, memGiB: mem}
		if vcpus > 0 {
			b.gcpAttrs[k.instanceType] = [2]float64{vcpus, mem}
		}
	default:
		return fmt.Errorf("%s: unknown row_kind %q (want vm_with_accelerator, tpu, gpu_attach_price_only or gcp_gpu_host_vm_price_only)", fileAnyLog, k.kind)
	}
	return nil
}

// addSeries adds the on-demand and spot lines of a machine, each only if it ever has a price.
func (b *builder) addSeries(l line, od, spot pricer) {
	if od != nil && od.ever() {
		l.capacity, l.price = fleet.OnDemand, od
		b.add(l)
	}
	if spot != nil && spot.ever() {
		l.capacity, l.price = fleet.Spot, spot
		b.add(l)
	}
}

// loadGCPHistory reads GCP's billing-catalog history of whole GPU VMs (host and GPUs in
// one price), region by region, 2022-02 → 2026-07.
func loadGCPHistory(fsys fs.FS, b *builder) error {
	recs, found, err := readCSV(fsys, fileGCPLog, []string{
		"observed_at", "event", "machine_type", "vcpus", "ram_gib", "region",
		"hour_ondemand_usd", "hour_spot_usd",
	})
	if err != nil || !found {
		return err
	}
	b.sources = append(b.sources, fileGCPLog)
	events := map[[2]string][]event{}
	var order [][2]string
	logStart := latest
	for _, r := range recs {
		e, err := r.logEvent()
		if err != nil {
			return err
		}
		if err := r.prices(&e, "hour_ondemand_usd", "hour_spot_usd"); err != nil {
			return err
		}
		if e.vcpus, err = r.number("vcpus"); err != nil {
			return err
		}
		if e.memGiB, err = r.number("ram_gib"); err != nil {
			return err
		}
		k := [2]string{r.str("machine_type"), r.str("region")}
		if _, seen := events[k]; !seen {
			order = append(order, k)
		}
		events[k] = append(events[k], e)
		logStart = min(logStart, e.at)
	}
	for _, k := range order {
		evs := events[k]
		od, spot := replay(fileGCPLog, evs, logStart)
		p := &gcpPart{region: k[1], od: od, spot: spot}
		// Attributes of the latest listed variant (replay sorted evs in place).
		for _, e := range slices.Backward(evs) {
			if !e.gone {
				p.vcpus, p.memGiB = e.vcpus, e.memGiB
				break
			}
		}
		b.gcpHist[k] = p
	}
	return nil
}

// logEvent reads a change-log row's time and kind (first_seen, changed, disappeared), the
// columns every price change log here shares.
func (r record) logEvent() (event, error) {
	var e event
	at, err := r.when("observed_at")
	if err != nil {
		return e, err
	}
	e.at = stampOf(at)
	switch ev := r.str("event"); ev {
	case "first_seen", "changed":
	case "disappeared":
		// When a machine's attributes change (a2-highgpu-1g 58 → 85 GiB) the log writes
		// the new variant's first_seen and the old one's disappeared at the same time,
		// in that order; keyed by (machine type, region) the disappearance goes first.
		e.gone, e.goneFirst = true, true
	default:
		return e, r.errorf("event", "want first_seen, changed or disappeared, got %q", ev)
	}
	return e, nil
}

// prices reads a row's on-demand and spot price columns into e.
func (r record) prices(e *event, onDemandCol, spotCol string) error {
	var err error
	if e.od, e.hasOD, err = r.price(onDemandCol); err != nil {
		return err
	}
	e.spot, e.hasSpot, err = r.price(spotCol)
	return err
}
