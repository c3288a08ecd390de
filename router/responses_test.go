package router

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/arbiter-serve/arbiter/fleet"
)

// histogramCount is a histogram's sample count in the rig's registry, summed over series.
func (r *rig) histogramCount(t *testing.T, name string) uint64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// POST /v1/responses is routed like a chat: whole and streamed, its usage (input_tokens,
// output_tokens) accounted; a stream's end is its response.completed event (it has no
// [DONE]) and its first token the first output_text.delta.
func TestResponsesAreRoutedAndAccounted(t *testing.T) {
	s := startSim(t, simOpts{})
	r := startRouter(t, nil, replica("a", s, fleet.Reserved, 0))
	resp, body := post(t, r.url+"/v1/responses", `{"model":"`+testModel+`","instructions":"Be brief.","input":"Hello","max_output_tokens":6}`)
	if resp.StatusCode != 200 || !strings.Contains(body, `"object":"response"`) {
		t.Fatalf("whole: %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, r.url+"/v1/responses", `{"model":"`+testModel+`","input":[{"role":"user","content":[{"type":"input_text","text":"Hi"}]}],"max_output_tokens":4,"stream":true}`)
	if resp.StatusCode != 200 || !strings.HasSuffix(strings.TrimSpace(body), `"type":"response.completed"}`) || strings.Contains(body, `"type":"error"`) || strings.Contains(body, "[DONE]") {
		t.Fatalf("stream: %d\n%s", resp.StatusCode, body)
	}
	if got := r.counter(t, "arbiter_router_tokens_total", "replica", "a", "type", "completion"); got != 10 {
		t.Errorf("completion tokens counted: %v; want 6 + 4", got)
	}
	if got := r.counter(t, "arbiter_router_tokens_total", "replica", "a", "type", "prompt"); got < 4 {
		t.Errorf("prompt tokens counted: %v", got)
	}
	for _, reason := range []string{"stream_truncated", "stream_broken", "status_5xx"} {
		if got := r.counter(t, "arbiter_router_errors_total", "reason", reason); got != 0 {
			t.Errorf("errors_total{reason=%q} = %v", reason, got)
		}
	}
	if got := r.histogramCount(t, "arbiter_router_time_to_first_token_seconds"); got != 1 {
		t.Errorf("TTFT observed %d times; want once, for the stream", got)
	}
	if got := r.counter(t, "arbiter_router_requests_total", "replica", "a", "code", "200"); got != 2 {
		t.Errorf("requests counted: %v; want 2", got)
	}
}

// A request that continues a stored response goes to the replica that stored it (only it
// can continue it), and so does GET /v1/responses/{id}; once that replica has left, both
// are a clear 404 instead of another replica's "not found".
func TestPreviousResponseGoesToTheReplicaThatStoredIt(t *testing.T) {
	a, b := startSim(t, simOpts{store: true}), startSim(t, simOpts{store: true})
	ra, rb := replica("a", a, fleet.Reserved, 0), replica("b", b, fleet.Reserved, 0)
	r := startRouter(t, func(c *Config) { c.RoutingHeaders = true; c.Policy = "round_robin" }, ra, rb)
	resp, body := post(t, r.url+"/v1/responses", `{"model":"`+testModel+`","input":"Remember 7.","max_output_tokens":3}`)
	var first struct{ ID string }
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &first) != nil || first.ID == "" {
		t.Fatalf("first: %d %s", resp.StatusCode, body)
	}
	owner := resp.Header.Get("X-Arbiter-Replica")
	for i := range 6 { // round robin would send half of them to the other replica
		resp, body := post(t, r.url+"/v1/responses", `{"model":"`+testModel+`","input":"What was it?","max_output_tokens":3,"previous_response_id":"`+first.ID+`"}`)
		if resp.StatusCode != 200 || resp.Header.Get("X-Arbiter-Replica") != owner {
			t.Fatalf("continuation %d: %d on %q (stored on %q): %s", i, resp.StatusCode, resp.Header.Get("X-Arbiter-Replica"), owner, body)
		}
	}
	resp, body = get(t, r.url+"/v1/responses/"+first.ID)
	if resp.StatusCode != 200 || !strings.Contains(body, first.ID) {
		t.Fatalf("GET stored response: %d %s", resp.StatusCode, body)
	}
	// A streamed answer's id (from its response.created event) is remembered too.
	resp, body = post(t, r.url+"/v1/responses", `{"model":"`+testModel+`","input":"Stream it.","max_output_tokens":2,"stream":true}`)
	i := strings.Index(body, `"id":"resp_`)
	if resp.StatusCode != 200 || i < 0 {
		t.Fatalf("stream: %d %s", resp.StatusCode, body)
	}
	streamedID := body[i+6 : i+6+strings.IndexByte(body[i+6:], '"')]
	streamOwner := resp.Header.Get("X-Arbiter-Replica")
	resp, _ = post(t, r.url+"/v1/responses", `{"model":"`+testModel+`","input":"more","max_output_tokens":2,"previous_response_id":"`+streamedID+`"}`)
	if resp.StatusCode != 200 || resp.Header.Get("X-Arbiter-Replica") != streamOwner {
		t.Fatalf("continuing a streamed response: %d on %q; stored on %q", resp.StatusCode, resp.Header.Get("X-Arbiter-Replica"), streamOwner)
	}

	// The owner leaves the set.
	keep := ra
	if owner == "a" {
		keep = rb
	}
	r.pool.SetReplicas([]fleet.Replica{keep})
	resp, body = post(t, r.url+"/v1/responses", `{"model":"`+testModel+`","input":"Still there?","previous_response_id":"`+first.ID+`"}`)
	if resp.StatusCode != 404 || !strings.Contains(body, "previous_response_not_found") || !strings.Contains(body, owner) {
		t.Fatalf("continuation after its replica left: %d %s", resp.StatusCode, body)
	}
	resp, body = get(t, r.url+"/v1/responses/"+first.ID)
	if resp.StatusCode != 404 || !strings.Contains(body, owner) {
		t.Fatalf("GET after its replica left: %d %s", resp.StatusCode, body)
	}
	req, _ := http.NewRequest(http.MethodGet, r.url+"/v1/responses/"+first.ID+"?stream=true", nil)
	if resp, body := do(t, req); resp.StatusCode != 501 {
		t.Fatalf("GET ?stream=true: %d %s; want a clear 501", resp.StatusCode, body)
	}
}
