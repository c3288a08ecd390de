package replicasim

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
)

// startTask starts a server (H100 8B profile) serving task.
func startTask(t *testing.T, task string) string {
	t.Helper()
	s, ln := newServer(t, false)
	s.cfg.Task = task
	return serve(t, s, ln)
}

// A reranker (-task score) answers rerank, score, classify and pooling as vLLM 0.11's
// protocol types shape them, each with its prompt tokens in usage, and refuses generation
// with vLLM's 400; a generation model refuses rerank the same way.
func TestPoolingTasksAsVLLMServesThem(t *testing.T) {
	url := startTask(t, TaskScore)
	code, body := post(t, url+"/v1/rerank", `{"model":"m","query":"capital of France","documents":["Berlin is in Germany.","The capital of France is Paris."],"top_n":1}`)
	var rr struct {
		Results []struct {
			Index          int                   `json:"index"`
			RelevanceScore float64               `json:"relevance_score"`
			Document       struct{ Text string } `json:"document"`
		} `json:"results"`
		Usage map[string]int `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &rr); code != 200 || err != nil {
		t.Fatalf("rerank: %d %s", code, body)
	}
	if len(rr.Results) != 1 || rr.Results[0].Index != 1 || rr.Results[0].Document.Text != "The capital of France is Paris." || len(rr.Usage) != 1 || rr.Usage["total_tokens"] < 10 {
		t.Fatalf("rerank: want the Paris document first, top_n 1, usage total_tokens alone: %s", body)
	}
	code, body = post(t, url+"/score", `{"model":"m","text_1":"a cat","text_2":["a cat","a dog"]}`)
	var sr struct {
		Object string `json:"object"`
		Data   []struct {
			Index int     `json:"index"`
			Score float64 `json:"score"`
		} `json:"data"`
		Usage struct {
			Prompt int `json:"prompt_tokens"`
			Total  int `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &sr); code != 200 || err != nil || sr.Object != "list" || len(sr.Data) != 2 || sr.Data[0].Score <= sr.Data[1].Score || sr.Usage.Prompt == 0 || sr.Usage.Total != sr.Usage.Prompt {
		t.Fatalf("score: %d %s", code, body)
	}
	for _, p := range []string{"/classify", "/pooling"} {
		code, body = post(t, url+p, `{"model":"m","input":["good","bad"]}`)
		if code != 200 || !strings.Contains(body, `"index":1`) || !strings.Contains(body, `"prompt_tokens":`) {
			t.Fatalf("%s: %d %s", p, code, body)
		}
	}
	code, body = post(t, url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	if code != 400 || !strings.Contains(body, "The model does not support Chat Completions API") {
		t.Fatalf("chat on a reranker: %d %s", code, body)
	}
	gen := startTask(t, TaskGenerate)
	code, body = post(t, gen+"/rerank", `{"model":"m","query":"q","documents":["d"]}`)
	if code != 400 || !strings.Contains(body, "The model does not support Rerank (Score) API") {
		t.Fatalf("rerank on a generation model: %d %s", code, body)
	}
}

// wav is a 16 kHz mono 16-bit PCM WAV file of the given seconds of silence.
func wav(seconds int) []byte {
	n := seconds * 32000
	h := make([]byte, 44, 44+n)
	copy(h, "RIFF")
	binary.LittleEndian.PutUint32(h[4:], uint32(36+n))
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

// A Whisper-shaped replica (-task transcription) answers a multipart transcription with
// vLLM's TranscriptionResponse: text and the audio's duration as usage.
func TestTranscriptionAsVLLMServesIt(t *testing.T) {
	url := startTask(t, TaskTranscription)
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	f, _ := w.CreateFormFile("file", "a.wav")
	_, _ = f.Write(wav(2))
	_ = w.WriteField("model", "m")
	_ = w.Close()
	resp, err := http.Post(url+"/v1/audio/transcriptions", w.FormDataContentType(), &buf)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tr struct {
		Text  string
		Usage struct {
			Type    string
			Seconds int
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&tr); resp.StatusCode != 200 || err != nil || tr.Text == "" || tr.Usage.Type != "duration" || tr.Usage.Seconds != 2 {
		t.Fatalf("%d %v %+v", resp.StatusCode, err, tr)
	}
	code, body := post(t, url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	if code != 400 || !strings.Contains(body, "does not support") {
		t.Fatalf("chat on a Whisper model: %d %s", code, body)
	}
	if code, body := post(t, url+"/tokenize", `{"model":"m","prompt":"hi"}`); code != 200 || !strings.Contains(body, `"count":`) {
		t.Fatalf("tokenize: %d %s", code, body)
	}
}
