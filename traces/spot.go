package traces

import (
	"bytes"
	"cmp"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SpotSeries says what the per-zone counts of a SpotTrace measure; the two
// SkyPilot trace families look alike on disk but mean different things.
type SpotSeries string

const (
	// SeriesAvailability counts spot instances that could have been obtained
	// (SkyPilot "availability" traces: probes, nothing was kept running).
	SeriesAvailability SpotSeries = "availability"
	// SeriesRunning counts spot instances that were actually running
	// (SkyPilot "preemption" traces, SpotServe): a drop is a preemption.
	SeriesRunning SpotSeries = "running"
)

// EventKind is the kind of a SpotEvent.
type EventKind string

const (
	// KindPreempted: running instances were taken away (SeriesRunning).
	KindPreempted EventKind = "preempted"
	// KindAcquired: running instances were obtained (SeriesRunning).
	KindAcquired EventKind = "acquired"
	// KindUnavailable: fewer instances could be obtained (SeriesAvailability).
	KindUnavailable EventKind = "unavailable"
	// KindAvailable: more instances could be obtained (SeriesAvailability).
	KindAvailable EventKind = "available"
)

// UnknownZone is the zone of traces whose file records none (SpotServe).
const UnknownZone = "unknown"

// SpotEvent is one change of a zone's count.
type SpotEvent struct {
	// At is when the new count was first observed, from the trace start. For
	// tick traces the change happened in (At-Step, At].
	At   time.Duration
	Zone string
	Kind EventKind
	// Delta is how many instances were lost or gained (always > 0). A tick
	// trace reports a drop from 16 to 6 as one event with Delta 10.
	Delta int
	// Count is the zone's count after the event.
	Count int
	// Node is SpotServe's node id ("node17"); empty for SkyPilot traces.
	Node string
}

// SpotTrace is a spot availability or preemption trace for one instance type
// over one or more zones that share a time base.
type SpotTrace struct {
	Name string
	// Source is "skypilot" or "spotserve".
	Source string
	// Cloud is "aws" or "gcp".
	Cloud  string
	Series SpotSeries
	// Resource is the file's resource tag: "v100_1", "c3-88", "g4dn", ...
	Resource string
	// InstanceType is the instance type the resource tag stands for per the
	// source READMEs ("p3.2xlarge"), empty where they do not pin one down
	// (k80_*: upstream names p2 sizes that AWS never sold; g4dn: the size
	// is not in the file).
	InstanceType string
	// Zones are sorted.
	Zones []string
	// Step is the sampling interval: gap_seconds for SkyPilot; for SpotServe
	// the greatest common divisor of the event times (60 s in g4dn.csv).
	Step time.Duration
	// Duration is the end of the longest zone; see ZoneEnd for one zone.
	Duration time.Duration
	// MaxCount is the largest count seen in any zone (1, 4, 16, 24...).
	MaxCount int

	zones  map[string]*zoneSeries
	events []SpotEvent // sorted by At, then zone order, then file order
}

// zoneSeries is a step function kept as change points, not ticks: the traces
// change value a few hundred times over up to 20,000 ticks, and SpotServe's
// events have no tick grid to expand onto.
type zoneSeries struct {
	at     []time.Duration // at[0] == 0, strictly increasing
	count  []int           // count[i] holds on [at[i], at[i+1])
	end    time.Duration   // data covers [0, end)
	prices []float64       // per Step tick, nil when the file has none
}

func (z *zoneSeries) valueAt(at time.Duration) int {
	i, found := slices.BinarySearch(z.at, at)
	if !found {
		i--
	}
	return z.count[i]
}

// Available reports the zone's count at time at: instances obtainable for
// SeriesAvailability, instances running for SeriesRunning. ok is false when
// the trace has no such zone or at is outside [0, ZoneEnd(zone)): zones of a
// set can end at different times and nothing is known after that.
func (t *SpotTrace) Available(zone string, at time.Duration) (n int, ok bool) {
	z := t.zones[zone]
	if z == nil || at < 0 || at >= z.end {
		return 0, false
	}
	return z.valueAt(at), true
}

// ZoneEnd is the end of the zone's data, 0 for an unknown zone.
func (t *SpotTrace) ZoneEnd(zone string) time.Duration {
	if z := t.zones[zone]; z != nil {
		return z.end
	}
	return 0
}

// End is how long the trace's longest zone series runs.
func (t *SpotTrace) End() time.Duration {
	var end time.Duration
	for _, z := range t.zones {
		end = max(end, z.end)
	}
	return end
}

// Price is the spot price in USD/hour at time at, for the SkyPilot files that
// carry a "prices" series; ok is false elsewhere.
func (t *SpotTrace) Price(zone string, at time.Duration) (usdPerHour float64, ok bool) {
	z := t.zones[zone]
	if z == nil || z.prices == nil || at < 0 || at >= z.end {
		return 0, false
	}
	return z.prices[at/t.Step], true
}

// Events returns all count changes with from <= At < to, in time order.
func (t *SpotTrace) Events(from, to time.Duration) []SpotEvent {
	lo, _ := slices.BinarySearchFunc(t.events, from, eventAtCmp)
	hi, _ := slices.BinarySearchFunc(t.events, to, eventAtCmp)
	if hi <= lo {
		return nil
	}
	return slices.Clone(t.events[lo:hi])
}

// Preemptions returns the KindPreempted events with from <= At < to. It is
// empty for SeriesAvailability traces: a drop in obtainable capacity is not
// an observed preemption, and whether it preempts what a simulated fleet
// holds depends on how much it holds, which only the simulator knows; use
// Available or Events for those traces.
func (t *SpotTrace) Preemptions(from, to time.Duration) []SpotEvent {
	var out []SpotEvent
	for _, e := range t.Events(from, to) {
		if e.Kind == KindPreempted {
			out = append(out, e)
		}
	}
	return out
}

func eventAtCmp(e SpotEvent, at time.Duration) int { return cmp.Compare(e.At, at) }

// LoadSpot reads a spot trace from path, which is one of:
//   - a SkyPilot JSON file (one zone);
//   - a directory of SkyPilot JSON files of one set and one resource, e.g.
//     availability/1-node/aws-02-15-2023 (nine zones);
//   - a glob of such files, for sets that mix resources, e.g.
//     availability/1-node/aws-10-26-2022/*_k80_1.json;
//   - the SpotServe CSV (g4dn.csv).
//
// A SkyPilot file does not say whether it is an availability or a preemption
// trace, so its path must contain an "availability" or "preemption"
// directory as the upstream layout does.
func LoadSpot(p string) (*SpotTrace, error) {
	var files []string
	if strings.ContainsAny(p, "*?[") {
		m, err := filepath.Glob(p)
		if err != nil {
			return nil, fmt.Errorf("traces: %s: %w", p, err)
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("traces: %s: no files match", p)
		}
		files = m
	} else {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("traces: %w", err)
		}
		if !st.IsDir() {
			files = []string{p}
		} else {
			m, err := filepath.Glob(filepath.Join(p, "*.json"))
			if err != nil {
				return nil, fmt.Errorf("traces: %s: %w", p, err)
			}
			if len(m) == 0 {
				return nil, fmt.Errorf("traces: %s: no SkyPilot *.json files in directory", p)
			}
			files = m
		}
	}
	slashed := make([]string, len(files))
	for i, f := range files {
		slashed[i] = filepath.ToSlash(f)
	}
	return loadSpotFiles(func(name string) ([]byte, error) { return os.ReadFile(filepath.FromSlash(name)) }, slashed)
}

// loadSpotFiles loads slash-separated paths through readFile, so that the
// embedded copies and files on disk share one code path.
func loadSpotFiles(readFile func(string) ([]byte, error), files []string) (*SpotTrace, error) {
	files = slices.Clone(files)
	slices.Sort(files)
	contents := make([][]byte, len(files))
	for i, f := range files {
		b, err := readFile(f)
		if err != nil {
			return nil, fmt.Errorf("traces: %w", err)
		}
		contents[i] = b
	}
	if len(files) == 1 && !looksLikeJSON(contents[0]) {
		return parseSpotServe(contents[0], files[0])
	}
	return parseSkyPilot(contents, files)
}

func looksLikeJSON(b []byte) bool {
	b = bytes.TrimLeft(bytes.TrimPrefix(b, []byte{0xEF, 0xBB, 0xBF}), " \t\r\n")
	return len(b) > 0 && b[0] == '{'
}

type skypilotFile struct {
	Metadata struct {
		GapSeconds *int64 `json:"gap_seconds"`
	} `json:"metadata"`
	Data   []int     `json:"data"`
	Prices []float64 `json:"prices"`
}

// skypilotName splits ".../<availability|preemption>/<n>-node/<set>/<zone>_<resource>.json".
func skypilotName(file string) (series SpotSeries, set, zone, resource string, err error) {
	dir, base := path.Split(file)
	stem, ok := strings.CutSuffix(base, ".json")
	if !ok {
		return "", "", "", "", errors.New("not a .json file")
	}
	zone, resource, ok = strings.Cut(stem, "_")
	if !ok || zone == "" || resource == "" {
		return "", "", "", "", fmt.Errorf("file name %q is not <zone>_<resource>.json", base)
	}
	parts := strings.Split(strings.TrimSuffix(dir, "/"), "/")
	set = parts[len(parts)-1]
	for _, d := range slices.Backward(parts) {
		switch d {
		case "availability":
			return SeriesAvailability, set, zone, resource, nil
		case "preemption":
			return SeriesRunning, set, zone, resource, nil
		}
	}
	return "", "", "", "", errors.New(`path has no "availability" or "preemption" directory, so the meaning of its counts is unknown`)
}

func parseSkyPilot(contents [][]byte, files []string) (*SpotTrace, error) {
	t := &SpotTrace{Source: "skypilot", zones: make(map[string]*zoneSeries)}
	var set string
	for i, f := range files {
		series, fset, zone, resource, err := skypilotName(f)
		if err != nil {
			return nil, fmt.Errorf("traces: %s: %w", f, err)
		}
		var raw skypilotFile
		if err := json.Unmarshal(contents[i], &raw); err != nil {
			return nil, jsonErr(f, contents[i], err)
		}
		if raw.Metadata.GapSeconds == nil {
			return nil, fmt.Errorf("traces: %s: missing metadata.gap_seconds", f)
		}
		gap := *raw.Metadata.GapSeconds
		if gap <= 0 || gap > int64(time.Hour*24/time.Second) {
			return nil, fmt.Errorf("traces: %s: metadata.gap_seconds = %d, want 1 to 86400", f, gap)
		}
		step := time.Duration(gap) * time.Second
		if i == 0 {
			t.Series, t.Resource, t.Step, set = series, resource, step, fset
		}
		// Zones are only comparable tick by tick within one set of one resource.
		switch {
		case series != t.Series:
			return nil, fmt.Errorf("traces: %s: %s trace mixed with %s traces", f, series, t.Series)
		case fset != set:
			return nil, fmt.Errorf("traces: %s: set %q mixed with set %q; sets have different start times", f, fset, set)
		case resource != t.Resource:
			return nil, fmt.Errorf("traces: %s: resource %q mixed with %q; load one resource at a time (a glob like *_%s.json)", f, resource, t.Resource, t.Resource)
		case step != t.Step:
			return nil, fmt.Errorf("traces: %s: gap_seconds %d differs from %v of the other files", f, gap, t.Step)
		case t.zones[zone] != nil:
			return nil, fmt.Errorf("traces: %s: zone %s loaded twice", f, zone)
		}
		if len(raw.Data) == 0 {
			return nil, fmt.Errorf("traces: %s: empty data", f)
		}
		if raw.Prices != nil && len(raw.Prices) != len(raw.Data) {
			return nil, fmt.Errorf("traces: %s: %d prices for %d data ticks", f, len(raw.Prices), len(raw.Data))
		}
		z := &zoneSeries{end: time.Duration(len(raw.Data)) * step, prices: raw.Prices}
		for j, v := range raw.Data {
			if v < 0 {
				return nil, fmt.Errorf("traces: %s: data[%d] = %d is negative", f, j, v)
			}
			if j < len(raw.Prices) && raw.Prices[j] < 0 {
				return nil, fmt.Errorf("traces: %s: prices[%d] = %v is negative", f, j, raw.Prices[j])
			}
			t.MaxCount = max(t.MaxCount, v)
			if j > 0 && v == raw.Data[j-1] {
				continue
			}
			at := time.Duration(j) * step
			z.at = append(z.at, at)
			z.count = append(z.count, v)
			if j > 0 {
				t.events = append(t.events, changeEvent(t.Series, zone, at, raw.Data[j-1], v))
			}
		}
		t.zones[zone] = z
		t.Zones = append(t.Zones, zone)
		t.Duration = max(t.Duration, z.end)
	}
	slices.Sort(t.Zones)
	// Stable, so equal times keep file order; files were sorted by path,
	// hence by zone.
	slices.SortStableFunc(t.events, func(a, b SpotEvent) int { return cmp.Compare(a.At, b.At) })
	t.Name = "skypilot-" + skypilotDirKind(t.Series) + "-" + set + "-" + t.Resource
	t.Cloud, _, _ = strings.Cut(set, "-")
	t.InstanceType = skypilotInstanceType(t.Resource)
	return t, nil
}

// skypilotInstanceType follows the resource table of the spot-traces README.
func skypilotInstanceType(resource string) string {
	switch resource {
	case "v100_1":
		return "p3.2xlarge"
	case "v100_8":
		return "p3.16xlarge"
	case "intel_64":
		return "r5.16xlarge"
	case "c3-88":
		return "c3-highcpu-88"
	}
	return ""
}

// skypilotDirKind maps back to the upstream directory name, which names use.
func skypilotDirKind(s SpotSeries) string {
	if s == SeriesAvailability {
		return "availability"
	}
	return "preemption"
}

func changeEvent(series SpotSeries, zone string, at time.Duration, from, to int) SpotEvent {
	e := SpotEvent{At: at, Zone: zone, Count: to}
	up := to > from
	if up {
		e.Delta = to - from
	} else {
		e.Delta = from - to
	}
	switch {
	case series == SeriesAvailability && up:
		e.Kind = KindAvailable
	case series == SeriesAvailability:
		e.Kind = KindUnavailable
	case up:
		e.Kind = KindAcquired
	default:
		e.Kind = KindPreempted
	}
	return e
}

// jsonErr turns encoding/json's byte offset into file:line:col.
func jsonErr(name string, data []byte, err error) error {
	var off int64 = -1
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		off = se.Offset
	case errors.As(err, &te):
		off = te.Offset
	}
	if off < 0 || off > int64(len(data)) {
		return fmt.Errorf("traces: %s: %w", name, err)
	}
	before := data[:off]
	line := bytes.Count(before, []byte{'\n'}) + 1
	col := int(off) - bytes.LastIndexByte(before, '\n')
	return fmt.Errorf("traces: %s:%d:%d: %w", name, line, col, err)
}

// parseSpotServe reads "time_ms,add|remove,node" rows (no header).
func parseSpotServe(content []byte, file string) (*SpotTrace, error) {
	cr := csv.NewReader(bytes.NewReader(content))
	cr.FieldsPerRecord = 3
	base := path.Base(file)
	t := &SpotTrace{
		Name:     "spotserve-" + strings.TrimSuffix(base, path.Ext(base)),
		Source:   "spotserve",
		Cloud:    "aws", // SpotServe's README: a trace of AWS g4dn instances
		Series:   SeriesRunning,
		Resource: strings.TrimSuffix(base, path.Ext(base)),
		Zones:    []string{UnknownZone},
	}
	alive := make(map[string]bool)
	z := &zoneSeries{at: []time.Duration{0}, count: []int{0}}
	var step time.Duration
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return nil, fmt.Errorf("traces: %s:%d: %w", file, pe.Line, pe.Err)
			}
			return nil, fmt.Errorf("traces: %s: %w", file, err)
		}
		line, _ := cr.FieldPos(0)
		ms, err := strconv.ParseInt(rec[0], 10, 64)
		if err != nil || ms < 0 || ms > int64(time.Duration(1<<62)/time.Millisecond) {
			return nil, fmt.Errorf("traces: %s:%d: time %q is not a non-negative millisecond count", file, line, rec[0])
		}
		at := time.Duration(ms) * time.Millisecond
		last := len(t.events) - 1
		if last >= 0 && at < t.events[last].At {
			return nil, fmt.Errorf("traces: %s:%d: time %d ms is before the previous row's; events must be in time order", file, line, ms)
		}
		node := rec[2]
		if node == "" {
			return nil, fmt.Errorf("traces: %s:%d: empty node id", file, line)
		}
		n := z.count[len(z.count)-1]
		var kind EventKind
		switch rec[1] {
		case "add":
			if alive[node] {
				return nil, fmt.Errorf("traces: %s:%d: %s added while already alive", file, line, node)
			}
			alive[node] = true
			kind, n = KindAcquired, n+1
		case "remove":
			if !alive[node] {
				return nil, fmt.Errorf("traces: %s:%d: %s removed while not alive", file, line, node)
			}
			delete(alive, node)
			kind, n = KindPreempted, n-1
		default:
			return nil, fmt.Errorf("traces: %s:%d: event %q, want add or remove", file, line, rec[1])
		}
		t.events = append(t.events, SpotEvent{At: at, Zone: UnknownZone, Kind: kind, Delta: 1, Count: n, Node: node})
		t.MaxCount = max(t.MaxCount, n)
		if z.at[len(z.at)-1] == at {
			z.count[len(z.count)-1] = n
		} else {
			z.at = append(z.at, at)
			z.count = append(z.count, n)
		}
		step = gcd(step, at)
	}
	if len(t.events) == 0 {
		return nil, fmt.Errorf("traces: %s: no events", file)
	}
	if step == 0 {
		step = time.Millisecond // every event at 0: the file's unit is all we know
	}
	t.Step = step
	// The file ends with its last event; the state it leaves holds for at
	// least the trace's resolution, so coverage runs one Step past it, the
	// way a tick trace of n ticks covers n*gap.
	z.end = t.events[len(t.events)-1].At + step
	t.Duration = z.end
	t.zones = map[string]*zoneSeries{UnknownZone: z}
	return t, nil
}

func gcd(a, b time.Duration) time.Duration {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
