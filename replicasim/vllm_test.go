package replicasim

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// vllmErrorBody is vLLM 0.11's error response (ErrorResponse{error: ErrorInfo}).
type vllmErrorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

func ids(first, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(first + i%1000))
	}
	return "[" + b.String() + "]"
}

func TestRequestsVLLMRefusesAreRefusedWithItsMessages(t *testing.T) {
	_, url := start(t, true) // echo mode: a 131,072-token context without a real prefill
	chat := func(extra string) string {
		return `{"model":"m","messages":[{"role":"user","content":"hi"}]` + extra + `}`
	}
	for _, c := range []struct {
		name, path, body, want string
	}{
		{"max_tokens 0", "/v1/chat/completions", chat(`,"max_tokens":0`), "max_tokens must be at least 1, got 0."},
		{"negative temperature", "/v1/chat/completions", chat(`,"temperature":-1`), "temperature must be non-negative, got -1.0."},
		{"n 0", "/v1/completions", `{"model":"m","prompt":"x","n":0}`, "n must be at least 1, got 0."},
		{"n 2 greedy", "/v1/completions", `{"model":"m","prompt":"x","n":2,"temperature":0}`, "n must be 1 when using greedy sampling, got 2."},
		{"logprobs 21", "/v1/completions", `{"model":"m","prompt":"x","logprobs":21}`, "Requested sample logprobs of 21, which is greater than max allowed: 20"},
		{"top_logprobs alone", "/v1/chat/completions", chat(`,"top_logprobs":2`), "when using `top_logprobs`, `logprobs` must be set to true."},
		{"max_tokens near 2^63", "/v1/completions", `{"model":"m","prompt":"x","max_tokens":9223372036854775000}`, "'max_tokens' or 'max_completion_tokens' is too large: 9223372036854775000. This model's maximum context length is 131072 tokens"},
		{"prompt fills the context", "/v1/completions", `{"model":"m","prompt":` + ids(1000, 131072) + `,"max_tokens":1}`, "This model's maximum context length is 131072 tokens. However, your request has 131072 input tokens."},
		{"prompt plus output too long", "/v1/completions", `{"model":"m","prompt":` + ids(1000, 131000) + `,"max_tokens":100}`, "(100 > 131072 - 131000)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out := post(t, url+c.path, c.body)
			var e vllmErrorBody
			if err := json.Unmarshal([]byte(out), &e); err != nil || code != 400 {
				t.Fatalf("%d %s: want 400 with vLLM's error body", code, out)
			}
			if e.Error.Type != "BadRequestError" || e.Error.Code != 400 || e.Error.Param != nil || !strings.Contains(e.Error.Message, c.want) {
				t.Fatalf("error %+v; want BadRequestError, code 400, message containing %q", e.Error, c.want)
			}
		})
	}
	code, out := post(t, url+"/v1/chat/completions", `{"model":"other","messages":[{"role":"user","content":"x"}]}`)
	if code != 404 || !strings.Contains(out, `"type":"NotFoundError"`) || !strings.Contains(out, `"code":404`) {
		t.Fatalf("unknown model: %d %s", code, out)
	}
}

// A request that names no model is served by the replica's model, and the answer names it,
// as vLLM does (serving_engine.py: _is_model_supported takes an empty name).
func TestMissingModelIsServedByTheReplicasModel(t *testing.T) {
	_, url := start(t, true)
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}`},
		{"/v1/completions", `{"prompt":"hi","max_tokens":3}`},
		{"/v1/embeddings", `{"input":"hi"}`},
	} {
		code, out := post(t, url+c.path, c.body)
		var r struct {
			Model string `json:"model"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil || code != 200 || r.Model != "m" {
			t.Fatalf("%s without a model: %d %s; want 200 answered by model \"m\"", c.path, code, out)
		}
	}
}

func TestDefaultMaxTokensIsTheRestOfTheContext(t *testing.T) {
	_, url := start(t, true)
	var r struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	// Room for 10 more tokens: vLLM stops at the context's end, before the model's own stop.
	_, out := post(t, url+"/v1/completions", `{"model":"m","prompt":`+ids(1000, 131062)+`}`)
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Usage.CompletionTokens != 10 || r.Choices[0].FinishReason != "length" {
		t.Fatalf("prompt 10 tokens short of the context, no max_tokens: %s", out)
	}
	_, out = post(t, url+"/v1/completions", `{"model":"m","prompt":"x"}`)
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Usage.CompletionTokens != 64 || r.Choices[0].FinishReason != "stop" {
		t.Fatalf("short prompt, no max_tokens: %s; want the simulated model's own stop after 64 tokens", out)
	}
}

func TestNChoicesLogprobsAndEcho(t *testing.T) {
	s, url := start(t, false)
	code, out := post(t, url+"/v1/completions", `{"model":"m","prompt":"Tell me a story about a fox","max_tokens":4,"n":3,"logprobs":2,"echo":true}`)
	var r struct {
		Choices []struct {
			Index    int    `json:"index"`
			Text     string `json:"text"`
			Logprobs struct {
				Tokens      []string             `json:"tokens"`
				TokenLogps  []float64            `json:"token_logprobs"`
				TextOffset  []int                `json:"text_offset"`
				TopLogprobs []map[string]float64 `json:"top_logprobs"`
			} `json:"logprobs"`
		} `json:"choices"`
		Usage struct {
			Prompt     int `json:"prompt_tokens"`
			Completion int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != 200 {
		t.Fatalf("%d %s", code, out)
	}
	if len(r.Choices) != 3 || r.Choices[2].Index != 2 || r.Usage.Completion != 12 {
		t.Fatalf("n=3: %d choices, usage %+v; want 3 and 12 completion tokens", len(r.Choices), r.Usage)
	}
	c := r.Choices[0]
	if !strings.HasPrefix(c.Text, "Tell me a story about a fox") {
		t.Errorf("echo: text %q does not start with the prompt", c.Text)
	}
	if len(c.Logprobs.Tokens) != 4 || len(c.Logprobs.TokenLogps) != 4 || len(c.Logprobs.TopLogprobs[0]) != 2 || c.Logprobs.TextOffset[0] != len("Tell me a story about a fox") {
		t.Errorf("logprobs %+v", c.Logprobs)
	}
	// The three choices are three engine requests sharing the prompt's blocks, as vLLM's
	// child requests do: the prompt is prefilled once per choice, but only its first copy
	// misses the cache.
	if st := s.engineStats(); st.PrefixQueries != int64(3*r.Usage.Prompt) {
		t.Errorf("prefix queries %d, want one per choice (3 × %d)", st.PrefixQueries, r.Usage.Prompt)
	}

	_, out = post(t, url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true,"n":2,"logprobs":true,"top_logprobs":3}`)
	var idx []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "data: {") && strings.Contains(line, `"content":" `) {
			var ch struct {
				Choices []struct {
					Index    int `json:"index"`
					Logprobs struct {
						Content []struct {
							Top []json.RawMessage `json:"top_logprobs"`
						} `json:"content"`
					} `json:"logprobs"`
				} `json:"choices"`
			}
			if err := json.Unmarshal([]byte(line[len("data: "):]), &ch); err != nil {
				t.Fatalf("chunk %s: %v", line, err)
			}
			if n := len(ch.Choices[0].Logprobs.Content); n != 1 || len(ch.Choices[0].Logprobs.Content[0].Top) != 3 {
				t.Fatalf("chunk logprobs %s", line)
			}
			idx = append(idx, strconv.Itoa(ch.Choices[0].Index))
		}
	}
	if strings.Join(idx, "") != "0101" {
		t.Errorf("streamed token chunks by choice index %v, want 0 1 0 1", idx)
	}
}

func TestTokenizeMatchesUsageAndDetokenizeRoundTrips(t *testing.T) {
	_, url := start(t, false)
	msgs := `"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"What is a fox?"}]`
	_, out := post(t, url+"/tokenize", `{"model":"m",`+msgs+`}`)
	var tok struct {
		Count       int   `json:"count"`
		MaxModelLen int   `json:"max_model_len"`
		Tokens      []int `json:"tokens"`
	}
	if err := json.Unmarshal([]byte(out), &tok); err != nil || tok.Count != len(tok.Tokens) || tok.MaxModelLen != 131072 {
		t.Fatalf("/tokenize: %s", out)
	}
	_, out = post(t, url+"/v1/chat/completions", `{"model":"m",`+msgs+`,"max_tokens":1}`)
	if !strings.Contains(out, `"prompt_tokens":`+strconv.Itoa(tok.Count)+",") {
		t.Fatalf("/tokenize counted %d; the chat request's usage says %s", tok.Count, out)
	}
	_, out = post(t, url+"/tokenize", `{"prompt":"The quick brown fox","add_special_tokens":false,"return_token_strs":true}`)
	if err := json.Unmarshal([]byte(out), &tok); err != nil || !strings.Contains(out, `"token_strs":["The"," quick"`) {
		t.Fatalf("/tokenize of a prompt: %s", out)
	}
	b, _ := json.Marshal(map[string][]int{"tokens": tok.Tokens})
	if _, out = post(t, url+"/detokenize", string(b)); out != `{"prompt":"The quick brown fox"}` {
		t.Fatalf("/detokenize: %s", out)
	}
	if code, out := post(t, url+"/detokenize", `{"tokens":[-1]}`); code != 400 {
		t.Fatalf("/detokenize of a negative id: %d %s", code, out)
	}
	if _, out := get(t, url+"/version"); out != `{"version":"`+vllmVersion+`"}` {
		t.Fatalf("/version: %s", out)
	}
	if code, _ := post(t, url+"/ping", ""); code != 200 {
		t.Fatalf("POST /ping: %d", code)
	}
}

func TestEmbeddingsOneVectorPerInputAsFloatsOrBase64(t *testing.T) {
	_, url := start(t, true)
	type resp struct {
		Data []struct {
			Index     int             `json:"index"`
			Embedding json.RawMessage `json:"embedding"`
		} `json:"data"`
		Usage struct {
			Prompt int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	var fl, b64 resp
	_, out := post(t, url+"/v1/embeddings", `{"model":"m","input":["alpha beta","gamma","delta"]}`)
	if err := json.Unmarshal([]byte(out), &fl); err != nil || len(fl.Data) != 3 || fl.Data[2].Index != 2 {
		t.Fatalf("three inputs: %s", out)
	}
	_, out = post(t, url+"/v1/embeddings", `{"model":"m","input":["alpha beta","gamma","delta"],"encoding_format":"base64"}`)
	if err := json.Unmarshal([]byte(out), &b64); err != nil || len(b64.Data) != 3 {
		t.Fatalf("base64: %s", out)
	}
	for i := range fl.Data {
		var floats []float64
		if err := json.Unmarshal(fl.Data[i].Embedding, &floats); err != nil {
			t.Fatal(err)
		}
		var s string
		if err := json.Unmarshal(b64.Data[i].Embedding, &s); err != nil {
			t.Fatalf("base64 embedding is not a string: %s", b64.Data[i].Embedding)
		}
		raw, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(raw) != 4*len(floats) {
			t.Fatalf("base64 embedding %d: %d bytes, %v; want %d little-endian float32s", i, len(raw), err, len(floats))
		}
		var norm float64
		for j, f := range floats {
			g := float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:])))
			if math.Abs(g-f) > 1e-6 {
				t.Fatalf("input %d, dim %d: base64 %v, float %v", i, j, g, f)
			}
			norm += f * f
		}
		if math.Abs(norm-1) > 1e-3 {
			t.Errorf("input %d: |v|² = %v, want a unit vector", i, norm)
		}
	}
	if string(fl.Data[0].Embedding) == string(fl.Data[1].Embedding) {
		t.Error("different inputs embedded equally")
	}
	if _, out := post(t, url+"/v1/embeddings", `{"model":"m","input":[[5,6,7],[8]]}`); strings.Count(out, `"object":"embedding"`) != 2 || !strings.Contains(out, `"prompt_tokens":4,`) {
		t.Errorf("two token-id inputs: %s", out)
	}
	if code, _ := post(t, url+"/v1/embeddings", `{"model":"m","input":"x","encoding_format":"int8"}`); code != 400 {
		t.Errorf("unknown encoding_format: %d, want 400", code)
	}
}

// metricValue reads one sample from a /metrics text (the first series whose name and labels
// start with prefix).
func metricValue(t *testing.T, text, prefix string) float64 {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, prefix) {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("/metrics has no %s", prefix)
	return 0
}

func TestMetricsAreVLLMsFamiliesUpdatedAsTokensCome(t *testing.T) {
	_, url := start(t, false)
	_, text := get(t, url+"/metrics")
	for _, family := range []string{
		"vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
		"vllm:request_inference_time_seconds", "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
		"vllm:request_max_num_generation_tokens", "vllm:request_params_n", "vllm:request_params_max_tokens",
		"vllm:iteration_tokens_total", "vllm:request_time_per_output_token_seconds",
	} {
		if !strings.Contains(text, "# TYPE "+family+" histogram") {
			t.Errorf("/metrics lacks the histogram %s", family)
		}
	}
	for _, want := range []string{
		`vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 0`,
		`vllm:cache_config_info{block_size="16",`,
		`vllm:request_prompt_tokens_bucket{engine="0",model_name="m",le="100000"}`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(text, `le="200000"`) {
		t.Error("token-count buckets go past max_model_len (vLLM's build_1_2_5_buckets stops at 131072)")
	}

	// A long stream: TTFT and the prompt's tokens are counted at the first token, not at the end.
	resp, err := http.Post(url+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":"hello there","max_tokens":400,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	_, text = get(t, url+"/metrics")
	if n := metricValue(t, text, "vllm:time_to_first_token_seconds_count"); n != 1 {
		t.Errorf("TTFT count %v while the stream runs, want 1", n)
	}
	if n := metricValue(t, text, "vllm:prompt_tokens_total"); n == 0 {
		t.Error("prompt tokens not counted at the first token")
	}
	// The client hangs up: vLLM counts the request as aborted.
	resp.Body.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, text = get(t, url+"/metrics")
		if metricValue(t, text, `vllm:request_success_total{engine="0",finished_reason="abort"`) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a stream the client closed was never counted as aborted")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := metricValue(t, text, "vllm:generation_tokens_total"); n == 0 || n >= 400 {
		t.Errorf("generation tokens %v: want the tokens made before the client left", n)
	}
	if metricValue(t, text, "vllm:request_queue_time_seconds_count") != 1 || metricValue(t, text, "vllm:iteration_tokens_total_count") == 0 {
		t.Error("the aborted request's phases or the steps were not recorded")
	}

	// n = 3: three engine requests, each counted in the per-request histograms, but the
	// request's most generated tokens is one observation.
	before := metricValue(t, text, "vllm:request_max_num_generation_tokens_count")
	beforeGen := metricValue(t, text, "vllm:request_generation_tokens_count")
	if code, out := post(t, url+"/v1/completions", `{"model":"m","prompt":"hello","max_tokens":5,"n":3}`); code != 200 {
		t.Fatalf("n=3: %d %s", code, out)
	}
	_, text = get(t, url+"/metrics")
	if got := metricValue(t, text, "vllm:request_max_num_generation_tokens_count") - before; got != 1 {
		t.Errorf("request_max_num_generation_tokens observed %v times for one n=3 request, want once", got)
	}
	if got := metricValue(t, text, "vllm:request_generation_tokens_count") - beforeGen; got != 3 {
		t.Errorf("request_generation_tokens observed %v times for n=3, want 3 (one per sequence)", got)
	}
}

// vLLM echoes a chat's last message only when it has the answer's role (an assistant turn
// being continued), or always when add_generation_prompt is false; streamed, it comes in a
// chunk of its own after the role chunk (vllm/entrypoints/openai/serving_chat.py).
func TestChatEcho(t *testing.T) {
	_, url := start(t, true)
	content := func(out string) string {
		var r struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Choices) != 1 {
			t.Fatalf("%s: %v", out, err)
		}
		return r.Choices[0].Message.Content
	}
	user := `"messages":[{"role":"user","content":"Name a fox."}]`
	prefill := `"messages":[{"role":"user","content":"Name a fox."},{"role":"assistant","content":"Its name is"}]`
	for _, c := range []struct {
		name, body, prefix string
	}{
		{"last message the user's: nothing echoed", user + `,"echo":true`, " The"},
		{"an assistant turn continued: echoed", prefill + `,"echo":true`, "Its name is The"},
		{"no echo asked", prefill, " The"},
		{"add_generation_prompt false: the last message whatever its role", user + `,"echo":true,"add_generation_prompt":false`, "Name a fox. The"},
		{"content as parts: their texts joined by newlines", `"messages":[{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"echo":true`, "a\nb The"},
	} {
		_, out := post(t, url+"/v1/chat/completions", `{"model":"m","max_tokens":1,`+c.body+`}`)
		if got := content(out); got != c.prefix {
			t.Errorf("%s: content %q, want %q", c.name, got, c.prefix)
		}
	}
	_, out := post(t, url+"/v1/chat/completions", `{"model":"m","max_tokens":2,"stream":true,"echo":true,`+prefill+`}`)
	var deltas []string
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "data: {") {
			continue
		}
		var ch struct {
			Choices []struct {
				Delta map[string]string `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(line[len("data: "):]), &ch); err != nil {
			t.Fatalf("chunk %s: %v", line, err)
		}
		if len(ch.Choices) > 0 {
			d := ch.Choices[0].Delta
			deltas = append(deltas, d["role"]+"|"+d["content"])
		}
	}
	if want := []string{"assistant|", "|Its name is", "| The", "| replica"}; strings.Join(deltas, ",") != strings.Join(want, ",") {
		t.Errorf("streamed deltas %q, want %q", deltas, want)
	}
}

// A streamed completion's text_offset counts from the start of the choice's whole text (the
// echoed prompt included), as the non-streamed response's does, not from each chunk.
func TestStreamedTextOffsetsMatchTheWholeResponse(t *testing.T) {
	_, url := start(t, true)
	req := `{"model":"m","prompt":"Tell me a story","max_tokens":14,"logprobs":1,"echo":true`
	_, whole := post(t, url+"/v1/completions", req+"}")
	var r struct {
		Choices []struct {
			Logprobs struct {
				TextOffset []int `json:"text_offset"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(whole), &r); err != nil || len(r.Choices) != 1 {
		t.Fatalf("%s: %v", whole, err)
	}
	want := append([]int(nil), r.Choices[0].Logprobs.TextOffset...) // r is reused below
	_, out := post(t, url+"/v1/completions", req+`,"stream":true}`)
	var got []int
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "data: {") {
			continue
		}
		if err := json.Unmarshal([]byte(line[len("data: "):]), &r); err != nil {
			t.Fatalf("chunk %s: %v", line, err)
		}
		if len(r.Choices) > 0 {
			got = append(got, r.Choices[0].Logprobs.TextOffset...)
		}
	}
	if len(want) != 14 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("streamed text offsets %v, want the whole response's %v", got, want)
	}
}

// startWithCachedTokens starts a server whose usage reports prompt_tokens_details
// (cached_tokens) and returns its URL.
func startWithCachedTokens(t *testing.T) string {
	t.Helper()
	s, ln := newServer(t, false)
	s.cfg.PromptTokensDetails = true
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.Run(ctx)
	go func() { _ = s.Serve(ctx, ln) }()
	return "http://" + ln.Addr().String()
}

// A conversation's next turn repeats the last turn's prompt and answer: on a real Llama 3
// server vLLM finds both in its prefix cache (the answer's blocks are cached as they fill).
func TestNextTurnFindsTheLastAnswerCached(t *testing.T) {
	url := startWithCachedTokens(t)
	type usage struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		Usage struct {
			Prompt  int `json:"prompt_tokens"`
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	ask := func(body string) usage {
		t.Helper()
		code, out := post(t, url+"/v1/chat/completions", body)
		var u usage
		if err := json.Unmarshal([]byte(out), &u); err != nil || code != 200 || len(u.Choices) != 1 {
			t.Fatalf("%d %s", code, out)
		}
		return u
	}
	q1 := `{"role":"system","content":"` + strings.Repeat("You answer questions about foxes. ", 30) + `"},{"role":"user","content":"Where do foxes live?"}`
	t1 := ask(`{"model":"m","max_tokens":200,"messages":[` + q1 + `]}`)
	answer, _ := json.Marshal(t1.Choices[0].Message.Content)
	t2 := ask(`{"model":"m","max_tokens":1,"messages":[` + q1 + `,{"role":"assistant","content":` + string(answer) + `},{"role":"user","content":"And what do they eat?"}]}`)
	// Turn 1's prompt and the first 199 tokens of its answer (the last one's KV is never
	// computed), in whole 16-token blocks.
	if want := (t1.Usage.Prompt + 199) / 16 * 16; t2.Usage.Details.Cached != want {
		t.Fatalf("turn 2 (%d prompt tokens) found %d cached; want turn 1's %d prompt tokens and its answer's, %d", t2.Usage.Prompt, t2.Usage.Details.Cached, t1.Usage.Prompt, want)
	}
}

// As vLLM, a request's cache_salt keys its prompt's blocks: the same prompt under another
// salt (or none) finds nothing cached, under its own salt all of it; an empty salt is
// refused with vLLM's message.
func TestCacheSaltKeepsPromptsApart(t *testing.T) {
	url := startWithCachedTokens(t)
	msgs := `"messages":[{"role":"user","content":"` + strings.Repeat("Summarise the tenancy agreement. ", 40) + `"}]`
	cached := func(salt string) int {
		t.Helper()
		body := `{"model":"m","max_tokens":1,` + msgs
		if salt != "" {
			body += `,"cache_salt":"` + salt + `"`
		}
		code, out := post(t, url+"/v1/chat/completions", body+"}")
		var u struct {
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(out), &u); err != nil || code != 200 {
			t.Fatalf("%d %s", code, out)
		}
		return u.Usage.Details.Cached
	}
	if got := cached(""); got != 0 {
		t.Fatalf("first request found %d cached", got)
	}
	if got := cached("dGVuYW50LWE="); got != 0 {
		t.Errorf("a salted request found %d tokens of the unsalted prompt cached; vLLM finds none", got)
	}
	if got := cached("dGVuYW50LWE="); got == 0 {
		t.Error("the same salt found nothing cached")
	}
	if got := cached("dGVuYW50LWI="); got != 0 {
		t.Errorf("another salt found %d cached", got)
	}
	if code, out := post(t, url+"/v1/chat/completions", `{"model":"m","max_tokens":1,`+msgs+`,"cache_salt":""}`); code != 400 || !strings.Contains(out, "cache_salt") {
		t.Errorf("an empty cache_salt: %d %s; want 400 naming it", code, out)
	}
}
