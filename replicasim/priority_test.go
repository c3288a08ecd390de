package replicasim

import (
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/arbiter-serve/arbiter/engine"
)

// The priority field as vLLM takes it: 0 (or absent) anywhere; another integer only with
// --scheduling-policy priority, else vLLM's 400; anything but an integer a 400.
func TestPriorityFieldAsVLLMTakesIt(t *testing.T) {
	_, fcfs := start(t, false)
	p, err := engine.LoadProfile("h100-llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Model: "m", Profile: p, PriorityScheduling: true, Logger: slog.New(slog.DiscardHandler), Exit: func(int) {}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	prio := serve(t, s, ln)
	body := func(p string) string {
		return `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2` + p + `}`
	}
	for _, c := range []struct {
		url, field string
		code       int
		msg        string
	}{
		{fcfs, "", 200, ""},
		{fcfs, `,"priority":0`, 200, ""},
		{fcfs, `,"priority":1`, 400, "Got priority 1 but Priority scheduling is not enabled."},
		{prio, `,"priority":1`, 200, ""},
		{prio, `,"priority":-3`, 200, ""},
		{prio, `,"priority":"high"`, 400, "priority: Input should be a valid integer"},
		{prio, `,"priority":1.5`, 400, "priority: Input should be a valid integer"},
		// Duplicate keys: the last one counts, as Python's json keeps it.
		{fcfs, `,"priority":3,"priority":0`, 200, ""},
		{prio, `,"priority":0,"priority":"high"`, 400, "priority: Input should be a valid integer"},
	} {
		code, b := post(t, c.url+"/v1/chat/completions", body(c.field))
		if code != c.code || !strings.Contains(b, c.msg) {
			t.Errorf("%s priority %q: HTTP %d %s; want %d %q", map[string]string{fcfs: "fcfs", prio: "priority"}[c.url], c.field, code, b, c.code, c.msg)
		}
		if c.code == 400 && !strings.Contains(b, `"type":"BadRequestError"`) {
			t.Errorf("priority %q: %s, want vLLM's BadRequestError", c.field, b)
		}
	}
}
