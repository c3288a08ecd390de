package doccheck

import (
	"strings"
	"testing"
)

// TestChecksCatchMistakes feeds the checks the mistakes they exist for, so that a check
// that stopped looking (a parser that finds no flags, a link pattern that matches nothing)
// fails here rather than passing every document.
func TestChecksCatchMistakes(t *testing.T) {
	root := repoRoot(t)
	dir, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	h := &helpCache{dir: dir, m: map[string]*flagSet{}}
	commands := []struct {
		line string
		want string // part of the error; "" for none
	}{
		{"bin/serve up examples/local.yaml", ""},
		{"bin/serve --home /tmp/a up -y --env K=V examples/local.yaml --detach", ""},
		{"bin/serve status -av --json", ""},
		{"bin/serve keys new alice", ""},
		{"serve down --all && serve stop", ""},
		{"AWS_PROFILE=x bin/serve up llama.yaml --providers providers.yaml", ""},
		{"bin/router -replicas examples/replicas.yaml -policy=least_load", ""},
		{"bin/simulate capacity -model llama-3.1-8b -gpus L4 -lengths 1:1 -tpot-ms 100", ""},
		{"bin/simulate -requests azure-code -hours 24 [-v]", ""},
		{"go build -o bin/ ./cmd/... && bash .ci/run", ""},
		{"bin/serve up --no-such-flag examples/local.yaml", "no flag --no-such-flag"},
		{"bin/serve up -q examples/local.yaml", "no flag -q"},
		{"bin/serve lauch examples/local.yaml", `no subcommand "lauch"`},
		{"bin/serve keys nw alice", `no subcommand "nw"`},
		{"bin/serve status --endpoint NAME --tail 3", "no flag --tail"},
		{"bin/router -replicas examples/replicas.yaml -polcy x", "no flag -polcy"},
		{"bin/replicasim -listen 127.0.0.1:8000 --modle m", "no flag -modle"},
		{"bin/simulate capacity -gpus L4 -hours 3", "no flag -hours"},
		{"bin/serve up examples/nothing-here.yaml", "no such file"},
		{"bash scripts/no-such-script.sh", "no such script"},
		{"go test ./no/such/package", "no such package"},
	}
	for _, c := range commands {
		var errs []string
		for _, words := range Commands(c.line) {
			errs = append(errs, h.checkCommand(root, words)...)
		}
		got := strings.Join(errs, "; ")
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s: got %q, want %q", c.line, got, c.want)
		}
	}

	anchorsOf := func(file string) (map[string]bool, error) {
		return Anchors([]string{"Router vs nginx, run of 2026-11-25 (issue 22 §4)", "HTTPS: `service.tls`", "Notes", "Notes"}), nil
	}
	links := []struct{ target, want string }{
		{"docs/README.md", ""},
		{"../bench/README.md", "leaves the repository"},
		{"docs/no-such-page.md", "no such file"},
		{"https://example.com/nowhere", ""},
		{"docs/operating.md#router-vs-nginx-run-of-2026-11-25-issue-22-4", ""},
		{"docs/operating.md#https-servicetls", ""},
		{"docs/operating.md#notes-1", ""},
		{"#notes-2", "has no heading #notes-2"},
		{"docs/", ""},
	}
	for _, l := range links {
		got := checkLink(root, "README.md", l.target, anchorsOf)
		if l.want == "" && got != "" || l.want != "" && !strings.Contains(got, l.want) {
			t.Errorf("link %s: got %q, want %q", l.target, got, l.want)
		}
	}

	d := Parse("# T\n\nSee [a `b`](x.md) and `[not](y.md)`.\n\n```sh\n[no](z.md)\n```\n")
	if len(d.Links) != 1 || d.Links[0].Target != "x.md" || len(d.Blocks) != 1 || d.Blocks[0].Lang != "sh" {
		t.Errorf("Parse: links %v, blocks %v; want one link to x.md and one sh block", d.Links, d.Blocks)
	}
}
