package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/arbiter-serve/arbiter/engine"
)

// vLLM's command line: replicasim run as `vllm serve MODEL [flags]` (a link named vllm, or
// its first argument serve) simulates the server that command would start, so a SkyServe
// file's run: line runs unchanged on a machine without a GPU. The flags replicasim models
// keep their meaning; the others (parallelism, memory, dtype, …) change nothing a simulator
// shows and are named in one warning, never silently dropped.

// vllmFlags maps vLLM's flags replicasim honours to its own (the same name where it has one).
var vllmFlags = map[string]string{
	"served-model-name":            "model",
	"enable-lora":                  "enable-lora",
	"lora-modules":                 "lora-modules",
	"max-loras":                    "max-loras",
	"max-lora-rank":                "max-lora-rank",
	"max-cpu-loras":                "max-cpu-loras",
	"enable-prompt-tokens-details": "enable-prompt-tokens-details",
	"task":                         "task",
	"enforce-eager":                "enforce-eager",
	"scheduling-policy":            "scheduling-policy",
}

// vllmBoolFlags take no value.
var vllmBoolFlags = map[string]bool{
	"enable-lora": true, "enable-prompt-tokens-details": true, "enforce-eager": true, "trust-remote-code": true,
	"enable-prefix-caching": true, "no-enable-prefix-caching": true, "disable-log-requests": true, "disable-log-stats": true,
	"enable-chunked-prefill": true, "enable-auto-tool-choice": true,
}

// vllmServeArgs turns `serve MODEL [flags]` into replicasim's flags. accelerator is the GPU
// the replica was placed on ($ARBITER_ACCELERATOR), which picks the profile generated for it
// and the model; without one, or for a model the engine does not know, the default profile.
// ignored lists the flags that change nothing here.
func vllmServeArgs(args []string, accelerator string) (out, ignored []string, err error) {
	if len(args) == 0 || args[0] != "serve" {
		return nil, nil, fmt.Errorf("as vllm, replicasim simulates `vllm serve MODEL [flags]` only, got %q", strings.Join(args, " "))
	}
	args = args[1:]
	model := ""
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		model, args = args[0], args[1:]
	}
	host, port, served := "127.0.0.1", "8000", ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			return nil, nil, fmt.Errorf("vllm serve: unexpected argument %q", a)
		}
		if !strings.HasPrefix(a, "--") {
			// A short form (-tp 2, -O3): nothing a simulator models.
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") && !strings.Contains(a, "=") {
				i++
				a += " " + args[i]
			}
			ignored = append(ignored, a)
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		name = strings.ReplaceAll(name, "_", "-") // vLLM takes --max_model_len too
		value := func() string {
			if hasVal {
				return val
			}
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
				i++
				return args[i]
			}
			return ""
		}
		switch {
		case name == "model":
			model = value()
		case name == "host":
			if h := value(); h != "" && h != "0.0.0.0" && h != "::" {
				host = h
			} // a simulator listens on loopback: it serves this machine only
		case name == "port":
			port = value()
		case name == "served-model-name":
			served = value()
		case name == "lora-modules":
			for i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
				i++
				out = append(out, "-lora-modules", args[i])
			}
			if hasVal {
				out = append(out, "-lora-modules", val)
			}
		case vllmBoolFlags[name]:
			if own, ok := vllmFlags[name]; ok {
				out = append(out, "-"+own)
			} else {
				ignored = append(ignored, "--"+name)
			}
		case vllmFlags[name] != "":
			out = append(out, "-"+vllmFlags[name], value())
		default:
			ignored = append(ignored, strings.TrimSpace("--"+name+" "+value()))
		}
	}
	if model == "" {
		return nil, nil, fmt.Errorf("vllm serve: no model (vllm serve MODEL)")
	}
	if served == "" {
		served = model
	}
	out = append([]string{"-listen", net.JoinHostPort(host, port), "-model", served}, out...)
	gpu := accelerator
	if gpu == "" {
		gpu = "H100"
	}
	if base, note := checkpointBase(model); base != "" {
		model = base
		ignored = append(ignored, note)
	}
	name, err := engine.ProfileOn(gpu, model)
	if err == nil {
		_, err = engine.LoadProfile(name)
	}
	if err != nil {
		ignored = append(ignored, fmt.Sprintf("(no profile for %s on %s: %v; the default profile)", model, gpu, err))
	} else {
		out = append(out, "-profile", name)
	}
	return out, ignored, nil
}

// checkpointBase is the model a local checkpoint folder was saved from, by the
// _name_or_path that transformers writes into its config.json (a merged adapter's
// checkpoint is the base model's architecture: issue 51), with a note saying so; "" for
// anything else (a Hugging Face id, a folder without it).
func checkpointBase(model string) (base, note string) {
	raw, err := os.ReadFile(filepath.Join(model, "config.json"))
	if err != nil {
		return "", ""
	}
	var c struct {
		NameOrPath string `json:"_name_or_path"`
	}
	if json.Unmarshal(raw, &c) != nil || c.NameOrPath == "" || c.NameOrPath == model {
		return "", ""
	}
	return c.NameOrPath, fmt.Sprintf("(the checkpoint in %s is simulated as %s, its config.json's _name_or_path)", model, c.NameOrPath)
}
