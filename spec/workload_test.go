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

// Offers rank in the order the user wrote: ordered candidates (by place and accelerator),
// a list of accelerators; a set or any_of states no order.
func TestPreference(t *testing.T) {
	ordered := mustParse(t, minimal+"resources:\n  ordered:\n    - {infra: aws/us-east-1, accelerators: H100}\n    - {infra: aws/us-west-2, accelerators: H100}\n    - {accelerators: A100:2}\n").Resources
	list := mustParse(t, minimal+"resources:\n  accelerators: [L4, A10G, H100]\n").Resources
	set := mustParse(t, minimal+"resources:\n  accelerators: {L4: 1, H100: 1}\n").Resources
	for _, c := range []struct {
		r                     Resources
		provider, region, acc string
		count, want           int
	}{
		{ordered, "aws", "us-east-1", "H100", 1, 0},
		{ordered, "aws", "us-west-2", "H100", 1, perCandidate},
		{ordered, "aws", "eu-west-1", "A100", 2, 2 * perCandidate},
		{ordered, "sim", "x", "H100", 1, 0}, // a place no candidate names: by accelerator
		{ordered, "aws", "us-east-1", "L4", 1, 3 * perCandidate},
		{list, "aws", "r", "L4", 1, 0},
		{list, "aws", "r", "A10G", 1, 1},
		{list, "aws", "r", "h100", 1, 2},
		{set, "aws", "r", "H100", 1, 0},
		{set, "aws", "r", "L4", 1, 0},
	} {
		if got := c.r.Preference(c.provider, c.region, "", "", c.acc, c.count); got != c.want {
			t.Errorf("Preference(%s/%s, %s:%d) = %d; want %d", c.provider, c.region, c.acc, c.count, got, c.want)
		}
	}
}
