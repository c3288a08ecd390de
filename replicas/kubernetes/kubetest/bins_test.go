package kubetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// binsProbe stands in for a test calling Bins: it records a skip or a failure instead of
// ending the test.
type binsProbe struct {
	testing.TB
	skipped, failed string
}

func (p *binsProbe) Skipf(format string, args ...any)  { p.skipped = fmt.Sprintf(format, args...) }
func (p *binsProbe) Fatalf(format string, args ...any) { p.failed = fmt.Sprintf(format, args...) }

// A new user who follows the skip message's advice gets the tests run: the command it
// names, run as written from the repository root, finds a finished build in the folder
// that Bins looked in and prints that folder, and Bins then uses it. A `go` that refuses
// to run stands first on PATH, so that a script looking anywhere else fails at once
// instead of starting a ten-minute build.
func TestTheSkipMessagesAdviceLeadsWhereBinsLooks(t *testing.T) {
	root := t.TempDir()
	t.Setenv("ARBITER_KUBE_CACHE", root)
	t.Setenv("ARBITER_KUBE_BIN", "")
	t.Setenv("ARBITER_REQUIRE_KUBE", "")
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	stub := t.TempDir()
	if err := os.WriteFile(filepath.Join(stub, "go"), []byte("#!/bin/sh\necho 'a test must not build Kubernetes' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", stub+string(os.PathListSeparator)+os.Getenv("PATH"))

	probe := &binsProbe{TB: t}
	looked := Bins(probe)
	if probe.skipped == "" {
		t.Fatalf("Bins did not skip with an empty cache (looked in %s)", looked)
	}
	advice := regexp.MustCompile("run `([^`]+)`").FindStringSubmatch(probe.skipped)
	if advice == nil || !strings.Contains(probe.skipped, looked) {
		t.Fatalf("the skip message names no command, or not the folder %s: %s", looked, probe.skipped)
	}
	// What a finished build leaves in the folder Bins names.
	if err := os.MkdirAll(filepath.Join(looked, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(looked, ".complete"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-c", advice[1])
	cmd.Dir = filepath.Join("..", "..", "..") // the repository root
	out, err := cmd.Output()
	stderr := ""
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = string(ee.Stderr)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err != nil || lines[len(lines)-1] != looked {
		t.Fatalf("`%s` with a finished build in %s: %v; it printed %q, want that folder on its last line\n%s", advice[1], looked, err, out, stderr)
	}
	probe = &binsProbe{TB: t}
	if got := Bins(probe); got != looked || probe.skipped != "" || probe.failed != "" {
		t.Fatalf("after the advice, Bins = %s, skip %q, fail %q", got, probe.skipped, probe.failed)
	}
}
