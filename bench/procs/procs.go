// Package procs is what the bench programs need of the processes they start and watch: a
// free loopback address to give one, its resident memory and liveness from /proc, and a
// group that starts them and kills them together.
package procs

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"gopkg.in/yaml.v3"
)

// FreeAddr returns a loopback address no one listens on right now, and never one it has
// returned before in this process: the kernel may give a port just closed again, and a
// bench that starts a replica on one address and the router on another found both on one
// port ("bind: address already in use": CI's abuse run under ulimit, 2026-11-30).
func FreeAddr() (string, error) {
	handedOut.mu.Lock()
	defer handedOut.mu.Unlock()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := ln.Addr().String()
		ln.Close()
		if !handedOut.addrs[addr] {
			handedOut.addrs[addr] = true
			return addr, nil
		}
	}
}

// handedOut are the addresses FreeAddr gave in this process.
var handedOut = struct {
	mu    sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// RSSKiB is a process's resident set in KiB (0 once it is gone).
func RSSKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
	}
	return 0
}

// TreeRSSKiB is the resident set of a process and its children (nginx's master and
// workers).
func TreeRSSKiB(pid int) int64 {
	total := RSSKiB(pid)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: the command may hold spaces, so read after its ')'.
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		if f := strings.Fields(rest); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			total += RSSKiB(child)
		}
	}
	return total
}

// Running reports whether a process lives (a killed child stays a zombie until reaped).
func Running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	return err == nil && !strings.Contains(string(b), "State:\tZ")
}

// MustFreeAddr is FreeAddr for programs that cannot go on without one.
func MustFreeAddr() string {
	addr, err := FreeAddr()
	if err != nil {
		panic(err)
	}
	return addr
}

// WaitHealthy waits until a server at addr answers /health with 200, for at most 60 s.
func WaitHealthy(addr string) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + addr + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not healthy within 60 s", addr)
}

// Group is a bench's processes, started from one folder of binaries and killed together.
type Group struct {
	ctx  context.Context
	bin  string
	cmds []*exec.Cmd
}

// NewGroup starts processes from the binaries in bin, each ended with ctx.
func NewGroup(ctx context.Context, bin string) *Group { return &Group{ctx: ctx, bin: bin} }

// Start runs the binary name with args, its stderr the bench's, env added to the bench's
// own environment.
func (g *Group) Start(env []string, name string, args ...string) error {
	cmd := exec.CommandContext(g.ctx, filepath.Join(g.bin, name), args...)
	cmd.Stderr, cmd.Env = os.Stderr, append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	g.cmds = append(g.cmds, cmd)
	return nil
}

// Stop kills every process started and waits for it.
func (g *Group) Stop() {
	for _, c := range g.cmds {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
	g.cmds = nil
}

// WriteYAML writes each value as YAML to its file name in dir, owner-only.
func WriteYAML(dir string, files map[string]any) error {
	for name, v := range files {
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}
