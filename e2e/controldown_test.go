package e2e

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/control"
)

// A standalone router keeps serving its last known ready set while the control plane
// (cmd/autoscaler) is down, even through losing a replica then (its own probes and retries
// take it out); when the control plane comes back, it replaces the replica and the router
// follows. No request fails throughout.
func TestRouterServesWhileTheControlPlaneIsDown(t *testing.T) {
	c := newCluster(t)
	c.apiURL = "http://" + c.api
	startControl := c.startAutoscaler
	cp := startControl()
	routerAdmin := "http://" + freeAddr(t)
	startProc(t, filepath.Join(c.home, "router.log"), "router", "-listen", c.listen, "-admin", routerAdmin[len("http://"):],
		"-control", c.apiURL, "-token-file", control.TokenPath(c.home), "-log-level", "warn")
	c.up("cpdown", simService("cpdown-model", `  replicas: 2`, "-default-max-tokens 24"))
	available := func() []string {
		resp, err := http.Get(routerAdmin + "/replicas")
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var vs []replicaView
		_ = json.NewDecoder(resp.Body).Decode(&vs)
		var ids []string
		for _, v := range vs {
			if v.Available {
				ids = append(ids, v.ID)
			}
		}
		slices.Sort(ids)
		return ids
	}
	before := replicaIDs(c.status("cpdown"))
	c.waitFor("the router to take both replicas", 20*time.Second, func() bool { return slices.Equal(available(), before) })

	l := c.startLoad("cpdown-model", 4, 24, false)
	streams := c.startLoad("cpdown-model", 2, 24, true)
	time.Sleep(time.Second)
	cp.kill()
	t.Log("control plane killed")
	time.Sleep(3 * time.Second)
	// Streams cut by a replica's death end in an error event by design; stop them before
	// killing one so the count below is about what the router can save.
	streams.finish(t, "streaming load with the control plane down")
	victim := before[0]
	for _, pid := range c.owned()[victim] {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	t.Logf("replica %s killed while the control plane is down", victim)
	c.waitFor("the router to stop sending to the dead replica", 20*time.Second, func() bool { return !slices.Contains(available(), victim) })
	time.Sleep(2 * time.Second)
	if got := l.ok.Load(); got == 0 || l.failed.Load() > 0 {
		t.Fatalf("with the control plane down: %d ok, %d failed: %v", got, l.failed.Load(), l.errs)
	}

	cp = startControl()
	t.Log("control plane restarted")
	var after []string
	c.waitFor("a replacement, ready and followed by the router", 60*time.Second, func() bool {
		st := c.status("cpdown")
		after = replicaIDs(st)
		return st.Ready == 2 && len(after) == 2 && !slices.Contains(after, victim) && slices.Equal(available(), after)
	})
	t.Logf("replicas %v → %v", before, after)
	time.Sleep(time.Second)
	l.finish(t, "non-streaming load through the control plane's death, a replica's death and the restart")
	c.serve("down", "--all")
	cp.kill()
}

// startAutoscaler runs the standalone control plane (cmd/autoscaler) on the cluster's home
// and API address (c.apiURL set to it), and returns once it answers.
func (c *cluster) startAutoscaler() *proc {
	p := startProc(c.t, filepath.Join(c.home, "autoscaler.log"), "autoscaler", "-home", c.home, "-api", c.api, "-admin", "",
		"-tick", "200ms", "-drain-timeout", "5s", "-grace", "2s", "-log-level", "debug")
	c.waitFor("the control plane", 20*time.Second, func() bool { _, err := c.serveErr("status"); return err == nil })
	return p
}
