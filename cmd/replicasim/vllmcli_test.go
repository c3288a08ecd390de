package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// SkyPilot's own run: lines (llm/llama-3_1-finetuning/serve.yaml's LoRA serve, llm/vllm's
// service), after the shell filled in their variables, start the simulator in their place.
func TestVLLMServeCommandLines(t *testing.T) {
	for _, c := range []struct {
		line        string
		accelerator string
		want        []string
		ignored     []string
	}{
		{
			line:    "serve meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 1 --enable-lora --lora-modules my-finance-lora=/checkpoints/8B-lora/Meta-Llama-3.1-8B-Instruct/ --max-model-len=2048 --port 8081",
			want:    []string{"-listen", "127.0.0.1:8081", "-model", "meta-llama/Llama-3.1-8B-Instruct", "-enable-lora", "-lora-modules", "my-finance-lora=/checkpoints/8B-lora/Meta-Llama-3.1-8B-Instruct/", "-profile", "h100-llama-3.1-8b"},
			ignored: []string{"--tensor-parallel-size 1", "--max-model-len 2048"},
		},
		{
			line:        "serve meta-llama/Llama-3.1-8B-Instruct --host 0.0.0.0 --port 8000 --max-loras 4 --lora-modules a=/x b=/y --served-model-name llama --trust-remote-code",
			accelerator: "L4",
			want:        []string{"-listen", "127.0.0.1:8000", "-model", "llama", "-max-loras", "4", "-lora-modules", "a=/x", "-lora-modules", "b=/y", "-profile", "l4-llama-3.1-8b"},
			ignored:     []string{"--trust-remote-code"},
		},
		{
			line:    "serve meta-llama/Llama-3.1-8B-Instruct --scheduling-policy priority --port 8000",
			want:    []string{"-listen", "127.0.0.1:8000", "-model", "meta-llama/Llama-3.1-8B-Instruct", "-scheduling-policy", "priority", "-profile", "h100-llama-3.1-8b"},
			ignored: nil,
		},
		{
			line:    "serve some/unknown-model --port 9000",
			want:    []string{"-listen", "127.0.0.1:9000", "-model", "some/unknown-model"},
			ignored: []string{"(no profile for some/unknown-model on H100"},
		},
	} {
		got, ignored, err := vllmServeArgs(strings.Fields(c.line), c.accelerator)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s:\n got %q (%v)\nwant %q", c.line, got, err, c.want)
		}
		for _, w := range c.ignored {
			if !slices.ContainsFunc(ignored, func(s string) bool { return strings.HasPrefix(s, w) }) {
				t.Errorf("%s: ignored %q, want %q among them", c.line, ignored, w)
			}
		}
	}
	for _, bad := range []string{"chat --model x", "serve", "serve m stray"} {
		if _, _, err := vllmServeArgs(strings.Fields(bad), ""); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A merged adapter's checkpoint (issue 51) is a folder transformers saved, whose
// config.json names the model it came from: it runs as that model.
func TestVLLMServeAMergedCheckpoint(t *testing.T) {
	dir := t.TempDir()
	conf := `{"_name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "torch_dtype": "bfloat16"}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	got, ignored, err := vllmServeArgs([]string{"serve", dir, "--port", "8001", "--served-model-name", "fin"}, "L4")
	want := []string{"-listen", "127.0.0.1:8001", "-model", "fin", "-profile", "l4-llama-3.1-8b"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("got %q (%v), want %q", got, err, want)
	}
	if len(ignored) != 1 || !strings.Contains(ignored[0], "simulated as meta-llama/Llama-3.1-8B-Instruct") {
		t.Errorf("ignored %q", ignored)
	}
}
