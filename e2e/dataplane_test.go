package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/bench/procs"
)

// routerPID is the embedded daemon's router process, from <home>/router.json (0: none).
func (c *cluster) routerPID() int {
	b, err := os.ReadFile(filepath.Join(c.home, "router.json"))
	if err != nil {
		return 0
	}
	var info struct{ PID int }
	if err := json.Unmarshal(b, &info); err != nil {
		return 0
	}
	return info.PID
}

// alive reports whether pid runs; a zombie does not (a router whose daemon was killed is
// reaped by whatever init the machine has, in its own time).
func alive(pid int) bool { return pid > 0 && procs.Running(pid) }

// The embedded daemon's router is a process of its own (issue 18 item 9): a kill -9 of
// the daemon leaves it serving the last ready set with no request failed, a restarted
// daemon adopts it rather than start another, a router that dies is started again by
// the daemon, and `serve stop` ends both.
func TestDataPlaneOutlivesTheDaemon(t *testing.T) {
	c := newCluster(t)
	c.up("outlive", simService("outlive-model", `  replicas: 2`, "-default-max-tokens 24"))
	router := c.routerPID()
	if !alive(router) || router == c.daemonPID() {
		t.Fatalf("router pid %d, daemon pid %d: want a live router process of its own", router, c.daemonPID())
	}

	l := c.startLoad("outlive-model", 4, 24, false)
	streams := c.startLoad("outlive-model", 2, 24, true)
	time.Sleep(time.Second)
	c.kill9()
	t.Log("daemon killed")
	time.Sleep(3 * time.Second)
	if _, err := c.serveErr("status"); err == nil {
		t.Fatal("serve status answered with the daemon killed")
	}
	if !alive(router) {
		t.Fatalf("the router (pid %d) died with the daemon", router)
	}
	c.startDaemon()
	if got := c.routerPID(); got != router {
		t.Fatalf("the restarted daemon runs router pid %d; want the surviving %d adopted", got, router)
	}
	if !c.logHas("adopted the router") {
		t.Fatalf("no adoption in the daemon log:\n%s", c.daemonLog())
	}
	time.Sleep(2 * time.Second)
	streams.finish(t, "streaming load through the daemon's kill and restart")
	l.finish(t, "non-streaming load through the daemon's kill and restart")

	// The router dies: requests fail until the daemon has started another on the same
	// address, and then succeed.
	if err := syscall.Kill(router, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t.Log("router killed")
	c.waitFor("a new router process serving", 60*time.Second, func() bool {
		pid := c.routerPID()
		if pid == 0 || pid == router || !alive(pid) {
			return false
		}
		code, _, err := c.request(t.Context(), "outlive-model")
		return err == nil && code == 200
	})
	l = c.startLoad("outlive-model", 2, 24, false)
	time.Sleep(time.Second)
	l.finish(t, "load through the restarted router")

	router = c.routerPID()
	c.serve("down", "--all")
	c.serve("stop")
	if alive(router) {
		t.Fatalf("the router (pid %d) outlived serve stop", router)
	}
}

// logHas reports whether the daemon's whole log holds s.
func (c *cluster) logHas(s string) bool {
	b, _ := os.ReadFile(filepath.Join(c.home, "daemon.log"))
	return bytes.Contains(b, []byte(s))
}
