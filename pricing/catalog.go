package pricing

import (
	"cmp"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/spec"
)

// Offer is the price of one instance that can run one replica, in one place, bought one
// way, at one time.
type Offer struct {
	// Provider is the cloud as spec writes it (aws, gcp, azure, lambda, vast). Region and
	// Zone are the catalog's: AWS zones are AZ ids (use1-az1, the same in every account),
	// GCP zones are zone names; Azure, Lambda and Vast price per region and leave Zone
	// empty, as do GCP machines whose zones no catalog lists.
	Provider, Region, Zone string
	// InstanceType is empty for GCP TPU slices, which the catalog lists without one.
	InstanceType     string
	Accelerator      string // as the catalogs spell it: A100-80GB, L4, H100-MEGA
	AcceleratorCount int    // per instance
	// VCPUs and MemoryGiB describe the host; 0 where the catalog does not say.
	VCPUs, MemoryGiB float64
	Capacity         fleet.Capacity // spot or on_demand; reserved only from ReservedOffers
	PricePerHour     float64        // USD per instance-hour
	PricePerGPUHour  float64        // PricePerHour / AcceleratorCount
	// Source is the file under gpu_prices/ that gave the price, for decision logs.
	Source string
	// PricedSince is when the source first showed this price (the change-log row, or the
	// first of equal daily rows); zero for an undated snapshot. It is after the time asked
	// for when that time precedes the log and the first price stands in for it.
	PricedSince time.Time
	// Preference is the rank of the candidate that matched in Quote (0 = most preferred);
	// all any_of candidates share rank 0. Offers leaves it 0.
	Preference int
}

// SpotAdvice is AWS's Spot Instance Advisor figure for one instance type in one region
// (Linux): how much spot saved against on-demand and how often spot was interrupted, both
// over the trailing month before the snapshot (≤ 2025-06-28).
type SpotAdvice struct {
	Region, InstanceType string
	SavingsPct           float64 // savings over on-demand, %
	InterruptionFreq     string  // AWS's bucket: <5%, 5-10%, 10-15%, 15-20%, >20%
	InterruptionUpperPct float64 // the bucket's upper bound as the feed gives it (5, 11, 16, 22, 100)
}

// line is one thing the catalogs price: an instance type in a place, bought one way.
type line struct {
	provider, region, zone, instanceType string
	accelerator                          string
	count                                int
	vcpus, memGiB                        float64
	capacity                             fleet.Capacity
	price                                pricer
}

func (l *line) offer(s sample) Offer {
	return Offer{
		Provider: l.provider, Region: l.region, Zone: l.zone, InstanceType: l.instanceType,
		Accelerator: l.accelerator, AcceleratorCount: l.count,
		VCPUs: l.vcpus, MemoryGiB: l.memGiB,
		Capacity:     l.capacity,
		PricePerHour: s.usd, PricePerGPUHour: s.usd / float64(l.count),
		Source: s.source, PricedSince: s.observed.time(),
	}
}

// Catalog is every price the loaded files give. It is immutable after Load and safe for
// concurrent use.
type Catalog struct {
	lines []line
	byAcc map[string][]int // lower-cased accelerator → indexes into lines
	names []string         // accelerator names with at least one line, sorted
	// notes say why an accelerator a file mentions has no price from some provider (GCP's
	// N1-attached GPUs, fractional GPUs), so an empty quote can say so.
	notes     map[string]map[string]string
	advice    map[[2]string]SpotAdvice // (region, instance type)
	sources   []string
	providers []string
}

// KnownFiles lists the paths under a gpu_prices directory that Load reads, each
// optional. Load also accepts each with a .gz suffix, as the embedded copies are stored.
func KnownFiles() []string {
	return []string{fileAWS, fileP5, fileAdvisor, fileAnySnapshot, fileAnyLog, fileGCPLog}
}

const (
	fileAWS         = "aws_skypilot_catalog_subset/aws_gpu_vms_subset.csv"
	fileP5          = "aws_p5_ondemand_history/gpu_prices.csv"
	fileAdvisor     = "aws_spot_advisor/aws_spot_advisor_gpu.csv"
	fileAnySnapshot = "anycloud_catalog/gpu_catalog_snapshot.csv"
	fileAnyLog      = "anycloud_catalog/gpu_price_changelog.csv"
	fileGCPLog      = "gcp_gpu_vm_price_history/gcp_gpu_vm_price_changelog.csv"
)

// Load reads the known files under dir, laid out as shared/data/gpu_prices/ is (each
// file in its own folder). Missing files are skipped; a directory with none of them, or
// a file that does not parse, is an error.
func Load(dir string) (*Catalog, error) {
	c, err := LoadFS(os.DirFS(dir))
	if err != nil {
		return nil, fmt.Errorf("pricing: load %s: %w", dir, err)
	}
	return c, nil
}

//go:embed catalogs
var embedded embed.FS

// Embedded loads the copies shipped in catalogs/ (gzipped, same content as the shared
// files; see catalogs/README.md), so that a binary quotes prices without the data
// directory. Each call parses them again (0.1–0.2 s of CPU); load once and share the Catalog.
func Embedded() (*Catalog, error) {
	sub, err := fs.Sub(embedded, "catalogs")
	if err != nil {
		return nil, fmt.Errorf("pricing: embedded catalogs: %w", err)
	}
	c, err := LoadFS(sub)
	if err != nil {
		return nil, fmt.Errorf("pricing: embedded catalogs: %w", err)
	}
	return c, nil
}

// LoadFS is Load on any file system, such as an fstest.MapFS in tests.
func LoadFS(fsys fs.FS) (*Catalog, error) {
	b := newBuilder()
	for _, step := range []func(fs.FS, *builder) error{
		loadAWS, loadP5, loadAdvisor, loadAnycloud, loadGCPHistory,
	} {
		if err := step(fsys, b); err != nil {
			return nil, err
		}
	}
	b.assembleGCP()
	if len(b.sources) == 0 {
		return nil, errors.New("none of the known price files is there: want some of " + strings.Join(KnownFiles(), ", "))
	}
	return b.finish(), nil
}

// Launchable are the clouds whose catalog prices Arbiter's providers can buy: AWS through
// its EC2 provider, and AWS, GCP and Azure through Kubernetes clusters there (Karpenter
// NodePools, node pools that scale from zero). Lambda and Vast are marketplaces no
// provider launches on: a $ per token quoted from them is not one a user can pay.
var Launchable = []string{"aws", "gcp", "azure"}

// Only is the catalog of the named providers alone (aws, gcp, …): the prices a service can
// launch on where its providers are those. It fails on a provider the catalog prices
// nothing for, naming those it does. The sources and notes stay whole (a note about a
// provider left out says nothing wrong).
func (c *Catalog) Only(providers ...string) (*Catalog, error) {
	keep := map[string]bool{}
	for _, p := range providers {
		if p = strings.ToLower(strings.TrimSpace(p)); p == "" {
			continue // "aws," names aws
		}
		if !slices.Contains(c.providers, p) {
			return nil, fmt.Errorf("provider %q: the catalogs price %s", p, strings.Join(c.providers, ", "))
		}
		keep[p] = true
	}
	out := &Catalog{notes: c.notes, advice: c.advice, sources: c.sources}
	for _, l := range c.lines {
		if keep[l.provider] {
			out.lines = append(out.lines, l)
		}
	}
	out.index()
	return out, nil
}

// CheapestOnDemand is the on-demand offer of an instance with gpus × accelerator (as the
// catalogs name it, case aside) at the lowest $/hour; ok is false where none is priced.
func CheapestOnDemand(offers []Offer, accelerator string, gpus int) (best Offer, ok bool) {
	for _, o := range offers {
		if o.Capacity == fleet.OnDemand && o.AcceleratorCount == gpus && accelerator != "" && strings.EqualFold(o.Accelerator, accelerator) && o.PricePerHour > 0 &&
			(!ok || o.PricePerHour < best.PricePerHour) {
			best, ok = o, true
		}
	}
	return best, ok
}

// Sources lists the files the catalog was loaded from.
func (c *Catalog) Sources() []string { return slices.Clone(c.sources) }

// Providers lists the clouds with at least one price, sorted.
func (c *Catalog) Providers() []string { return slices.Clone(c.providers) }

// Accelerators lists the accelerator names that have at least one price, sorted
// case-insensitively; Quote matches them case-insensitively.
func (c *Catalog) Accelerators() []string { return slices.Clone(c.names) }

// SpotAdvice gives AWS's Spot Advisor figures for an instance type in a region; ok is
// false where the advisor snapshot has none (every provider but AWS).
func (c *Catalog) SpotAdvice(region, instanceType string) (SpotAdvice, bool) {
	a, ok := c.advice[[2]string{region, instanceType}]
	return a, ok
}

// Offers lists every price in force at at: each change log replayed up to at; before a
// log's first entry, the first price it gives for machines listed from its start; an
// undated snapshot at every time. The zero time means the latest prices. The result is
// sorted by provider, region, zone, instance type and capacity.
func (c *Catalog) Offers(at time.Time) []Offer {
	t := resolve(at)
	out := make([]Offer, 0, len(c.lines))
	for i := range c.lines {
		l := &c.lines[i]
		if s, st := l.price.at(t); st == priced {
			out = append(out, l.offer(s))
		}
	}
	return out
}

// resolve maps the zero time to a time after every log, so that it reads as "latest".
func resolve(at time.Time) stamp {
	if at.IsZero() {
		return latest
	}
	return stamp(at.Unix())
}

// ReservedOffers turns the capacity a spec says is already paid for into offers, so that
// placement can rank it beside the catalog's (reserved prices come from the spec, never
// from a catalog). PricePerHour is per instance, as arbiter.reserved writes it.
func ReservedOffers(rs []spec.ReservedCapacity) []Offer {
	out := make([]Offer, 0, len(rs))
	for _, r := range rs {
		o := Offer{
			Provider: r.Provider, Region: r.Region, Zone: r.Zone,
			Accelerator: r.Accelerator, AcceleratorCount: r.Count,
			Capacity: fleet.Reserved, PricePerHour: r.PricePerHour,
			Source: "spec: arbiter.reserved",
		}
		if r.Count > 0 {
			o.PricePerGPUHour = r.PricePerHour / float64(r.Count)
		}
		out = append(out, o)
	}
	return out
}

// builder collects lines from every file; gcp* hold the GCP pieces that are joined once
// all files are read, because one GCP machine's price can come from two files.
type builder struct {
	lines    map[lineKey]*line
	display  map[string]string // lower-cased accelerator → first spelling seen
	notes    map[string]map[string]string
	advice   map[[2]string]SpotAdvice
	sources  []string
	gcpHost  map[[2]string]*gcpPart // (machine type, zone)
	gcpGPU   map[gcpGPUKey]*gcpPart
	gcpHist  map[[2]string]*gcpPart // (machine type, region)
	gcpAttrs map[string][2]float64  // machine type → (vCPUs, GiB) from the anycloud snapshot
}

type lineKey struct {
	provider, region, zone, instanceType, accelerator string
	count                                             int
	capacity                                          fleet.Capacity
}

func newBuilder() *builder {
	return &builder{
		lines:    map[lineKey]*line{},
		display:  map[string]string{},
		notes:    map[string]map[string]string{},
		advice:   map[[2]string]SpotAdvice{},
		gcpHost:  map[[2]string]*gcpPart{},
		gcpGPU:   map[gcpGPUKey]*gcpPart{},
		gcpHist:  map[[2]string]*gcpPart{},
		gcpAttrs: map[string][2]float64{},
	}
}

// add keeps the first line for a key: the one duplicate in the data (p4de.24xlarge listed
// twice in some AZs, once without a spot price) repeats the same on-demand price.
func (b *builder) add(l line) {
	lower := strings.ToLower(l.accelerator)
	if d, ok := b.display[lower]; ok {
		l.accelerator = d
	} else {
		b.display[lower] = l.accelerator
	}
	k := lineKey{l.provider, l.region, l.zone, l.instanceType, l.accelerator, l.count, l.capacity}
	if _, dup := b.lines[k]; !dup {
		b.lines[k] = &l
	}
}

// note records why an accelerator has no price from a provider. One reason is kept,
// the least in byte order, so that messages do not depend on map iteration order.
func (b *builder) note(accelerator, provider, why string) {
	lower := strings.ToLower(accelerator)
	if b.notes[lower] == nil {
		b.notes[lower] = map[string]string{}
	}
	if old, ok := b.notes[lower][provider]; !ok || why < old {
		b.notes[lower][provider] = why
	}
}

func (b *builder) finish() *Catalog {
	c := &Catalog{
		notes:   b.notes,
		advice:  b.advice,
		sources: b.sources,
	}
	keys := make([]lineKey, 0, len(b.lines))
	for k := range b.lines {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareKeys)
	for _, k := range keys {
		c.lines = append(c.lines, *b.lines[k])
	}
	c.index()
	return c
}

// index fills what Quote and the listings look lines up by: the lines of each accelerator
// (lower-cased), the accelerator names and the providers, sorted.
func (c *Catalog) index() {
	c.byAcc, c.names, c.providers = map[string][]int{}, nil, nil
	for i, l := range c.lines {
		lower := strings.ToLower(l.accelerator)
		if _, ok := c.byAcc[lower]; !ok {
			c.names = append(c.names, l.accelerator)
		}
		c.byAcc[lower] = append(c.byAcc[lower], i)
		if !slices.Contains(c.providers, l.provider) {
			c.providers = append(c.providers, l.provider)
		}
	}
	slices.SortFunc(c.names, func(a, b string) int {
		return cmp.Or(cmp.Compare(strings.ToLower(a), strings.ToLower(b)), cmp.Compare(a, b))
	})
	slices.Sort(c.providers)
}

func compareKeys(a, b lineKey) int {
	return cmp.Or(
		cmp.Compare(a.provider, b.provider),
		cmp.Compare(a.region, b.region),
		cmp.Compare(a.zone, b.zone),
		cmp.Compare(a.instanceType, b.instanceType),
		cmp.Compare(a.accelerator, b.accelerator),
		cmp.Compare(a.count, b.count),
		cmp.Compare(a.capacity, b.capacity),
	)
}
