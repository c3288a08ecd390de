package oai

import (
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

// vLLM's UsageInfo as it serialises it; each case changes what one engine, proxy or
// attacker might.
func TestReadUsageRefusesWhatNoReplicaCanHaveCounted(t *testing.T) {
	for _, tc := range []struct {
		usage     string
		want      Usage
		detailHas string
	}{
		{`{"prompt_tokens":12,"total_tokens":17,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":8}}`, Usage{Prompt: 12, Completion: 5}, ""},
		{`{"prompt_tokens":12,"total_tokens":12,"completion_tokens":null,"prompt_tokens_details":null}`, Usage{Prompt: 12}, ""}, // embeddings
		{`{"prompt_tokens":12,"completion_tokens":5}`, Usage{Prompt: 12, Completion: 5}, ""},                                    // no total: nothing to check it by
		{`{"prompt_tokens":12,"total_tokens":17,"completion_tokens":5.0}`, Usage{Prompt: 12, Completion: 5}, ""},                // a whole number written as a float
		{`{"prompt_tokens":16777216,"total_tokens":16777216,"completion_tokens":0}`, Usage{Prompt: MaxUsageTokens}, ""},
		{`{"prompt_tokens":-100,"total_tokens":-95,"completion_tokens":5}`, Usage{Invalid: UsageNegative}, "prompt_tokens -100"},
		{`{"prompt_tokens":12,"total_tokens":11,"completion_tokens":-1}`, Usage{Invalid: UsageNegative}, "completion_tokens -1"},
		{`{"prompt_tokens":12.5,"completion_tokens":5}`, Usage{Invalid: UsageFractional}, "prompt_tokens 12.5"},
		{`{"prompt_tokens":"12","completion_tokens":5}`, Usage{Invalid: UsageNotNumber}, "prompt_tokens is a string"},
		{`{"prompt_tokens":16777217,"completion_tokens":5}`, Usage{Invalid: UsageTooLarge}, "prompt_tokens 16777217"},
		{`{"prompt_tokens":9223372036854775807,"total_tokens":-9223372036854775808,"completion_tokens":1}`, Usage{Invalid: UsageTooLarge}, "prompt_tokens"}, // int64 overflow
		{`{"prompt_tokens":1e308,"completion_tokens":1e308}`, Usage{Invalid: UsageTooLarge}, "prompt_tokens 1e308"},
		{`{"prompt_tokens":12,"total_tokens":9,"completion_tokens":5}`, Usage{Invalid: UsageInconsistent}, "total_tokens 9"}, // a proxy that subtracts cached tokens from the total
		{`{"prompt_tokens":12,"total_tokens":17,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":13}}`, Usage{Invalid: UsageInconsistent}, "cached_tokens 13"},
		{`{"prompt_tokens":12,"total_tokens":17,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":-1}}`, Usage{Invalid: UsageNegative}, "cached_tokens -1"},
		{`[12,5]`, Usage{Invalid: UsageNotObject}, "array"},
	} {
		v, err := fastjson.Parse(tc.usage)
		if err != nil {
			t.Fatal(err)
		}
		got := ReadUsage(v)
		if !strings.Contains(got.Detail, tc.detailHas) {
			t.Errorf("ReadUsage(%s).Detail = %q; want it to name %q", tc.usage, got.Detail, tc.detailHas)
		}
		got.Detail = ""
		if got != tc.want {
			t.Errorf("ReadUsage(%s) = %+v; want %+v", tc.usage, got, tc.want)
		}
	}
	// A usage that is not an object, in a stream's final chunk, is refused, not ignored: the
	// chunk is still the usage chunk (and stripped when the client did not ask for it).
	var p fastjson.Parser
	u, only, ok := ChunkUsage(&p, []byte(`{"choices":[],"usage":"lots"}`))
	if !ok || !only || u.Invalid != UsageNotObject {
		t.Errorf("ChunkUsage of a string usage = %+v %v %v", u, only, ok)
	}
	if u, ok := ResponseUsage(&p, []byte(`{"choices":[],"usage":{"prompt_tokens":-3,"completion_tokens":4}}`)); !ok || u.Invalid != UsageNegative {
		t.Errorf("ResponseUsage of a negative count = %+v %v", u, ok)
	}
}
