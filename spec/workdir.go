package spec

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/arbiter-serve/arbiter/internal/workdir"
)

// CheckWorkdir checks the workdir on this machine, where serve runs (Parse reads only the
// file): it must be a directory, and where the aws provider copies it to every replica's
// VM, hold at most workdir.MaxBytes after its ignore files (.skyignore, else .gitignore).
// A relative workdir is relative to the current directory and ~ is the home directory, as
// SkyPilot reads it. The error is an ErrorList placed at the workdir key's value.
func (s *Service) CheckWorkdir() error {
	if s.Workdir == "" {
		return nil
	}
	fail := func(format string, args ...any) error {
		p := s.workdirPos
		return ErrorList{{File: p.File, Line: p.Line, Column: p.Column, Msg: fmt.Sprintf(format, args...)}}
	}
	dir, err := ExpandWorkdir(s.Workdir)
	if err != nil {
		return fail("workdir: %v", err)
	}
	fi, err := os.Stat(dir)
	switch {
	case os.IsNotExist(err):
		return fail("workdir: %s does not exist here; give the folder whose files setup and run use", dir)
	case err != nil:
		return fail("workdir: %v", err)
	case !fi.IsDir():
		return fail("workdir: %s is not a directory", dir)
	}
	if !slices.Contains(s.Arbiter.Providers, "aws") {
		return nil
	}
	bytes, files, err := workdir.Size(dir)
	if err != nil {
		return fail("workdir: %v", err)
	}
	if bytes > workdir.MaxBytes {
		return fail("workdir: %s holds %.2f GiB in %d files after its ignore files; the aws provider copies it to every replica's VM and takes at most %d GiB: leave large files out with a .skyignore, or put data in a bucket (file_mounts)",
			dir, float64(bytes)/(1<<30), files, workdir.MaxBytes>>30)
	}
	return nil
}

// ExpandWorkdir is the workdir as an absolute path: ~ is the home directory, and a
// relative path is relative to the current directory.
func ExpandWorkdir(p string) (string, error) {
	if rest, ok := strings.CutPrefix(p, "~/"); ok || p == "~" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		p = filepath.Join(home, rest)
	}
	return filepath.Abs(p)
}
