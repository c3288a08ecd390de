package router

import (
	"bytes"
	"encoding/binary"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicasim"
)

const rerankBody = `{"model":"` + testModel + `","query":"capital of France","documents":["Berlin is in Germany.","The capital of France is Paris."]}`

// A model's replicas that declare no tasks: a generation replica and a reranker. A rerank
// sent to the generation replica is refused (vLLM's 400 "does not support"), retried on the
// reranker unseen by the client, and never sent there again; chat the other way round. The
// reranker's usage (total_tokens alone) is accounted as prompt tokens.
func TestPoolingEndpointsLearnWhichReplicaServesThem(t *testing.T) {
	gen, rer := startSim(t, simOpts{}), startSim(t, simOpts{task: replicasim.TaskScore})
	r := startRouter(t, func(c *Config) { c.RoutingHeaders = true; c.Policy = "round_robin" },
		replica("gen", gen, fleet.Reserved, 0), replica("rer", rer, fleet.Reserved, 0))
	chat := func(i int) {
		t.Helper()
		resp, b := post(t, r.url+"/v1/chat/completions", chatBody(false, ""))
		if resp.StatusCode != 200 || resp.Header.Get("X-Arbiter-Replica") != "gen" {
			t.Fatalf("chat %d: %d on %q: %s", i, resp.StatusCode, resp.Header.Get("X-Arbiter-Replica"), b)
		}
	}
	for i := range 4 { // round robin sends one of them to the reranker first
		chat(i)
	}
	for i := range 6 {
		for _, path := range []string{"/v1/rerank", "/rerank", "/score"} {
			body := rerankBody
			if path == "/score" {
				body = `{"model":"` + testModel + `","text_1":"a cat","text_2":["a cat","a dog"]}`
			}
			resp, b := post(t, r.url+path, body)
			if resp.StatusCode != 200 || resp.Header.Get("X-Arbiter-Replica") != "rer" {
				t.Fatalf("%s %d: %d on %q: %s", path, i, resp.StatusCode, resp.Header.Get("X-Arbiter-Replica"), b)
			}
		}
		chat(i)
	}
	// Each replica refused one API once: the rerank/score API and the generate API.
	if got := r.counter(t, "arbiter_router_errors_total", "reason", "api_not_served"); got != 2 {
		t.Errorf("refusals learned: %v; want 2 (one per replica)", got)
	}
	if got := r.counter(t, "arbiter_router_tokens_total", "replica", "rer", "type", "prompt"); got < 6*3*10 {
		t.Errorf("prompt tokens accounted on the reranker: %v; want each request's", got)
	}
	if got := r.counter(t, "arbiter_router_tokens_total", "replica", "rer", "type", "completion"); got != 0 {
		t.Errorf("completion tokens on the reranker: %v; want 0", got)
	}
}

// A replica that declares its tasks is never sent another API's request: a model whose
// replicas all leave rerank out answers vLLM's own 404 shape, and the replica saw nothing.
func TestDeclaredTasksKeepRequestsOffReplicasThatCannotServeThem(t *testing.T) {
	gen := startSim(t, simOpts{})
	rep := replica("gen", gen, fleet.Reserved, 0)
	rep.Tasks = []string{fleet.TaskGenerate}
	r := startRouter(t, nil, rep)
	resp, body := post(t, r.url+"/rerank", rerankBody)
	if resp.StatusCode != 404 || !strings.Contains(body, "does not support Rerank (Score) API") || !strings.Contains(body, `"type":"NotFoundError"`) || !strings.Contains(body, `"code":404`) {
		t.Fatalf("rerank on a generation-only model: %d %s", resp.StatusCode, body)
	}
	if got := r.counter(t, "arbiter_router_requests_total", "replica", "gen"); got != 0 {
		t.Errorf("the replica was sent %v requests; want none", got)
	}
}

func wavFile(seconds int) []byte {
	n := seconds * 32000
	h := make([]byte, 44, 44+n)
	copy(h, "RIFF")
	copy(h[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(h[16:], 16)
	binary.LittleEndian.PutUint16(h[20:], 1)
	binary.LittleEndian.PutUint16(h[22:], 1)
	binary.LittleEndian.PutUint32(h[24:], 16000)
	binary.LittleEndian.PutUint32(h[28:], 32000)
	binary.LittleEndian.PutUint16(h[32:], 2)
	binary.LittleEndian.PutUint16(h[34:], 16)
	copy(h[36:], "data")
	binary.LittleEndian.PutUint32(h[40:], uint32(n))
	return append(h, make([]byte, n)...)
}

func audioRequest(t *testing.T, url, model string, file []byte) *http.Request {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	f, _ := w.CreateFormFile("file", "talk.wav")
	_, _ = f.Write(file)
	_ = w.WriteField("model", model) // after the file, as the OpenAI SDKs send it
	_ = w.Close()
	req, err := http.NewRequest(http.MethodPost, url, &buf)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", w.FormDataContentType())
	return req
}

// An audio transcription (multipart, the model after the file) is routed by its model to the
// Whisper replica, not the generation one, and its usage (the audio's seconds) accounted; a
// file over max_request_body_bytes is refused before it is read.
func TestAudioIsRoutedByItsFormModelAndAccounted(t *testing.T) {
	gen, whisper := startSim(t, simOpts{}), startSim(t, simOpts{task: replicasim.TaskTranscription})
	g, w := replica("gen", gen, fleet.Reserved, 0), replica("whisper", whisper, fleet.Reserved, 0)
	g.Tasks, w.Tasks = []string{fleet.TaskGenerate}, []string{fleet.TaskTranscription}
	r := startRouter(t, func(c *Config) { c.RoutingHeaders = true; c.MaxRequestBodyBytes = 1 << 20 }, g, w)
	for range 3 {
		resp, body := do(t, audioRequest(t, r.url+"/v1/audio/transcriptions", testModel, wavFile(4)))
		if resp.StatusCode != 200 || resp.Header.Get("X-Arbiter-Replica") != "whisper" || !strings.Contains(body, `"seconds":4`) {
			t.Fatalf("transcription: %d on %q: %s", resp.StatusCode, resp.Header.Get("X-Arbiter-Replica"), body)
		}
	}
	if got := r.counter(t, "arbiter_router_audio_seconds_total", "replica", "whisper"); got != 12 {
		t.Errorf("audio seconds accounted: %v; want 12", got)
	}
	resp, body := do(t, audioRequest(t, r.url+"/v1/audio/translations", testModel, wavFile(1)))
	if resp.StatusCode != 200 || !strings.Contains(body, `"text"`) {
		t.Fatalf("translation: %d %s", resp.StatusCode, body)
	}
	resp, body = do(t, audioRequest(t, r.url+"/v1/audio/transcriptions", testModel, wavFile(40)))
	if resp.StatusCode != 413 || !strings.Contains(body, "max_request_body_bytes") {
		t.Fatalf("a 1.3 MB file with a 1 MiB limit: %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, r.url+"/v1/audio/transcriptions", `{"model":"`+testModel+`"}`)
	if resp.StatusCode != 400 || !strings.Contains(body, "multipart/form-data") {
		t.Fatalf("a JSON transcription: %d %s", resp.StatusCode, body)
	}
}

// /tokenize and /detokenize are forwarded as vLLM answers them; GET /v1/models/{model} is
// answered (OpenAI's retrieve model), slashes escaped or not; a path the router does not
// route says so and lists what it routes.
func TestTokenizeModelRetrieveAndUnknownPaths(t *testing.T) {
	s := startSim(t, simOpts{})
	r := startRouter(t, nil, replica("a", s, fleet.Reserved, 0))
	resp, body := post(t, r.url+"/tokenize", `{"model":"`+testModel+`","prompt":"Hello world"}`)
	if resp.StatusCode != 200 || !strings.Contains(body, `"count":`) || !strings.Contains(body, `"tokens":[`) {
		t.Fatalf("tokenize: %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, r.url+"/detokenize", `{"model":"`+testModel+`","tokens":[9906,1917]}`)
	if resp.StatusCode != 200 || !strings.Contains(body, `"prompt":"Hello world"`) {
		t.Fatalf("detokenize: %d %s", resp.StatusCode, body)
	}
	resp, body = get(t, r.url+"/v1/models/"+testModel)
	if resp.StatusCode != 200 || !strings.Contains(body, `"id":"`+testModel+`"`) || !strings.Contains(body, `"object":"model"`) {
		t.Fatalf("retrieve: %d %s", resp.StatusCode, body)
	}
	resp, body = get(t, r.url+"/v1/models/org%2Fnope")
	if resp.StatusCode != 404 || !strings.Contains(body, "model_not_found") || !strings.Contains(body, "org/nope") {
		t.Fatalf("retrieve an unknown model: %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, r.url+"/v1/frobnicate", `{}`)
	if resp.StatusCode != 404 || !strings.Contains(body, "does not route it") || !strings.Contains(body, "/v1/rerank") {
		t.Fatalf("unknown path: %d %s", resp.StatusCode, body)
	}
}
