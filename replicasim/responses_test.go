package replicasim

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
)

// serve starts a server built by newServer (and changed since).
func serve(t *testing.T, s *Server, ln net.Listener) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.Run(ctx)
	go func() { _ = s.Serve(ctx, ln) }()
	return "http://" + ln.Addr().String()
}

// responseObject is the part of vLLM's ResponsesResponse the tests read.
type responseObject struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Status string `json:"status"`
	Output []struct {
		Type    string `json:"type"`
		Role    string `json:"role"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage *struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
	PreviousResponseID *string `json:"previous_response_id"`
}

// /v1/responses as vLLM 0.11 answers it: a response object with one assistant message and
// its usage; streamed, the typed events in vLLM's order, each with its sequence number,
// ending with response.completed and no [DONE].
func TestResponsesAsVLLMServesThem(t *testing.T) {
	_, url := start(t, false)
	code, body := post(t, url+"/v1/responses", `{"model":"m","instructions":"Be brief.","input":"Hello","max_output_tokens":5}`)
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	var r responseObject
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if !strings.HasPrefix(r.ID, "resp_") || r.Object != "response" || r.Status != "completed" || len(r.Output) != 1 ||
		r.Output[0].Type != "message" || r.Output[0].Role != "assistant" || len(r.Output[0].Content) != 1 ||
		r.Output[0].Content[0].Type != "output_text" || r.Output[0].Content[0].Text == "" {
		t.Fatalf("response object: %s", body)
	}
	if r.Usage == nil || r.Usage.OutputTokens != 5 || r.Usage.InputTokens < 3 || r.Usage.TotalTokens != r.Usage.InputTokens+5 {
		t.Fatalf("usage: %s", body)
	}

	code, body = post(t, url+"/v1/responses", `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"Hi"}]}],"max_output_tokens":3,"stream":true}`)
	if code != 200 {
		t.Fatalf("stream: %d %s", code, body)
	}
	var types []string
	for i, ev := range strings.Split(strings.TrimSpace(body), "\n\n") {
		lines := strings.SplitN(ev, "\n", 2)
		typ, ok := strings.CutPrefix(lines[0], "event: ")
		if !ok || len(lines) != 2 || !strings.HasPrefix(lines[1], "data: ") {
			t.Fatalf("event %d is not event: + data: %q", i, ev)
		}
		var d struct {
			Type string `json:"type"`
			Seq  int    `json:"sequence_number"`
		}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(lines[1], "data: ")), &d); err != nil || d.Type != typ || d.Seq != i {
			t.Fatalf("event %d: %q (type %q seq %d, %v)", i, ev, d.Type, d.Seq, err)
		}
		types = append(types, typ)
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.delta response.output_text.delta " +
		"response.output_text.done response.content_part.done response.output_item.done response.completed"
	if got := strings.Join(types, " "); got != want {
		t.Fatalf("events:\n%s\nwant:\n%s", got, want)
	}
	if strings.Contains(body, "[DONE]") {
		t.Fatal("a Responses stream has no [DONE]")
	}
}

// Without a store (vLLM's default) previous_response_id is 404; with one, it continues the
// stored conversation (its tokens prefilled again) and GET returns the stored response.
func TestResponsesStore(t *testing.T) {
	_, url := start(t, false)
	code, body := post(t, url+"/v1/responses", `{"model":"m","input":"x","previous_response_id":"resp_1"}`)
	if code != 404 || !strings.Contains(body, "Response with id 'resp_1' not found.") {
		t.Fatalf("no store: %d %s", code, body)
	}

	s, ln := newServer(t, false)
	s.cfg.StoreResponses = true
	url = serve(t, s, ln)
	_, body = post(t, url+"/v1/responses", `{"model":"m","input":"Hello there","max_output_tokens":4}`)
	var first responseObject
	if err := json.Unmarshal([]byte(body), &first); err != nil {
		t.Fatal(err)
	}
	code, body = get(t, url+"/v1/responses/"+first.ID)
	if code != 200 || !strings.Contains(body, `"id":"`+first.ID+`"`) {
		t.Fatalf("GET stored: %d %s", code, body)
	}
	code, body = post(t, url+"/v1/responses", `{"model":"m","input":"and then?","max_output_tokens":4,"previous_response_id":"`+first.ID+`"}`)
	var next responseObject
	if code != 200 || json.Unmarshal([]byte(body), &next) != nil || next.PreviousResponseID == nil || *next.PreviousResponseID != first.ID {
		t.Fatalf("continuation: %d %s", code, body)
	}
	if min := first.Usage.InputTokens + first.Usage.OutputTokens; next.Usage.InputTokens <= min {
		t.Fatalf("continuation prefilled %d tokens; want more than the stored conversation's %d", next.Usage.InputTokens, min)
	}
	if code, _ := post(t, url+"/v1/responses", `{"model":"m","input":"x","previous_response_id":"resp_nope"}`); code != 404 {
		t.Fatalf("unknown previous response: %d; want 404", code)
	}
}
