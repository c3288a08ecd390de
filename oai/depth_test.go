package oai

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestScan(t *testing.T) {
	deep := strings.Repeat("[", 65) + strings.Repeat("]", 65)
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, true},
		{`{"a":"` + strings.Repeat("[", 1000) + `"}`, true},   // brackets in a string
		{`{"a":"\"` + strings.Repeat("{", 1000) + `"}`, true}, // after an escaped quote
		{`{"a":` + deep + `}`, false},
		{strings.Repeat("[", 64) + strings.Repeat("]", 64), true},
	} {
		if _, err := Scan([]byte(tc.body), MaxDepth, MaxValues); (err == nil) != tc.ok {
			t.Errorf("Scan(%.40q…) = %v; want ok %v", tc.body, err, tc.ok)
		}
	}
	wide := "[" + strings.Repeat("{},", 2000) + "{}]"
	if n, err := Scan([]byte(wide), MaxDepth, 5000); err != nil || n < 2000 || n > 4100 {
		t.Errorf("Scan of 2,001 objects: %d values, %v", n, err)
	}
	if _, err := Scan([]byte(wide), MaxDepth, 1000); err == nil {
		t.Error("2,001 objects passed a limit of 1,000 values")
	}
	if n, _ := Scan([]byte(`{"a":"x,y,z,[{"}`), MaxDepth, 10); n != 2 {
		t.Errorf("commas and brackets in a string were counted: %d values", n)
	}
}

// FuzzScan: the scan never panics, and a body it passes parses no deeper than the
// limit (checked against encoding/json's view of nesting in valid bodies).
func FuzzScan(f *testing.F) {
	f.Add([]byte(`{"a":[1,{"b":"[{"}]}`))
	f.Add([]byte(`"\\\"["`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := Scan(b, 3, MaxValues); err != nil || !json.Valid(b) {
			return
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		depth := 0
		for {
			tok, err := dec.Token()
			if err != nil {
				return
			}
			switch tok {
			case json.Delim('{'), json.Delim('['):
				if depth++; depth > 3 {
					t.Fatalf("Scan passed %q, which nests %d deep", b, depth)
				}
			case json.Delim('}'), json.Delim(']'):
				depth--
			}
		}
	})
}
