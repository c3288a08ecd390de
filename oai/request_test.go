package oai

import (
	"errors"
	"slices"
	"testing"

	"github.com/valyala/fastjson"
)

func TestParse(t *testing.T) {
	var p fastjson.Parser
	r, err := Parse(&p, []byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":7,
		"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}]}`), Chat)
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "m" || !r.Stream || !r.IncludeUsage || !r.HasStreamOptions || r.MaxTokens != 7 || r.Prompt != "be brief\nhi" || r.Messages != 2 {
		t.Fatalf("parsed %+v", r)
	}
	r, err = Parse(&p, []byte(`{"model":"m","prompt":["a","b"],"max_completion_tokens":3}`), Completion)
	if err != nil || r.Prompt != "a\nb" || r.MaxTokens != 3 {
		t.Fatalf("completion: %+v %v", r, err)
	}
	r, err = Parse(&p, []byte(`{"model":"m","input":[[1,2,3],[40000]]}`), Embedding)
	if err != nil || r.Prompt != "" || !slices.Equal(r.TokenIDs, []int{1, 2, 3, 40000}) {
		t.Fatalf("embedding token ids: %+v %v", r, err)
	}
	r, err = Parse(&p, []byte(`{"model":"m","prompt":[7,8]}`), Completion)
	if err != nil || !slices.Equal(r.TokenIDs, []int{7, 8}) {
		t.Fatalf("completion token ids: %+v %v", r, err)
	}
	r, err = Parse(&p, []byte(`{"prompt":"x"}`), Completion)
	if err != nil || r.Model != "" {
		t.Fatalf("a missing model must parse as empty (vLLM serves its default): %+v %v", r, err)
	}
	r, err = Parse(&p, []byte(`{"model":"m","prompt":"x","cache_salt":"c2FsdC1h"}`), Completion)
	if err != nil || r.CacheSalt != "c2FsdC1h" {
		t.Fatalf("cache_salt: %+v %v", r, err)
	}
}

func TestParseRejects(t *testing.T) {
	var p fastjson.Parser
	for body, kind := range map[string]Kind{
		`not json`:                                   Chat,
		`[]`:                                         Chat,
		`{"messages":[]}`:                            Chat,
		`{"model":1,"messages":[]}`:                  Chat,
		`{"model":"m"}`:                              Chat,
		`{"model":"m","prompt":[1,"a"]}`:             Completion,
		`{"model":"m","prompt":["a",1]}`:             Completion,
		`{"model":"m","prompt":[[1],[]]}`:            Completion,
		`{"model":"m","prompt":[-1]}`:                Completion,
		`{"model":"m","prompt":[1.5]}`:               Completion,
		`{"model":"m","prompt":[{}]}`:                Completion,
		`{"model":"m","prompt":null}`:                Completion,
		`{"model":"m","messages":"x"}`:               Chat,
		`{"model":"m","messages":[1]}`:               Chat,
		`{"model":"m","messages":[{"content":"x"}]}`: Chat,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":-1}`:    Chat,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":1}`: Chat,
		`{"model":"m","n":1}`:                        Completion,
		`{"model":"m","prompt":[]}`:                  Completion,
		`{"model":"m","input":{}}`:                   Embedding,
		`{"model":"m","prompt":"x","cache_salt":""}`: Completion,
		`{"model":"m","prompt":"x","cache_salt":7}`:  Completion,
	} {
		if _, err := Parse(&p, []byte(body), kind); !errors.Is(err, ErrBadRequest) {
			t.Errorf("Parse(%s) = %v, want ErrBadRequest", body, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`), uint8(0))
	f.Add([]byte(`{"model":"m","prompt":"x","max_tokens":5}`), uint8(1))
	f.Add([]byte(`{"model":"m","input":["a",[1,2]]}`), uint8(2))
	f.Fuzz(func(t *testing.T, body []byte, k uint8) {
		var p fastjson.Parser
		r, err := Parse(&p, body, Kind(k%3))
		if err != nil && !errors.Is(err, ErrBadRequest) {
			t.Fatalf("error not wrapped as ErrBadRequest: %v", err)
		}
		if err == nil && r.Prompt != "" && len(r.TokenIDs) > 0 {
			t.Fatal("a prompt parsed as both text and token ids")
		}
	})
}
