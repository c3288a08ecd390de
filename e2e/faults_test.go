package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is a child process of the test, in its own process group.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startProc(t *testing.T, logPath, bin string, args ...string) *proc {
	t.Helper()
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, bin), args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(p.kill)
	return p
}

// kill is kill -9 of the whole process group, and waits for it.
func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// faultRig is the standalone router binary in front of two replicasim binaries.
type faultRig struct {
	t            *testing.T
	dir          string
	url, admin   string
	addrs        [2]string
	sims         [2]*proc
	simArgs      []string
	routerLog    string
	routerDone   chan struct{}
	clientStream *http.Client
}

func newFaultRig(t *testing.T) *faultRig {
	r := &faultRig{t: t, dir: t.TempDir(), clientStream: &http.Client{Timeout: 60 * time.Second}}
	// The GPU performance model: 300 output tokens take about 3 s, long enough to kill a
	// replica in the middle of a request.
	r.simArgs = []string{"-model", "fault-model", "-profile", "h100-llama-3.1-8b", "-log-level", "warn"}
	var replicas strings.Builder
	replicas.WriteString("replicas:\n")
	for i := range r.addrs {
		r.addrs[i] = freeAddr(t)
		r.startSim(i)
		fmt.Fprintf(&replicas, "  - {id: r%d, address: %s, model: fault-model, capacity: reserved}\n", i, r.addrs[i])
	}
	write := func(name, s string) string {
		p := filepath.Join(r.dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rf := write("replicas.yaml", replicas.String())
	cfg := write("router.yaml", `policy: round_robin
first_byte_timeout: 5s
stream_idle_timeout: 2s
probe: {interval: 200ms, timeout: 500ms, failure_threshold: 2}
ejection: {max_fails: 2, base_backoff: 500ms, max_backoff: 2s}
`)
	listen, admin := freeAddr(t), freeAddr(t)
	r.url, r.admin = "http://"+listen, "http://"+admin
	r.routerLog = filepath.Join(r.dir, "router.log")
	startProc(t, r.routerLog, "router", "-listen", listen, "-admin", admin, "-replicas", rf, "-config", cfg, "-log-level", "warn")
	r.waitAvailable(0, 1)
	return r
}

// restart brings replica i back on its port once the router has seen it gone (so that
// "available" afterwards is about the new process).
func (r *faultRig) restart(i int) {
	r.t.Helper()
	r.sims[i].kill()
	r.waitFor("the router to see the replica gone", func() bool { return !r.replicas()[fmt.Sprintf("r%d", i)].Available })
	r.startSim(i)
	r.waitAvailable(0, 1)
}

func (r *faultRig) startSim(i int) {
	r.sims[i] = startProc(r.t, filepath.Join(r.dir, fmt.Sprintf("sim%d.log", i)), "replicasim", append([]string{"-listen", r.addrs[i]}, r.simArgs...)...)
	r.waitFor("replicasim listening", func() bool {
		resp, err := http.Get("http://" + r.addrs[i] + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

type replicaView struct {
	ID        string `json:"id"`
	Available bool   `json:"available"`
	InFlight  int64  `json:"in_flight"`
}

func (r *faultRig) replicas() map[string]replicaView {
	resp, err := http.Get(r.admin + "/replicas")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var vs []replicaView
	_ = json.NewDecoder(resp.Body).Decode(&vs)
	out := map[string]replicaView{}
	for _, v := range vs {
		out[v.ID] = v
	}
	return out
}

func (r *faultRig) waitFor(what string, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(r.routerLog)
			r.t.Fatalf("timed out waiting for %s; router view %v\nrouter log:\n%s", what, r.replicas(), b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *faultRig) waitAvailable(ids ...int) {
	r.t.Helper()
	r.waitFor(fmt.Sprintf("replicas %v available", ids), func() bool {
		v := r.replicas()
		for _, i := range ids {
			if !v[fmt.Sprintf("r%d", i)].Available {
				return false
			}
		}
		return true
	})
}

// settled: no request left open on any replica in the router's own counts.
func (r *faultRig) settled() bool {
	for _, v := range r.replicas() {
		if v.InFlight != 0 {
			return false
		}
	}
	return true
}

func (r *faultRig) setFault(i int, kind string) {
	r.t.Helper()
	method, body := http.MethodPost, fmt.Sprintf(`{"kind":%q}`, kind)
	if kind == "" {
		method, body = http.MethodDelete, ""
	}
	req, _ := http.NewRequest(method, "http://"+r.addrs[i]+"/admin/fault", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		r.t.Fatalf("fault %q on r%d: %v %v", kind, i, resp, err)
	}
	resp.Body.Close()
}

func (r *faultRig) chat(stream bool, maxTokens int) (int, string) {
	body := fmt.Sprintf(`{"model":"fault-model","messages":[{"role":"user","content":"hello there"}],"max_tokens":%d,"stream":%v}`, maxTokens, stream)
	resp, err := r.clientStream.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The router binary in front of two replicasim processes, through each way a replica
// fails: faults before the first byte are retried on the other replica and the client
// never sees them; a replica killed mid-stream ends its streams with an SSE error event;
// in-flight counts return to 0 after every case; a replica restarted on the same port is
// taken back.
func TestRouterSurvivesReplicaFaults(t *testing.T) {
	r := newFaultRig(t)

	// Before the first byte: garbage instead of HTTP, a reset, a hang past first_byte_timeout.
	for _, kind := range []string{"garbage", "reset", "hang"} {
		r.setFault(0, kind)
		for n := range 2 {
			if code, body := r.chat(n%2 == 0, 8); code != 200 || strings.Contains(body, `"error"`) {
				t.Fatalf("%s on r0, request %d: %d %s; want the other replica's answer", kind, n, code, body)
			}
		}
		r.setFault(0, "")
		r.waitFor("counts back to 0 after "+kind, r.settled)
		r.waitAvailable(0, 1) // re-admitted after its ejection backoff
	}

	// kill -9 while non-streaming requests wait for their whole answer (no byte sent yet):
	// every one is retried on the survivor.
	var wg sync.WaitGroup
	codes := make([]int, 8)
	for i := range codes {
		wg.Add(1)
		go func() { defer wg.Done(); codes[i], _ = r.chat(false, 300) }()
	}
	time.Sleep(600 * time.Millisecond)
	if v := r.replicas()["r0"]; v.InFlight == 0 {
		t.Fatalf("no request on r0 to kill it under: %v", r.replicas())
	}
	r.sims[0].kill()
	wg.Wait()
	for i, c := range codes {
		if c != 200 {
			t.Errorf("non-streaming request %d across a kill -9: %d; want 200 (retried before any byte)", i, c)
		}
	}
	r.waitFor("counts back to 0 after kill -9", r.settled)

	// Restarted on the same port: taken back.
	r.restart(0)

	// kill -9 mid-stream: the streams on the victim end with an error event the client's
	// SDK raises; those on the other replica finish; nothing stays counted.
	bodies := make([]string, 6)
	for i := range bodies {
		wg.Add(1)
		go func() { defer wg.Done(); _, bodies[i] = r.chat(true, 300) }()
	}
	time.Sleep(600 * time.Millisecond)
	if v := r.replicas()["r0"]; v.InFlight == 0 {
		t.Fatalf("no stream on r0 to kill it under: %v", r.replicas())
	}
	r.sims[0].kill()
	wg.Wait()
	broken, whole := 0, 0
	for _, b := range bodies {
		switch {
		case strings.Contains(b, `"error"`) && strings.HasSuffix(strings.TrimSpace(b), "data: [DONE]"):
			broken++
		case strings.HasSuffix(strings.TrimSpace(b), "data: [DONE]"):
			whole++
		default:
			t.Errorf("a stream ended neither whole nor with an error event: %.300q", b)
		}
	}
	if broken == 0 || whole == 0 {
		t.Errorf("%d streams broken, %d whole; want some of each (round robin over two replicas)", broken, whole)
	}
	r.waitFor("counts back to 0 after a mid-stream kill", r.settled)
	for n := range 4 {
		if code, body := r.chat(false, 4); code != 200 {
			t.Fatalf("after the mid-stream kill, request %d: %d %s", n, code, body)
		}
	}
	r.restart(0)

	resp, err := http.Get(r.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(m, []byte("arbiter_router_retries_total")) || !bytes.Contains(m, []byte(`arbiter_router_ejections_total{replica="r0"}`)) {
		t.Errorf("retries and r0's ejections should be counted:\n%s", grepLines(m, "retries|ejections"))
	}
	t.Logf("streams across the kill: %d ended with an error event, %d whole", broken, whole)
	if t.Failed() {
		b, _ := os.ReadFile(r.routerLog)
		t.Logf("router log:\n%s", b)
	}
}

func grepLines(b []byte, alts string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, a := range strings.Split(alts, "|") {
			if strings.Contains(l, a) {
				out = append(out, l)
			}
		}
	}
	return strings.Join(out, "\n")
}
