package fleet

import (
	"math"
	"strings"
	"testing"
)

func TestServiceFor(t *testing.T) {
	named := []Service{{Name: "a", Models: []string{"m1"}}, {Name: "b", Models: []string{"m2", "m1"}}}
	for _, tc := range []struct {
		services []Service
		model    string
		want     int
	}{
		{named, "m1", 0}, // the first that lists it, in the given order
		{named, "m2", 1},
		{named, "nope", -1},
		{[]Service{{Name: "only"}}, "anything", 0}, // a lone service that named no model claims it
		{[]Service{{Name: "x"}, {Name: "y"}}, "anything", -1},
		{append([]Service{{Name: "unnamed"}}, named...), "nope", -1},
		{nil, "m", -1},
	} {
		if got := ServiceFor(tc.services, tc.model); got != tc.want {
			t.Errorf("ServiceFor(%v, %q) = %d; want %d", tc.services, tc.model, got, tc.want)
		}
	}
}

func TestMixClassOf(t *testing.T) {
	for _, tc := range []struct{ in, out, p, o int }{
		{0, 0, 0, 0}, {127, 63, 0, 0}, {128, 64, 1, 1}, {2000, 300, 2, 2}, {32768, 4096, 5, 4}, {1 << 20, 1 << 20, 5, 4},
	} {
		if p, o := MixClassOf(tc.in, tc.out); p != tc.p || o != tc.o {
			t.Errorf("MixClassOf(%d, %d) = %d, %d; want %d, %d", tc.in, tc.out, p, o, tc.p, tc.o)
		}
	}
}

// A report's mix is checked like its other numbers: a cell whose class does not exist, whose
// counts are not finite or whose token means lie outside its class is refused, and says why.
func TestMixValidate(t *testing.T) {
	good := MixCell{Prompt: 2, Output: 2, Requests: 10, PromptTokens: 10 * 2000, OutputTokens: 10 * 300}
	rep := LoadReport{Router: "r", Models: []ModelLoad{{Model: "m", Requests: 10, Mix: []MixCell{good, {Prompt: 5, Output: 4, Requests: 1, PromptTokens: 100_000, OutputTokens: 5000}}}}}
	if err := rep.Validate(); err != nil {
		t.Fatalf("a good mix refused: %v", err)
	}
	for _, tc := range []struct {
		cell MixCell
		want string
	}{
		{MixCell{Prompt: 6}, "want a prompt class 0 to 5"},
		{MixCell{Output: -1}, "want a prompt class 0 to 5 and an output class 0 to 4"},
		{MixCell{Requests: math.NaN()}, "requests: NaN"},
		{MixCell{Requests: 1, PromptTokens: math.Inf(1)}, "prompt_tokens: +Inf"},
		{MixCell{Requests: -1}, "requests: -1"},
		{MixCell{Prompt: 0, Requests: 10, PromptTokens: 5000}, "prompt_tokens: 5000 over 10 requests: want a mean from 0 to 127"},
		{MixCell{Prompt: 2, Output: 2, Requests: 10, PromptTokens: 20000, OutputTokens: 100}, "output_tokens: 100 over 10 requests: want a mean from 256 to 1023"},
		{MixCell{Requests: 0, PromptTokens: 5}, "prompt_tokens: 5 over 0 requests"},
		{MixCell{Prompt: 5, Requests: 1, PromptTokens: 1 << 30}, "want a mean from 32768 to 16777216"},
	} {
		bad := rep
		bad.Models = []ModelLoad{{Model: "m", Requests: 3, Mix: []MixCell{good, tc.cell}}}
		err := bad.Validate()
		if err == nil || !strings.Contains(err.Error(), "models[0] (m): mix[1]: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v; want an error on mix[1] saying %q", tc.cell, err, tc.want)
		}
	}
	dup := LoadReport{Router: "r", Models: []ModelLoad{{Model: "m", Mix: []MixCell{good, good}}}}
	if err := dup.Validate(); err == nil || !strings.Contains(err.Error(), "class (2, 2) given twice") {
		t.Errorf("a class given twice: got %v", err)
	}
}
