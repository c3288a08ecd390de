package oai

import (
	"bytes"
	"encoding/binary"
	"mime/multipart"
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

// Rerank, score, pooling and classify bodies as vLLM 0.11's protocol types take them
// (RerankRequest, ScoreRequest, PoolingRequest, ClassificationRequest).
func TestParsePoolingRequests(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		kind       Kind
		prompt     string
		shared     string
		pairs      int
	}{
		{"rerank", `{"model":"m","query":"capital of France?","documents":["Paris is.","Berlin is."],"top_n":1}`, Rerank, "capital of France?\nParis is.\nBerlin is.", "capital of France?", 2},
		{"rerank multimodal query", `{"model":"m","query":{"content":[{"type":"text","text":"q"}]},"documents":["d"]}`, Rerank, "q\nd", "q", 1},
		{"score one to many", `{"model":"m","text_1":"a","text_2":["b","c","d"]}`, Score, "a\nb\nc\nd", "a", 3},
		{"score pairwise", `{"model":"m","text_1":["a","b"],"text_2":["c","d"]}`, Score, "a\nb\nc\nd", "", 2},
		{"pooling input", `{"model":"m","input":"pool me"}`, Pooling, "pool me", "", 0},
		{"pooling messages", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, Pooling, "hi", "", 0},
		{"classify list", `{"model":"m","input":["good","bad"]}`, Classify, "good\nbad", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p fastjson.Parser
			r, err := Parse(&p, []byte(tc.body), tc.kind)
			if err != nil {
				t.Fatal(err)
			}
			if r.Model != "m" || r.Prompt != tc.prompt || r.SharedText != tc.shared || r.Pairs != tc.pairs || r.Kind.Generates() {
				t.Fatalf("got model %q prompt %q shared %q pairs %d", r.Model, r.Prompt, r.SharedText, r.Pairs)
			}
		})
	}
	for _, tc := range []struct {
		body string
		kind Kind
		want string
	}{
		{`{"model":"m","documents":["d"]}`, Rerank, "'query' is required"},
		{`{"model":"m","query":"q"}`, Rerank, "'documents' is required"},
		{`{"model":"m","query":"q","documents":[]}`, Rerank, "'documents' must not be empty"},
		{`{"model":"m","query":"q","documents":[1]}`, Rerank, "'documents[0]' must be a string"},
		{`{"model":"m","text_1":"a"}`, Score, "'text_1' and 'text_2' are required"},
		{`{"model":"m"}`, Classify, "'input' is required"},
	} {
		var p fastjson.Parser
		if _, err := Parse(&p, []byte(tc.body), tc.kind); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.body, err, tc.want)
		}
	}
}

// A rerank's usage is total_tokens alone (RerankUsage); a transcription's is its audio's
// duration (TranscriptionUsageAudio); a score's and a pooling's are UsageInfo.
func TestPoolingAndAudioUsage(t *testing.T) {
	for _, tc := range []struct {
		body string
		want Usage
	}{
		{`{"id":"rerank-1","results":[],"usage":{"total_tokens":37}}`, Usage{Prompt: 37}},
		{`{"data":[],"usage":{"prompt_tokens":12,"total_tokens":12,"completion_tokens":0,"prompt_tokens_details":null}}`, Usage{Prompt: 12}},
		{`{"text":"hello","usage":{"type":"duration","seconds":9}}`, Usage{AudioSeconds: 9}},
		{`{"text":"hello","usage":{"type":"duration","seconds":-1}}`, Usage{Invalid: UsageNegative, Detail: "seconds -1 is negative"}},
	} {
		var p fastjson.Parser
		got, ok := ResponseUsage(&p, []byte(tc.body))
		if !ok || got != tc.want {
			t.Errorf("%s: got %+v %v, want %+v", tc.body, got, ok, tc.want)
		}
	}
}

// wavHeader is a canonical 44-byte PCM WAV header for 16 kHz mono 16-bit audio.
func wavHeader(dataBytes int) []byte {
	h := make([]byte, 44)
	copy(h, "RIFF")
	binary.LittleEndian.PutUint32(h[4:], uint32(36+dataBytes))
	copy(h[8:], "WAVEfmt ")
	binary.LittleEndian.PutUint32(h[16:], 16)
	binary.LittleEndian.PutUint16(h[20:], 1)
	binary.LittleEndian.PutUint16(h[22:], 1)
	binary.LittleEndian.PutUint32(h[24:], 16000)
	binary.LittleEndian.PutUint32(h[28:], 32000)
	binary.LittleEndian.PutUint16(h[32:], 2)
	binary.LittleEndian.PutUint16(h[34:], 16)
	copy(h[36:], "data")
	binary.LittleEndian.PutUint32(h[40:], uint32(dataBytes))
	return h
}

// The OpenAI SDKs send the file before the model; the model is found after it.
func TestParseAudioRequest(t *testing.T) {
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	f, _ := w.CreateFormFile("file", "a.wav")
	_, _ = f.Write(append(wavHeader(96000), make([]byte, 96000)...)) // 3 s
	_ = w.WriteField("model", "openai/whisper-large-v3")
	_ = w.WriteField("prompt", "a talk")
	_ = w.Close()
	r, err := ParseAudioRequest(buf.Bytes(), w.FormDataContentType())
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "openai/whisper-large-v3" || r.Prompt != "a talk" || r.FileBytes != 96044 || r.Seconds != 3 {
		t.Fatalf("got %+v", r)
	}
	if _, err := ParseAudioRequest([]byte(`{"model":"m"}`), "application/json"); err == nil || !strings.Contains(err.Error(), "multipart/form-data") {
		t.Fatalf("JSON body: got %v", err)
	}
	buf.Reset()
	w = multipart.NewWriter(&buf)
	_ = w.WriteField("model", "m")
	_ = w.Close()
	if _, err := ParseAudioRequest(buf.Bytes(), w.FormDataContentType()); err == nil || !strings.Contains(err.Error(), "'file' is required") {
		t.Fatalf("no file: got %v", err)
	}
}
