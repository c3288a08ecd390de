// Package e2e runs Arbiter as a user does: the real serve, router and replicasim binaries
// as processes talking HTTP on loopback, a real SQLite state file, and replicas that are
// real child processes.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/bench/procs"
	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/replicas"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "arbiter-e2e-bin")
	if err != nil {
		panic(err)
	}
	// The control plane and router race-built when the tests are; the replicas not (many
	// run at once, and their speed is what the tests time).
	race := func(pkg string) []string {
		if raceEnabled {
			return []string{"build", "-o", dir, "-race", pkg}
		}
		return []string{"build", "-o", dir, pkg}
	}
	for _, args := range [][]string{race("../cmd/serve"), race("../cmd/router"), race("../cmd/picker"), race("../cmd/autoscaler"), {"build", "-o", dir, "../cmd/replicasim"}} {
		build := exec.Command("go", args...)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: build failed:", err)
			os.Exit(1)
		}
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// cluster is one Arbiter installation: a home directory and the ports its embedded daemon
// uses.
type cluster struct {
	t                  *testing.T
	home               string
	api, listen, admin string
	extraDaemonFlags   []string
	// apiURL, if set, points the CLI at a control plane it did not start (cmd/autoscaler).
	apiURL string
	// env is added to the CLI's environment, and so to the daemon it starts (a cloud's
	// credentials).
	env []string
}

// freeAddr is procs.FreeAddr, which never hands one address out twice in the process (the
// kernel may give a port just closed again: TestHAWalkthrough once got one port for a
// control plane's API and a router), shared with the tests that call procs directly.
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := procs.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, home: t.TempDir(), api: freeAddr(t), listen: freeAddr(t), admin: freeAddr(t)}
	t.Cleanup(func() {
		// Whatever a test did, it must not leave replicas behind: end them the way a user
		// would, then stop the daemon, then check the process table.
		// With the daemon's flags: after `serve stop`, down starts the control plane again
		// (on this test's ports, not the defaults another test may hold).
		_, _ = c.serveErr(append([]string{"down", "--all", "--wait", "60s"}, c.daemonFlags()...)...)
		router := c.routerPID()
		_, _ = c.serveErr("stop")
		if alive(router) {
			t.Errorf("the router process %d outlived serve stop", router)
			_ = syscall.Kill(router, syscall.SIGKILL)
		}
		if log := c.daemonLog(); strings.Contains(log, "DATA RACE") || strings.Contains(log, "panic:") {
			t.Errorf("the daemon reported a race or a panic:\n%s", log)
		}
		if left := c.owned(); len(left) > 0 {
			t.Errorf("replica processes left behind: %v", left)
			for _, pids := range left {
				for _, p := range pids {
					_ = syscall.Kill(p, syscall.SIGKILL)
				}
			}
		}
	})
	return c
}

func (c *cluster) daemonFlags() []string {
	return append([]string{"--control-listen", c.api, "--listen", c.listen, "--admin", c.admin, "--tick", "200ms", "--drain-timeout", "5s", "--grace", "2s", "--log-level", "debug"},
		c.extraDaemonFlags...)
}

func (c *cluster) cmd(args ...string) *exec.Cmd {
	global := []string{"--home", c.home}
	if c.apiURL != "" {
		global = append(global, "--api", c.apiURL)
	}
	cmd := exec.Command(filepath.Join(binDir, "serve"), append(global, args...)...)
	cmd.Env = append(append(os.Environ(), c.env...), "ARBITER_HOME="+c.home)
	return cmd
}

func (c *cluster) serveErr(args ...string) (string, error) {
	out, err := c.cmd(args...).CombinedOutput()
	return string(out), err
}

func (c *cluster) serve(args ...string) string {
	c.t.Helper()
	out, err := c.serveErr(args...)
	if err != nil {
		c.t.Fatalf("serve %s: %v\n%s\ndaemon log:\n%s", strings.Join(args, " "), err, out, c.daemonLog())
	}
	return out
}

// daemonLog is the daemon's output: all of it when it holds a race report, else the tail.
func (c *cluster) daemonLog() string {
	b, _ := os.ReadFile(filepath.Join(c.home, "daemon.log"))
	if i := bytes.Index(b, []byte("WARNING: DATA RACE")); i >= 0 {
		return string(b[i:min(len(b), i+20000)])
	}
	if len(b) > 8000 {
		b = b[len(b)-8000:]
	}
	return string(b)
}

// up writes a service file and runs serve up on it.
func (c *cluster) up(name, yaml string, extra ...string) string {
	c.t.Helper()
	path := filepath.Join(c.home, name+".yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		c.t.Fatal(err)
	}
	args := append([]string{"up", "-n", name}, extra...)
	args = append(args, c.daemonFlags()...)
	return c.serve(append(args, path)...)
}

func (c *cluster) writeSpec(name, yaml string) string {
	path := filepath.Join(c.home, name+".yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		c.t.Fatal(err)
	}
	return path
}

func (c *cluster) status(name string) control.ServiceStatus {
	c.t.Helper()
	var st []control.ServiceStatus
	out := c.serve("status", "--json", name)
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st) != 1 {
		c.t.Fatalf("status --json %s: %v\n%s", name, err, out)
	}
	return st[0]
}

// apiStatus reads a service's status straight from the control plane's API: a few
// milliseconds, where the CLI's status is a process start (hundreds on a loaded machine),
// for states that last well under a second. ok is false while the API does not answer.
func (c *cluster) apiStatus(name string) (st control.ServiceStatus, ok bool) {
	c.t.Helper()
	base := c.apiURL
	if base == "" {
		base = "http://" + c.api
	}
	token, err := os.ReadFile(control.TokenPath(c.home))
	if err != nil {
		return st, false
	}
	req, err := http.NewRequest(http.MethodGet, base+"/v1/services/"+name, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, false
	}
	defer resp.Body.Close()
	return st, resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&st) == nil
}

// waitFor polls cond until it holds or the timeout passes.
func (c *cluster) waitFor(what string, timeout time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.t.Fatalf("timed out after %s waiting for %s\nstatus:\n%s\ndaemon log:\n%s", timeout, what, c.serve("status"), c.daemonLog())
}

func (c *cluster) owned() map[string][]int {
	procs, err := replicas.OwnedProcesses(control.Owner(c.home))
	if err != nil {
		c.t.Fatal(err)
	}
	return procs
}

func (c *cluster) daemonPID() int {
	b, err := os.ReadFile(filepath.Join(c.home, "daemon.json"))
	if err != nil {
		c.t.Fatal(err)
	}
	var info struct{ PID int }
	if err := json.Unmarshal(b, &info); err != nil {
		c.t.Fatal(err)
	}
	return info.PID
}

// startDaemon starts the embedded daemon directly (as after a crash, by a supervisor).
func (c *cluster) startDaemon() {
	c.t.Helper()
	logf, err := os.OpenFile(filepath.Join(c.home, "daemon.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	_ = os.Remove(filepath.Join(c.home, "daemon.json"))
	cmd := c.cmd(append([]string{"daemon"}, c.daemonFlags()...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	go cmd.Wait()
	c.waitFor("the restarted daemon", 20*time.Second, func() bool {
		_, err := c.serveErr("status")
		return err == nil
	})
}

// load is a bounded client loop against the endpoint: every request must succeed.
type load struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	errs       []string
	stop       chan struct{}
	wg         sync.WaitGroup
}

func (c *cluster) startLoad(model string, workers int, maxTokens int, stream bool) *load {
	l := &load{stop: make(chan struct{})}
	client := &http.Client{Timeout: 120 * time.Second}
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Tell me about GPUs and spot prices."}],"max_tokens":%d,"stream":%v}`, model, maxTokens, stream)
	deadline := time.Now().Add(3 * time.Minute) // bounded in time even if nobody stops it
	for range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for n := 0; n < 5000 && time.Now().Before(deadline); n++ {
				select {
				case <-l.stop:
					return
				default:
				}
				resp, err := client.Post("http://"+c.listen+"/v1/chat/completions", "application/json", strings.NewReader(body))
				var b []byte
				if err == nil {
					b, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					if err == nil && (resp.StatusCode != 200 || bytes.Contains(b, []byte(`"error"`)) || !bytes.Contains(b, []byte(`"usage"`)) && !stream) {
						err = fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, b)
					}
					if err == nil && stream && !bytes.HasSuffix(bytes.TrimSpace(b), []byte("data: [DONE]")) {
						err = fmt.Errorf("stream did not end with [DONE]: %.200s", b)
					}
				}
				if err != nil {
					l.failed.Add(1)
					l.mu.Lock()
					if len(l.errs) < 10 {
						l.errs = append(l.errs, err.Error())
					}
					l.mu.Unlock()
					time.Sleep(20 * time.Millisecond) // a router that is down refuses at once: do not spin
					continue
				}
				l.ok.Add(1)
			}
		}()
	}
	return l
}

func (l *load) finish(t *testing.T, what string) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	t.Logf("%s: %d requests ok, %d failed", what, l.ok.Load(), l.failed.Load())
	if l.failed.Load() > 0 || l.ok.Load() == 0 {
		t.Errorf("%s: %d ok, %d failed; first errors: %v", what, l.ok.Load(), l.failed.Load(), l.errs)
	}
}

// request sends one chat request and returns its status and body.
func (c *cluster) request(ctx context.Context, model string) (int, string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.listen+"/v1/chat/completions",
		strings.NewReader(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":8}`, model)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// requestOK sends one chat request: nil if it was answered 200, else why not.
func (c *cluster) requestOK(ctx context.Context, model string) error {
	code, body, err := c.request(ctx, model)
	if err == nil && code != http.StatusOK {
		err = &httpErr{code, body}
	}
	return err
}

// requestsOK sends n chat requests at once and waits for every answer: nil if all were
// answered 200, else the first reason one was not.
func (c *cluster) requestsOK(ctx context.Context, model string, n int) error {
	errs := make(chan error, n)
	for range n {
		go func() { errs <- c.requestOK(ctx, model) }()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// chat sends one chat request, streamed (asking for the usage chunk) or not, and returns
// its status and whole body; a stream that does not end with [DONE] is an error.
func (c *cluster) chat(ctx context.Context, model string, stream bool) (int, string, error) {
	opts := ""
	if stream {
		opts = `,"stream":true,"stream_options":{"include_usage":true}`
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.listen+"/v1/chat/completions",
		strings.NewReader(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":8%s}`, model, opts)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && stream && resp.StatusCode == 200 && !bytes.HasSuffix(bytes.TrimSpace(b), []byte("data: [DONE]")) {
		err = fmt.Errorf("stream did not end with [DONE]: %.300s", b)
	}
	return resp.StatusCode, string(b), err
}
