package traces

import (
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// RequestFormat names the on-disk layout a request trace was read from.
type RequestFormat string

const (
	// FormatAzure is the Azure LLM inference trace 2023 CSV
	// (TIMESTAMP,ContextTokens,GeneratedTokens).
	FormatAzure RequestFormat = "azure-csv"
	// FormatMooncake is the Mooncake FAST'25 JSON-lines trace
	// ({"timestamp","input_length","output_length","hash_ids"}).
	FormatMooncake RequestFormat = "mooncake-jsonl"
)

// MooncakeBlockTokens is the number of prompt tokens covered by one Mooncake
// hash_ids entry. The file does not say it; the Mooncake README does
// ("block = 512 tokens"), and every line of the shipped trace satisfies
// len(hash_ids) == ceil(input_length/512).
const MooncakeBlockTokens = 512

// azureHeader is matched exactly: a different header means a different
// dataset whose columns we would silently misread.
const azureHeader = "TIMESTAMP,ContextTokens,GeneratedTokens"

// azureLayout parses "2023-11-16 18:17:03.9799600"; the trace gives no time
// zone, and only differences between timestamps are used.
const azureLayout = "2006-01-02 15:04:05.9999999"

// Request is one arrival of a request trace.
type Request struct {
	// At is the arrival offset from the first request of the file.
	At           time.Duration
	InputTokens  int
	OutputTokens int
	// PrefixBlocks are Mooncake's hash_ids: block i covers prompt tokens
	// [i*BlockTokens, (i+1)*BlockTokens); two requests whose leading ids are
	// equal share that prompt prefix. Nil for Azure, which has no prefix data.
	PrefixBlocks []uint64
}

// RequestTrace is a whole request trace in arrival order.
type RequestTrace struct {
	Name   string
	Format RequestFormat
	// Start is the wall-clock time of the first request when the file has
	// one (Azure; no time zone is given, so it is read as UTC). Zero otherwise.
	Start time.Time
	// StartOffset is the file's own timestamp of the first request when the
	// file uses relative time (Mooncake). Request.At is rebased on it so that
	// every trace, including a later slice of a Mooncake hour, starts at 0.
	StartOffset time.Duration
	Requests    []Request
	// Span is the arrival offset of the last request.
	Span time.Duration
	// Duration is the period Tile repeats the trace with. Neither dataset
	// records where its observation window ends, so it is derived, not read:
	// Span plus one mean inter-arrival gap (Span/(n-1)). That keeps the
	// trace's mean rate across copies and puts one average gap, not zero,
	// between the last request of a copy and the first of the next. Callers
	// who know the true window (the Mooncake half-hour is exactly 30 min by
	// its README) may overwrite it before calling Tile.
	Duration time.Duration
	// BlockTokens is the number of tokens per PrefixBlocks entry
	// (MooncakeBlockTokens), 0 when the trace has no prefix blocks.
	BlockTokens int
}

// LoadRequests reads an Azure CSV or Mooncake JSONL request trace, optionally
// gzip-compressed, telling the format from the content rather than from the
// file name so that renamed or compressed copies still load.
func LoadRequests(path string) (*RequestTrace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("traces: %w", err)
	}
	defer f.Close()
	t, err := readRequests(f, path)
	if err != nil {
		return nil, err
	}
	t.Name = traceBaseName(path)
	return t, nil
}

// traceBaseName strips directories and data/compression extensions.
func traceBaseName(path string) string {
	name := filepath.Base(path)
	for _, ext := range []string{".gz", ".jsonl", ".json", ".csv"} {
		name = strings.TrimSuffix(name, ext)
	}
	return name
}

// readRequests parses r; name is used only in error messages.
func readRequests(r io.Reader, name string) (*RequestTrace, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("traces: %s: %w", name, err)
		}
		defer zr.Close()
		br = bufio.NewReaderSize(zr, 64<<10)
	}
	first, err := firstByte(br)
	if err != nil {
		return nil, fmt.Errorf("traces: %s: %w", name, err)
	}
	var t *RequestTrace
	if first == '{' {
		t, err = parseMooncake(br, name)
	} else {
		t, err = parseAzure(br, name)
	}
	if err != nil {
		return nil, err
	}
	t.finish()
	return t, nil
}

// firstByte returns the first byte that is not a UTF-8 BOM or white space,
// without consuming anything but the BOM.
func firstByte(br *bufio.Reader) (byte, error) {
	if bom, _ := br.Peek(3); bytes.Equal(bom, []byte{0xEF, 0xBB, 0xBF}) {
		br.Discard(3)
	}
	for n := 1; ; n++ {
		b, err := br.Peek(n)
		if len(b) < n {
			if err == nil || errors.Is(err, io.EOF) {
				err = errors.New("empty file")
			}
			return 0, err
		}
		switch c := b[n-1]; c {
		case ' ', '\t', '\r', '\n':
		default:
			return c, nil
		}
	}
}

func parseAzure(r io.Reader, name string) (*RequestTrace, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = strings.Count(azureHeader, ",") + 1
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err != nil {
		return nil, csvErr(name, err)
	}
	if strings.Join(head, ",") != azureHeader {
		return nil, fmt.Errorf("traces: %s:1: unrecognized request trace: header %q, want Azure %q or Mooncake JSON lines",
			name, head, azureHeader)
	}
	t := &RequestTrace{Format: FormatAzure}
	var prev time.Time
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, csvErr(name, err)
		}
		line, _ := cr.FieldPos(0)
		ts, err := time.ParseInLocation(azureLayout, rec[0], time.UTC)
		if err != nil {
			return nil, fmt.Errorf("traces: %s:%d: TIMESTAMP: %w", name, line, err)
		}
		in, err := parseCount(rec[1])
		if err != nil {
			return nil, fmt.Errorf("traces: %s:%d: ContextTokens: %w", name, line, err)
		}
		out, err := parseCount(rec[2])
		if err != nil {
			return nil, fmt.Errorf("traces: %s:%d: GeneratedTokens: %w", name, line, err)
		}
		if len(t.Requests) == 0 {
			t.Start = ts
		} else if ts.Before(prev) {
			return nil, fmt.Errorf("traces: %s:%d: TIMESTAMP %s is before the previous row's %s; the trace must be in arrival order",
				name, line, rec[0], prev.Format(azureLayout))
		}
		prev = ts
		t.Requests = append(t.Requests, Request{At: ts.Sub(t.Start), InputTokens: in, OutputTokens: out})
	}
	if len(t.Requests) == 0 {
		return nil, fmt.Errorf("traces: %s: no requests after the header", name)
	}
	return t, nil
}

// csvErr keeps the line number encoding/csv found and puts it where the
// other errors of this package have it.
func csvErr(name string, err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("traces: %s:%d: %w", name, pe.Line, pe.Err)
	}
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("traces: %s: empty file", name)
	}
	return fmt.Errorf("traces: %s: %w", name, err)
}

func parseCount(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, fmt.Errorf("%d is negative", n)
	}
	return n, nil
}

// mooncakeLine uses pointers so that a missing field is an error instead of
// a silent zero.
type mooncakeLine struct {
	Timestamp    *int64   `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

func parseMooncake(r *bufio.Reader, name string) (*RequestTrace, error) {
	t := &RequestTrace{Format: FormatMooncake, BlockTokens: MooncakeBlockTokens}
	var prevMS int64
	for line := 1; ; line++ {
		raw, err := r.ReadBytes('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("traces: %s:%d: %w", name, line, err)
		}
		if trimmed := bytes.TrimSpace(raw); len(trimmed) > 0 {
			req, ms, perr := parseMooncakeLine(trimmed)
			if perr != nil {
				return nil, fmt.Errorf("traces: %s:%d: Mooncake JSON line: %w", name, line, perr)
			}
			if len(t.Requests) == 0 {
				t.StartOffset = time.Duration(ms) * time.Millisecond
			} else if ms < prevMS {
				return nil, fmt.Errorf("traces: %s:%d: timestamp %d ms is before the previous line's %d ms; the trace must be in arrival order",
					name, line, ms, prevMS)
			}
			prevMS = ms
			req.At = time.Duration(ms)*time.Millisecond - t.StartOffset
			t.Requests = append(t.Requests, req)
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	if len(t.Requests) == 0 {
		return nil, fmt.Errorf("traces: %s: no requests", name)
	}
	return t, nil
}

func parseMooncakeLine(b []byte) (Request, int64, error) {
	var l mooncakeLine
	if err := json.Unmarshal(b, &l); err != nil {
		return Request{}, 0, err
	}
	switch {
	case l.Timestamp == nil:
		return Request{}, 0, errors.New(`missing "timestamp"`)
	case l.InputLength == nil:
		return Request{}, 0, errors.New(`missing "input_length"`)
	case l.OutputLength == nil:
		return Request{}, 0, errors.New(`missing "output_length"`)
	case *l.Timestamp < 0:
		return Request{}, 0, fmt.Errorf("timestamp %d is negative", *l.Timestamp)
	case *l.Timestamp > math.MaxInt64/int64(time.Millisecond):
		return Request{}, 0, fmt.Errorf("timestamp %d ms does not fit a time.Duration", *l.Timestamp)
	case *l.InputLength < 0:
		return Request{}, 0, fmt.Errorf("input_length %d is negative", *l.InputLength)
	case *l.OutputLength < 0:
		return Request{}, 0, fmt.Errorf("output_length %d is negative", *l.OutputLength)
	}
	return Request{InputTokens: *l.InputLength, OutputTokens: *l.OutputLength, PrefixBlocks: l.HashIDs}, *l.Timestamp, nil
}

func (t *RequestTrace) finish() {
	n := len(t.Requests)
	t.Span = t.Requests[n-1].At
	t.Duration = t.Span
	if n > 1 {
		t.Duration += t.Span / time.Duration(n-1)
	}
}

// Tile repeats the trace back to back until total, for simulations longer
// than the trace (the traces cover 30-60 min, the simulations 24 h or more).
//
// Copy k (k = 0, 1, ...) is the trace shifted by k*Duration; only requests
// with At < total are kept, so the last copy is cut short. With n requests
// and q = floor(total/Duration), the result has q*n requests plus those of
// the trace with At < total - q*Duration, which is at most
// ceil(total/Duration)*n. The result is sorted by At.
//
// PrefixBlocks of copy k are shifted by k*(max id + 1): a replayed hour
// stands for other users, and reusing the ids would let copy k hit the
// prefix cache filled by copy k-1, a hit rate the data never showed. The
// cost is that prefixes shared by everyone (a system prompt) miss once per
// copy. Every request gets its own PrefixBlocks slice, so callers may
// modify the result without touching t.
//
// If Duration <= 0 (a trace of one instant) there is nothing to repeat and
// Tile returns the single copy's requests before total.
func (t *RequestTrace) Tile(total time.Duration) []Request {
	n := len(t.Requests)
	if total <= 0 || n == 0 {
		return nil
	}
	copies := 1
	if t.Duration > 0 {
		copies = int((total-1)/t.Duration) + 1
	}
	var idStride uint64
	blocksPerCopy := 0
	for _, r := range t.Requests {
		for _, id := range r.PrefixBlocks {
			idStride = max(idStride, id+1)
		}
		blocksPerCopy += len(r.PrefixBlocks)
	}
	out := make([]Request, 0, t.tiledLen(total))
	overlap := false
	for k := range copies {
		shift := time.Duration(k) * t.Duration
		idShift := uint64(k) * idStride
		var backing []uint64
		if blocksPerCopy > 0 {
			backing = make([]uint64, 0, blocksPerCopy)
		}
		for i, r := range t.Requests {
			r.At += shift
			if r.At >= total {
				break
			}
			if i == 0 && len(out) > 0 && r.At < out[len(out)-1].At {
				overlap = true
			}
			if r.PrefixBlocks != nil {
				start := len(backing)
				for _, id := range r.PrefixBlocks {
					backing = append(backing, id+idShift)
				}
				r.PrefixBlocks = backing[start:len(backing):len(backing)]
			}
			out = append(out, r)
		}
	}
	if overlap {
		// Only when a caller set Duration below Span: copies interleave.
		slices.SortStableFunc(out, func(a, b Request) int { return cmp.Compare(a.At, b.At) })
	}
	return out
}

// tiledLen is the exact length of Tile(total) when copies do not overlap and
// only a capacity hint otherwise; it lets Tile allocate once.
func (t *RequestTrace) tiledLen(total time.Duration) int {
	n := len(t.Requests)
	if t.Duration <= 0 {
		return n
	}
	q := int(total / t.Duration)
	rest := total - time.Duration(q)*t.Duration
	tail, _ := slices.BinarySearchFunc(t.Requests, rest, func(r Request, at time.Duration) int { return cmp.Compare(r.At, at) })
	return q*n + tail
}
