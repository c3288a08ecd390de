package traces

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The tests read the embedded files directly and count with bytes and
// encoding/json instead of the loaders, so a loader bug cannot hide itself.

func readEmbedded(t testing.TB, p string) []byte {
	t.Helper()
	b, err := fs.ReadFile(Embedded(), p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// lineCount counts lines, including a last line without a newline (the Azure
// files end that way).
func lineCount(b []byte) int {
	n := bytes.Count(b, []byte{'\n'})
	if len(b) > 0 && b[len(b)-1] != '\n' {
		n++
	}
	return n
}

func TestEmbeddedMatchesSHA256SUMS(t *testing.T) {
	sums := readEmbedded(t, "SHA256SUMS")
	listed := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(sums))
	for sc.Scan() {
		want, p, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", sc.Text())
		}
		p = strings.TrimPrefix(p, "./")
		listed[p] = true
		got := sha256.Sum256(readEmbedded(t, p))
		if hex.EncodeToString(got[:]) != want {
			t.Errorf("%s: sha256 %x, want %s (copy differs from shared/data)", p, got, want)
		}
	}
	// Every shipped data file must be covered, so nothing unchecked sneaks in.
	err := fs.WalkDir(Embedded(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || p == "README.md" || p == "SHA256SUMS" {
			return err
		}
		if !listed[p] {
			t.Errorf("%s is embedded but not in SHA256SUMS", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != 43 {
		t.Errorf("SHA256SUMS lists %d files, want 43", len(listed))
	}
}

func TestRequestTraces(t *testing.T) {
	mooncakeLast := []uint64{0, 74677, 79585, 89934, 89935, 89936, 89937, 89938, 89939, 89940, 89941, 89942, 89943, 89944, 89945, 89946, 89947, 96532, 96533}
	cases := []struct {
		name, file  string
		header      int
		rows        int // from the source README
		format      RequestFormat
		start       string
		first, last Request
	}{
		{
			name: "azure-code", file: "llm_traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv",
			header: 1, rows: 8819, format: FormatAzure, start: "2023-11-16 18:17:03.9799600",
			first: Request{At: 0, InputTokens: 4808, OutputTokens: 10},
			// 19:14:19.9280160 - 18:17:03.9799600
			last: Request{At: 57*time.Minute + 15*time.Second + 948056*time.Microsecond, InputTokens: 549, OutputTokens: 173},
		},
		{
			name: "azure-conversation", file: "llm_traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
			header: 1, rows: 19366, format: FormatAzure, start: "2023-11-16 18:15:46.6805900",
			first: Request{At: 0, InputTokens: 374, OutputTokens: 44},
			// 19:14:08.4025270 - 18:15:46.6805900
			last: Request{At: 58*time.Minute + 21*time.Second + 721937*time.Microsecond, InputTokens: 197, OutputTokens: 183},
		},
		{
			name: "mooncake-conversation-30min", file: "llm_traces/mooncake_fast25/conversation_trace_first30min.jsonl",
			header: 0, rows: 5719, format: FormatMooncake,
			first: Request{At: 0, InputTokens: 6758, OutputTokens: 500, PrefixBlocks: []uint64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}},
			last:  Request{At: 1797 * time.Second, InputTokens: 9586, OutputTokens: 543, PrefixBlocks: mooncakeLast},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr, err := NamedRequests(c.name)
			if err != nil {
				t.Fatal(err)
			}
			raw := readEmbedded(t, c.file)
			if rows := lineCount(raw) - c.header; len(tr.Requests) != rows || rows != c.rows {
				t.Fatalf("%d requests; file has %d rows, README says %d", len(tr.Requests), rows, c.rows)
			}
			if tr.Name != c.name || tr.Format != c.format {
				t.Errorf("Name %q Format %q", tr.Name, tr.Format)
			}
			if c.start != "" {
				want, _ := time.Parse(azureLayout, c.start)
				if !tr.Start.Equal(want) {
					t.Errorf("Start %v, want %v", tr.Start, want)
				}
			}
			if got := tr.Requests[0]; !reflect.DeepEqual(got, c.first) {
				t.Errorf("first request %+v, want %+v", got, c.first)
			}
			if got := tr.Requests[len(tr.Requests)-1]; !reflect.DeepEqual(got, c.last) {
				t.Errorf("last request %+v, want %+v", got, c.last)
			}
			if !slices.IsSortedFunc(tr.Requests, func(a, b Request) int { return int(a.At - b.At) }) {
				t.Error("arrivals are not sorted")
			}
			if tr.Span != c.last.At {
				t.Errorf("Span %v, want %v", tr.Span, c.last.At)
			}
			n := time.Duration(len(tr.Requests))
			if want := c.last.At + c.last.At/(n-1); tr.Duration != want {
				t.Errorf("Duration %v, want Span + Span/(n-1) = %v", tr.Duration, want)
			}
			if c.format == FormatMooncake {
				if tr.BlockTokens != 512 {
					t.Errorf("BlockTokens %d, want 512 (Mooncake README)", tr.BlockTokens)
				}
				for i, r := range tr.Requests {
					if want := (r.InputTokens + 511) / 512; len(r.PrefixBlocks) != want {
						t.Fatalf("request %d: %d prefix blocks for %d tokens, want %d", i, len(r.PrefixBlocks), r.InputTokens, want)
					}
				}
			} else if tr.BlockTokens != 0 || tr.Requests[0].PrefixBlocks != nil {
				t.Error("Azure trace has prefix data")
			}
		})
	}
}

func TestLoadRequestsFromDisk(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"azure-code", "mooncake-conversation-30min"} {
		want, err := NamedRequests(name)
		if err != nil {
			t.Fatal(err)
		}
		raw := readEmbedded(t, requestFiles()[name])
		plain := filepath.Join(dir, name+".data")
		if err := os.WriteFile(plain, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		zw.Write(raw)
		zw.Close()
		zipped := filepath.Join(dir, name+".gz")
		if err := os.WriteFile(zipped, gz.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{plain, zipped} {
			got, err := LoadRequests(p)
			if err != nil {
				t.Fatal(err)
			}
			got.Name = want.Name
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: LoadRequests differs from NamedRequests(%q)", p, name)
			}
		}
	}
}

func TestTileSmall(t *testing.T) {
	tr := &RequestTrace{Requests: []Request{
		{At: 0, PrefixBlocks: []uint64{0, 1}},
		{At: time.Second, PrefixBlocks: []uint64{0, 2}},
		{At: 2 * time.Second},
	}}
	tr.finish()
	if tr.Duration != 3*time.Second {
		t.Fatalf("Duration %v, want 3s (span 2s + mean gap 1s)", tr.Duration)
	}
	at := func(rs []Request) (out []time.Duration) {
		for _, r := range rs {
			out = append(out, r.At)
		}
		return out
	}
	s := time.Second
	for _, c := range []struct {
		total time.Duration
		want  []time.Duration
	}{
		{0, nil},
		{s, []time.Duration{0}},
		{6 * s, []time.Duration{0, s, 2 * s, 3 * s, 4 * s, 5 * s}},
		{7 * s, []time.Duration{0, s, 2 * s, 3 * s, 4 * s, 5 * s, 6 * s}},
	} {
		if got := at(tr.Tile(c.total)); !slices.Equal(got, c.want) {
			t.Errorf("Tile(%v) arrivals %v, want %v", c.total, got, c.want)
		}
	}
	got := tr.Tile(7 * s)
	// Ids shift by max id + 1 = 3 per copy.
	if want := []uint64{3, 5}; !slices.Equal(got[4].PrefixBlocks, want) {
		t.Errorf("copy 1 request 1 blocks %v, want %v", got[4].PrefixBlocks, want)
	}
	if want := []uint64{6, 7}; !slices.Equal(got[6].PrefixBlocks, want) {
		t.Errorf("copy 2 request 0 blocks %v, want %v", got[6].PrefixBlocks, want)
	}
	if got[5].PrefixBlocks != nil {
		t.Errorf("request without blocks got %v", got[5].PrefixBlocks)
	}
	got[0].PrefixBlocks[0] = 99
	if tr.Requests[0].PrefixBlocks[0] != 0 {
		t.Error("Tile output aliases the trace's PrefixBlocks")
	}

	// A caller-set Duration below Span interleaves copies; the result must
	// still be in time order.
	tr.Duration = 1500 * time.Millisecond
	want := []time.Duration{0, s, 1500 * time.Millisecond, 2 * s, 2500 * time.Millisecond}
	if got := at(tr.Tile(3 * s)); !slices.Equal(got, want) {
		t.Errorf("overlapping Tile arrivals %v, want %v", got, want)
	}
}

func TestTile24h(t *testing.T) {
	const total = 24 * time.Hour
	for _, name := range RequestNames() {
		t.Run(name, func(t *testing.T) {
			tr, err := NamedRequests(name)
			if err != nil {
				t.Fatal(err)
			}
			n := len(tr.Requests)
			out := tr.Tile(total)
			copies := int(math.Ceil(float64(total) / float64(tr.Duration)))
			want := 0
			for k := range copies {
				for _, r := range tr.Requests {
					if time.Duration(k)*tr.Duration+r.At < total {
						want++
					}
				}
			}
			if len(out) != want || len(out) > copies*n || len(out) <= (copies-1)*n {
				t.Fatalf("Tile(24h) has %d requests, want %d (ceil(24h/%v) = %d copies of %d)", len(out), want, tr.Duration, copies, n)
			}
			if last := out[len(out)-1].At; last >= total || last < total-tr.Duration {
				t.Errorf("last arrival %v does not reach into the last period before 24h", last)
			}
			if !slices.IsSortedFunc(out, func(a, b Request) int { return int(a.At - b.At) }) {
				t.Error("tiled arrivals are not sorted")
			}
			var stride uint64
			for _, r := range tr.Requests {
				for _, id := range r.PrefixBlocks {
					stride = max(stride, id+1)
				}
			}
			for _, k := range []int{0, 1, copies / 2, copies - 2} {
				for _, i := range []int{0, n / 2, n - 1} {
					got, orig := out[k*n+i], tr.Requests[i]
					if got.At != time.Duration(k)*tr.Duration+orig.At || got.InputTokens != orig.InputTokens || got.OutputTokens != orig.OutputTokens {
						t.Fatalf("copy %d request %d = %+v, want the original %+v shifted by %v", k, i, got, orig, time.Duration(k)*tr.Duration)
					}
					for j, id := range orig.PrefixBlocks {
						if got.PrefixBlocks[j] != id+uint64(k)*stride {
							t.Fatalf("copy %d request %d block %d = %d, want %d", k, i, j, got.PrefixBlocks[j], id+uint64(k)*stride)
						}
					}
				}
			}
		})
	}
}

// rawSkyPilot decodes a SkyPilot file on its own, for counting.
type rawSkyPilot struct {
	Metadata struct {
		Gap int `json:"gap_seconds"`
	} `json:"metadata"`
	Data   []int     `json:"data"`
	Prices []float64 `json:"prices"`
}

// summaryTransitions reads the number of value changes per file from
// summary.csv, computed by the data's curator in Python.
func summaryTransitions(t *testing.T) map[string]int {
	rows, err := csv.NewReader(bytes.NewReader(readEmbedded(t, "spot_traces_skypilot/summary.csv"))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	col := slices.Index(rows[0], "transitions")
	out := map[string]int{}
	for _, r := range rows[1:] {
		n, err := strconv.Atoi(r[col])
		if err != nil {
			t.Fatal(err)
		}
		out["spot_traces_skypilot/"+r[0]] = n
	}
	return out
}

func TestSkyPilotTraces(t *testing.T) {
	transitions := summaryTransitions(t)
	if len(transitions) != 34 {
		t.Fatalf("summary.csv has %d rows, want 34", len(transitions))
	}
	groups, err := spotFiles()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, name := range SpotNames() {
		if !strings.HasPrefix(name, "skypilot-") {
			continue
		}
		t.Run(name, func(t *testing.T) {
			tr, err := NamedSpot(name)
			if err != nil {
				t.Fatal(err)
			}
			files := groups[name]
			seen += len(files)
			if len(tr.Zones) != len(files) {
				t.Fatalf("%d zones for %d files", len(tr.Zones), len(files))
			}
			wantPreempt, wantEvents := 0, 0
			for _, f := range files {
				zone, _, _ := strings.Cut(path.Base(f), "_")
				var raw rawSkyPilot
				if err := json.Unmarshal(readEmbedded(t, f), &raw); err != nil {
					t.Fatal(err)
				}
				gap := time.Duration(raw.Metadata.Gap) * time.Second
				if tr.Step != gap {
					t.Errorf("Step %v, file gap %v", tr.Step, gap)
				}
				if end := tr.ZoneEnd(zone); end != time.Duration(len(raw.Data))*gap {
					t.Errorf("%s: ZoneEnd %v, want %d ticks × %v", zone, end, len(raw.Data), gap)
				}
				changes := 0
				for i := 1; i < len(raw.Data); i++ {
					if raw.Data[i] != raw.Data[i-1] {
						changes++
					}
					if raw.Data[i] < raw.Data[i-1] && strings.Contains(f, "/preemption/") {
						wantPreempt++
					}
				}
				if changes != transitions[f] {
					t.Errorf("%s: %d changes, summary.csv says %d", f, changes, transitions[f])
				}
				wantEvents += changes
				// Every 97th tick, at its start and just before its end.
				for i := 0; i < len(raw.Data); i += 97 {
					for _, at := range []time.Duration{time.Duration(i) * gap, time.Duration(i+1)*gap - 1} {
						if got, ok := tr.Available(zone, at); !ok || got != raw.Data[i] {
							t.Fatalf("%s: Available(%v) = %d, %v; data[%d] = %d", zone, at, got, ok, i, raw.Data[i])
						}
						if p, ok := tr.Price(zone, at); ok != (raw.Prices != nil) || (ok && p != raw.Prices[i]) {
							t.Fatalf("%s: Price(%v) = %v, %v; prices present %v", zone, at, p, ok, raw.Prices != nil)
						}
					}
				}
				if _, ok := tr.Available(zone, tr.ZoneEnd(zone)); ok {
					t.Errorf("%s: Available at ZoneEnd reports data", zone)
				}
			}
			all := tr.Events(0, tr.Duration)
			if len(all) != wantEvents {
				t.Errorf("%d events, want %d", len(all), wantEvents)
			}
			if got := len(tr.Preemptions(0, tr.Duration)); got != wantPreempt {
				t.Errorf("%d preemptions, want %d drops", got, wantPreempt)
			}
			if !slices.IsSortedFunc(all, func(a, b SpotEvent) int { return int(a.At - b.At) }) {
				t.Error("events are not sorted")
			}
			for _, e := range all {
				if n, _ := tr.Available(e.Zone, e.At); n != e.Count || e.Delta <= 0 {
					t.Fatalf("event %+v: Available at its time is %d", e, n)
				}
			}
		})
	}
	if seen != 34 {
		t.Errorf("embedded spot traces cover %d SkyPilot files, want 34", seen)
	}
}

// Concrete values read off the files by eye, so that a consistent but wrong
// time base (off by one tick, seconds for minutes) fails.
func TestSpotConcrete(t *testing.T) {
	avail16, err := NamedSpot("skypilot-availability-aws-08-27-2023-v100_1")
	if err != nil {
		t.Fatal(err)
	}
	// us-east-2b data starts 0, 0, 0, 3, 3, 3, 3, 7, ...; 300 s ticks.
	for _, c := range []struct {
		at   time.Duration
		want int
	}{{0, 0}, {899 * time.Second, 0}, {900 * time.Second, 3}, {35 * time.Minute, 7}} {
		if got, ok := avail16.Available("us-east-2b", c.at); !ok || got != c.want {
			t.Errorf("us-east-2b at %v: %d, %v; want %d", c.at, got, ok, c.want)
		}
	}
	// us-east-2b has 3,247 ticks, us-west-2a 4,736 (their last value is 16).
	if _, ok := avail16.Available("us-east-2b", 3247*300*time.Second); ok {
		t.Error("us-east-2b reports data after its last tick")
	}
	if got, ok := avail16.Available("us-west-2a", 4735*300*time.Second); !ok || got != 16 {
		t.Errorf("us-west-2a last tick: %d, %v; want 16", got, ok)
	}
	if avail16.Duration != 4736*300*time.Second || avail16.MaxCount != 16 || avail16.Series != SeriesAvailability {
		t.Errorf("Duration %v MaxCount %d Series %s", avail16.Duration, avail16.MaxCount, avail16.Series)
	}
	if len(avail16.Preemptions(0, avail16.Duration)) != 0 {
		t.Error("availability trace reports preemptions")
	}
	if _, ok := avail16.Available("us-east-1a", 0); ok {
		t.Error("unknown zone reports data")
	}

	// us-east-1a (195 s ticks) starts at 0 and first changes at ticks 246
	// (to 1) and 249 (to 0).
	a9, err := NamedSpot("skypilot-availability-aws-02-15-2023-v100_1")
	if err != nil {
		t.Fatal(err)
	}
	var east1a []SpotEvent
	for _, e := range a9.Events(0, 250*195*time.Second) {
		if e.Zone == "us-east-1a" {
			east1a = append(east1a, e)
		}
	}
	want := []SpotEvent{
		{At: 246 * 195 * time.Second, Zone: "us-east-1a", Kind: KindAvailable, Delta: 1, Count: 1},
		{At: 249 * 195 * time.Second, Zone: "us-east-1a", Kind: KindUnavailable, Delta: 1, Count: 0},
	}
	if !reflect.DeepEqual(east1a, want) {
		t.Errorf("us-east-1a first events %+v, want %+v", east1a, want)
	}

	// us-east-1c of the 04-22 preemption set: 32 s ticks, first drop 1 → 0
	// at tick 369, price 0.918 USD/h throughout.
	p4, err := NamedSpot("skypilot-preemption-aws-04-22-2023-v100_1")
	if err != nil {
		t.Fatal(err)
	}
	var first *SpotEvent
	for _, e := range p4.Preemptions(0, p4.Duration) {
		if e.Zone == "us-east-1c" {
			first = &e
			break
		}
	}
	if first == nil || first.At != 369*32*time.Second || first.Kind != KindPreempted || first.Count != 0 {
		t.Errorf("first us-east-1c preemption %+v, want tick 369 (%v)", first, 369*32*time.Second)
	}
	if p4.Cloud != "aws" || p4.InstanceType != "p3.2xlarge" || p4.Series != SeriesRunning || p4.Source != "skypilot" {
		t.Errorf("Cloud %q InstanceType %q Series %q Source %q", p4.Cloud, p4.InstanceType, p4.Series, p4.Source)
	}
	if p, ok := p4.Price("us-east-1c", 10000*32*time.Second); !ok || p != 0.918 {
		t.Errorf("us-east-1c price %v, %v; want 0.918", p, ok)
	}
	if _, ok := p4.Price("us-east-1f", 0); ok {
		t.Error("us-east-1f has no prices in its file but Price reports one")
	}
}

func TestSpotServe(t *testing.T) {
	tr, err := NamedSpot("spotserve-g4dn")
	if err != nil {
		t.Fatal(err)
	}
	raw := readEmbedded(t, spotServeFile)
	if got, want := len(tr.Events(0, tr.Duration)), lineCount(raw); got != want || want != 153 {
		t.Errorf("%d events, file has %d lines (README: 153)", got, want)
	}
	if got, want := len(tr.Preemptions(0, tr.Duration)), bytes.Count(raw, []byte(",remove,")); got != want || want != 74 {
		t.Errorf("%d preemptions, file has %d removes (README: 74)", got, want)
	}
	if !slices.Equal(tr.Zones, []string{UnknownZone}) || tr.Step != time.Minute || tr.MaxCount != 24 {
		t.Errorf("Zones %v Step %v MaxCount %d; want [unknown] 1m 24 (README)", tr.Zones, tr.Step, tr.MaxCount)
	}
	if want := 38760*time.Second + time.Minute; tr.Duration != want {
		t.Errorf("Duration %v, want last event + Step = %v", tr.Duration, want)
	}
	ms := time.Millisecond
	for _, c := range []struct {
		at   time.Duration
		want int
	}{{0, 0}, {479999 * ms, 0}, {480000 * ms, 1}, {540000 * ms, 2}, {600000 * ms, 21}, {time.Hour, 12}, {5 * time.Hour, 11}, {38700 * time.Second, 6}, {38760 * time.Second, 5}, {tr.Duration - 1, 5}} {
		if got, ok := tr.Available(UnknownZone, c.at); !ok || got != c.want {
			t.Errorf("Available(%v) = %d, %v; want %d", c.at, got, ok, c.want)
		}
	}
	first := tr.Events(0, time.Hour)[0]
	if want := (SpotEvent{At: 480 * time.Second, Zone: UnknownZone, Kind: KindAcquired, Delta: 1, Count: 1, Node: "node1"}); first != want {
		t.Errorf("first event %+v, want %+v", first, want)
	}
}

// writeTree writes files (slash paths) under a temp dir and returns it.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, content := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLoadSpotFromDisk(t *testing.T) {
	files := map[string]string{}
	for _, p := range []string{
		"spot_traces_skypilot/availability/16-node/aws-08-27-2023/us-east-2b_v100_1.json",
		"spot_traces_skypilot/availability/16-node/aws-08-27-2023/us-west-2a_v100_1.json",
		"spot_traces_skypilot/availability/16-node/aws-08-27-2023/us-west-2c_v100_1.json",
		"spot_traces_skypilot/availability/1-node/aws-10-26-2022/us-west-2a_k80_1.json",
		"spot_traces_skypilot/availability/1-node/aws-10-26-2022/us-west-2b_k80_1.json",
		"spot_traces_skypilot/availability/1-node/aws-10-26-2022/us-west-2a_v100_1.json",
		spotServeFile,
	} {
		files[p] = string(readEmbedded(t, p))
	}
	dir := writeTree(t, files)
	sky := filepath.Join(dir, "spot_traces_skypilot", "availability")
	for _, c := range []struct{ path, name string }{
		{filepath.Join(sky, "16-node", "aws-08-27-2023"), "skypilot-availability-aws-08-27-2023-v100_1"},
		{filepath.Join(sky, "1-node", "aws-10-26-2022", "*_k80_1.json"), "skypilot-availability-aws-10-26-2022-k80_1"},
		{filepath.Join(dir, filepath.FromSlash(spotServeFile)), "spotserve-g4dn"},
	} {
		got, err := LoadSpot(c.path)
		if err != nil {
			t.Fatal(err)
		}
		want, err := NamedSpot(c.name)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("LoadSpot(%s) differs from NamedSpot(%q): %s vs %s", c.path, c.name, got.Name, want.Name)
		}
	}
	one, err := LoadSpot(filepath.Join(sky, "1-node", "aws-10-26-2022", "us-west-2a_v100_1.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(one.Zones, []string{"us-west-2a"}) || one.Resource != "v100_1" {
		t.Errorf("single file: Zones %v Resource %q", one.Zones, one.Resource)
	}
	if _, err := LoadSpot(filepath.Join(sky, "1-node", "aws-10-26-2022")); err == nil || !strings.Contains(err.Error(), "resource") {
		t.Errorf("directory mixing k80_1 and v100_1: err = %v, want a resource error", err)
	}
}

func TestMalformed(t *testing.T) {
	const azureHead = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	const azureRow = "2023-11-16 18:17:03.9799600,4808,10\n"
	const mc = `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}` + "\n"
	const sky = `{"metadata": {"gap_seconds": 30},` + "\n"
	cases := []struct {
		name, file, content string
		spot                bool
		want                string // substring of the error
	}{
		{"azure bad number", "a.csv", azureHead + azureRow + "2023-11-16 18:17:04.0000000,abc,5\n", false, "a.csv:3: ContextTokens"},
		{"azure negative", "a.csv", azureHead + azureRow + azureRow + "2023-11-16 18:17:04.0000000,5,-1\n", false, "a.csv:4: GeneratedTokens"},
		{"azure field count", "a.csv", azureHead + azureRow + "2023-11-16 18:17:04.0000000,5\n", false, "a.csv:3:"},
		{"azure bad time", "a.csv", azureHead + "yesterday,1,2\n", false, "a.csv:2: TIMESTAMP"},
		{"azure unsorted", "a.csv", azureHead + azureRow + "2023-11-16 18:17:03.0000000,1,2\n", false, "a.csv:3: TIMESTAMP"},
		{"unknown header", "a.csv", "time,in,out\n1,2,3\n", false, "a.csv:1: unrecognized"},
		{"header only", "a.csv", azureHead, false, "a.csv: no requests"},
		{"empty", "e.csv", " \n", false, "e.csv: empty"},
		{"mooncake bad json", "m.jsonl", mc + `{"timestamp": 1, "input_length": 6` + "\n" + mc, false, "m.jsonl:2:"},
		{"mooncake missing field", "m.jsonl", mc + mc + `{"timestamp": 5, "output_length": 1}` + "\n", false, `m.jsonl:3: Mooncake JSON line: missing "input_length"`},
		{"mooncake wrong type", "m.jsonl", mc + "\n" + `{"timestamp": "5", "input_length": 1, "output_length": 1}`, false, "m.jsonl:3:"},
		{"mooncake unsorted", "m.jsonl", `{"timestamp": 9, "input_length": 1, "output_length": 1}` + "\n" + mc, false, "m.jsonl:2: timestamp 0 ms is before"},
		{"spotserve bad event", "g.csv", "0,add,node1\n60000,crash,node1\n", true, "g.csv:2: event"},
		{"spotserve remove dead", "g.csv", "0,add,node1\n60000,remove,node2\n", true, "g.csv:2: node2 removed"},
		{"spotserve unsorted", "g.csv", "60000,add,node1\n0,add,node2\n", true, "g.csv:2: time 0 ms"},
		{"spotserve bad time", "g.csv", "0,add,node1\n1.5,add,node2\n", true, "g.csv:2: time"},
		{"skypilot bad value", "availability/1-node/s/us-east-1a_v100_1.json", sky + ` "data": [1, 0, "x"]}`, true, "us-east-1a_v100_1.json:2:"},
		{"skypilot negative", "preemption/1-node/s/us-east-1a_v100_1.json", sky + ` "data": [1, -1]}`, true, "data[1] = -1"},
		{"skypilot no gap", "preemption/1-node/s/us-east-1a_v100_1.json", `{"metadata": {}, "data": [1]}`, true, "gap_seconds"},
		{"skypilot price count", "preemption/1-node/s/us-east-1a_v100_1.json", sky + ` "data": [1, 1], "prices": [1.0]}`, true, "1 prices for 2"},
		{"skypilot no kind dir", "elsewhere/us-east-1a_v100_1.json", sky + ` "data": [1]}`, true, `no "availability" or "preemption"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(writeTree(t, map[string]string{c.file: c.content}), filepath.FromSlash(c.file))
			var err error
			if c.spot {
				_, err = LoadSpot(p)
			} else {
				_, err = LoadRequests(p)
			}
			if err == nil {
				t.Fatalf("no error for %q", c.content)
			}
			// The message must name the file, with its line where one applies.
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) {
				t.Errorf("error %q, want it to name %s and contain %q", err, p, c.want)
			}
		})
	}
}

func TestMapZones(t *testing.T) {
	a9, err := NamedSpot("skypilot-availability-aws-02-15-2023-v100_1")
	if err != nil {
		t.Fatal(err)
	}
	// AZ ids as in the AWS price catalog, shuffled and with the duplicates a
	// per-instance-type column has; us-east-2 offers only one zone here.
	catalog := []string{"usw2-az3", "use1-az6", "use1-az1", "", "usw2-az1", "use2-az1", "use1-az2", "use1-az1", "usw2-az2", "use1-az4", "euc1-az1"}
	got, err := a9.MapZones(catalog)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"us-east-1a": "use1-az1", "us-east-1c": "use1-az2", "us-east-1d": "use1-az4", "us-east-1f": "use1-az6",
		"us-east-2a": "use2-az1", "us-east-2b": "use2-az1",
		"us-west-2a": "usw2-az1", "us-west-2b": "usw2-az2", "us-west-2c": "usw2-az3",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("MapZones = %v, want %v", got, want)
	}
	slices.Reverse(catalog)
	if again, _ := a9.MapZones(catalog); !reflect.DeepEqual(again, got) {
		t.Error("MapZones depends on catalog order")
	}

	// Identity wins, and a zone whose region the catalog lacks takes a zone of
	// its own country, even one already taken, before any abroad.
	gcp, err := NamedSpot("skypilot-preemption-gcp-04-30-2023-c3-88")
	if err != nil {
		t.Fatal(err)
	}
	if gcp.Cloud != "gcp" || gcp.InstanceType != "c3-highcpu-88" {
		t.Errorf("GCP trace: Cloud %q InstanceType %q", gcp.Cloud, gcp.InstanceType)
	}
	got, err = gcp.MapZones([]string{"us-central1-a", "us-central1-b", "us-central1-c", "asia-east1-a", "europe-west4-b"})
	if err != nil {
		t.Fatal(err)
	}
	want = map[string]string{"us-central1-a": "us-central1-a", "us-central1-b": "us-central1-b", "us-central1-c": "us-central1-c", "us-east1-b": "us-central1-a"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("GCP MapZones = %v, want %v", got, want)
	}

	// The AWS US trace on a GCP catalog (the simulator's case): US zones only, each
	// mapping saying which rule made it, and the continent before the rest of the world.
	ms, err := a9.ExplainZones([]string{"us-central1-a", "us-east4-c", "asia-east1-a", "europe-west4-b", "northamerica-northeast1-a", "me-west1-a"})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if !strings.HasPrefix(m.Catalog, "us-") || m.Rule != "same country" {
			t.Errorf("%v: want a US zone by the same-country rule", m)
		}
	}
	ms, err = a9.ExplainZones([]string{"northamerica-northeast1-a", "europe-west4-b"})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Catalog != "northamerica-northeast1-a" || m.Rule != "same continent" {
			t.Errorf("%v: want Montreal by the same-continent rule", m)
		}
	}
	ms, err = a9.ExplainZones([]string{"europe-west4-b", "asia-east1-a"})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if !strings.HasPrefix(m.Rule, "anywhere") {
			t.Errorf("%v: crossing continents must say so", m)
		}
	}
	for zone, want := range map[string]string{"use1-az4": "north america", "us-west-2b": "north america", "us-central1-a": "north america",
		"cac1-az1": "north america", "sae1-az1": "south america", "euc1-az2": "europe", "europe-west4-b": "europe",
		"apne2-az1": "asia pacific", "australia-southeast1-a": "asia pacific", "me-west1-a": "middle east", "afs1-az2": "africa", UnknownZone: ""} {
		if got := Geography(zone); got != want {
			t.Errorf("Geography(%q) = %q, want %q", zone, got, want)
		}
	}

	ss, err := NamedSpot("spotserve-g4dn")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := ss.MapZones([]string{"use1-az2", "use1-az1"}); got[UnknownZone] != "use1-az1" || len(got) != 1 {
		t.Errorf("SpotServe MapZones = %v, want unknown → use1-az1", got)
	}
	if _, err := ss.MapZones([]string{"", ""}); err == nil {
		t.Error("empty catalog: no error")
	}
}

func TestRegionKey(t *testing.T) {
	// Every Region / AZ-id prefix pair of the AWS price catalog in shared/data.
	for region, id := range map[string]string{
		"af-south-1": "afs1", "ap-east-1": "ape1", "ap-northeast-1": "apne1", "ap-northeast-2": "apne2",
		"ap-northeast-3": "apne3", "ap-south-1": "aps1", "ap-southeast-1": "apse1", "ap-southeast-2": "apse2",
		"ap-southeast-3": "apse3", "ca-central-1": "cac1", "eu-central-1": "euc1", "eu-north-1": "eun1",
		"eu-south-1": "eus1", "eu-west-1": "euw1", "eu-west-2": "euw2", "eu-west-3": "euw3",
		"me-central-1": "mec1", "me-south-1": "mes1", "us-east-1": "use1", "us-east-2": "use2",
		"us-west-1": "usw1", "us-west-2": "usw2",
	} {
		if a, b := regionKey(region+"b"), regionKey(id+"-az3"); a == "" || a != b {
			t.Errorf("regionKey(%sb) = %q, regionKey(%s-az3) = %q", region, a, id, b)
		}
	}
	for zone, want := range map[string]string{"us-central1-a": "gcp:us-central1", "unknown": "", "us-gov-west-1a": "", "eastus": ""} {
		if got := regionKey(zone); got != want {
			t.Errorf("regionKey(%q) = %q, want %q", zone, got, want)
		}
	}
}

func BenchmarkLoadRequests(b *testing.B) {
	for _, name := range RequestNames() {
		raw := readEmbedded(b, requestFiles()[name])
		p := filepath.Join(b.TempDir(), "trace")
		if err := os.WriteFile(p, raw, 0o644); err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				if _, err := LoadRequests(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkTile(b *testing.B) {
	for _, name := range RequestNames() {
		tr, err := NamedRequests(name)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("%s/24h", name), func(b *testing.B) {
			for b.Loop() {
				tr.Tile(24 * time.Hour)
			}
		})
	}
}
