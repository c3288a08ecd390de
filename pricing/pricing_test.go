package pricing

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/spec"
)

// sharedDir is shared/data/gpu_prices seen from this package; tests that need it skip
// where the checkout has no shared/ (the embedded copies carry the same bytes).
const sharedDir = "../../shared/data/gpu_prices"

// embeddedCatalog parses the embedded files once for the whole test binary.
var embeddedCatalog = sync.OnceValues(Embedded)

func catalog(t testing.TB) *Catalog {
	t.Helper()
	c, err := embeddedCatalog()
	if err != nil {
		t.Fatalf("Embedded: %v", err)
	}
	return c
}

func day(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// where names one line of a catalog.
type where struct {
	provider, region, zone, instanceType string
	capacity                             fleet.Capacity
}

func lookup(offers []Offer, w where) (Offer, bool) {
	for _, o := range offers {
		if o.Provider == w.provider && o.Region == w.region && o.Zone == w.zone && o.InstanceType == w.instanceType && o.Capacity == w.capacity {
			return o, true
		}
	}
	return Offer{}, false
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// TestKnownPrices pins rows of the CSVs (copied here by hand from the files) to the
// normalised offer: per-instance and per-GPU USD/hour and the file that gave it.
func TestKnownPrices(t *testing.T) {
	c := catalog(t)
	const aws, gcpLog, anyComposed = fileAWS, fileGCPLog, fileAnyLog + " (host VM + GPUs)"
	for _, tc := range []struct {
		name      string
		at        time.Time
		w         where
		acc       string
		count     int
		price     float64
		perGPU    float64
		source    string
		vcpus     float64
		memoryGiB float64
	}{{
		// g5.xlarge,A10G,1.0,4.0,16.0,1.006,0.417700,us-east-1,use1-az1
		name: "aws g5.xlarge on-demand", w: where{"aws", "us-east-1", "use1-az1", "g5.xlarge", fleet.OnDemand},
		acc: "A10G", count: 1, price: 1.006, perGPU: 1.006, source: aws, vcpus: 4, memoryGiB: 16,
	}, {
		name: "aws g5.xlarge spot", w: where{"aws", "us-east-1", "use1-az1", "g5.xlarge", fleet.Spot},
		acc: "A10G", count: 1, price: 0.4177, perGPU: 0.4177, source: aws, vcpus: 4, memoryGiB: 16,
	}, {
		// g6e.12xlarge,L40S,4.0,48.0,384.0,10.49264,4.235900,us-east-1,use1-az1
		name: "aws g6e.12xlarge on-demand", w: where{"aws", "us-east-1", "use1-az1", "g6e.12xlarge", fleet.OnDemand},
		acc: "L40S", count: 4, price: 10.49264, perGPU: 2.62316, source: aws, vcpus: 48, memoryGiB: 384,
	}, {
		name: "aws g6e.12xlarge spot", w: where{"aws", "us-east-1", "use1-az1", "g6e.12xlarge", fleet.Spot},
		acc: "L40S", count: 4, price: 4.2359, perGPU: 1.058975, source: aws, vcpus: 48, memoryGiB: 384,
	}, {
		// lambda,vm_with_accelerator,gpu_8x_v100_n,V100,8.0,88.0,448.0,6.32,,europe-central-1,
		name: "lambda 8xV100", w: where{"lambda", "europe-central-1", "", "gpu_8x_v100_n", fleet.OnDemand},
		acc: "V100", count: 8, price: 6.32, perGPU: 0.79, source: fileAnyLog, vcpus: 88, memoryGiB: 448,
	}, {
		// GCP splits a3-ultragpu-8g into host VM 12.266 (spot 5.0093) and 8×H200 74.49392
		// (spot 37.2472) in us-central1-b; the history does not list the family.
		name: "gcp a3-ultragpu-8g host+GPUs", w: where{"gcp", "us-central1", "us-central1-b", "a3-ultragpu-8g", fleet.OnDemand},
		acc: "H200", count: 8, price: 86.75992, perGPU: 10.84499, source: anyComposed, vcpus: 224, memoryGiB: 2952,
	}, {
		name: "gcp a3-ultragpu-8g host+GPUs spot", w: where{"gcp", "us-central1", "us-central1-b", "a3-ultragpu-8g", fleet.Spot},
		acc: "H200", count: 8, price: 42.2565, perGPU: 5.2820625, source: anyComposed, vcpus: 224, memoryGiB: 2952,
	}, {
		// 2024-05-23T03:53:47+00:00 … a3-highgpu-8g,h100-80gb,8,208,1872,us-central1,88.4899999025753,62.4084208126027
		// spread over the zones anycloud lists for the machine in us-central1.
		name: "gcp a3-highgpu-8g history", at: day("2024-06-01T00:00:00Z"), w: where{"gcp", "us-central1", "us-central1-a", "a3-highgpu-8g", fleet.OnDemand},
		acc: "H100", count: 8, price: 88.4899999025753, perGPU: 11.061249987821913, source: gcpLog, vcpus: 208, memoryGiB: 1872,
	}, {
		name: "gcp a3-highgpu-8g history spot", at: day("2024-06-01T00:00:00Z"), w: where{"gcp", "us-central1", "us-central1-c", "a3-highgpu-8g", fleet.Spot},
		acc: "H100", count: 8, price: 62.4084208126027, perGPU: 7.801052601575338, source: gcpLog, vcpus: 208, memoryGiB: 1872,
	}, {
		// azure,vm_with_accelerator,Standard_NC24ads_A100_v4,A100-80GB,1,24,220,3.673,0.746721,eastus,
		name: "azure NC24ads_A100_v4", w: where{"azure", "eastus", "", "Standard_NC24ads_A100_v4", fleet.Spot},
		acc: "A100-80GB", count: 1, price: 0.746721, perGPU: 0.746721, source: fileAnyLog, vcpus: 24, memoryGiB: 220,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			o, ok := lookup(c.Offers(tc.at), tc.w)
			if !ok {
				t.Fatalf("no offer for %+v at %v", tc.w, tc.at)
			}
			if o.Accelerator != tc.acc || o.AcceleratorCount != tc.count {
				t.Errorf("accelerator %s:%d, want %s:%d", o.Accelerator, o.AcceleratorCount, tc.acc, tc.count)
			}
			if !near(o.PricePerHour, tc.price) || !near(o.PricePerGPUHour, tc.perGPU) {
				t.Errorf("price %v/h (%v per GPU), want %v (%v)", o.PricePerHour, o.PricePerGPUHour, tc.price, tc.perGPU)
			}
			if o.Source != tc.source {
				t.Errorf("source %q, want %q", o.Source, tc.source)
			}
			if o.VCPUs != tc.vcpus || o.MemoryGiB != tc.memoryGiB {
				t.Errorf("host %v vCPUs %v GiB, want %v, %v", o.VCPUs, o.MemoryGiB, tc.vcpus, tc.memoryGiB)
			}
		})
	}
}

// TestChangeLogReplay checks prices before and after logged changes.
func TestChangeLogReplay(t *testing.T) {
	c := catalog(t)
	type want struct {
		at     string
		price  float64 // 0: no offer at that time
		source string
		since  string // PricedSince, "" for an undated snapshot
	}
	for _, tc := range []struct {
		name  string
		w     where
		wants []want
	}{{
		// p5.48xlarge us-east-1: the AWS snapshot before the daily tracker starts
		// (2025-04-23), 98.32 until the 2025-06-04 run, 55.04 from the 2025-06-05 run.
		name: "aws p5 June 2025 cut",
		w:    where{"aws", "us-east-1", "use1-az3", "p5.48xlarge", fleet.OnDemand},
		wants: []want{
			{"2024-01-01T00:00:00Z", 98.32, fileAWS, ""},
			{"2025-06-04T12:00:00Z", 98.32, fileP5, "2025-04-23T18:52:57Z"},
			{"2025-06-05T07:22:35Z", 98.32, fileP5, "2025-04-23T18:52:57Z"},
			{"2025-06-05T07:22:36Z", 55.04, fileP5, "2025-06-05T07:22:36Z"},
			{"2026-08-22T00:00:00Z", 55.04, fileP5, "2025-06-05T07:22:36Z"},
		},
	}, {
		// a3-highgpu-8g us-central1 Spot in the billing history: first listed 2024-05-17,
		// 61.95 → 35.59 (2024-10-31) → 20.42 (2025-03-13) → 50.61 (2026-07-22).
		name: "gcp a3-highgpu-8g spot",
		w:    where{"gcp", "us-central1", "us-central1-a", "a3-highgpu-8g", fleet.Spot},
		wants: []want{
			{"2023-06-01T00:00:00Z", 0, "", ""}, // not listed yet; anycloud's 2026 price must not stand in
			{"2024-05-17T12:00:33Z", 61.94814684, fileGCPLog, "2024-05-17T12:00:33Z"},
			{"2024-11-01T00:00:00Z", 35.5930099726027, fileGCPLog, "2024-10-31T03:54:12Z"},
			{"2025-04-01T00:00:00Z", 20.4230336438356, fileGCPLog, "2025-03-13T03:56:15Z"},
			{"2026-07-22T14:23:37Z", 50.6095408219178, fileGCPLog, "2026-07-22T14:23:37Z"},
		},
	}, {
		// a2-highgpu-1g us-central1 on-demand: 3.558986 in the first version (2022-02-09),
		// and before it; 3.673385 from 2022-02-16, when the log writes the 85 GiB variant's
		// first_seen before the 58 GiB variant's disappeared at the same time.
		name: "gcp a2-highgpu-1g variant switch",
		w:    where{"gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", fleet.OnDemand},
		wants: []want{
			{"2021-06-01T00:00:00Z", 3.558986, fileGCPLog, "2022-02-09T23:07:12Z"},
			{"2022-02-16T22:20:19Z", 3.558986, fileGCPLog, "2022-02-09T23:07:12Z"},
			{"2022-02-16T22:20:20Z", 3.673385, fileGCPLog, "2022-02-16T22:20:20Z"},
		},
	}, {
		// Lambda gpu_1x_h100_pcie us-east-1: 2.86 at the log's start, 3.29 from
		// 2026-04-06, gone at 2026-05-07T04:37:46, back at 07:27:08.
		name: "lambda h100 disappears and returns",
		w:    where{"lambda", "us-east-1", "", "gpu_1x_h100_pcie", fleet.OnDemand},
		wants: []want{
			{"2026-01-01T00:00:00Z", 2.86, fileAnyLog, "2026-04-02T15:55:58Z"},
			{"2026-04-06T09:50:21Z", 2.86, fileAnyLog, "2026-04-02T15:55:58Z"},
			{"2026-04-10T00:00:00Z", 3.29, fileAnyLog, "2026-04-06T09:50:22Z"},
			{"2026-05-07T05:00:00Z", 0, "", ""},
			{"2026-05-07T08:00:00Z", 3.29, fileAnyLog, "2026-05-07T07:27:08Z"},
		},
	}, {
		// Azure NC24ads_A100_v4 eastus flips 3.673 ↔ 4.777 on 2026-05-01; at 10:30 the raw
		// row says 4.777, the daily median (lower of 4×3.673, 3×4.777) 3.673.
		name: "azure daily median",
		w:    where{"azure", "eastus", "", "Standard_NC24ads_A100_v4", fleet.OnDemand},
		wants: []want{
			{"2026-05-01T10:30:00Z", 3.673, fileAnyLog, "2026-04-02T16:17:42Z"},
		},
	}, {
		name: "azure daily median spot",
		w:    where{"azure", "eastus", "", "Standard_NC24ads_A100_v4", fleet.Spot},
		wants: []want{
			{"2026-05-01T10:30:00Z", 0.67877, fileAnyLog, "2026-04-02T16:17:42Z"},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			for _, w := range tc.wants {
				o, ok := lookup(c.Offers(day(w.at)), tc.w)
				if w.price == 0 {
					if ok {
						t.Errorf("at %s: offer %v/h from %s, want none", w.at, o.PricePerHour, o.Source)
					}
					continue
				}
				if !ok {
					t.Errorf("at %s: no offer, want %v", w.at, w.price)
					continue
				}
				var since time.Time
				if w.since != "" {
					since = day(w.since)
				}
				if !near(o.PricePerHour, w.price) || o.Source != w.source || !o.PricedSince.Equal(since) {
					t.Errorf("at %s: %v/h from %s since %v, want %v from %s since %v", w.at, o.PricePerHour, o.Source, o.PricedSince, w.price, w.source, since)
				}
			}
		})
	}
}

// TestOffersNormalised checks invariants over every offer at a few times.
func TestOffersNormalised(t *testing.T) {
	c := catalog(t)
	for _, at := range []time.Time{{}, day("2022-06-01T00:00:00Z"), day("2024-06-01T00:00:00Z"), day("2026-05-01T00:00:00Z")} {
		offers := c.Offers(at)
		if len(offers) < 1000 {
			t.Fatalf("at %v: %d offers, want thousands", at, len(offers))
		}
		providers := map[string]bool{}
		for _, o := range offers {
			providers[o.Provider] = true
			if o.Capacity != fleet.Spot && o.Capacity != fleet.OnDemand {
				t.Fatalf("%+v: capacity", o)
			}
			if o.AcceleratorCount < 1 || o.PricePerHour < 0 || !near(o.PricePerGPUHour*float64(o.AcceleratorCount), o.PricePerHour) {
				t.Fatalf("%+v: count or price not normalised", o)
			}
		}
		if len(providers) != 5 {
			t.Errorf("at %v: providers %v, want aws, azure, gcp, lambda, vast", at, providers)
		}
	}
	if got := c.Providers(); !slices.Equal(got, []string{"aws", "azure", "gcp", "lambda", "vast"}) {
		t.Errorf("Providers() = %v", got)
	}
	accs := c.Accelerators()
	for _, want := range []string{"A100", "A100-80GB", "A10G", "H100", "H100-MEGA", "H200", "L4", "L40S", "T4", "V100", "B200", "RTX-PRO-6000"} {
		if !slices.Contains(accs, want) {
			t.Errorf("Accelerators() lacks %s", want)
		}
	}
	if slices.Contains(accs, "P100") {
		t.Error("P100 is listed, but GCP prices it only as an N1 attachment whose host price is unknown")
	}
}

func TestSpotAdvice(t *testing.T) {
	c := catalog(t)
	// us-east-1,Linux,p5.48xlarge,192,2048.0,52,4,>20%,100
	a, ok := c.SpotAdvice("us-east-1", "p5.48xlarge")
	want := SpotAdvice{Region: "us-east-1", InstanceType: "p5.48xlarge", SavingsPct: 52, InterruptionFreq: ">20%", InterruptionUpperPct: 100}
	if !ok || a != want {
		t.Errorf("SpotAdvice = %+v, %v; want %+v", a, ok, want)
	}
	// ca-central-1,Linux,p5.48xlarge,192,2048.0,-62,0,<5%,5: spot cost more that month.
	if a, _ := c.SpotAdvice("ca-central-1", "p5.48xlarge"); a.SavingsPct != -62 {
		t.Errorf("ca-central-1 p5 savings %v, want -62", a.SavingsPct)
	}
	if _, ok := c.SpotAdvice("us-central1", "a3-highgpu-8g"); ok {
		t.Error("advice for a GCP machine")
	}
}

// TestGCPMachineTable keeps gcpMachineGPUs in step with the data: every machine type in
// either GCP file maps to a GPU, and the count agrees with the history's gpu_count.
func TestGCPMachineTable(t *testing.T) {
	sub, err := fs.Sub(embedded, "catalogs")
	if err != nil {
		t.Fatal(err)
	}
	recs, _, err := readCSV(sub, fileGCPLog, []string{"machine_type", "gpu", "gpu_count"})
	if err != nil {
		t.Fatal(err)
	}
	gpuNames := map[string]string{"a100": "A100", "a100-80gb": "A100-80GB", "h100-80gb": "H100", "h100-80gb-mega": "H100-MEGA", "l4": "L4", "rtx6000": "RTX-PRO-6000"}
	for _, r := range recs {
		m := r.str("machine_type")
		acc, n, ok := gcpMachineGPUs(m)
		count, _ := r.number("gpu_count")
		if !ok || n != count {
			t.Fatalf("%s: gcpMachineGPUs = %s, %v, %v; history says %s × %v", m, acc, n, ok, r.str("gpu"), count)
		}
		// Early versions call a2-ultragpu "a100"; the family is A100 80GB.
		if want := gpuNames[r.str("gpu")]; acc != want && !strings.HasPrefix(m, "a2-ultragpu") {
			t.Fatalf("%s: %s, history says %s", m, acc, r.str("gpu"))
		}
	}
	snap, _, err := readCSV(sub, fileAnySnapshot, []string{"row_kind", "InstanceType"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range snap {
		if r.str("row_kind") == "gcp_gpu_host_vm_price_only" {
			if _, _, ok := gcpMachineGPUs(r.str("InstanceType")); !ok {
				t.Errorf("host VM %s has no GPU mapping", r.str("InstanceType"))
			}
		}
	}
}

// TestEmbeddedMatchesSHA256SUMS proves the gzipped copies hold the shared files' bytes
// (SHA256SUMS repeats shared/data/MANIFEST.sha256 for them).
func TestEmbeddedMatchesSHA256SUMS(t *testing.T) {
	sums, err := embedded.ReadFile("catalogs/SHA256SUMS")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(sums))
	n := 0
	for sc.Scan() {
		want, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", sc.Text())
		}
		f, err := embedded.Open("catalogs/" + name + ".gz")
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		if _, err := io.Copy(h, zr); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if got := hex.EncodeToString(h.Sum(nil)); got != want {
			t.Errorf("%s: sha256 %s, want %s", name, got, want)
		}
		n++
	}
	if n != len(KnownFiles()) {
		t.Errorf("SHA256SUMS lists %d files, want the %d known ones", n, len(KnownFiles()))
	}
}

// TestEmbeddedMatchesShared: Load on the shared directory and Embedded agree offer by offer.
func TestEmbeddedMatchesShared(t *testing.T) {
	if _, err := os.Stat(sharedDir); err != nil {
		t.Skipf("no %s: %v", sharedDir, err)
	}
	shared, err := Load(sharedDir)
	if err != nil {
		t.Fatal(err)
	}
	emb := catalog(t)
	if !slices.Equal(shared.Sources(), emb.Sources()) {
		t.Errorf("sources %v vs embedded %v", shared.Sources(), emb.Sources())
	}
	for _, at := range []time.Time{{}, day("2023-03-01T00:00:00Z"), day("2025-06-05T12:00:00Z")} {
		if a, b := shared.Offers(at), emb.Offers(at); !slices.Equal(a, b) {
			t.Errorf("at %v: %d shared offers, %d embedded, not equal", at, len(a), len(b))
		}
	}
}

// awsHead is the header and two rows of aws_gpu_vms_subset.csv.
const awsHead = `InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,AvailabilityZone
g4dn.xlarge,T4,1.0,4.0,16.0,0.698,0.283600,af-south-1,afs1-az2
g4dn.xlarge,T4,1.0,4.0,16.0,0.698,0.230700,af-south-1,afs1-az3
`

func TestLoadFSSubsetAndErrors(t *testing.T) {
	c, err := LoadFS(fstest.MapFS{fileAWS: {Data: []byte(awsHead)}})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(c.Offers(time.Time{})); got != 4 {
		t.Errorf("%d offers from two rows, want 4 (on-demand and spot each)", got)
	}
	if _, err := LoadFS(fstest.MapFS{}); err == nil || !strings.Contains(err.Error(), "none of the known price files") {
		t.Errorf("empty dir: err = %v", err)
	}
	bad := strings.Replace(awsHead, "0.230700", "cheap", 1)
	_, err = LoadFS(fstest.MapFS{fileAWS: {Data: []byte(bad)}})
	if err == nil || !strings.Contains(err.Error(), fileAWS+":3: column SpotPrice") {
		t.Errorf("bad price: err = %v, want file:line and column", err)
	}
	_, err = LoadFS(fstest.MapFS{fileAWS: {Data: []byte("InstanceType,Price\n")}})
	if err == nil || !strings.Contains(err.Error(), `no column "AcceleratorName"`) {
		t.Errorf("missing column: err = %v", err)
	}
	_, err = Load(t.TempDir())
	if err == nil || !strings.HasPrefix(err.Error(), "pricing: load ") {
		t.Errorf("Load of an empty dir: err = %v", err)
	}
}

// Only keeps the named providers' prices and nothing else: the embedded catalogs' Vast
// H100 ($1.80/h on 2026-08-01, which no Arbiter provider can buy) leaves with Vast.
func TestOnlyKeepsTheNamedProviders(t *testing.T) {
	all, err := Embedded()
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC)
	c, err := all.Only("aws", "GCP", "azure")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Providers(); !slices.Equal(got, []string{"aws", "azure", "gcp"}) {
		t.Errorf("providers %v, want aws, azure, gcp", got)
	}
	n := 0
	for _, o := range all.Offers(at) {
		if o.Provider == "aws" || o.Provider == "gcp" || o.Provider == "azure" {
			n++
		}
	}
	offers := c.Offers(at)
	if len(offers) != n || n == 0 {
		t.Errorf("%d offers, want the %d of aws, gcp and azure", len(offers), n)
	}
	for _, o := range offers {
		if o.Provider != "aws" && o.Provider != "gcp" && o.Provider != "azure" {
			t.Fatalf("offer of %s kept", o.Provider)
		}
	}
	q, err := c.Quote(spec.Resources{Accelerators: []spec.Accelerator{{Name: "H100", Count: 1}}}, at)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range q {
		if o.Provider == "vast" || o.PricePerHour < 2 {
			t.Errorf("quote kept %s %s at $%.2f/h", o.Provider, o.InstanceType, o.PricePerHour)
		}
	}
	if _, err := all.Only("aws", "oracle"); err == nil || !strings.Contains(err.Error(), "oracle") {
		t.Errorf("Only(oracle): %v, want an error naming it", err)
	}
}
