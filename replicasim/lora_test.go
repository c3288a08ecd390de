package replicasim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
)

// peftAdapter writes a LoRA adapter folder as PEFT saves one: adapter_config.json (its
// LoraConfig: r, lora_alpha, target_modules, …) and the weights, here a sparse file of size
// bytes.
func peftAdapter(t *testing.T, rank int, size int64) string {
	t.Helper()
	dir := t.TempDir()
	conf := fmt.Sprintf(`{"peft_type":"LORA","task_type":"CAUSAL_LM","base_model_name_or_path":"meta-llama/Llama-3.1-8B-Instruct","r":%d,"lora_alpha":16,"lora_dropout":0.05,"target_modules":["q_proj","v_proj"],"bias":"none"}`, rank)
	if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "adapter_model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	return dir
}

func startLoRA(t *testing.T, l LoRAConfig) (*Server, string) {
	t.Helper()
	p, err := engine.LoadProfile("h100-llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Model: "m", Profile: p, LoRA: &l, Logger: slog.New(slog.DiscardHandler), Exit: func(int) {}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return s, serve(t, s, ln)
}

func postType(t *testing.T, url, contentType, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, contentType, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestLoRAModulesServedAndListedAsVLLMDoes(t *testing.T) {
	sql := peftAdapter(t, 8, 16<<20)
	_, url := startLoRA(t, LoRAConfig{MaxLoRAs: 2, Modules: []LoRAModule{
		{Name: "sql-lora", Path: sql},
		{Name: "tuned", Path: peftAdapter(t, 16, 8<<20), Base: "meta-llama/Llama-3.1-8B"},
	}})
	code, out := get(t, url+"/v1/models")
	var list struct {
		Data []struct {
			ID, Root    string
			Parent      *string
			MaxModelLen *int `json:"max_model_len"`
		}
	}
	if err := json.Unmarshal([]byte(out), &list); code != 200 || err != nil || len(list.Data) != 3 {
		t.Fatalf("/v1/models: %d %s (%v)", code, out, err)
	}
	base, a, b := list.Data[0], list.Data[1], list.Data[2]
	if base.ID != "m" || base.Parent != nil || base.MaxModelLen == nil {
		t.Errorf("base card %+v", base)
	}
	if a.ID != "sql-lora" || a.Root != sql || a.Parent == nil || *a.Parent != "m" || a.MaxModelLen != nil {
		t.Errorf("sql-lora card %s: want root its path, parent the served model, max_model_len null", out)
	}
	if b.ID != "tuned" || b.Parent == nil || *b.Parent != "meta-llama/Llama-3.1-8B" {
		t.Errorf("JSON-form module's card %s: want its base_model_name as parent", out)
	}
	code, out = post(t, url+"/v1/chat/completions", `{"model":"sql-lora","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`)
	if code != 200 || !strings.Contains(out, `"model":"sql-lora"`) {
		t.Errorf("adapter request: %d %s", code, out)
	}
	code, out = post(t, url+"/v1/completions", `{"model":"nope","prompt":"hi","max_tokens":4}`)
	if code != 404 || !strings.Contains(out, "The model `nope` does not exist.") {
		t.Errorf("unknown adapter: %d %s", code, out)
	}
	// Without runtime updates the endpoints do not exist.
	if code, _ := post(t, url+"/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"`+sql+`"}`); code != 404 {
		t.Errorf("load without VLLM_ALLOW_RUNTIME_LORA_UPDATING: %d, want 404", code)
	}
}

func TestLoRARuntimeLoadAndUnloadAnswerAsVLLMDoes(t *testing.T) {
	_, url := startLoRA(t, LoRAConfig{MaxLoRAs: 1, RuntimeUpdates: true})
	dir := peftAdapter(t, 8, 64<<20)
	start := time.Now()
	code, out := post(t, url+"/v1/load_lora_adapter", `{"lora_name":"fin","lora_path":"`+dir+`"}`)
	took := time.Since(start)
	if code != 200 || out != "Success: LoRA adapter 'fin' added successfully." {
		t.Fatalf("load: %d %q", code, out)
	}
	// 64 MiB at 0.51 GiB/s and 32 layers at 20 ms.
	if want := 122*time.Millisecond + 640*time.Millisecond; took < want {
		t.Errorf("load answered in %v, before the adapter could be read (%v)", took, want)
	}
	missing := filepath.Join(t.TempDir(), "nothing")
	for _, c := range []struct {
		name, path, ctype, body string
		code                    int
		typ, msg                string
	}{
		{"again", "load", "application/json", `{"lora_name":"fin","lora_path":"` + dir + `"}`, 400, "InvalidUserInput", "The lora adapter 'fin' has already been loaded."},
		{"no path", "load", "application/json", `{"lora_name":"x"}`, 400, "InvalidUserInput", "Both 'lora_name' and 'lora_path' must be provided."},
		{"missing folder", "load", "application/json", `{"lora_name":"gone","lora_path":"` + missing + `"}`, 404, "NotFoundError", "Loading lora gone failed: No adapter found for " + missing},
		{"rank too large", "load", "application/json", `{"lora_name":"big","lora_path":"` + peftAdapter(t, 64, 1<<20) + `"}`, 400, "BadRequestError", "LoRA rank 64 is greater than max_lora_rank 16."},
		{"not JSON", "load", "text/plain", `{"lora_name":"x","lora_path":"y"}`, 415, "Unsupported Media Type", "Unsupported Media Type: Only 'application/json' is allowed"},
		{"unload no name", "unload", "application/json", `{}`, 400, "InvalidUserInput", "'lora_name' needs to be provided to unload a LoRA adapter."},
		{"unload unknown", "unload", "application/json", `{"lora_name":"nope"}`, 404, "NotFoundError", "The lora adapter 'nope' cannot be found."},
	} {
		code, out := postType(t, url+"/v1/"+c.path+"_lora_adapter", c.ctype, c.body)
		var e vllmErrorBody
		if err := json.Unmarshal([]byte(out), &e); err != nil || code != c.code || e.Error.Code != c.code || e.Error.Type != c.typ || e.Error.Message != c.msg {
			t.Errorf("%s: %d %s; want %d %s %q", c.name, code, out, c.code, c.typ, c.msg)
		}
	}

	// An adapter unloaded while its request streams: the request finishes, new ones are 404s.
	resp, err := http.Post(url+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"fin","prompt":"hi","max_tokens":300,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if code, out := post(t, url+"/v1/unload_lora_adapter", `{"lora_name":"fin"}`); code != 200 || out != "Success: LoRA adapter 'fin' removed successfully." {
		t.Fatalf("unload: %d %q", code, out)
	}
	body, _ := io.ReadAll(resp.Body)
	if n := strings.Count(string(body), `"text"`); !strings.HasSuffix(strings.TrimSpace(string(body)), "data: [DONE]") || n < 300 {
		t.Errorf("the unloaded adapter's stream ended after %d chunks: %q", n, string(body)[max(0, len(body)-200):])
	}
	if code, out := post(t, url+"/v1/completions", `{"model":"fin","prompt":"hi","max_tokens":1}`); code != 404 || !strings.Contains(out, "The model `fin` does not exist.") {
		t.Errorf("after unload: %d %s", code, out)
	}
	if _, out := get(t, url+"/v1/models"); strings.Contains(out, "fin") {
		t.Errorf("/v1/models after unload still lists it: %s", out)
	}
}

// vllm:lora_requests_info names the adapters of running and waiting requests, comma-joined
// without spaces, with the time it was set as its value.
func TestLoRARequestsInfoMetric(t *testing.T) {
	a, b, c := peftAdapter(t, 8, 1<<20), peftAdapter(t, 8, 1<<20), peftAdapter(t, 8, 1<<20)
	_, url := startLoRA(t, LoRAConfig{MaxLoRAs: 2, MaxCPULoRAs: 3, Modules: []LoRAModule{{Name: "a", Path: a}, {Name: "b", Path: b}, {Name: "c", Path: c}}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, name := range []string{"a", "b", "c"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions",
			strings.NewReader(`{"model":"`+name+`","prompt":"hi","max_tokens":2000,"stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		go func() { // a stream's headers come with its first token, which c waits for
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		}()
	}
	re := regexp.MustCompile(`vllm:lora_requests_info\{max_lora="2",running_lora_adapters="([^"]*)",waiting_lora_adapters="([^"]*)"\} (\S+)`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, out := get(t, url+"/metrics")
		var newest []string
		newestAt := 0.0
		for _, m := range re.FindAllStringSubmatch(out, -1) {
			if v, _ := strconv.ParseFloat(m[3], 64); v > newestAt {
				newest, newestAt = m, v
			}
		}
		if newest != nil && len(newest[1]) == 3 && len(newest[2]) == 1 && !strings.Contains(newest[1], newest[2]) {
			if age := float64(time.Now().UnixNano())/1e9 - newestAt; age < 0 || age > 5 {
				t.Errorf("the newest series was set %.1f s ago, want the time of the last step", age)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no series with two adapters running and the third waiting (two slots); newest %q in:\n%s", newest, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestParseLoRAModulesAsVLLMTakesThem(t *testing.T) {
	args := ExpandNargs(strings.Fields(`serve --enable-lora --lora-modules a=/x b=org/y --max-loras 2 -lora-modules {"name":"c","path":"/z"}`), "lora-modules")
	want := strings.Fields(`serve --enable-lora --lora-modules a=/x --lora-modules b=org/y --max-loras 2 -lora-modules {"name":"c","path":"/z"}`)
	if !slices.Equal(args, want) {
		t.Errorf("ExpandNargs: %q, want %q", args, want)
	}
	for _, c := range []struct {
		in   string
		want LoRAModule
		err  string
	}{
		{in: "sql=/adapters/sql", want: LoRAModule{Name: "sql", Path: "/adapters/sql"}},
		{in: `{"name":"sql","path":"yard1/llama-2-7b-sql-lora-test","base_model_name":"meta-llama/Llama-2-7b-hf"}`, want: LoRAModule{Name: "sql", Path: "yard1/llama-2-7b-sql-lora-test", Base: "meta-llama/Llama-2-7b-hf"}},
		{in: "sql", err: "want name=path"},
		{in: "=x", err: "want name=path"},
		{in: `{"name":"x"}`, err: "needs name and path"},
		{in: `{"name":"x","path":"y","rank":4}`, err: "unknown field"},
	} {
		got, err := ParseLoRAModule(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want %q", c.in, err, c.err)
			}
		} else if err != nil || got != c.want {
			t.Errorf("%s: %+v %v", c.in, got, err)
		}
	}
	for v, want := range map[string]bool{"1": true, "True": true, " true ": true, "0": false, "": false, "yes": false} {
		if RuntimeLoRAUpdates(v) != want {
			t.Errorf("RuntimeLoRAUpdates(%q) = %v", v, !want)
		}
	}
	// A module that fails to load stops the start, as in vLLM.
	p, _ := engine.LoadProfile("h100-llama-3.1-8b")
	if _, err := New(Config{Model: "m", Profile: p, LoRA: &LoRAConfig{Modules: []LoRAModule{{Name: "x", Path: "/nonexistent/x"}}}}); err == nil || !strings.Contains(err.Error(), "No adapter found for /nonexistent/x") {
		t.Errorf("a missing module: %v", err)
	}
}
