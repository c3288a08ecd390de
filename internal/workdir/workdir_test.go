package workdir

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func write(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func walked(t *testing.T, dir string) []string {
	t.Helper()
	var got []string
	if err := Walk(dir, func(rel string, d fs.DirEntry) error {
		if !d.IsDir() {
			got = append(got, rel)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// Without a .skyignore, the .gitignore files (each about its own folder) and
// .git/info/exclude decide, as git reads them.
func TestGitignoreRules(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, map[string]string{
		".gitignore":        "# comment\n*.log\n/build/\n!keep.log\n",
		".git/info/exclude": "secret.txt\n",
		"serve.py":          "x",
		"a.log":             "x",
		"keep.log":          "x",
		"secret.txt":        "x",
		"build/out.bin":     "x",
		"sub/build/ok.txt":  "x", // /build/ is anchored at the root
		"sub/.gitignore":    "data/\n",
		"sub/data/big.bin":  "x",
		"sub/b.log":         "x",
		"sub/c.py":          "x",
		"other/data/d.txt":  "x", // sub's data/ is about sub only
	})
	got := walked(t, dir)
	want := []string{".git/info/exclude", ".gitignore", "keep.log", "other/data/d.txt", "serve.py", "sub/.gitignore", "sub/build/ok.txt", "sub/c.py"}
	if !slices.Equal(got, want) {
		t.Fatalf("synced %v\nwant %v", got, want)
	}
}

// A .skyignore at the root replaces the .gitignore files (SkyPilot's rule); nested
// .skyignore files are about their own folders.
func TestSkyignoreReplacesGitignore(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, map[string]string{
		".skyignore":          "weights/\n",
		".gitignore":          "*.py\n",
		"serve.py":            "x",
		"weights/w.bin":       "x",
		"lib/.skyignore":      "*.tmp\n",
		"lib/x.tmp":           "x",
		"lib/util.py":         "x",
		"lib/weights.txt":     "x",
		"notlib/y.tmp":        "x",
		"deep/weights/v.bin":  "x", // weights/ without a leading / matches at any depth
		"deep/weightsnot.txt": "x",
	})
	got := walked(t, dir)
	want := []string{".gitignore", ".skyignore", "deep/weightsnot.txt", "lib/.skyignore", "lib/util.py", "lib/weights.txt", "notlib/y.tmp", "serve.py"}
	if !slices.Equal(got, want) {
		t.Fatalf("synced %v\nwant %v", got, want)
	}
}

// The archive holds what Walk syncs, relative to its root, with modes and links; the same
// folder packs to the same bytes (its digest names it in the staging bucket).
func TestPackIsReproducibleAndComplete(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, map[string]string{".skyignore": "*.ckpt\n", "run.sh": "echo hi\n", "cfg/model.json": "{}", "big.ckpt": "xxxx"})
	if err := os.Chmod(filepath.Join(dir, "run.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("cfg/model.json", filepath.Join(dir, "model.json")); err != nil {
		t.Fatal(err)
	}
	a, err := Pack(dir, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b, err := Pack(dir, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if a.SHA256 != b.SHA256 || len(a.SHA256) != 64 || a.Files != 3 || a.Bytes != int64(len("echo hi\n")+2+len(".skyignore")-3) {
		t.Fatalf("packs %+v and %+v", a, b)
	}
	f, err := os.Open(a.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		got[h.Name] = string(body) + "|" + h.FileInfo().Mode().String() + "|" + h.Linkname
	}
	for name, want := range map[string]string{"run.sh": "echo hi\n|-rwxr-xr-x|", "cfg/": "|drwxr-xr-x|", "cfg/model.json": "{}|-rw-r--r--|",
		"model.json": "|Lrwxrwxrwx|cfg/model.json", ".skyignore": "*.ckpt\n|-rw-r--r--|"} {
		if got[name] != want {
			t.Errorf("%s: %q, want %q", name, got[name], want)
		}
	}
	if _, ok := got["big.ckpt"]; ok || len(got) != 5 {
		t.Errorf("archive holds %v", got)
	}
}

func TestNotADirectory(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, map[string]string{"f": "x"})
	if _, _, err := Size(filepath.Join(dir, "f")); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("a file as workdir: %v", err)
	}
	if _, _, err := Size(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing workdir is accepted")
	}
}
