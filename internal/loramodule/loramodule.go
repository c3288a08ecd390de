// Package loramodule reads vLLM's --lora-modules values, for the spec (what a run: command
// gives vLLM) and the replica simulator (what it was given) alike.
package loramodule

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Module is one --lora-modules entry: name=path, or vLLM's JSON form with a parent.
type Module struct {
	Name string `json:"name"`
	Path string `json:"path"`
	// Base is the JSON form's base_model_name, /v1/models' parent.
	Base string `json:"base_model_name,omitempty"`
}

// Parse reads one --lora-modules value as vLLM's LoRAParserAction does
// (vllm/entrypoints/openai/cli_args.py): name=path, or a JSON object with name, path and
// optionally base_model_name; another key is an error, as vLLM's LoRAModulePath(**dict)
// makes it.
func Parse(v string) (Module, error) {
	if strings.HasPrefix(strings.TrimSpace(v), "{") {
		var m Module
		dec := json.NewDecoder(strings.NewReader(v))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&m); err != nil {
			return m, fmt.Errorf("--lora-modules %s: not a LoRA module's JSON (name, path, base_model_name): %v", v, err)
		}
		if m.Name == "" || m.Path == "" {
			return m, fmt.Errorf("--lora-modules %s: the JSON form needs name and path", v)
		}
		return m, nil
	}
	name, path, ok := strings.Cut(v, "=")
	if !ok || name == "" || path == "" {
		return Module{}, fmt.Errorf("--lora-modules %q: want name=path or a JSON object", v)
	}
	return Module{Name: name, Path: path}, nil
}
