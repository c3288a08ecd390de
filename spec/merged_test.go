package spec

import (
	"errors"
	"strings"
	"testing"
)

// The run: lines are in the forms SkyPilot's own LLM examples start vLLM with (llm/vllm's
// service.yaml: `vllm serve $MODEL_NAME --host 0.0.0.0 --port 8080 --tensor-parallel-size
// $SKYPILOT_NUM_GPUS_PER_NODE …`; older examples: `python -u -m
// vllm.entrypoints.openai.api_server --model …`), with vLLM's LoRA flags.
func TestMergedRunStartsTheMergedCheckpoint(t *testing.T) {
	for _, c := range []struct{ name, run, want string }{
		{"vllm serve",
			"vllm serve $MODEL_NAME --host 0.0.0.0 --port 8080 --tensor-parallel-size $SKYPILOT_NUM_GPUS_PER_NODE --enable-lora --max-loras 4 --lora-modules a=/x b=/y --max-lora-rank=64 --served-model-name llama\n",
			"vllm serve /merged/fin --host 0.0.0.0 --port 8080 --tensor-parallel-size $SKYPILOT_NUM_GPUS_PER_NODE --served-model-name fin\n"},
		{"python -m with --model",
			"conda activate vllm\npython -u -m vllm.entrypoints.openai.api_server --host 0.0.0.0 --port 8080 --model meta-llama/Llama-3.1-8B-Instruct --enable-lora --lora-modules '{\"name\": \"a\", \"path\": \"/x\"}'\n",
			""},
		{"exec, and a quoted model",
			"exec vllm serve \"$MODEL\" --enable-lora --port 8000\n",
			"exec vllm serve /merged/fin --port 8000 --served-model-name fin\n"},
		{"quoted flags",
			"vllm serve m '--enable-lora' \"--lora-modules\" a=/x --enable-lora-bias --port 8000\n",
			"vllm serve /merged/fin --port 8000 --served-model-name fin\n"},
		{"--model= and a path with a space",
			"vllm serve --model=m --enable_lora --port 8000\n",
			"vllm serve --model='/merged/a b' --port 8000 --served-model-name fin\n"},
	} {
		path := "/merged/fin"
		if strings.Contains(c.name, "space") {
			path = "/merged/a b"
		}
		got, err := MergedRun(c.run, path, "fin")
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if c.want == "" {
			if !strings.Contains(got, "-m vllm.entrypoints.openai.api_server --host 0.0.0.0 --port 8080 --model /merged/fin --served-model-name fin") || strings.Contains(got, "lora") || !strings.HasPrefix(got, "conda activate vllm\n") {
				t.Errorf("%s: %q", c.name, got)
			}
			continue
		}
		if got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
	for _, bad := range []string{"python serve.py --port 8000\n", "echo vllm serve m\n"} {
		if _, err := MergedRun(bad, "/m", "fin"); !errors.Is(err, ErrNoVLLMServe) {
			t.Errorf("%q: %v; want ErrNoVLLMServe", bad, err)
		}
	}
	if _, err := MergedRun("vllm serve --port 8000\n", "/m", "fin"); err == nil || !strings.Contains(err.Error(), "without a model") {
		t.Errorf("no model: %v", err)
	}
	if _, err := MergedRun("vllm serve \"${ARGS[@]}\"\n", "/m", "fin"); err == nil || !strings.Contains(err.Error(), "from an array") {
		t.Errorf("model and flags from an array: %v", err)
	}
}

func TestMergedAdapterDeclared(t *testing.T) {
	const run = "run: vllm serve m --enable-lora --max-loras 4\n"
	file := run + `service: {replica_policy: {min_replicas: 0, max_replicas: 4, target_qps_per_replica: 2}}
file_mounts:
  /ckpt: {source: s3://team/llama, mode: MOUNT}
arbiter:
  providers: [aws]
  adapters:
    - {name: fin, source: s3://team/llama/fin, merged: s3://team/llama/fin-merged}
    - {name: sql, source: hf://o/sql, merged: hf://o/sql-merged}
`
	s, err := Parse("s.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	if a := s.Arbiter.Adapters; len(a) != 2 || a[0].MergedPath != "/ckpt/fin-merged" || a[1].MergedPath != "o/sql-merged" || a[0].Merged != "s3://team/llama/fin-merged" {
		t.Errorf("adapters %+v", a)
	}
	checkRoundTrip(t, []byte(file))
	for _, c := range []struct{ name, file, want string }{
		{"fixed count", run + "service: {replicas: 2}\narbiter: {adapters: [{name: a, source: /srv/a, merged: /srv/am}]}\n", "give the service a range"},
		{"no vllm serve", "run: python serve.py --enable-lora\nservice: {replica_policy: {min_replicas: 0, max_replicas: 4, target_qps_per_replica: 2}}\narbiter: {adapters: [{name: a, source: /srv/a, merged: /srv/am}]}\n", "starts no vLLM server"},
		{"relative", run + "service: {replica_policy: {max_replicas: 2, target_qps_per_replica: 2}}\narbiter: {adapters: [{name: a, source: /srv/a, merged: am}]}\n", "arbiter.adapters[0].merged: \"am\": want an absolute folder"},
		{"unmounted", run + "service: {replica_policy: {max_replicas: 2, target_qps_per_replica: 2}}\narbiter: {providers: [aws], adapters: [{name: a, source: hf://o/a, merged: s3://b/am}]}\n", "arbiter.adapters[0].merged: \"s3://b/am\": nothing puts it on the replicas"},
	} {
		_, err := Parse("s.yaml", []byte(c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error containing %q", c.name, err, c.want)
		}
	}
}
