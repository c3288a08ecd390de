package oai

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestCheckDepth(t *testing.T) {
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
		if err := CheckDepth([]byte(tc.body), MaxDepth); (err == nil) != tc.ok {
			t.Errorf("CheckDepth(%.40q…) = %v; want ok %v", tc.body, err, tc.ok)
		}
	}
}

// FuzzCheckDepth: the scan never panics, and a body it passes parses no deeper than the
// limit (checked against encoding/json's view of nesting in valid bodies).
func FuzzCheckDepth(f *testing.F) {
	f.Add([]byte(`{"a":[1,{"b":"[{"}]}`))
	f.Add([]byte(`"\\\"["`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if CheckDepth(b, 3) != nil || !json.Valid(b) {
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
					t.Fatalf("CheckDepth passed %q, which nests %d deep", b, depth)
				}
			case json.Delim('}'), json.Delim(']'):
				depth--
			}
		}
	})
}
