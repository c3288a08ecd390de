package pricing

import (
	"compress/gzip"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"strconv"
	"strings"
	"time"
)

// record is one CSV row with what is needed to say where it came from in an error.
type record struct {
	file   string
	line   int
	fields []string
	cols   map[string]int
}

// readCSV reads name, or name+".gz" when only the compressed copy exists (the embedded
// catalogs are gzipped to keep binaries small). found is false when neither exists, so
// that a directory may hold any subset of the known files. want lists the columns the
// caller reads; a file without one of them is an error rather than a silent zero.
func readCSV(fsys fs.FS, name string, want []string) (recs []record, found bool, err error) {
	f, err := fsys.Open(name)
	gz := false
	if errors.Is(err, fs.ErrNotExist) {
		f, err = fsys.Open(name + ".gz")
		gz = true
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("open %s: %w", name, err)
	}
	defer f.Close()
	var r io.Reader = f
	if gz {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, true, fmt.Errorf("%s.gz: %w", name, err)
		}
		defer zr.Close()
		r = zr
	}
	recs, err = parseCSV(name, r, want)
	return recs, true, err
}

func parseCSV(name string, r io.Reader, want []string) ([]record, error) {
	cr := csv.NewReader(r)
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: reading header: %w", name, err)
	}
	cols := make(map[string]int, len(head))
	for i, h := range head {
		cols[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	for _, w := range want {
		if _, ok := cols[w]; !ok {
			return nil, fmt.Errorf("%s: no column %q (have %s)", name, w, strings.Join(head, ", "))
		}
	}
	var out []record
	for {
		fields, err := cr.Read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		line, _ := cr.FieldPos(0)
		out = append(out, record{file: name, line: line, fields: fields, cols: cols})
	}
}

func (r record) str(col string) string {
	return strings.TrimSpace(r.fields[r.cols[col]])
}

func (r record) errorf(col, format string, args ...any) error {
	return fmt.Errorf("%s:%d: column %s: %s", r.file, r.line, col, fmt.Sprintf(format, args...))
}

// price reads a USD amount; an empty cell is "no price" (ok false), which every source
// uses for "not offered" or "unknown".
func (r record) price(col string) (usd float64, ok bool, err error) {
	s := r.str(col)
	if s == "" {
		return 0, false, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, false, r.errorf(col, "want a price in USD/hour ≥ 0, got %q", s)
	}
	return v, true, nil
}

// number reads an optional non-negative quantity (vCPUs, GiB, GPU count); empty is 0.
func (r record) number(col string) (float64, error) {
	s := r.str(col)
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, r.errorf(col, "want a number ≥ 0, got %q", s)
	}
	return v, nil
}

// signed reads a number that may be negative: the Spot Advisor's savings are, where spot
// cost more than on-demand over its month (-62 % for one type).
func (r record) signed(col string) (float64, error) {
	s := r.str(col)
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, r.errorf(col, "want a number, got %q", s)
	}
	return v, nil
}

// wholeCount reads an accelerator count. Catalogs write "8.0"; fractional counts (Azure's
// 1/3 A10, GCP's 1/8 RTX PRO 6000) come back with ok false, because a service asks for
// whole GPUs (spec rejects fractions), so such rows can never be chosen.
func (r record) wholeCount(col string) (n int, ok bool, err error) {
	v, err := r.number(col)
	if err != nil {
		return 0, false, err
	}
	if v < 1 || v != math.Trunc(v) || v > 1<<16 {
		return 0, false, nil
	}
	return int(v), true, nil
}

// when reads a timestamp. The logs write RFC 3339 with offsets; the p5 tracker writes
// naive UTC times and, in placeholder rows, bare dates.
func (r record) when(col string) (time.Time, error) {
	s := r.str(col)
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, r.errorf(col, "want an ISO-8601 time, got %q", s)
}
