package doccheck

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

// The checks cover README.md and every Markdown file under docs/ and bench/.
//
// Links: every relative link must reach a file or folder of the repository, and a
// #fragment on a Markdown file must name one of its headings. Links with a scheme (https:,
// mailto:) are not followed: this test runs offline.
//
// Shell blocks (```sh, bash, shell): each simple command is checked by its first word.
//   - bin/serve, serve: the subcommands and flags against the built binary's -h output,
//     level by level (serve keys new).
//   - bin/router, bin/replicasim, bin/simulate (and its subcommands): the flags against
//     the built binary's -h output.
//   - go build / go test / go run: the ./ package paths exist.
//   - bash FILE: the script exists.
//   - Every command's arguments that look like a path inside the repository (a relative
//     path with a '/' and a file extension such as examples/local.yaml) must exist.
//   - Skipped: other programs' flags (curl, kubectl, gcloud, docker, prometheus, sqlite3,
//     apt-get, node...): they are theirs to define, and the docs quote them from their
//     owners' documentation. `docker exec … serve …` runs inside the image and is skipped
//     with docker.
// Placeholders stay as they are written (NAME, FILE); `[-v]` is read as -v and `…` is
// skipped, so a usage line in a block is checked too.

var docRoots = []string{"README.md", "docs", "bench"}

// repoRoot is the module root, found from this package's directory.
func repoRoot(t testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// markdownFiles lists the files the checks read, relative to root.
func markdownFiles(t testing.TB, root string) []string {
	var out []string
	for _, r := range docRoots {
		err := filepath.WalkDir(filepath.Join(root, r), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			if !d.IsDir() && strings.HasSuffix(p, ".md") {
				rel, _ := filepath.Rel(root, p)
				out = append(out, rel)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(out) < 10 {
		t.Fatalf("found only %d Markdown files under %v: is the root right (%s)?", len(out), docRoots, root)
	}
	return out
}

func readDoc(t testing.TB, root, rel string) Doc {
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return Parse(string(b))
}

var schemeRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

// checkLink returns what is wrong with a link target in file rel, or "".
func checkLink(root, rel, target string, anchorsOf func(string) (map[string]bool, error)) string {
	if schemeRE.MatchString(target) {
		return ""
	}
	path, frag, _ := strings.Cut(target, "#")
	file := rel
	if path != "" {
		if strings.HasPrefix(path, "/") {
			file = filepath.Clean(strings.TrimPrefix(path, "/"))
		} else {
			file = filepath.Join(filepath.Dir(rel), path)
		}
		if strings.HasPrefix(file, "..") {
			return fmt.Sprintf("%s leaves the repository", target)
		}
		if _, err := os.Stat(filepath.Join(root, file)); err != nil {
			return fmt.Sprintf("%s: no such file or folder (%s)", target, file)
		}
	}
	if frag == "" || !strings.HasSuffix(file, ".md") {
		return ""
	}
	anchors, err := anchorsOf(file)
	if err != nil {
		return err.Error()
	}
	if !anchors[frag] {
		return fmt.Sprintf("%s: %s has no heading #%s", target, file, frag)
	}
	return ""
}

func TestRelativeLinksResolve(t *testing.T) {
	root := repoRoot(t)
	cache := map[string]map[string]bool{}
	anchorsOf := func(file string) (map[string]bool, error) {
		if a, ok := cache[file]; ok {
			return a, nil
		}
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return nil, err
		}
		a := Anchors(Parse(string(b)).Headings)
		cache[file] = a
		return a, nil
	}
	n := 0
	for _, rel := range markdownFiles(t, root) {
		for _, l := range readDoc(t, root, rel).Links {
			n++
			if msg := checkLink(root, rel, l.Target, anchorsOf); msg != "" {
				t.Errorf("%s:%d: %s", rel, l.Line, msg)
			}
		}
	}
	t.Logf("%d links checked", n)
}

// TestREADMEStaysAFirstVisit keeps the README to what a first visit needs (issue 39):
// topics belong in docs/.
func TestREADMEStaysAFirstVisit(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n >= 200 {
		t.Errorf("README.md has %d lines; keep it under 200 and move the topic to a page in docs/", n)
	}
}

// TestMain removes the binaries the tests built (about 120 MB).
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binDir is where binaries built them; empty until it has.
var binDir string

// binaries builds the commands the docs run, once per test binary.
var binaries = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "doccheck-bin-")
	if err != nil {
		return "", err
	}
	binDir = dir
	root, err := findRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./cmd/serve", "./cmd/router", "./cmd/replicasim", "./cmd/simulate")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return dir, nil
})

func findRoot() (string, error) {
	dir, err := os.Getwd()
	for err == nil {
		if _, e := os.Stat(filepath.Join(dir, "go.mod")); e == nil {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("no go.mod above the test's directory")
		}
		dir = filepath.Dir(dir)
	}
	return "", err
}

// flagSet is what one command's -h says it takes.
type flagSet struct {
	long   map[string]bool // name → takes a value
	short  map[string]bool
	subs   []string // subcommands, for a cobra command that has them
	leaf   bool     // runs on its own (cobra: Usage shows more than "[command]")
	helped string   // the -h output, for error messages
}

var (
	cobraFlagRE = regexp.MustCompile(`^\s+(?:-(\w), )?--([\w-]+)(?: (\S+))?`)
	cobraSubRE  = regexp.MustCompile(`^  (\S+)\s{2,}\S`)
	// A one-letter flag's usage follows on the same line, after a tab.
	goFlagRE = regexp.MustCompile(`^  -([\w.-]+)(?: (\S+))?(?:\t.*)?$`)
)

// help runs bin with args and -h, and parses its flags (cobra's or the flag package's).
func help(bin string, args ...string) (*flagSet, error) {
	out, _ := exec.Command(bin, append(slices.Clone(args), "-h")...).CombinedOutput()
	fs := &flagSet{long: map[string]bool{}, short: map[string]bool{"h": false}, helped: string(out)}
	fs.long["help"] = false
	section := ""
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasSuffix(line, ":") && !strings.HasPrefix(line, " "):
			section = line
			continue
		case section == "Usage:" && strings.TrimSpace(line) != "":
			if !strings.HasSuffix(strings.TrimSpace(line), "[command]") {
				fs.leaf = true
			}
		case section == "Available Commands:":
			if m := cobraSubRE.FindStringSubmatch(line); m != nil {
				fs.subs = append(fs.subs, m[1])
			}
		case section == "Flags:" || section == "Global Flags:":
			if m := cobraFlagRE.FindStringSubmatch(line); m != nil {
				val := m[3] != "" && !strings.HasPrefix(m[3], "  ")
				fs.long[m[2]] = val
				if m[1] != "" {
					fs.short[m[1]] = val
				}
			}
		case strings.HasPrefix(section, "Usage of ") || strings.HasPrefix(section, "usage: ") || section == "":
			if m := goFlagRE.FindStringSubmatch(line); m != nil {
				fs.long[m[1]] = m[2] != ""
				fs.leaf = true
			}
		}
	}
	if len(fs.long) == 1 && len(fs.subs) == 0 {
		return nil, fmt.Errorf("%s %s -h printed no flags:\n%s", bin, strings.Join(args, " "), out)
	}
	return fs, nil
}

// helpCache memoises help per binary and subcommand path.
type helpCache struct {
	dir string
	m   map[string]*flagSet
}

func (h *helpCache) get(bin string, path ...string) (*flagSet, error) {
	key := bin + " " + strings.Join(path, " ")
	if fs, ok := h.m[key]; ok {
		return fs, nil
	}
	fs, err := help(filepath.Join(h.dir, bin), path...)
	if err != nil {
		return nil, err
	}
	h.m[key] = fs
	return fs, nil
}

// goFlagSubcommands are the subcommands of the flag-package binaries, whose -h does not
// list them: `simulate capacity` has flags of its own.
var goFlagSubcommands = map[string][]string{"simulate": {"capacity", "gpumix", "routers"}}

// checkArgs checks words (after the binary) against bin's flags; cobra says whether
// the binary has subcommands to descend into.
func (h *helpCache) checkArgs(bin string, cobra bool, words []string) []string {
	var errs []string
	var path []string
	fs, err := h.get(bin)
	if err != nil {
		return []string{err.Error()}
	}
	positional := 0
	for i := 0; i < len(words); i++ {
		w := strings.Trim(words[i], "[]")
		if w == "" || w == "…" || w == "..." || strings.HasSuffix(w, "...") || strings.HasPrefix(w, ">") || strings.HasPrefix(w, "<") {
			continue
		}
		if strings.HasPrefix(w, "-") && len(w) > 1 {
			name, _, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "=")
			var val, ok bool
			switch {
			case cobra && !strings.HasPrefix(w, "--"):
				// -n, or -ay: every letter a short flag
				for _, c := range name {
					v, found := fs.short[string(c)]
					if !found {
						errs = append(errs, fmt.Sprintf("%s %s: no flag -%c", bin, strings.Join(path, " "), c))
					}
					val, ok = v, true
				}
			default:
				val, ok = fs.long[name]
				if !ok {
					dash := "-"
					if cobra {
						dash = "--"
					}
					errs = append(errs, fmt.Sprintf("%s %s: no flag %s%s", bin, strings.Join(path, " "), dash, name))
				}
			}
			if ok && val && !hasValue {
				i++ // the flag's value
			}
			continue
		}
		subs := fs.subs
		if !cobra && len(path) == 0 && positional == 0 {
			subs = goFlagSubcommands[bin]
		}
		if positional == 0 && slices.Contains(subs, w) {
			path = append(path, w)
			if fs, err = h.get(bin, path...); err != nil {
				return append(errs, err.Error())
			}
			continue
		}
		if positional == 0 && cobra && len(fs.subs) > 0 && !fs.leaf {
			errs = append(errs, fmt.Sprintf("%s %s: no subcommand %q (it has %s)", bin, strings.Join(path, " "), w, strings.Join(fs.subs, ", ")))
			return errs
		}
		positional++
	}
	return errs
}

// repoPathRE matches a word that names a file in the repository: relative, with a folder
// and an extension, no variable or home.
var repoPathRE = regexp.MustCompile(`^[A-Za-z0-9_.][A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)+\.(ya?ml|json|sh|csv|md|go|mjs)$`)

// checkCommand returns what is wrong with one simple command of a shell block.
func (h *helpCache) checkCommand(root string, words []string) []string {
	for len(words) > 0 && (strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-") || words[0] == "sudo" || words[0] == "time") {
		words = words[1:] // VAR=value, sudo
	}
	if len(words) == 0 {
		return nil
	}
	var errs []string
	if words[0] != "docker" {
		for _, w := range words[1:] {
			if _, v, ok := strings.Cut(w, "="); ok {
				w = v
			}
			if repoPathRE.MatchString(w) && !strings.HasPrefix(w, "..") {
				if _, err := os.Stat(filepath.Join(root, w)); err != nil {
					errs = append(errs, fmt.Sprintf("%s: no such file in the repository", w))
				}
			}
		}
	}
	bin := strings.TrimPrefix(words[0], "bin/")
	switch {
	case bin == "serve":
		errs = append(errs, h.checkArgs("serve", true, words[1:])...)
	case words[0] == "bin/router" || words[0] == "bin/replicasim" || words[0] == "bin/simulate":
		errs = append(errs, h.checkArgs(bin, false, words[1:])...)
	case words[0] == "bash" && len(words) > 1 && !strings.HasPrefix(words[1], "-"):
		if _, err := os.Stat(filepath.Join(root, words[1])); err != nil {
			errs = append(errs, fmt.Sprintf("bash %s: no such script", words[1]))
		}
	case words[0] == "go" && len(words) > 1 && (words[1] == "build" || words[1] == "test" || words[1] == "run" || words[1] == "vet"):
		for _, w := range words[2:] {
			if !strings.HasPrefix(w, "./") {
				continue
			}
			dir := strings.TrimSuffix(strings.TrimSuffix(w, "/..."), "/")
			if _, err := os.Stat(filepath.Join(root, dir)); err != nil {
				errs = append(errs, fmt.Sprintf("go %s %s: no such package", words[1], w))
			}
			if words[1] == "run" {
				break // the rest are the program's own arguments
			}
		}
	}
	return errs
}

var shellLangs = []string{"sh", "bash", "shell"}

func TestCommandBlocksUseRealFlags(t *testing.T) {
	root := repoRoot(t)
	dir, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	h := &helpCache{dir: dir, m: map[string]*flagSet{}}
	n := 0
	for _, rel := range markdownFiles(t, root) {
		for _, b := range readDoc(t, root, rel).Blocks {
			if !slices.Contains(shellLangs, b.Lang) {
				continue
			}
			for _, words := range Commands(b.Text) {
				n++
				for _, e := range h.checkCommand(root, words) {
					t.Errorf("%s: block at line %d: %s: %s", rel, b.Line, strings.Join(words, " "), e)
				}
			}
		}
	}
	t.Logf("%d commands checked", n)
}
