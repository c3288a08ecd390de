package spec

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The aws provider copies a workdir to its VMs (replicas/aws): Parse accepts it, and
// CheckWorkdir, which serve runs where the folder is, refuses one that is missing, not a
// directory, or (on aws) over 1 GiB after its ignore files, each at the workdir's place.
func TestWorkdirOnAWS(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "serve.py"), []byte("print('hi')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "weights.bin") // sparse: its size counts, no disk is used
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1<<30 + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	parse := func(workdir, providers string) *Service {
		t.Helper()
		sp, err := Parse("svc.yaml", []byte(minimal+"workdir: "+workdir+"\narbiter: {providers: ["+providers+"]}\n"))
		if err != nil {
			t.Fatalf("workdir on %s refused: %v", providers, err)
		}
		return sp
	}
	for _, c := range []struct{ workdir, providers, want string }{
		{dir, "aws", "after its ignore files; the aws provider copies it to every replica's VM and takes at most 1 GiB"},
		{filepath.Join(dir, "nope"), "aws", "does not exist here"},
		{filepath.Join(dir, "serve.py"), "local", "is not a directory"},
	} {
		err := parse(c.workdir, c.providers).CheckWorkdir()
		var el ErrorList
		if !errors.As(err, &el) || len(el) != 1 || el[0].Line != 4 || el[0].Column != 10 || !strings.Contains(err.Error(), c.want) {
			t.Errorf("workdir %s on %s: %v; want %q at 4:10", c.workdir, c.providers, err, c.want)
		}
	}
	// The local provider runs in the folder as it is: no bound.
	if err := parse(dir, "local").CheckWorkdir(); err != nil {
		t.Errorf("a large workdir on the local provider: %v", err)
	}
	// Left out by a .skyignore, the large file no longer counts.
	if err := os.WriteFile(filepath.Join(dir, ".skyignore"), []byte("*.bin\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := parse(dir, "aws").CheckWorkdir(); err != nil {
		t.Errorf("with *.bin in .skyignore: %v", err)
	}
}
