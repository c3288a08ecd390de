package e2e

import (
	"bufio"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Idle connections cannot take the router down: under `ulimit -n 256` (soft and hard, so
// it cannot be raised), 600 idle client connections get the ones beyond its budget
// answered 503 and closed, never an exhausted descriptor table; the router keeps serving
// its admin port meanwhile and serves requests again once the flood closes.
func TestIdleConnectionFloodUnderALowDescriptorLimit(t *testing.T) {
	dir := t.TempDir()
	simAddr, listen, admin := freeAddr(t), freeAddr(t), freeAddr(t)
	startProc(t, filepath.Join(dir, "sim.log"), "replicasim", "-listen", simAddr, "-model", "fd-model", "-echo", "-log-level", "warn")
	rf := filepath.Join(dir, "replicas.yaml")
	if err := os.WriteFile(rf, []byte("replicas:\n  - {id: r0, address: "+simAddr+", model: fd-model, capacity: reserved}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "router.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-c", `ulimit -n 256 && exec "$0" "$@"`, filepath.Join(binDir, "router"),
		"-listen", listen, "-admin", admin, "-replicas", rf, "-log-level", "info")
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lf.Close()
	exited := make(chan struct{})
	var exitErr error
	go func() { exitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	chat := func() (int, error) {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Post("http://"+listen+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"fd-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`))
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if code, err := chat(); err == nil && code == 200 {
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("the router never served; its log:\n%s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The flood: 600 connections that send nothing, each opened and kept.
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	shed, failed := 0, 0
	floodEnd := time.Now().Add(20 * time.Second)
	for range 600 {
		if failed >= 5 || time.Now().After(floodEnd) {
			break // nothing accepts any more: the checks below say why
		}
		c, err := net.DialTimeout("tcp", listen, time.Second)
		if err != nil {
			failed++ // the kernel's backlog is full: refused at the door is fine too
			continue
		}
		conns = append(conns, c)
	}
	// Those beyond the router's budget are answered 503 and closed at once.
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err == nil && strings.Contains(line, "503") {
			shed++
		}
	}
	select {
	case <-exited:
		b, _ := os.ReadFile(logPath)
		t.Fatalf("the router died under the flood (%v); its log:\n%s", exitErr, b)
	default:
	}
	if shed == 0 {
		t.Errorf("none of %d idle connections was shed; a limit of 256 descriptors cannot hold them all", len(conns))
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + admin + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the admin port during the flood: %v %v", resp, err)
	}
	resp.Body.Close()
	t.Logf("flood: %d connections opened, %d shed with 503", len(conns), shed)
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	deadline = time.Now().Add(30 * time.Second)
	for {
		code, err := chat()
		if err == nil && code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the flood closed, requests still fail: %d %v", code, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if b, _ := os.ReadFile(logPath); strings.Contains(string(b), "Permanent error when accepting") {
		t.Fatalf("the router's accept loop failed:\n%s", b)
	}
}
