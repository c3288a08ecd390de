package spec

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/internal/loramodule"
)

// Adapter is a LoRA adapter the service serves on its base model (issue 51): named by the
// run: command's --lora-modules (vLLM loads it at start), or by arbiter.adapters (loaded at
// run time through vLLM's /v1/load_lora_adapter, so that serve update adds and removes one
// without restarting a replica).
type Adapter struct {
	// Name is what clients send as "model".
	Name string
	// Path is where the replica's vLLM reads it (its lora_path): a path on the replica, or
	// a Hugging Face id, which vLLM downloads.
	Path string
	// Source is arbiter.adapters' source as written; empty for a --lora-modules one.
	Source string
	// Parent is the base model it runs on (vLLM's /v1/models parent); empty: the service's
	// model.
	Parent string
	// Static: named by --lora-modules, loaded by vLLM before it serves.
	Static bool
	// Merged is arbiter.adapters' merged as written: a checkpoint of the base model with the
	// adapter merged into its weights (PEFT's merge_and_unload), which lets a hot adapter
	// run replicas of its own at the base model's step cost; "" none. MergedPath is where
	// a replica's vLLM reads it, as Path is for the adapter.
	Merged, MergedPath string
}

// HasAdapter reports whether the service serves an adapter of that name.
func (a *Arbiter) HasAdapter(name string) bool {
	return slices.ContainsFunc(a.Adapters, func(ad Adapter) bool { return ad.Name == name })
}

// MergedPath is where the replicas read adapter name's merged checkpoint: "" for an adapter
// without one, or no adapter of that name.
func (a *Arbiter) MergedPath(name string) string {
	for _, ad := range a.Adapters {
		if ad.Name == name {
			return ad.MergedPath
		}
	}
	return ""
}

// LoRA is what the run: command tells of the engine's adapters.
type LoRA struct {
	// Enabled: the command starts vLLM (or replicasim) with --enable-lora.
	Enabled bool
	// MaxLoRAs is its --max-loras, the adapters one batch may mix (vLLM's default, 1).
	MaxLoRAs int
	// RuntimeUpdates: VLLM_ALLOW_RUNTIME_LORA_UPDATING is true in the replicas'
	// environment, as arbiter.adapters needs; Arbiter sets it when the file leaves it out.
	RuntimeUpdates bool
}

// RuntimeLoRAEnv is the environment variable without which vLLM has no load endpoints.
const RuntimeLoRAEnv = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"

var adapterKeys = []string{"name", "source", "parent", "merged"}

// adapters reads arbiter.adapters: a list of {name, source, parent, merged}.
func (d *decoder) adapters(b *block, a *Arbiter) {
	n := b.get("adapters")
	if n == nil {
		return
	}
	const at = "arbiter.adapters"
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, "%s: want a list of adapters, each {name, source}, got %s", at, describe(n))
		return
	}
	for i, it := range n.Content {
		p := fmt.Sprintf("%s[%d]", at, i)
		ab := d.block(p, it, it, adapterKeys)
		if ab == nil {
			continue
		}
		var ad Adapter
		ab.str("name", &ad.Name)
		ab.str("source", &ad.Source)
		ab.str("parent", &ad.Parent)
		ab.str("merged", &ad.Merged)
		switch {
		case !ab.has("name") || strings.TrimSpace(ad.Name) == "":
			d.errorf(it, "%s: name missing: the model name clients send for this adapter", p)
			continue
		case !ab.has("source") || strings.TrimSpace(ad.Source) == "":
			d.errorf(it, "%s: source missing: a folder on the replicas (/adapters/sql), a bucket mounted by file_mounts (s3://bucket/sql), or a Hugging Face id (hf://org/name)", p)
			continue
		}
		if !d.adapterName(ab.get("name"), p+".name", ad.Name) {
			continue
		}
		ad.Path, _ = adapterPath(ad.Source)
		a.Adapters = append(a.Adapters, ad)
		d.adapterAt = append(d.adapterAt, it)
	}
}

// adapterName checks a name clients will send (fleet.CheckAdapterName).
func (d *decoder) adapterName(at *yaml.Node, where, name string) bool {
	if err := fleet.CheckAdapterName(name); err != nil {
		d.errorf(at, "%s: %v", where, err)
		return false
	}
	return true
}

// adapterPath is the lora_path a source gives vLLM before file_mounts are considered.
func adapterPath(src string) (string, bool) {
	if id, ok := strings.CutPrefix(src, "hf://"); ok {
		return id, true
	}
	return src, false
}

// runFlags is what the run: command tells vLLM that Arbiter must know.
type runFlags struct {
	LoRA     LoRA
	Adapters []Adapter // its --lora-modules
	// SchedulingPolicy is its --scheduling-policy ("": not given, vLLM's fcfs).
	SchedulingPolicy string
}

// runVLLM reads what the run: command tells vLLM: about adapters, --enable-lora,
// --max-loras and --lora-modules (name=path or vLLM's JSON form; several after one flag),
// and --scheduling-policy, with $VARS from vars filled in as the replica's shell would. A
// module whose name or path uses a variable without a value is an error: the name is what
// clients will send.
func runVLLM(run string, vars map[string]string) (runFlags, error) {
	var rf runFlags
	l := &rf.LoRA
	f, err := syntax.NewParser().Parse(strings.NewReader(run), "run")
	if err != nil {
		return rf, nil // not a script this can read; the shell will say
	}
	var firstErr error
	fail := func(format string, args ...any) {
		if firstErr == nil {
			firstErr = fmt.Errorf(format, args...)
		}
	}
	// A word as the replica's shell would make it. A variable the file gives no value (the
	// replica's own $HOME, SkyPilot's $SKYPILOT_*) is left as ${NAME}, followed by mark.
	expandWith := func(w *syntax.Word, mark string) string {
		cfg := &expand.Config{Env: expand.FuncEnviron(func(name string) string {
			if v, ok := vars[name]; ok {
				return v
			}
			return "${" + name + "}" + mark
		})}
		s, err := expand.Literal(cfg, w)
		if err != nil {
			return printWord(w)
		}
		return s
	}
	word := func(w *syntax.Word) string { return expandWith(w, "") }
	syntax.Walk(f, func(n syntax.Node) bool {
		call, ok := n.(*syntax.CallExpr)
		if !ok {
			return true
		}
		args := call.Args
		for i := 0; i < len(args); i++ {
			text := word(args[i])
			if !strings.HasPrefix(text, "-") {
				continue
			}
			name, val, hasVal := strings.Cut(strings.TrimLeft(text, "-"), "=")
			switch name {
			case "scheduling-policy":
				rf.SchedulingPolicy = val
				if !hasVal && i+1 < len(args) {
					i++
					rf.SchedulingPolicy = word(args[i])
				}
			case "enable-lora":
				l.Enabled = true
			case "max-loras":
				v := val
				if !hasVal && i+1 < len(args) {
					i++
					v = word(args[i])
				}
				if n, err := strconv.Atoi(v); err == nil && n >= 1 {
					l.MaxLoRAs = n
				} else {
					fail("run: --max-loras %q: want a number of adapters ≥ 1", v)
				}
			case "lora-modules":
				// Each value with the flag's own word (--lora-modules=VALUE) or after it.
				var ws []*syntax.Word
				if hasVal {
					ws = append(ws, args[i])
				}
				for !hasVal && i+1 < len(args) && !strings.HasPrefix(word(args[i+1]), "-") {
					i++
					ws = append(ws, args[i])
				}
				for _, w := range ws {
					// The value as kept (a variable without a value left as ${NAME}), and again
					// with such variables marked: a name that differs depends on one.
					a, b := word(w), expandWith(w, "~")
					if hasVal {
						_, a, _ = strings.Cut(a, "=")
						_, b, _ = strings.Cut(b, "=")
					}
					m, err := parseLoRAModule(a)
					if err != nil {
						fail("run: %v", err)
						continue
					}
					if other, err := parseLoRAModule(b); err != nil || other.Name != m.Name {
						fail("run: --lora-modules %s: the adapter's name comes from a variable the file gives no value; give it one in envs (or --env): the name is what clients send", printWord(w))
						continue
					}
					rf.Adapters = append(rf.Adapters, m)
				}
			}
		}
		return true
	})
	return rf, firstErr
}

func printWord(w *syntax.Word) string {
	var b strings.Builder
	_ = syntax.NewPrinter().Print(&b, w)
	return b.String()
}

// parseLoRAModule reads one --lora-modules value as vLLM does: name=path, or a JSON object
// {"name", "path", "base_model_name"} (loramodule.Parse, which the replica simulator reads
// its own flags with).
func parseLoRAModule(v string) (Adapter, error) {
	m, err := loramodule.Parse(v)
	if err != nil {
		return Adapter{}, err
	}
	return Adapter{Name: m.Name, Path: m.Path, Parent: m.Base, Static: true}, nil
}

// checkAdapters settles the service's adapters against what its run: command tells vLLM
// (rf), its models, file_mounts and providers: what validates is what the replicas can load.
func (d *decoder) checkAdapters(s *Service, rf runFlags) {
	a := &s.Arbiter
	l, static := rf.LoRA, rf.Adapters
	if l.Enabled && l.MaxLoRAs == 0 {
		l.MaxLoRAs = 1
	}
	declared := a.Adapters
	a.LoRA, a.Adapters = l, nil
	for _, m := range static {
		if err := fleet.CheckAdapterName(m.Name); err != nil {
			d.errorAt("run", "run: --lora-modules %s: %v", quote(m.Name), err)
			continue
		}
		a.Adapters = append(a.Adapters, m)
	}
	if len(declared) > 0 && !l.Enabled {
		d.errorAt("arbiter.adapters", "arbiter.adapters: the run: command does not start vLLM with --enable-lora, without which it serves no adapter")
	}
	if len(declared) > 0 {
		v, set := s.Envs[RuntimeLoRAEnv]
		if sv, ok := s.Secrets[RuntimeLoRAEnv]; ok {
			v, set = sv, true
		}
		if set && !truthy(v) {
			d.errorAt("arbiter.adapters", "arbiter.adapters are loaded at run time, which vLLM allows only with %s=true; envs sets it to %q", RuntimeLoRAEnv, v)
		}
		a.LoRA.RuntimeUpdates = true
	}
	remote := slices.ContainsFunc(a.Providers, func(p string) bool { return p != "local" && p != "sim" })
	for i, ad := range declared {
		where := fmt.Sprintf("arbiter.adapters[%d]", i)
		p, ok := d.adapterOnReplica(s, ad.Source, remote, d.adapterAt[i], where, "source")
		if !ok {
			continue
		}
		ad.Path = p
		if ad.Merged != "" {
			if rp := s.Service.ReplicaPolicy; rp.MinReplicas == rp.MaxReplicas || rp.MaxReplicas < 2 {
				d.errorf(d.adapterAt[i], "%s.merged: a hot adapter's own replicas are counted in max_replicas beside at least one shared replica, and scaled on its load: give the service a range (min_replicas < max_replicas, max_replicas ≥ 2)", where)
				continue
			}
			if ad.MergedPath, ok = d.adapterOnReplica(s, ad.Merged, remote, d.adapterAt[i], where, "merged"); !ok {
				continue
			}
			if _, err := MergedRun(s.Run, ad.MergedPath, ad.Name); err != nil {
				d.errorf(d.adapterAt[i], "%s.merged: the adapter's own replicas start vLLM on the merged checkpoint in place of the base model, and %v", where, err)
				continue
			}
		}
		a.Adapters = append(a.Adapters, ad)
	}
	seen := map[string]bool{}
	for _, m := range a.Models {
		seen[m] = true
	}
	for _, ad := range a.Adapters {
		if seen[ad.Name] {
			d.errorAt("arbiter.adapters", "adapter %s: the name is taken by a model or another adapter of the service (a --lora-modules name counts)", quote(ad.Name))
		}
		seen[ad.Name] = true
	}
}

func truthy(v string) bool {
	v = strings.ToLower(strings.TrimSpace(v))
	return v == "1" || v == "true"
}

// adapterOnReplica is where a replica's vLLM reads an adapter from its source: a Hugging
// Face id as it is; a bucket URL inside a file_mounts bucket the replicas mount (not COPY:
// an adapter added later by serve update would not be in the copy); a local path as it is
// on the local and sim providers (the replicas run on this machine), elsewhere inside a
// local folder that file_mounts puts on the replicas.
func (d *decoder) adapterOnReplica(s *Service, src string, remote bool, at *yaml.Node, where, key string) (string, bool) {
	where += "." + key
	if id, hf := adapterPath(src); hf {
		if strings.Count(id, "/") != 1 || strings.HasPrefix(id, "/") || strings.HasSuffix(id, "/") {
			d.errorf(at, "%s: %s: want hf://ORG/NAME, a Hugging Face model id", where, quote(src))
			return "", false
		}
		return id, true
	}
	bucket := strings.Contains(src, "://")
	if !bucket && !path.IsAbs(src) && !strings.HasPrefix(src, "~") {
		d.errorf(at, "%s: %s: want an absolute folder, ~/…, a bucket URL (s3://…) or hf://ORG/NAME", where, quote(src))
		return "", false
	}
	if !bucket && !remote {
		return src, true
	}
	for _, m := range s.FileMounts {
		rest, ok := strings.CutPrefix(src, strings.TrimSuffix(m.Source, "/"))
		if !ok || (rest != "" && !strings.HasPrefix(rest, "/")) {
			continue
		}
		if bucket && strings.EqualFold(m.Mode, "copy") {
			d.errorf(at, "%s: %s is in file_mounts %s, copied once at launch (mode COPY): an adapter added later would not be there; mount it (mode: MOUNT)", where, quote(src), m.Path)
			return "", false
		}
		return strings.TrimSuffix(m.Path, "/") + rest, true
	}
	what := "the bucket"
	if !bucket {
		what = "this machine's folder"
	}
	d.errorf(at, "%s: %s: nothing puts it on the replicas; mount %s with file_mounts and name the adapter inside it", where, quote(src), what)
	return "", false
}

// checkEnginePriority refuses arbiter.queue.engine_priority unless the run: command starts
// vLLM with --scheduling-policy priority: under vLLM's default (fcfs) it refuses every
// request whose priority is not 0, which the routers would then send (standard and
// sheddable requests).
func (d *decoder) checkEnginePriority(a *Arbiter, policy string) {
	if !a.Queue.EnginePriority || policy == "priority" {
		return
	}
	given := "without --scheduling-policy (vLLM's default, fcfs)"
	if policy != "" {
		given = "with --scheduling-policy " + policy
	}
	d.errorAt("arbiter.queue.engine_priority", "arbiter.queue.engine_priority: the routers would give standard and sheddable requests a priority vLLM refuses unless it runs with --scheduling-policy priority; the run: command starts it %s", given)
}
