// Package workdir packs a service's workdir the way SkyPilot syncs it to a cluster
// (https://docs.skypilot.co/en/stable/examples/syncing-code-artifacts.html): the whole
// folder, less what its ignore files exclude. When the folder has a .skyignore at its
// root, the .skyignore files (at the root and below, each about its own folder) decide and
// .gitignore files are not read; otherwise the .gitignore files and .git/info/exclude do,
// as git reads them. Patterns are git's (github.com/go-git/go-git's gitignore package),
// negations (!pattern) included, which SkyPilot's rsync-based sync drops.
package workdir

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing/format/gitignore"
)

// MaxBytes bounds the files a workdir may hold (after its ignore files): a workdir is
// code and small files, packed and copied to every replica's machine; data belongs in a
// bucket (file_mounts).
const MaxBytes = 1 << 30

// Walk calls fn for every entry of dir that SkyPilot would sync, in lexical order, with
// its slash-separated path relative to dir; folders an ignore file excludes are not
// entered. dir must be a directory.
func Walk(dir string, fn func(rel string, d fs.DirEntry) error) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	ignoreFile := ".gitignore"
	var patterns []gitignore.Pattern
	if _, err := os.Stat(filepath.Join(dir, ".skyignore")); err == nil {
		ignoreFile = ".skyignore"
	} else if ps, err := readPatterns(filepath.Join(dir, ".git", "info", "exclude"), nil); err == nil {
		patterns = ps
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	// Each folder's ignore file adds patterns about that folder and below, in force while
	// the walk is inside it (git's order of precedence: deeper files win).
	type frame struct {
		depth, n int
	}
	var stack []frame
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		var parts []string
		if rel != "." {
			parts = strings.Split(filepath.ToSlash(rel), "/")
		}
		// Leave the patterns of folders the walk has left.
		for len(stack) > 0 && stack[len(stack)-1].depth >= len(parts) {
			patterns = patterns[:len(patterns)-stack[len(stack)-1].n]
			stack = stack[:len(stack)-1]
		}
		if len(parts) > 0 && gitignore.NewMatcher(patterns).Match(parts, d.IsDir()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			ps, err := readPatterns(filepath.Join(path, ignoreFile), parts)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			if len(ps) > 0 {
				patterns = append(patterns, ps...)
				stack = append(stack, frame{depth: len(parts), n: len(ps)})
			}
		}
		if len(parts) == 0 {
			return nil
		}
		return fn(strings.Join(parts, "/"), d)
	})
}

// readPatterns reads an ignore file's patterns, about the folder domain (path parts
// relative to the workdir).
func readPatterns(path string, domain []string) ([]gitignore.Pattern, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ps []gitignore.Pattern
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
			continue
		}
		ps = append(ps, gitignore.ParsePattern(line, domain))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ps, nil
}

// Size is the bytes of the regular files Walk syncs, and their count.
func Size(dir string) (bytes int64, files int, err error) {
	err = Walk(dir, func(_ string, d fs.DirEntry) error {
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		bytes += fi.Size()
		files++
		return nil
	})
	return bytes, files, err
}

// Archive is a packed workdir.
type Archive struct {
	// Path is the tar.gz file, which the caller removes.
	Path string
	// SHA256 is its hex digest, and Size its bytes.
	SHA256 string
	Size   int64
	// Files and Bytes count the regular files packed and their bytes.
	Files int
	Bytes int64
}

// Pack writes what Walk syncs of dir as a gzipped tar in a new file under tmp ("" for the
// system's), with each entry's mode and modification time (as rsync -a keeps them) and no
// owner; symbolic links stay links. Files and folders are relative to the archive's root,
// so that tar -x -C DEST puts them in DEST. A workdir of more than MaxBytes is refused.
func Pack(dir, tmp string) (a Archive, err error) {
	f, err := os.CreateTemp(tmp, "arbiter-workdir-*.tar.gz")
	if err != nil {
		return Archive{}, err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	zw := gzip.NewWriter(cw)
	tw := tar.NewWriter(zw)
	err = Walk(dir, func(rel string, d fs.DirEntry) error {
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(filepath.Join(dir, filepath.FromSlash(rel))); err != nil {
				return err
			}
		case d.IsDir(), d.Type().IsRegular():
		default:
			return nil // sockets, pipes, devices: nothing a replica could use
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = rel
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{} // what rsync -a keeps is the mtime
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		a.Files++
		a.Bytes += fi.Size()
		if a.Bytes > MaxBytes {
			return fmt.Errorf("workdir %s holds more than %d MiB (after its ignore files): leave large files out with a .skyignore, or put data in a bucket (file_mounts)", dir, MaxBytes>>20)
		}
		src, err := os.Open(filepath.Join(dir, filepath.FromSlash(rel)))
		if err != nil {
			return err
		}
		defer src.Close()
		if n, err := io.Copy(tw, src); err != nil {
			return err
		} else if n != fi.Size() {
			return fmt.Errorf("workdir: %s changed while it was packed", rel)
		}
		return nil
	})
	if err != nil {
		return Archive{}, err
	}
	if err := tw.Close(); err != nil {
		return Archive{}, err
	}
	if err := zw.Close(); err != nil {
		return Archive{}, err
	}
	a.Path, a.SHA256, a.Size = f.Name(), hex.EncodeToString(h.Sum(nil)), cw.n
	return a, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
