package oai

import (
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
