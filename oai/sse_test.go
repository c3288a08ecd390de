package oai

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/valyala/fastjson"
)

func TestNextEvent(t *testing.T) {
	for _, c := range []struct {
		in, ev, rest string
		ok           bool
	}{
		{"data: a\n\ndata: b\n\n", "data: a\n\n", "data: b\n\n", true},
		{"data: a\r\n\r\nx", "data: a\r\n\r\n", "x", true},
		{"data: a\n", "", "data: a\n", false},
		{"", "", "", false},
		{"id: 1\ndata: a\n\n", "id: 1\ndata: a\n\n", "", true},
	} {
		ev, rest, ok := NextEvent([]byte(c.in))
		if string(ev) != c.ev || string(rest) != c.rest || ok != c.ok {
			t.Errorf("NextEvent(%q) = %q, %q, %v", c.in, ev, rest, ok)
		}
	}
}

// Fed a byte at a time, scanning only what is new (the router's stream reader), events
// split exactly as a scan of the whole would split them, whatever their line endings.
func TestNextEventFromSplitsAsTheWholeScan(t *testing.T) {
	in := "data: a\n\ndata: b\r\n\r\n: ping\n\nid: 1\ndata: c\n\r\ndata: d\n\n"
	var want []string
	for rest := []byte(in); ; {
		ev, r, ok := NextEvent(rest)
		if !ok {
			break
		}
		want, rest = append(want, string(ev)), r
	}
	var got []string
	var pending []byte
	for i := range len(in) {
		from := max(len(pending)-2, 0)
		pending = append(pending, in[i])
		rest := pending
		for {
			ev, r, ok := NextEventFrom(rest, from)
			if !ok {
				break
			}
			got, rest, from = append(got, string(ev)), r, 0
		}
		pending = append(pending[:0], rest...)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || len(want) != 5 {
		t.Errorf("incremental: %q\nwhole: %q", got, want)
	}
}

func TestEventDataAndUsage(t *testing.T) {
	if d := EventData([]byte("event: x\ndata: {\"a\":1}\n\n")); string(d) != `{"a":1}` {
		t.Errorf("EventData = %q", d)
	}
	if d := EventData([]byte("data: a\ndata: b\n\n")); string(d) != "a\nb" {
		t.Errorf("multi-line EventData = %q", d)
	}
	var p fastjson.Parser
	u, only, ok := ChunkUsage(&p, []byte(`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}`))
	if !ok || !only || u.Prompt != 3 || u.Completion != 4 {
		t.Errorf("usage chunk: %+v %v %v", u, only, ok)
	}
	if _, _, ok := ChunkUsage(&p, []byte(`{"choices":[{"delta":{}}],"usage":null}`)); ok {
		t.Error("null usage reported")
	}
	if _, only, ok := ChunkUsage(&p, []byte(`{"choices":[{"x":1}],"usage":{"prompt_tokens":1}}`)); !ok || only {
		t.Error("usage with choices misclassified")
	}
}

func TestResponseUsage(t *testing.T) {
	var p fastjson.Parser
	for body, want := range map[string]Usage{
		`{"choices":[{"message":{"content":"the \"usage\": {fake}"}}],"usage":{"prompt_tokens":7,"total_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}`: {Prompt: 7, Completion: 2},
		`{"usage" : {"prompt_tokens":1,"completion_tokens":3}, "choices":[]}`: {Prompt: 1, Completion: 3},
		`{"choices":[],"usage":null}`:                                         {},
	} {
		got, _ := ResponseUsage(&p, []byte(body))
		if got != want {
			t.Errorf("ResponseUsage(%s) = %+v, want %+v", body, got, want)
		}
	}
}

func FuzzResponseUsage(f *testing.F) {
	f.Add(`the "usage": {fake}`, 7, 2)
	f.Add("}\\\"{", 0, 1)
	f.Fuzz(func(t *testing.T, content string, prompt, completion int) {
		// Any generated text, correctly escaped, before a trailing usage object.
		text, err := json.Marshal(content)
		if err != nil {
			t.Skip()
		}
		body := fmt.Appendf(nil, `{"choices":[{"message":{"content":%s}}],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, text, prompt, completion)
		var p fastjson.Parser
		got, ok := ResponseUsage(&p, body)
		if !ok {
			t.Fatalf("ResponseUsage(%s) found no usage", body)
		}
		if valid := prompt >= 0 && completion >= 0 && prompt <= MaxUsageTokens && completion <= MaxUsageTokens; valid != (got.Invalid == "") {
			t.Fatalf("ResponseUsage(%s) = %+v: valid %v", body, got, valid)
		}
		if got.Invalid == "" && got != (Usage{Prompt: prompt, Completion: completion}) {
			t.Fatalf("ResponseUsage(%s) = %+v", body, got)
		}
		if got.Invalid != "" && (got.Prompt != 0 || got.Completion != 0 || got.Detail == "") {
			t.Fatalf("refused usage %+v passes numbers on, or says nothing of why", got)
		}
	})
}
