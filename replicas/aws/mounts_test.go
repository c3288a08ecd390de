package aws

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/arbiter-serve/arbiter/spec"
)

// The user data's mount lines run: with stand-ins for mount-s3 and the aws CLI that
// record their arguments, each S3 file mount is made at its path with the tool its mode
// asks for (MOUNT and MOUNT_CACHED: Mountpoint for Amazon S3; COPY: aws s3 sync).
func TestS3MountsScriptRuns(t *testing.T) {
	dir, home := t.TempDir(), t.TempDir()
	calls := filepath.Join(dir, "calls")
	for _, tool := range []string{"mount-s3", "aws"} {
		stub := "#!/bin/sh\necho \"" + tool + " $*\" >> " + calls + "\n"
		if err := os.WriteFile(filepath.Join(dir, tool), []byte(stub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mnt := filepath.Join(dir, "mnt weights") // a space must survive quoting
	script := s3Mounts([]spec.FileMount{
		{Path: mnt, Source: "s3://weights/llama/", Store: "s3", Mode: "MOUNT"},
		{Path: "data", Source: "s3://ds", Store: "s3", Mode: "COPY"},
		{Path: "~/cache", Source: "s3://c", Store: "s3", Mode: "MOUNT_CACHED"},
	})
	script = strings.ReplaceAll(script, "/var/cache/arbiter-s3", filepath.Join(dir, "cache"))
	cmd := exec.Command("bash", "-euc", script)
	cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "HOME="+home)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("script failed: %v\n%s\n%s", err, out, script)
	}
	b, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	want := "mount-s3 weights " + mnt + " --prefix llama/\n" +
		"aws s3 sync --only-show-errors s3://ds " + home + "/data\n" +
		"mount-s3 c " + home + "/cache --cache " + filepath.Join(dir, "cache") + "/2\n"
	if string(b) != want {
		t.Fatalf("calls:\n%s\nwant:\n%s", b, want)
	}
	for _, d := range []string{mnt, filepath.Join(home, "data"), filepath.Join(home, "cache")} {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			t.Errorf("mount point %s not made: %v", d, err)
		}
	}
}
