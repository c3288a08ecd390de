package aws

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas/aws/ec2fake"
	"github.com/arbiter-serve/arbiter/replicas/aws/s3fake"
)

const stagingBucket = "arbiter-staging-test"

// withStaging gives the rig a fake S3 account holding the staging bucket, and the
// provider its endpoint; dir receives the fake EC2's instance folder.
func withStaging(t *testing.T, dir *string) (*s3fake.Server, func(*ec2fake.Config, *Config)) {
	fake := s3fake.New(s3fake.Config{Buckets: []string{stagingBucket}, AccessKeyID: "AKIAIOSFODNN7EXAMPLE", SecretAccessKey: testSecret})
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	return fake, func(f *ec2fake.Config, c *Config) {
		*dir = f.Dir
		c.StagingBucket, c.S3Endpoint = stagingBucket, srv.URL
	}
}

// testWorkdir is a workdir whose run reads a file, with a large file its .skyignore
// leaves out.
func testWorkdir(t *testing.T) string {
	dir := t.TempDir()
	for name, body := range map[string]string{"model.txt": "from-the-workdir\n", ".skyignore": "*.ckpt\n", "weights.ckpt": "not synced", "conf/a.json": "{}"} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A workdir is packed and uploaded once per service version (through a 503 SlowDown,
// which the SDK retries), under its SHA-256; each instance's user data fetches it by a
// presigned URL into ~/sky_workdir, where setup and run then run and find its files, and
// not the ones its .skyignore leaves out. A later version with the same workdir uploads
// nothing; a presigned URL altered is refused.
func TestWorkdirStagedOnceAndFetched(t *testing.T) {
	var ec2Dir string
	s3, mod := withStaging(t, &ec2Dir)
	r := newRig(t, mod)
	ctx := ctxFor(t, time.Minute)
	s3.SlowDown(1)
	wd := testWorkdir(t)
	var addrs []string
	for _, id := range []string{"r-1", "r-2"} {
		ls := r.launchSpec(id, fleet.OnDemand, "use1-az6")
		ls.Workdir = wd
		ls.Run = `test ! -e weights.ckpt && test -f conf/a.json && MODEL_NAME="$(cat model.txt)" ` + ls.Run
		in, err := r.p.Launch(ctx, ls)
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, in.Address)
	}
	for i, a := range addrs {
		if got := get(t, a); !strings.Contains(got, "model=from-the-workdir") {
			t.Fatalf("replica %d says %q: its run did not read the workdir's file", i+1, got)
		}
	}
	if put, head := s3.Calls("PutObject"), s3.Calls("HeadObject"); put != 2 || head != 1 {
		t.Errorf("PutObject %d times (want 2: a SlowDown, then the upload), HeadObject %d (want 1: once per version)", put, head)
	}
	if get := s3.Calls("GetObject"); get != 2 {
		t.Errorf("GetObject %d times, want one per instance", get)
	}
	objs := s3.Objects()
	if len(objs) != 1 {
		t.Fatalf("staged objects %v", objs)
	}
	for k := range objs {
		if !regexp.MustCompile(`^` + stagingBucket + `/arbiter/workdirs/[0-9a-f]{64}\.tar\.gz$`).MatchString(k) {
			t.Errorf("staged as %s; want under arbiter/workdirs/ by its SHA-256", k)
		}
	}
	// Setup ran in the workdir too.
	for id := range r.fake.Live() {
		if _, err := os.Stat(filepath.Join(ec2Dir, id, "home", "sky_workdir", "setup.marker")); err != nil {
			t.Errorf("instance %s: setup did not run in ~/sky_workdir: %v", id, err)
		}
	}

	// The next version, with the workdir unchanged: asked about, not uploaded again.
	ls := r.launchSpec("r-3", fleet.OnDemand, "use1-az6")
	ls.Version, ls.Workdir = 4, wd
	if _, err := r.p.Launch(ctx, ls); err != nil {
		t.Fatal(err)
	}
	if put, head := s3.Calls("PutObject"), s3.Calls("HeadObject"); put != 2 || head != 2 {
		t.Errorf("an unchanged workdir: PutObject %d times (want still 2), HeadObject %d (want 2)", put, head)
	}

	// The URL in the user data reads that object only, and only as signed.
	reqs := r.fake.Requests("RunInstances")
	ud, _ := base64.StdEncoding.DecodeString(reqs[len(reqs)-1].Get("UserData"))
	m := regexp.MustCompile(`curl [^\n]* '(http[^']+)'`).FindStringSubmatch(string(ud))
	if m == nil {
		t.Fatalf("no curl of the workdir in the user data:\n%s", ud)
	}
	if strings.Contains(string(ud), testSecret) {
		t.Error("the secret access key reached the user data")
	}
	resp, err := http.Get(m[1])
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the presigned URL: %v %v", resp, err)
	}
	resp.Body.Close()
	other := strings.Replace(m[1], "/arbiter/workdirs/", "/arbiter/workdirs/x", 1)
	if resp, err := http.Get(other); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("the presigned URL bent to another key: %v %v; want 403", resp, err)
	} else {
		resp.Body.Close()
	}
	granted := grantedActions(t)
	for _, a := range []string{"s3:PutObject", "s3:GetObject", "s3:ListBucket"} {
		if !granted[a] {
			t.Errorf("the provider needs %s, which deploy/aws/iam-policy.json does not grant", a)
		}
	}
}

// A staging bucket that refuses the control plane (403) fails the launch before any
// instance starts, saying what the credentials lack; no staging bucket at all is said
// as such.
func TestWorkdirRefusedClearly(t *testing.T) {
	var ec2Dir string
	s3, mod := withStaging(t, &ec2Dir)
	r := newRig(t, mod)
	ctx := ctxFor(t, time.Minute)
	s3.Deny(stagingBucket, true)
	ls := r.launchSpec("r-1", fleet.OnDemand, "use1-az6")
	ls.Workdir = testWorkdir(t)
	_, err := r.p.Launch(ctx, ls)
	if err == nil || !strings.Contains(err.Error(), "S3 refused it (403)") || !strings.Contains(err.Error(), "s3:PutObject") || !strings.Contains(err.Error(), "AccessDenied") {
		t.Fatalf("a refused upload: %v", err)
	}
	if n := r.fake.Calls("RunInstances"); n != 0 {
		t.Errorf("%d instances launched without their workdir", n)
	}

	r2 := newRig(t, nil)
	_, err = r2.p.Launch(ctx, ls)
	if err == nil || !strings.Contains(err.Error(), "give staging_bucket") {
		t.Fatalf("a workdir without a staging bucket: %v", err)
	}
	ls.Workdir = filepath.Join(ls.Workdir, "model.txt")
	s3.Deny(stagingBucket, false)
	if _, err := r.p.Launch(ctx, ls); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("a file as workdir: %v", err)
	}
}
