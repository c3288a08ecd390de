// Command abuse attacks real Arbiter processes on loopback the way careless users and
// hostile clients would (issue 18): JSON bombs against a router (many concurrent
// multi-megabyte bodies, nested deep or spread wide), with its peak and final RSS.
//
//	go build -o bin/ ./cmd/router ./cmd/replicasim ./cmd/serve && go run ./bench/abuse -bin bin
//
// Then it attacks a router as hostile clients do (no key, a key over its limit, path
// tricks, oversized bodies and headers, vanishing clients, idle connection floods,
// slowloris), puts a hung replica and a header-recording one behind a router, then a
// replica an attacker controls (issue 35: oversized and endless SSE events, odd status
// lines, deep JSON, lying usage and /metrics, hostile headers, a flapping /health) and
// sends it the request framings a smuggling scanner tries, and attacks a
// real `serve daemon`: specs and load reports that once got through, a write-locked state
// file while a replica dies, its files' modes, and a kill -9 under load. Each case prints
// what was expected, what was observed and whether it held; the exit status is 1 if any
// did not.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/arbiter-serve/arbiter/bench/procs"
)

func main() {
	bin := flag.String("bin", "bin", "directory holding the router, replicasim and serve binaries")
	n := flag.Int("bodies", 48, "concurrent bodies per attack")
	size := flag.Int("size", 7<<20, "bytes per body")
	rounds := flag.Int("rounds", 3, "times each attack is sent")
	only := flag.String("only", "", "run only the sections whose title contains this (e.g. hostile); skips the JSON bombs")
	maxRSS := flag.Float64("max-rss", 0, "fail (exit 1) when the router's peak RSS passes this many MiB in any attack, or it dies (0: only when it dies)")
	flag.Parse()
	if err := run(*bin, *n, *size, *rounds, *maxRSS, *only); err != nil {
		fmt.Fprintln(os.Stderr, "abuse:", err)
		os.Exit(1)
	}
}

func run(bin string, n, size, rounds int, maxRSS float64, only string) error {
	dir, err := os.MkdirTemp("", "abuse")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	simAddr, listen, admin := procs.MustFreeAddr(), procs.MustFreeAddr(), procs.MustFreeAddr()
	sim, err := start(filepath.Join(bin, "replicasim"), "-listen", simAddr, "-model", "m", "-echo", "-log-level", "warn")
	if err != nil {
		return err
	}
	defer stop(sim)
	rf := filepath.Join(dir, "replicas.yaml")
	if err := os.WriteFile(rf, []byte("replicas:\n  - {id: r0, address: "+simAddr+", model: m, capacity: reserved}\n"), 0o600); err != nil {
		return err
	}
	router, err := start(filepath.Join(bin, "router"), "-listen", listen, "-admin", admin, "-replicas", rf, "-log-level", "warn")
	if err != nil {
		return err
	}
	defer stop(router)
	url := "http://" + listen + "/v1/chat/completions"
	if err := waitServing(url); err != nil {
		return err
	}
	head := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"x":`
	room := size - len(head) - 1
	prompt := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"`
	attacks := []struct {
		name, body string
		clients    int // concurrent bodies
	}{
		{"deep: one array nested to the body's size", head + strings.Repeat("[", room/2) + strings.Repeat("]", room/2) + "}", n},
		{"wide: the body's size in empty objects", head + "[" + strings.TrimSuffix(strings.Repeat("{},", room/3), ",") + "]}", n},
		{"wide within the value limit: 500,000 numbers", head + "[" + strings.TrimSuffix(strings.Repeat("1,", 500_000), ",") + "]}", n},
		// Valid requests, nothing to refuse but their number: what bounds the raw bodies.
		{"many clients, a body-sized prompt each", prompt + strings.Repeat("x", size-len(prompt)-4) + `"}]}`, 4 * n},
	}
	if only != "" {
		attacks = nil
	}
	if attacks != nil {
		fmt.Printf("router RSS at rest: %.0f MiB\n\n", rssMiB(router.Process.Pid))
		fmt.Println("| attack | bodies × size × rounds | answers | router peak RSS | RSS after | router alive |")
		fmt.Println("|---|---|---|---:|---:|---|")
	}
	var failed []string
	for _, a := range attacks {
		var peak atomic.Uint64
		done := make(chan struct{})
		go func() {
			for {
				if r := uint64(rssMiB(router.Process.Pid)); r > peak.Load() {
					peak.Store(r)
				}
				select {
				case <-done:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
		codes := map[string]int{}
		var mu sync.Mutex
		client := &http.Client{Timeout: 60 * time.Second}
		for range rounds {
			var wg sync.WaitGroup
			for range a.clients {
				wg.Go(func() {
					code := "error"
					resp, err := client.Post(url, "application/json", bytes.NewReader([]byte(a.body)))
					if err == nil {
						code = strconv.Itoa(resp.StatusCode)
						resp.Body.Close()
					}
					mu.Lock()
					codes[code]++
					mu.Unlock()
				})
			}
			wg.Wait()
		}
		time.Sleep(200 * time.Millisecond)
		close(done)
		alive := procs.Running(router.Process.Pid)
		fmt.Printf("| %s | %d × %.1f MiB × %d | %v | %d MiB | %.0f MiB | %v |\n", a.name, a.clients, float64(len(a.body))/(1<<20), rounds, codes, peak.Load(), rssMiB(router.Process.Pid), alive)
		switch {
		case !alive:
			failed = append(failed, a.name+": the router died")
		case maxRSS > 0 && float64(peak.Load()) > maxRSS:
			failed = append(failed, fmt.Sprintf("%s: peak RSS %d MiB over %.0f", a.name, peak.Load(), maxRSS))
		}
	}
	for _, section := range []struct {
		title string
		run   func(bin, dir string) ([]row, error)
	}{
		{"client attack (a keyed router, default limits)", clientAttacks},
		{"replica attack (a router without keys)", replicaAttacks},
		{"hostile replica and request framing (issue 35: a router in front of a replica an attacker controls)", hostileReplicaAttacks},
		{"control-plane attack (a real serve daemon)", daemonAttacks},
	} {
		if !strings.Contains(section.title, only) {
			continue
		}
		rows, err := section.run(bin, dir)
		if err != nil {
			return fmt.Errorf("%s: %w", section.title, err)
		}
		failed = append(failed, printRows(section.title, rows)...)
	}
	if len(failed) > 0 {
		return fmt.Errorf("not held: %s", strings.Join(failed, "; "))
	}
	return nil
}

func start(path string, args ...string) (*exec.Cmd, error) {
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, cmd.Start()
}

func stop(cmd *exec.Cmd) {
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
}

func waitServing(url string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the router did not serve within 30 s")
}

func rssMiB(pid int) float64 { return float64(procs.RSSKiB(pid)) / 1024 }
