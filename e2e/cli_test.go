package e2e

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// Clear errors and exit codes: no control plane, unknown names, invalid files.
func TestCLIErrors(t *testing.T) {
	c := newCluster(t)
	expect := func(code int, substr string, args ...string) {
		t.Helper()
		out, err := c.serveErr(args...)
		if got := exitCode(err); got != code || !strings.Contains(out, substr) {
			t.Errorf("serve %s: exit %d, output %q; want exit %d containing %q", strings.Join(args, " "), got, out, code, substr)
		}
	}
	expect(3, "no control plane is running", "status")
	expect(3, "no control plane is running", "down", "--all")
	bad := c.writeSpec("bad", "service:\n  replicas: two\nrun: x\n")
	expect(2, "bad.yaml:2:", "validate", bad) // an invalid file exits 2 from every command
	expect(2, "bad.yaml:2:", append([]string{"up"}, append(c.daemonFlags(), bad)...)...)
	expect(2, "no such file", "validate", "/nonexistent/service.yaml")
	expect(0, "spot $", "validate", "../examples/skyserve-vllm.yaml") // priced from the catalogs, with the placement rule
	typo := c.writeSpec("typo", "resources: {accelerators: A10O}\nservice: {replicas: 1}\nrun: x\n")
	expect(2, `closest known: A100`, "validate", typo)

	spec := simService("cli-model", `  replica_policy: {min_replicas: 0, max_replicas: 1}`, "")
	c.up("cli", spec)
	// `serve up` again with the same service is a no-op that shows it; with another, an error.
	expect(0, "up already with this file (version 1)", append([]string{"up", "-n", "cli"}, append(c.daemonFlags(), c.writeSpec("cli2", spec))...)...)
	expect(1, "already exists with another spec; use `serve update cli FILE`", append([]string{"up", "-n", "cli"}, append(c.daemonFlags(),
		c.writeSpec("cli2b", strings.Replace(spec, "max_replicas: 1", "max_replicas: 2", 1)))...)...)
	expect(1, `no service named "nope"`, "status", "nope")
	expect(1, `no service named "nope"`, "logs", "nope")
	expect(1, "not found", "update", "nope", c.writeSpec("cli3", spec))
	// The service is named once, not by the CLI and again by the control plane's error.
	if out, _ := c.serveErr("update", "nope", c.writeSpec("cli4", spec)); strings.Count(out, "nope") != 1 {
		t.Errorf("serve update nope: %q names the service %d times, want once", out, strings.Count(out, "nope"))
	}
	expect(2, "give service names or --all", "down")
	expect(0, "version 1 submitted", "logs", "cli")
	if out := c.serve("status", "--endpoint", "cli"); out != "http://"+c.listen+"\n" {
		t.Errorf("status --endpoint cli: %q, want the endpoint's URL alone", out)
	}
	expect(2, "one service name", "status", "--endpoint")
	expect(0, "serve version", "--version")
	// An update with the file the service runs (a comment added) rolls nothing.
	expect(0, "nothing to update", "update", "cli", c.writeSpec("cli-same", spec+"# the same service\n"))
	if st := c.status("cli"); st.Version != 1 {
		t.Errorf("after an update with an unchanged file: version %d, want 1", st.Version)
	}

	// SkyServe's `HF_TOKEN: null`: the value comes from --env, and survives a restart.
	nullEnv := c.writeSpec("envs", strings.Replace(simService("env-model", `  replica_policy: {min_replicas: 0, max_replicas: 1}`, ""), "MODEL: env-model", "MODEL: null", 1))
	expect(2, "MODEL", append([]string{"up", "-n", "envs"}, append(c.daemonFlags(), nullEnv)...)...)
	expect(0, "scaled to zero", append([]string{"up", "-n", "envs", "--env", "MODEL=env-model"}, append(c.daemonFlags(), nullEnv)...)...)
	expect(0, "Control plane stopped", "stop")
	c.startDaemon()
	if st := c.status("envs"); len(st.Models) == 0 || st.Models[0] != "env-model" {
		t.Fatalf("after a restart: %+v", st)
	}

	// SkyServe's `secrets: {HF_TOKEN: null}`: valid for validate, which says it is needed at
	// launch; up without it (no terminal to ask on) refuses naming --secret; with --secret
	// the replica gets it (its run refuses to start without), and it survives a restart.
	secret := c.writeSpec("secret", strings.Replace(simService("secret-model", `  replica_policy: {min_replicas: 1, max_replicas: 1}`, ""),
		"run: exec", "secrets: {HF_TOKEN: null}\nrun: test \"$HF_TOKEN\" = hf_e2e && exec", 1))
	expect(0, "secrets.HF_TOKEN has no value: give it at launch (serve up --secret HF_TOKEN=", "validate", secret)
	expect(2, "with --secret HF_TOKEN=", append([]string{"up", "-n", "secret"}, append(c.daemonFlags(), secret)...)...)
	expect(0, "ready", append([]string{"up", "-n", "secret", "--secret", "HF_TOKEN=hf_e2e"}, append(c.daemonFlags(), secret)...)...)
	if out := c.serve("status", "-v", "secret"); strings.Contains(out, "hf_e2e") {
		t.Errorf("serve status shows the secret:\n%s", out)
	}
	expect(0, "Control plane stopped", "stop")
	c.startDaemon()
	if st := c.status("secret"); st.Status == "failed" {
		t.Fatalf("after a restart the service with a --secret no longer loads: %+v", st)
	}
	expect(0, "every replica terminated", append([]string{"down", "secret", "--wait", "60s"}, c.daemonFlags()...)...)

	// The lifecycle after `serve stop`: replicas keep running; `serve start` adopts them;
	// `serve down --all` after another stop starts the control plane itself to end them.
	c.up("life", simService("life-model", `  replica_policy: {min_replicas: 1, max_replicas: 1}`, ""))
	c.waitFor("a ready replica", 60*time.Second, func() bool { return c.status("life").Ready == 1 })
	expect(0, "Control plane stopped", "stop")
	if len(c.owned()) == 0 {
		t.Fatal("serve stop ended the replica; it should keep running for the next control plane")
	}
	expect(0, "life  version 1", append([]string{"start"}, c.daemonFlags()...)...)
	expect(0, "already running", append([]string{"start"}, c.daemonFlags()...)...)
	if st := c.status("life"); st.Ready != 1 {
		t.Fatalf("after serve start: %+v", st)
	}
	// Ended replicas are counted in serve status and listed with -a; SPOT is the ready
	// replicas' spot share.
	c.serve("preempt", "life-1", "--notice", "1s")
	c.waitFor("the preempted replica replaced", 60*time.Second, func() bool {
		st := c.status("life")
		return st.Ready == 1 && st.Replicas[0].ID != "life-1"
	})
	c.waitFor("the preempted replica ended", 60*time.Second, func() bool {
		out, _ := c.serveErr("status", "-a", "life")
		return strings.Contains(out, "life-1") && strings.Contains(out, "terminated")
	})
	if out := c.serve("status", "life"); strings.Contains(out, "life-1 ") || !strings.Contains(out, "1 ended replicas not shown") || !strings.Contains(out, "SPOT") {
		t.Errorf("serve status without -a:\n%s", out)
	}
	expect(0, "Control plane stopped", "stop")
	expect(0, "Service life: every replica terminated", append([]string{"down", "--all", "--wait", "60s"}, c.daemonFlags()...)...)
	if left := c.owned(); len(left) != 0 {
		t.Fatalf("serve down --all after serve stop left replicas: %v", left)
	}
}

// A run: that dies at once must not be relaunched every tick: launches back off.
func TestCrashLoopBacksOff(t *testing.T) {
	c := newCluster(t)
	spec := strings.Replace(simService("loop-model", `  replicas: 1`, ""), "run: exec replicasim", "run: echo crashing; exit 3; exec replicasim", 1)
	c.up("loop", spec, "--detach")
	time.Sleep(6 * time.Second)
	out := c.serve("logs", "loop")
	launches := strings.Count(out, "launching on local")
	if launches < 2 || launches > 5 || !strings.Contains(out, "next launch in") {
		t.Fatalf("%d launches in 6 s (want 2-5, backing off):\n%s", launches, out)
	}
	if log := c.serve("logs", "loop", "loop-1"); !strings.Contains(log, "crashing") {
		t.Fatalf("replica log: %q", log)
	}
	// The log only grows: the last 2 lines now are 2 consecutive lines of the whole log after.
	got := c.serve("logs", "--tail", "2", "--no-follow", "loop")
	if all := c.serve("logs", "loop"); strings.Count(got, "\n") != 2 || !strings.Contains(all, got) {
		t.Fatalf("logs --tail 2: %q; want 2 consecutive lines of\n%s", got, all)
	}
}
