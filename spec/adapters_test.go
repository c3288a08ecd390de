package spec

import (
	"reflect"
	"strings"
	"testing"
)

// SkyPilot's own LoRA serving form (llm/llama-3_1-finetuning/serve.yaml: vllm serve with
// --enable-lora --lora-modules $LORA_NAME=/checkpoints/…, names from envs), as a service.
const skyLoRA = `envs:
  MODEL_SIZE: 8B
  LORA_NAME: my-finance-lora
resources:
  accelerators: L4
run: |
  vllm serve meta-llama/Meta-Llama-3.1-${MODEL_SIZE}-Instruct \
    --tensor-parallel-size $SKYPILOT_NUM_GPUS_PER_NODE \
    --enable-lora \
    --lora-modules $LORA_NAME=/checkpoints/${MODEL_SIZE}-lora/Meta-Llama-3.1-${MODEL_SIZE}-Instruct/ \
    --max-model-len=2048 --port 8081
service:
  readiness_probe: /v1/models
  replicas: 1
`

func TestAdaptersFromTheRunCommand(t *testing.T) {
	s, err := Parse("s.yaml", []byte(skyLoRA))
	if err != nil {
		t.Fatal(err)
	}
	want := []Adapter{{Name: "my-finance-lora", Path: "/checkpoints/8B-lora/Meta-Llama-3.1-8B-Instruct/", Static: true}}
	if !reflect.DeepEqual(s.Arbiter.Adapters, want) || s.Arbiter.LoRA != (LoRA{Enabled: true, MaxLoRAs: 1}) {
		t.Errorf("adapters %+v lora %+v; want %+v and LoRA enabled with vLLM's one slot", s.Arbiter.Adapters, s.Arbiter.LoRA, want)
	}

	// Several after one flag, vLLM's JSON form, --max-loras, and replicasim's spelling.
	for _, run := range []string{
		`vllm serve m --enable-lora --lora-modules sql-lora=yard1/llama-2-7b-sql-lora-test '{"name": "fin", "path": "/a/fin", "base_model_name": "meta-llama/Llama-2-7b"}' --max-loras 4`,
		`exec replicasim -listen 127.0.0.1:$PORT -enable-lora -max-loras=4 -lora-modules sql-lora=yard1/llama-2-7b-sql-lora-test -lora-modules '{"name":"fin","path":"/a/fin","base_model_name":"meta-llama/Llama-2-7b"}'`,
	} {
		s, err := Parse("s.yaml", []byte("run: "+quoteYAML(run)+"\nservice: {replicas: 1}\n"))
		if err != nil {
			t.Fatalf("%s: %v", run, err)
		}
		want := []Adapter{
			{Name: "sql-lora", Path: "yard1/llama-2-7b-sql-lora-test", Static: true},
			{Name: "fin", Path: "/a/fin", Parent: "meta-llama/Llama-2-7b", Static: true},
		}
		if !reflect.DeepEqual(s.Arbiter.Adapters, want) || s.Arbiter.LoRA.MaxLoRAs != 4 {
			t.Errorf("%s:\n adapters %+v max_loras %d", run, s.Arbiter.Adapters, s.Arbiter.LoRA.MaxLoRAs)
		}
	}
}

// Attached values (--flag=VALUE, quoted JSON), a count from envs, and a path from the
// replica's own environment ($HOME, which the file does not give) read as the shell would.
func TestAdaptersFromAttachedFlags(t *testing.T) {
	run := `vllm serve m --enable-lora --max-loras=$SLOTS --lora-modules='{"name": "fin", "path": "/a/fin"}' --lora-modules sql=$HOME/ckpt/sql`
	s, err := Parse("s.yaml", []byte("envs: {SLOTS: 6}\nrun: "+quoteYAML(run)+"\nservice: {replicas: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Adapter{{Name: "fin", Path: "/a/fin", Static: true}, {Name: "sql", Path: "${HOME}/ckpt/sql", Static: true}}
	if !reflect.DeepEqual(s.Arbiter.Adapters, want) || s.Arbiter.LoRA.MaxLoRAs != 6 {
		t.Errorf("adapters %+v max_loras %d; want %+v and 6", s.Arbiter.Adapters, s.Arbiter.LoRA.MaxLoRAs, want)
	}
	// The JSON form with a path from the replica's environment.
	run = `vllm serve m --enable-lora --lora-modules "{\"name\": \"fin\", \"path\": \"$HOME/fin\"}"`
	s, err = Parse("s.yaml", []byte("run: "+quoteYAML(run)+"\nservice: {replicas: 1}\n"))
	if err != nil || len(s.Arbiter.Adapters) != 1 || s.Arbiter.Adapters[0].Path != "${HOME}/fin" {
		t.Errorf("JSON module with $HOME in its path: %+v, %v", s, err)
	}
}

func quoteYAML(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func TestDeclaredAdapters(t *testing.T) {
	const run = "run: vllm serve m --enable-lora --max-loras 4\n"
	s, err := Parse("s.yaml", []byte(run+`service: {replicas: 1}
file_mounts:
  /adapters: {source: s3://team-adapters/llama, mode: MOUNT}
arbiter:
  model: m
  providers: [aws]
  adapters:
    - {name: sql, source: hf://yard1/llama-2-7b-sql-lora-test}
    - {name: fin, source: s3://team-adapters/llama/fin, parent: m}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []Adapter{
		{Name: "sql", Source: "hf://yard1/llama-2-7b-sql-lora-test", Path: "yard1/llama-2-7b-sql-lora-test"},
		{Name: "fin", Source: "s3://team-adapters/llama/fin", Path: "/adapters/fin", Parent: "m"},
	}
	if !reflect.DeepEqual(s.Arbiter.Adapters, want) || !s.Arbiter.LoRA.RuntimeUpdates {
		t.Errorf("adapters %+v, runtime updates %v; want %+v, true", s.Arbiter.Adapters, s.Arbiter.LoRA.RuntimeUpdates, want)
	}
	checkRoundTrip(t, []byte(run+"service: {replicas: 1}\narbiter:\n  adapters: [{name: a, source: /srv/a}, {name: b, source: 'hf://o/b', parent: p}]\n"))

	local := run + "service: {replicas: 1}\narbiter:\n  adapters: [{name: a, source: /srv/a}]\n"
	if s, err := Parse("s.yaml", []byte(local)); err != nil || s.Arbiter.Adapters[0].Path != "/srv/a" {
		t.Errorf("a local folder on the local provider: %v", err)
	}

	for _, c := range []struct{ name, file, want string }{
		{"no --enable-lora", "run: vllm serve m\nservice: {replicas: 1}\narbiter: {adapters: [{name: a, source: /srv/a}]}\n",
			"does not start vLLM with --enable-lora"},
		{"runtime updates off", run + "envs: {VLLM_ALLOW_RUNTIME_LORA_UPDATING: 'False'}\nservice: {replicas: 1}\narbiter: {adapters: [{name: a, source: /srv/a}]}\n",
			"VLLM_ALLOW_RUNTIME_LORA_UPDATING=true"},
		{"relative", run + "service: {replicas: 1}\narbiter: {adapters: [{name: a, source: adapters/a}]}\n", "want an absolute folder"},
		{"bad hf id", run + "service: {replicas: 1}\narbiter: {adapters: [{name: a, source: 'hf://a'}]}\n", "want hf://ORG/NAME"},
		{"comma", run + "service: {replicas: 1}\narbiter: {adapters: [{name: 'a,b', source: /srv/a}]}\n", "has a comma"},
		{"no source", run + "service: {replicas: 1}\narbiter: {adapters: [{name: a}]}\n", "source missing"},
		{"taken by the model", run + "service: {replicas: 1}\narbiter: {model: m, adapters: [{name: m, source: /srv/a}]}\n", "the name is taken"},
		{"twice", "run: vllm serve m --enable-lora --lora-modules a=/x\nservice: {replicas: 1}\narbiter: {adapters: [{name: a, source: /srv/a}]}\n", "the name is taken"},
		{"unmounted bucket", run + "service: {replicas: 1}\narbiter: {providers: [aws], adapters: [{name: a, source: s3://b/a}]}\n", "nothing puts it on the replicas"},
		{"copied bucket", run + "service: {replicas: 1}\nfile_mounts: {/adapters: {source: s3://b, mode: COPY}}\narbiter: {providers: [aws], adapters: [{name: a, source: s3://b/a}]}\n", "mode COPY"},
		{"local folder, remote replicas", run + "service: {replicas: 1}\narbiter: {providers: [aws], adapters: [{name: a, source: /srv/a}]}\n", "mount this machine's folder"},
		{"module name unknown", "run: vllm serve m --enable-lora --lora-modules $NAME=/x\nservice: {replicas: 1}\n", "the adapter's name comes from a variable the file gives no value"},
		{"module form", "run: vllm serve m --enable-lora --lora-modules /x\nservice: {replicas: 1}\n", "want name=path"},
		{"max_loras", "run: vllm serve m --enable-lora --max-loras 0\nservice: {replicas: 1}\n", "--max-loras \"0\""},
	} {
		_, err := Parse("s.yaml", []byte(c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error containing %q", c.name, err, c.want)
		}
	}
}
