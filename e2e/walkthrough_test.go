package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
	"github.com/arbiter-serve/arbiter/state/pgtest"
)

// mdBlock is one fenced sh block of a page, under its last heading.
type mdBlock struct {
	heading, text string
	skip          bool // marked <!-- e2e: skip ... --> on the line before
}

// shBlocks reads a Markdown page's ```sh blocks, in order.
func shBlocks(t *testing.T, path string) []mdBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out          []mdBlock
		heading      string
		prev         string
		in, skipNext bool
		cur          strings.Builder
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case in && line == "```":
			out = append(out, mdBlock{heading: heading, text: cur.String(), skip: skipNext})
			in, skipNext = false, false
			cur.Reset()
		case in:
			cur.WriteString(line + "\n")
		case line == "```sh":
			in, skipNext = true, strings.HasPrefix(prev, "<!-- e2e: skip")
		case strings.HasPrefix(line, "#"):
			heading = strings.TrimSpace(strings.TrimLeft(line, "#"))
		}
		if strings.TrimSpace(line) != "" {
			prev = line
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// walkthrough is the HA page's deployment, as its commands left it: three control planes
// (cp-a, cp-b, cp-c) and two routers, on addresses and a PostgreSQL of the test's.
type walkthrough struct {
	t    *testing.T
	dir  string   // $ARBITER_DIR
	env  []string // the page's settings, and a PATH with the binaries and psql
	cps  map[string][2]string
	st   *state.Store
	logs string // what the page's commands printed
}

// bash runs a script of the page's commands in the repository's root, with the settings.
func (w *walkthrough) bash(what, script string, within time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	out, err := os.CreateTemp(w.dir, "script-*.log")
	if err != nil {
		w.t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -euo pipefail\n"+script)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = "..", w.env, out, out
	err = cmd.Run()
	b, _ := os.ReadFile(out.Name())
	w.logs += fmt.Sprintf("--- %s:\n%s\n", what, b)
	return string(b), err
}

// serve runs the CLI with the page's settings (its own flags first).
func (w *walkthrough) serve(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(binDir, "serve"), args...)
	cmd.Env = w.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// leader is the control plane whose metrics say it leads ("" if none does).
func (w *walkthrough) leader() string {
	for name, a := range w.cps {
		if _, body := httpGet(w.t, "http://"+a[1]+"/metrics"); strings.Contains(body, "\narbiter_control_leader 1\n") {
			return name
		}
	}
	return ""
}

func (w *walkthrough) log(name string) string {
	b, _ := os.ReadFile(filepath.Join(w.dir, name, "autoscaler.log"))
	return string(b)
}

func (w *walkthrough) fatalf(format string, args ...any) {
	w.t.Helper()
	var logs strings.Builder
	for _, name := range []string{"cp-a", "cp-b", "cp-c"} {
		fmt.Fprintf(&logs, "--- %s log (tail):\n%s\n", name, tail(w.log(name), 5000))
	}
	for _, name := range []string{"router-1.log", "router-2.log"} {
		b, _ := os.ReadFile(filepath.Join(w.dir, name))
		fmt.Fprintf(&logs, "--- %s (tail):\n%s\n", name, tail(string(b), 3000))
	}
	w.t.Fatalf(format+"\n%s\n%s", append(args, tail(w.logs, 8000), logs.String())...)
}

func (w *walkthrough) kill9(name string) {
	w.t.Helper()
	b, err := os.ReadFile(filepath.Join(w.dir, name, "pid"))
	if err != nil {
		w.t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil {
		w.t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		w.t.Fatalf("kill -9 %s (%d): %v", name, pid, err)
	}
}

func (w *walkthrough) waitFor(what string, within time.Duration, ok func() bool) {
	w.t.Helper()
	for deadline := time.Now().Add(within); !ok(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			w.fatalf("timed out after %v waiting for %s", within, what)
		}
	}
}

// docs/ha-hosts.md run as its reader would (issue 46 §5): every sh block, in order, in one
// shell per part, with the page's settings pointing at free loopback ports and a
// throwaway PostgreSQL; then, on the deployment it leaves, what an operator tripped on
// (§1, §2, §4), and the page's tear-down, after which no replica process is left.
func TestHAWalkthrough(t *testing.T) {
	t.Parallel() // its own database, ports and homes; most of its time is a cold start and two leases
	if _, err := exec.LookPath("psql"); err != nil {
		if os.Getenv("ARBITER_REQUIRE_POSTGRES") != "" {
			t.Fatal("psql not found and ARBITER_REQUIRE_POSTGRES is set (apt-get install postgresql)")
		}
		t.Skip("psql not installed")
	}
	pg := pgtest.Start(t)
	w := &walkthrough{t: t, dir: t.TempDir(), cps: map[string][2]string{}}
	// Two leases pass (the page's drill, the write through a failover): 6 s unless
	// $ARBITER_E2E_LEASE says (bench/docs/failover.md times the write at a deployment's).
	lease := 6 * time.Second
	if os.Getenv("ARBITER_E2E_LEASE") != "" {
		lease = haLease
	}
	settings := map[string]string{
		"ARBITER_DIR":         w.dir,
		"ARBITER_DB_ADMIN":    fmt.Sprintf("postgresql://postgres@127.0.0.1:%d/postgres", pg.Port()),
		"ARBITER_DB_HOST":     fmt.Sprintf("127.0.0.1:%d", pg.Port()),
		"ARBITER_DB_PASSWORD": "walkthrough-secret",
		"ARBITER_LEASE":       lease.String(),
	}
	for _, k := range []string{"CP_A", "CP_B", "CP_C", "ROUTER_1", "ROUTER_2"} {
		settings[k], settings[k+"_ADMIN"] = freeAddr(t), freeAddr(t)
	}
	for _, cp := range []string{"a", "b", "c"} {
		k := "CP_" + strings.ToUpper(cp)
		w.cps["cp-"+cp] = [2]string{settings[k], settings[k+"_ADMIN"]}
	}
	w.env = append(os.Environ(), "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"), "HOME="+w.dir)
	for k, v := range settings {
		w.env = append(w.env, k+"="+v)
	}
	api := fmt.Sprintf("http://%s,http://%s,http://%s", settings["CP_A"], settings["CP_B"], settings["CP_C"])
	w.env = append(w.env, "ARBITER_API="+api)

	blocks := shBlocks(t, "../docs/ha-hosts.md")
	if len(blocks) < 8 || blocks[0].heading != "Settings" {
		t.Fatalf("docs/ha-hosts.md: %d sh blocks, the first under %q; want the settings first", len(blocks), blocks[0].heading)
	}
	var run, down strings.Builder
	down.WriteString(blocks[0].text)
	skipped := 0
	for _, b := range blocks {
		switch {
		case b.skip:
			skipped++
		case b.heading == "Tear down":
			down.WriteString(b.text)
		default:
			run.WriteString(b.text)
		}
	}
	if skipped != 1 || !strings.Contains(down.String(), "serve down") {
		t.Fatalf("docs/ha-hosts.md: %d blocks skipped (want the build's only), tear-down %q", skipped, down.String())
	}
	// Whatever happens, the page's own tear-down ends what it started, then anything left.
	t.Cleanup(func() {
		if token, err := os.ReadFile(filepath.Join(w.dir, "token")); err == nil {
			w.env = append(w.env, "ARBITER_TOKEN="+strings.TrimSpace(string(token))) // as step 3 exports it
		}
		if out, err := w.bash("the page's tear-down", down.String(), 3*time.Minute); err != nil {
			t.Errorf("the page's tear-down: %v\n%s", err, out)
		}
		// SIGTERM'd: each ends its own way (a control plane releases its lease), within
		// its grace.
		for _, name := range []string{"cp-a/pid", "cp-b/pid", "cp-c/pid", "router-1.pid", "router-2.pid"} {
			b, err := os.ReadFile(filepath.Join(w.dir, name))
			var pid int
			if _, serr := fmt.Sscan(string(b), &pid); err != nil || serr != nil {
				continue
			}
			for deadline := time.Now().Add(60 * time.Second); alive(pid) && time.Now().Before(deadline); {
				time.Sleep(100 * time.Millisecond)
			}
			if alive(pid) {
				t.Errorf("%s (pid %d) still runs a minute after the tear-down", name, pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		for _, name := range []string{"cp-a", "cp-b", "cp-c"} {
			if log := w.log(name); strings.Contains(log, "DATA RACE") || strings.Contains(log, "panic:") {
				t.Errorf("%s reported a race or a panic:\n%s", name, tail(log, 20000))
			}
		}
		if w.st == nil {
			return
		}
		owner, err := w.st.DeploymentValue(context.Background(), state.LocalOwnerKey, nil)
		if err != nil {
			t.Error(err)
			return
		}
		if left, _ := replicas.OwnedProcesses(owner); len(left) > 0 {
			t.Errorf("replica processes left after the tear-down: %v", left)
			for _, pids := range left {
				for _, p := range pids {
					_ = syscall.Kill(p, syscall.SIGKILL)
				}
			}
		}
		w.st.Close()
	})
	start := time.Now()
	out, err := w.bash("the page", run.String(), 6*time.Minute)
	if err != nil {
		w.fatalf("docs/ha-hosts.md's commands as written: %v\n%s", err, tail(out, 6000))
	}
	t.Logf("docs/ha-hosts.md ran in %v", time.Since(start).Round(time.Second))
	for _, want := range []string{`"content"`, "llama-local", "Service llama-local is scaled to zero"} {
		if !strings.Contains(out, want) {
			w.fatalf("the page's output lacks %q", want)
		}
	}
	// The CLI's token, as the page's readers export it in their own shells.
	token, err := os.ReadFile(filepath.Join(w.dir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	w.env = append(w.env, "ARBITER_TOKEN="+strings.TrimSpace(string(token)))
	dsn := fmt.Sprintf("postgres://arbiter:%s@%s/arbiter?sslmode=disable", settings["ARBITER_DB_PASSWORD"], settings["ARBITER_DB_HOST"])
	if w.st, err = state.OpenPostgres(context.Background(), dsn, state.Options{}); err != nil {
		t.Fatal(err)
	}
	leader := w.leader()
	if leader != "cp-b" && leader != "cp-c" {
		w.fatalf("after the page's drill %q leads; want cp-b or cp-c (cp-a was killed, then came back as a standby)", leader)
	}
	standby := map[string]string{"cp-b": "cp-c", "cp-c": "cp-b"}[leader]
	url := func(name string) string { return "http://" + w.cps[name][0] }

	// §4: the replica cp-a launched keeps its output in cp-a's home; it is read through
	// every control plane, and while cp-a is down the answer names it.
	for _, via := range []string{leader, standby, "cp-a"} {
		out, err := w.serve("--api", url(via), "logs", "llama-local", "llama-local-1")
		if err != nil || !strings.Contains(out, "msg=serving") {
			w.fatalf("serve logs through %s: %v\n%s\nwant the replica's own output", via, err, out)
		}
	}

	// §1: up through a standby, then status through a standby at once: the service is there.
	dir := t.TempDir()
	v1, v2 := filepath.Join(dir, "echo.yaml"), filepath.Join(dir, "echo-v2.yaml")
	policy := `  replica_policy: {min_replicas: 0, max_replicas: 1}`
	if err := os.WriteFile(v1, []byte(simService("ha-echo-model", policy, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(v2, []byte(simService("ha-echo-model", policy, "-ready-delay 1s")), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := w.serve("--api", url(standby)+","+url(leader), "up", "-y", "-n", "ha-echo", v1); err != nil || !strings.Contains(out, "scaled to zero") {
		w.fatalf("serve up through the standby %s: %v\n%s", standby, err, out)
	}
	if out, err := w.serve("--api", url("cp-a"), "status", "ha-echo"); err != nil || !strings.Contains(out, "ha-echo") {
		w.fatalf("serve status through the other standby right after the up: %v\n%s", err, out)
	}

	// §4, the launcher down: the answer says which control plane keeps the output.
	w.kill9("cp-a")
	out, err = w.serve("--api", url(leader), "logs", "llama-local", "llama-local-1")
	if err == nil || !strings.Contains(out, url("cp-a")) {
		w.fatalf("serve logs with the control plane that launched the replica down: %v\n%s\nwant an error naming %s", err, out, url("cp-a"))
	}

	// §2: the leader killed, and at once an update through all three: it waits for the
	// next leader and lands once.
	refusals := func() int {
		n := 0
		for _, name := range []string{"cp-a", "cp-b", "cp-c"} {
			log := w.log(name)
			for _, line := range strings.Split(log, "\n") {
				if strings.Contains(line, "path=/v1/services/ha-echo") && (strings.Contains(line, "write refused: no control plane can take it now") ||
					strings.Contains(line, "forwarding to the leader failed")) {
					n++
				}
			}
		}
		return n
	}
	before := refusals()
	w.kill9(leader)
	killed := time.Now()
	out, err = w.serve("update", "-d", "ha-echo", v2)
	landed := time.Since(killed)
	if err != nil || !strings.Contains(out, "rolling update to version 2") {
		w.fatalf("serve update right after the leader's kill: %v\n%s", err, out)
	}
	sv, err := w.st.GetService(context.Background(), "ha-echo")
	if err != nil || sv.Version != 2 {
		w.fatalf("ha-echo after the update through the failover: version %d, %v; want 2", sv.Version, err)
	}
	if _, err := w.st.GetVersion(context.Background(), "ha-echo", 3); !errors.Is(err, state.ErrNotFound) {
		w.fatalf("ha-echo has a version 3 (%v): the update landed twice", err)
	}
	attempts := refusals() - before + 1
	w.waitFor("the standby leading", 4*lease, func() bool { return w.leader() == standby })
	t.Logf("WRITE THROUGH A FAILOVER: serve update landed %v after the leader's kill -9 (lease %v), after %d attempts, once (version 2, no version 3); the CLI said: %s",
		landed.Round(100*time.Millisecond), lease, attempts, strings.TrimSpace(out))
	if !strings.Contains(out, "waiting for a control plane") {
		t.Logf("(the update landed without waiting: the standby took the lease before it was sent)")
	}
}
