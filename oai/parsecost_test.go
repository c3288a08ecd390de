package oai

import (
	"runtime"
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

// parseAlloc is what parsing body with a fresh parser (as the router parses large bodies)
// allocates, in bytes.
func parseAlloc(t *testing.T, body []byte, kind Kind) int64 {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := Parse(&fastjson.Parser{}, body, kind); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	return int64(after.TotalAlloc - before.TotalAlloc)
}

// The router budgets large parses by ParseCost: it must cover what a parse takes (or the
// budget bounds nothing), without asking far more (or it refuses bodies it could parse).
func TestParseCostCoversWhatAParseTakes(t *testing.T) {
	head := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"`
	list := func(n int, elem string) string {
		return `{"model":"m","messages":[{"role":"user","content":"hi"}],"x":[` + strings.TrimSuffix(strings.Repeat(elem+",", n), ",") + "]}"
	}
	for _, c := range []struct{ name, body string }{
		{"a 7 MiB prompt", head + strings.Repeat("x", 7<<20) + `"}]}`},
		{"500,000 numbers", list(500_000, "1")},
		{"250,000 empty objects", list(250_000, "{}")},
		{"200,000 short strings", list(200_000, `"abcdefgh"`)},
		{"100,000 token ids as a prompt", `{"model":"m","prompt":[` + strings.TrimSuffix(strings.Repeat("128000,", 100_000), ",") + "]}"},
	} {
		body := []byte(c.body)
		kind := Chat
		if strings.Contains(c.body, `"prompt"`) {
			kind = Completion
		}
		values, err := Scan(body, MaxDepth, MaxValues)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, est := parseAlloc(t, body, kind), ParseCost(len(body), values)
		t.Logf("%s: %d bytes, %d values: parse took %.1f MiB, estimated %.1f MiB (%.2f×)", c.name, len(body), values, float64(got)/(1<<20), float64(est)/(1<<20), float64(est)/float64(got))
		if est < got || est > 5*got/2 {
			t.Errorf("%s: ParseCost %d for a parse that took %d bytes; want between 1× and 2.5× of it", c.name, est, got)
		}
	}
}
