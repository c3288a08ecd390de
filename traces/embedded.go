package traces

import (
	"embed"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"
)

// data holds byte-identical copies of the shared traces (see data/README.md
// and data/SHA256SUMS), so that simulations and tests do not depend on where
// a checkout of shared/ lives.
//
//go:embed data
var data embed.FS

const spotServeFile = "spot_traces_spotserve/g4dn.csv"

// Embedded returns the shipped data files, rooted at traces/data, for callers
// that want the raw bytes (the READMEs, summary.csv).
func Embedded() fs.FS {
	sub, err := fs.Sub(data, "data")
	if err != nil {
		panic(err) // "data" is a valid path: fs.Sub cannot fail here
	}
	return sub
}

// requestFiles is the fixed list of request traces; their names are what
// benchmark tables cite, so they do not follow file names.
func requestFiles() map[string]string {
	return map[string]string{
		"azure-code":                  "llm_traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv",
		"azure-conversation":          "llm_traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
		"mooncake-conversation-30min": "llm_traces/mooncake_fast25/conversation_trace_first30min.jsonl",
	}
}

// RequestNames lists the embedded request traces for NamedRequests.
func RequestNames() []string {
	return slices.Sorted(maps.Keys(requestFiles()))
}

// NamedRequests loads an embedded request trace by name (see RequestNames).
func NamedRequests(name string) (*RequestTrace, error) {
	p, ok := requestFiles()[name]
	if !ok {
		return nil, fmt.Errorf("traces: no embedded request trace %q; have %s", name, strings.Join(RequestNames(), ", "))
	}
	f, err := Embedded().Open(p)
	if err != nil {
		return nil, fmt.Errorf("traces: %w", err)
	}
	defer f.Close()
	t, err := readRequests(f, p)
	if err != nil {
		return nil, err
	}
	t.Name = name
	return t, nil
}

// spotFiles groups the embedded SkyPilot files into loadable traces (one set,
// one resource each) under the name LoadSpot would give them, found by
// walking the files so that the names cannot drift from the data.
func spotFiles() (map[string][]string, error) {
	groups := map[string][]string{"spotserve-g4dn": {spotServeFile}}
	root := Embedded()
	err := fs.WalkDir(root, "spot_traces_skypilot", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Ext(p) != ".json" {
			return err
		}
		series, set, _, resource, err := skypilotName(p)
		if err != nil {
			return fmt.Errorf("traces: embedded %s: %w", p, err)
		}
		name := "skypilot-" + skypilotDirKind(series) + "-" + set + "-" + resource
		groups[name] = append(groups[name], p)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return groups, nil
}

// SpotNames lists the embedded spot traces for NamedSpot, e.g.
// "skypilot-availability-aws-02-15-2023-v100_1" and "spotserve-g4dn".
func SpotNames() []string {
	groups, err := spotFiles()
	if err != nil {
		return nil // only a broken build embeds a misnamed file; NamedSpot reports it
	}
	return slices.Sorted(maps.Keys(groups))
}

// NamedSpot loads an embedded spot trace by name (see SpotNames).
func NamedSpot(name string) (*SpotTrace, error) {
	groups, err := spotFiles()
	if err != nil {
		return nil, err
	}
	files, ok := groups[name]
	if !ok {
		return nil, fmt.Errorf("traces: no embedded spot trace %q; have %s", name, strings.Join(slices.Sorted(maps.Keys(groups)), ", "))
	}
	root := Embedded()
	t, err := loadSpotFiles(func(p string) ([]byte, error) { return fs.ReadFile(root, p) }, files)
	if err != nil {
		return nil, err
	}
	t.Name = name
	return t, nil
}
