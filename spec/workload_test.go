package spec

import (
	"strings"
	"testing"
)

// arbiter.workload is the request mix to expect before any traffic: both lengths, positive,
// bounded, and together within the model's context where the spec names a known model.
func TestWorkload(t *testing.T) {
	s := mustParse(t, minimal+"arbiter:\n  model: meta-llama/Llama-3.1-8B-Instruct\n  workload: {prompt_tokens: 2000, output_tokens: 300}\n")
	if s.Arbiter.Workload != (Workload{PromptTokens: 2000, OutputTokens: 300}) {
		t.Errorf("Workload = %+v", s.Arbiter.Workload)
	}
	if w := mustParse(t, minimal).Arbiter.Workload; w != (Workload{}) {
		t.Errorf("no workload given: %+v; want none", w)
	}
	checkRoundTrip(t, []byte(minimal+"arbiter:\n  workload: {prompt_tokens: 2000, output_tokens: 300}\n"))
	// Unknown model: only the absolute bound applies.
	mustParse(t, minimal+"arbiter:\n  model: my-own-model\n  workload: {prompt_tokens: 1000000, output_tokens: 300}\n")
	for _, c := range []struct {
		src       string
		line, col int
		msg       string
	}{
		{"arbiter:\n  workload: {prompt_tokens: 0, output_tokens: 300}\n", 5, 29, "arbiter.workload.prompt_tokens: want a number of tokens from 1 to 16777216, got 0"},
		{"arbiter:\n  workload: {prompt_tokens: 200, output_tokens: -3}\n", 5, 49, "arbiter.workload.output_tokens: want a number of tokens from 1 to 16777216, got -3"},
		{"arbiter:\n  workload: {prompt_tokens: 2.5, output_tokens: 3}\n", 5, 29, "arbiter.workload.prompt_tokens: want a number of tokens"},
		{"arbiter:\n  workload: {prompt_tokens: 100000000, output_tokens: 3}\n", 5, 29, "got 100000000"},
		{"arbiter:\n  workload: {prompt_tokens: 2000}\n", 5, 13, "arbiter.workload: give both prompt_tokens and output_tokens"},
		{"arbiter:\n  workload: {prompt: 2000, output_tokens: 5}\n", 5, 14, `unknown key "prompt" in arbiter.workload; allowed: prompt_tokens, output_tokens`},
		{"arbiter:\n  workload: 2000\n", 5, 13, "arbiter.workload: want a mapping"},
		{"arbiter:\n  model: meta-llama/Llama-2-7b-hf\n  workload: {prompt_tokens: 4000, output_tokens: 300}\n", 6, 13, "arbiter.workload: 4000 prompt plus 300 output tokens exceed llama-2-7b's context of 4096 tokens"},
		{"arbiter:\n  profile: h100-llama-2-7b\n  workload:\n    prompt_tokens: 4000\n    output_tokens: 300\n", 7, 5, "exceed llama-2-7b's context of 4096 tokens"},
	} {
		errs := parseErrors(t, minimal+c.src)
		found := false
		for _, e := range errs {
			if e.Line == c.line && e.Column == c.col && strings.Contains(e.Msg, c.msg) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: got %v; want at %d:%d %q", c.src, errs, c.line, c.col, c.msg)
		}
	}
}
