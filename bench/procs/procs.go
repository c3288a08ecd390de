// Package procs is what the bench programs need of the processes they start and watch: a
// free loopback address to give one, and its resident memory and liveness from /proc.
package procs

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// FreeAddr returns a loopback address no one listens on right now.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

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
