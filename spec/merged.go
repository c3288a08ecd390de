package spec

import (
	"errors"
	"fmt"
	"strings"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"
)

// loraFlags are vLLM's serve flags about LoRA adapters, with whether each takes values
// (several, for --lora-modules): a replica that serves an adapter merged into the base
// weights serves no adapter, so MergedRun drops them.
var loraFlags = map[string]int{
	"enable-lora": 0, "fully-sharded-loras": 0,
	"lora-modules": -1, "max-loras": 1, "max-lora-rank": 1, "max-cpu-loras": 1,
	"lora-extra-vocab-size": 1, "lora-dtype": 1, "long-lora-scaling-factors": 1,
	"enable-lora-bias": 0, "default-mm-loras": 1,
	"served-model-name": -1,
}

// ErrNoVLLMServe: a run: command in which MergedRun finds no vLLM server to start on
// another checkpoint.
var ErrNoVLLMServe = errors.New("the run: command starts no vLLM server Arbiter can point at another checkpoint: want `vllm serve MODEL …` or `python -m vllm.entrypoints.openai.api_server --model MODEL …`")

// MergedRun is the run: command of a replica of an adapter's own (issue 51): the service's
// command with vLLM started on the merged checkpoint at path (the adapter folded into the
// base model's weights, PEFT's merge_and_unload) in place of the base model, serving it
// under the adapter's name, and without the LoRA flags (it serves no adapter). Every vLLM
// server the command starts is changed; the rest of the script is kept as it was (printed
// again by the shell parser, so its layout may change, not its meaning).
func MergedRun(run, path, name string) (string, error) {
	f, err := syntax.NewParser().Parse(strings.NewReader(run), "run")
	if err != nil {
		return "", fmt.Errorf("run: %v", err)
	}
	found := 0
	var failed error
	syntax.Walk(f, func(n syntax.Node) bool {
		call, ok := n.(*syntax.CallExpr)
		if !ok || failed != nil {
			return failed == nil
		}
		args, ok, err := mergedArgs(call.Args, path, name)
		switch {
		case err != nil:
			failed = err
		case ok:
			call.Args = args
			found++
		}
		return true
	})
	if failed != nil {
		return "", failed
	}
	if found == 0 {
		return "", ErrNoVLLMServe
	}
	var b strings.Builder
	if err := syntax.NewPrinter().Print(&b, f); err != nil {
		return "", err
	}
	return b.String(), nil
}

// mergedArgs is a call's words with vLLM pointed at path and serving name; ok is false for
// a call that starts no vLLM server.
func mergedArgs(args []*syntax.Word, path, name string) (out []*syntax.Word, ok bool, err error) {
	// s is where the command starts: after an exec (the shell gives the server its pid).
	s := 0
	lit := func(i int) string {
		if s+i >= len(args) {
			return ""
		}
		return args[s+i].Lit() // "" for a word with quotes or expansions
	}
	if lit(0) == "exec" {
		s = 1
	}
	first := 0 // the first flag's index, from s
	modelAt := -1
	switch {
	case lit(0) == "vllm" && lit(1) == "serve":
		first = 2
		if s+2 < len(args) && !strings.HasPrefix(wordText(args[s+2]), "-") {
			if strings.Contains(printWord(args[s+2]), "[@]") || strings.Contains(printWord(args[s+2]), "[*]") {
				return nil, false, fmt.Errorf("run: vllm serve %s: the model and flags come from an array, which Arbiter cannot point at the merged checkpoint; name the model in the command", printWord(args[s+2]))
			}
			modelAt, first = s+2, 3
		}
	case strings.HasPrefix(lit(0), "python"):
		// python [its own flags, -u] -m vllm.entrypoints.openai.api_server
		j := 1
		for s+j < len(args) && lit(j) != "-m" && strings.HasPrefix(lit(j), "-") {
			j++
		}
		if lit(j) != "-m" || lit(j+1) != "vllm.entrypoints.openai.api_server" {
			return nil, false, nil
		}
		first = j + 2
	default:
		return nil, false, nil
	}
	first += s
	pathWord, err := litWord(path)
	if err != nil {
		return nil, false, err
	}
	nameWord, err := litWord(name)
	if err != nil {
		return nil, false, err
	}
	out = append(out, args[:first]...)
	if modelAt >= 0 {
		out[modelAt] = pathWord
	}
	flagName := func(w *syntax.Word) (string, bool) {
		s := wordText(w)
		if !strings.HasPrefix(s, "--") {
			return "", false
		}
		n, _, hasVal := strings.Cut(s[2:], "=")
		return strings.ReplaceAll(n, "_", "-"), hasVal
	}
	model := modelAt >= 0
	for i := first; i < len(args); i++ {
		n, hasVal := flagName(args[i])
		if n == "model" {
			model = true
			if hasVal {
				out = append(out, mustWord("--model="+quoteArg(path)))
				continue
			}
			out = append(out, args[i])
			if i+1 < len(args) {
				i++
				out = append(out, pathWord)
			}
			continue
		}
		takes, drop := loraFlags[n]
		if !drop {
			out = append(out, args[i])
			continue
		}
		if hasVal {
			continue
		}
		switch takes {
		case 1:
			i++
		case -1:
			for i+1 < len(args) && !strings.HasPrefix(wordText(args[i+1]), "-") {
				i++
			}
		}
	}
	if !model {
		return nil, false, errors.New("run: vLLM is started without a model (vllm serve MODEL)")
	}
	out = append(out, mustWord("--served-model-name"), nameWord)
	return out, true, nil
}

// wordText is a word as the shell would read it, its quotes removed and its variables
// empty (enough to tell a flag's name); as written where it cannot be read so.
func wordText(w *syntax.Word) string {
	s, err := expand.Literal(&expand.Config{Env: expand.ListEnviron()}, w)
	if err != nil {
		return printWord(w)
	}
	return s
}

// litWord is s as one shell word, quoted where the shell would read it otherwise.
func litWord(s string) (*syntax.Word, error) {
	if strings.ContainsAny(s, "\x00\n") {
		return nil, fmt.Errorf("%q cannot be a word of the run: command", s)
	}
	return mustWord(quoteArg(s)), nil
}

func quoteArg(s string) string {
	q, err := syntax.Quote(s, syntax.LangBash)
	if err != nil {
		return "'" + s + "'" // Quote refuses only NUL and invalid UTF-8 in POSIX mode
	}
	return q
}

func mustWord(text string) *syntax.Word {
	return &syntax.Word{Parts: []syntax.WordPart{&syntax.Lit{Value: text}}}
}
