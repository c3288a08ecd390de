package oai

import (
	"fmt"
	"math"

	"github.com/valyala/fastjson"
)

// Usage is the token count a response reports. Invalid, when not empty, is why its
// numbers cannot be trusted (one of the Usage* reasons; Detail says which number and what
// it was): Prompt and Completion are then 0, and the router counts nothing from it.
type Usage struct {
	Prompt, Completion int
	// AudioSeconds is a transcription's usage: vLLM's TranscriptionUsageAudio
	// ({"type":"duration","seconds":N}), which counts no tokens.
	AudioSeconds    int
	Invalid, Detail string
}

// MaxUsageTokens bounds each count a usage object may report for one request: 2^24,
// 16,777,216 tokens. The longest context any model served by vLLM has is Llama 4 Scout's
// 10 million tokens (Meta's announcement; vLLM serves it with up to 3.6M on 8×H200,
// https://blog.vllm.ai/2025/04/05/llama4.html), and no request's prompt, output or cached prefix can exceed its model's
// context; a count past 2^24 is a corrupt report, an overflow or a lie. Two such counts
// sum to 2^25, so no total a router keeps in an int64 (or a float64 counter, exact to 2^53)
// can overflow from one report, nor from 2^38 of them.
const MaxUsageTokens = 1 << 24

var usageKey = []byte(`"usage"`)

// Reasons a usage object is refused: the values of Usage.Invalid, and the reason label of
// the router's count of refused reports.
const (
	UsageNotObject    = "not_an_object" // usage is a string, a number, a list
	UsageNotNumber    = "not_a_number"  // a count is a string, a list, true
	UsageNegative     = "negative"      // a count below 0
	UsageFractional   = "fractional"    // a count that is not a whole number
	UsageTooLarge     = "too_large"     // a count above MaxUsageTokens
	UsageInconsistent = "inconsistent"  // total ≠ prompt + completion, or cached > prompt
)

// ReadUsage checks and reads an OpenAI usage object, as vLLM writes it (UsageInfo:
// prompt_tokens, total_tokens, completion_tokens, prompt_tokens_details.cached_tokens).
// Every count present must be a whole number from 0 to MaxUsageTokens; total_tokens, when
// present, must be prompt_tokens + completion_tokens (OpenAI's definition, which vLLM
// and the other engines keep), and cached_tokens at most prompt_tokens. A missing or null
// count is 0, as vLLM's defaults are. Any failure refuses the whole object: a replica that
// miscounts one number cannot be trusted with the others.
func ReadUsage(v *fastjson.Value) Usage {
	if v.Type() != fastjson.TypeObject {
		return Usage{Invalid: UsageNotObject, Detail: fmt.Sprintf("usage is a %s, not an object", v.Type())}
	}
	var bad Usage
	count := func(v *fastjson.Value, name string) (n int, present bool) {
		if bad.Invalid != "" || v == nil || v.Type() == fastjson.TypeNull {
			return 0, false
		}
		if v.Type() != fastjson.TypeNumber {
			bad = Usage{Invalid: UsageNotNumber, Detail: fmt.Sprintf("%s is a %s, not a number", name, v.Type())}
			return 0, false
		}
		f, err := v.Float64()
		switch {
		case err != nil || math.IsNaN(f):
			bad = Usage{Invalid: UsageNotNumber, Detail: fmt.Sprintf("%s %s is not a number", name, v)}
		case f < 0:
			bad = Usage{Invalid: UsageNegative, Detail: fmt.Sprintf("%s %s is negative", name, v)}
		case f > MaxUsageTokens:
			bad = Usage{Invalid: UsageTooLarge, Detail: fmt.Sprintf("%s %s is over %d, more than any model's context", name, v, MaxUsageTokens)}
		case f != math.Trunc(f):
			bad = Usage{Invalid: UsageFractional, Detail: fmt.Sprintf("%s %s is not a whole number", name, v)}
		default:
			return int(f), true
		}
		return 0, false
	}
	// The Responses API names them input_tokens, output_tokens and input_tokens_details
	// (vLLM's ResponseUsage); a usage object has one set or the other.
	promptKey, completionKey, detailsKey := "prompt_tokens", "completion_tokens", "prompt_tokens_details"
	if v.Get("input_tokens") != nil || v.Get("output_tokens") != nil {
		promptKey, completionKey, detailsKey = "input_tokens", "output_tokens", "input_tokens_details"
	}
	if t := v.Get("type"); t != nil && string(t.GetStringBytes()) == "duration" {
		secs, _ := count(v.Get("seconds"), "seconds")
		if bad.Invalid != "" {
			return bad
		}
		return Usage{AudioSeconds: secs}
	}
	prompt, hasPrompt := count(v.Get(promptKey), promptKey)
	completion, hasCompletion := count(v.Get(completionKey), completionKey)
	total, hasTotal := count(v.Get("total_tokens"), "total_tokens")
	if hasTotal && !hasPrompt && !hasCompletion {
		// A rerank's usage is total_tokens alone (vLLM's RerankUsage, after Jina's): all
		// of them prompt tokens, since a rerank generates none.
		prompt = total
	}
	var cached int
	var hasCached bool
	if d := v.Get(detailsKey); d != nil && d.Type() == fastjson.TypeObject {
		cached, hasCached = count(d.Get("cached_tokens"), detailsKey+".cached_tokens")
	}
	switch {
	case bad.Invalid != "":
		return bad
	case hasTotal && total != prompt+completion:
		return Usage{Invalid: UsageInconsistent, Detail: fmt.Sprintf("total_tokens %d is not %s %d + %s %d", total, promptKey, prompt, completionKey, completion)}
	case hasCached && cached > prompt:
		return Usage{Invalid: UsageInconsistent, Detail: fmt.Sprintf("cached_tokens %d is more than %s %d", cached, promptKey, prompt)}
	}
	return Usage{Prompt: prompt, Completion: completion}
}
