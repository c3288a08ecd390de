package oai

import (
	"testing"

	"github.com/valyala/fastjson"
)

// Responses API requests in the forms the official SDKs and the Vercel AI SDK send: input
// as a string, or as a list of message items (with or without "type":"message", content a
// string or input_text parts), instructions, max_output_tokens, previous_response_id.
func TestParseResponsesRequests(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		prompt     string
		messages   int
		max        int
		prev       string
		stream     bool
	}{
		{"string input (client.responses.create)", `{"model":"m","input":"Tell me a joke","max_output_tokens":64}`, "Tell me a joke", 1, 64, "", false},
		{"instructions and items, streamed", `{"model":"m","instructions":"Be brief.","input":[{"role":"user","content":"Hi"}],"stream":true}`, "Be brief.\nHi", 2, 0, "", true},
		{"AI SDK items with input_text parts", `{"model":"m","input":[{"role":"system","content":"sys"},{"role":"user","content":[{"type":"input_text","text":"What is"},{"type":"input_text","text":" 2+2?"}]}],"max_output_tokens":10}`, "sys\nWhat is 2+2?", 2, 10, "", false},
		{"typed message items and a function output", `{"model":"m","input":[{"type":"message","role":"user","content":"a"},{"type":"function_call_output","call_id":"c1","output":"42"}]}`, "a\n42", 2, 0, "", false},
		{"continuing a stored response", `{"model":"m","input":"and then?","previous_response_id":"resp_7"}`, "and then?", 1, 0, "resp_7", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p fastjson.Parser
			r, err := Parse(&p, []byte(tc.body), Responses)
			if err != nil {
				t.Fatal(err)
			}
			if r.Prompt != tc.prompt || r.Messages != tc.messages || r.MaxTokens != tc.max || r.PreviousResponseID != tc.prev || r.Stream != tc.stream {
				t.Fatalf("got prompt %q messages %d max %d prev %q stream %v", r.Prompt, r.Messages, r.MaxTokens, r.PreviousResponseID, r.Stream)
			}
		})
	}
	for _, body := range []string{
		`{"model":"m"}`,
		`{"model":"m","input":5}`,
		`{"model":"m","input":["x"]}`,
		`{"model":"m","input":"x","instructions":3}`,
		`{"model":"m","input":"x","max_output_tokens":-1}`,
		`{"model":"m","input":"x","previous_response_id":""}`,
	} {
		var p fastjson.Parser
		if _, err := Parse(&p, []byte(body), Responses); err == nil {
			t.Errorf("%s: accepted", body)
		}
	}
}

// A Responses answer's usage (vLLM's ResponseUsage) is read like a chat's, and checked the
// same way; a stream's is in its response.completed event.
func TestResponsesUsage(t *testing.T) {
	var p fastjson.Parser
	body := `{"id":"resp_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"the \"usage\": here"}]}],"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":8},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":17},"user":null}`
	u, ok := ResponseUsage(&p, []byte(body))
	if !ok || u.Invalid != "" || u.Prompt != 12 || u.Completion != 5 {
		t.Fatalf("whole response: %+v %v", u, ok)
	}
	ev := `{"response":` + body + `,"sequence_number":9,"type":"response.completed"}`
	u, usageOnly, ok := ChunkUsage(&p, []byte(ev))
	if !ok || usageOnly || u.Prompt != 12 || u.Completion != 5 {
		t.Fatalf("response.completed: %+v usageOnly %v ok %v", u, usageOnly, ok)
	}
	created := `{"response":{"id":"resp_1","usage":null},"sequence_number":0,"type":"response.created"}`
	if _, _, ok := ChunkUsage(&p, []byte(created)); ok {
		t.Fatal("response.created has no usage yet")
	}
	for _, bad := range []string{
		`{"input_tokens":-3,"output_tokens":5}`,
		`{"input_tokens":3,"output_tokens":5,"total_tokens":9}`,
		`{"input_tokens":3,"output_tokens":5,"input_tokens_details":{"cached_tokens":4}}`,
	} {
		v := fastjson.MustParse(bad)
		if u := ReadUsage(v); u.Invalid == "" {
			t.Errorf("%s: accepted as %+v", bad, u)
		}
	}
}

func TestEventType(t *testing.T) {
	for ev, want := range map[string]string{
		"event: response.output_text.delta\ndata: {}\n\n": "response.output_text.delta",
		"event:error\r\ndata: {}\r\n\r\n":                 "error",
		"data: {}\n\n":                                    "",
	} {
		if got := string(EventType([]byte(ev))); got != want {
			t.Errorf("%q: %q; want %q", ev, got, want)
		}
	}
}
