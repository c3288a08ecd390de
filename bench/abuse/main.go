// Command abuse attacks real Arbiter processes on loopback the way careless users and
// hostile clients would (issue 18): JSON bombs against a router (many concurrent
// multi-megabyte bodies, nested deep or spread wide), with its peak and final RSS.
//
//	go build -o bin/ ./cmd/router ./cmd/replicasim ./cmd/serve && go run ./bench/abuse -bin bin
//
// Then it submits to a real `serve daemon` the specs and router reports that once got
// through, each of which must now be refused with 400.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
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
	maxRSS := flag.Float64("max-rss", 0, "fail (exit 1) when the router's peak RSS passes this many MiB in any attack, or it dies (0: only when it dies)")
	flag.Parse()
	if err := run(*bin, *n, *size, *rounds, *maxRSS); err != nil {
		fmt.Fprintln(os.Stderr, "abuse:", err)
		os.Exit(1)
	}
}

func run(bin string, n, size, rounds int, maxRSS float64) error {
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
	attacks := []struct{ name, body string }{
		{"deep: one array nested to the body's size", head + strings.Repeat("[", room/2) + strings.Repeat("]", room/2) + "}"},
		{"wide: the body's size in empty objects", head + "[" + strings.TrimSuffix(strings.Repeat("{},", room/3), ",") + "]}"},
		{"wide within the value limit: 1,000,000 numbers", head + "[" + strings.TrimSuffix(strings.Repeat("1,", 1_000_000), ",") + "]}"},
	}
	fmt.Printf("router RSS at rest: %.0f MiB\n\n", rssMiB(router.Process.Pid))
	fmt.Println("| attack | bodies × size × rounds | answers | router peak RSS | RSS after | router alive |")
	fmt.Println("|---|---|---|---:|---:|---|")
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
			for range n {
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
		fmt.Printf("| %s | %d × %.1f MiB × %d | %v | %d MiB | %.0f MiB | %v |\n", a.name, n, float64(len(a.body))/(1<<20), rounds, codes, peak.Load(), rssMiB(router.Process.Pid), alive)
		switch {
		case !alive:
			failed = append(failed, a.name+": the router died")
		case maxRSS > 0 && float64(peak.Load()) > maxRSS:
			failed = append(failed, fmt.Sprintf("%s: peak RSS %d MiB over %.0f", a.name, peak.Load(), maxRSS))
		}
	}
	cp, err := controlPlaneAttacks(bin, dir)
	if err != nil {
		return err
	}
	failed = append(failed, cp...)
	dp, err := controlPlaneCrash(bin, dir)
	if err != nil {
		return err
	}
	failed = append(failed, dp...)
	if len(failed) > 0 {
		return fmt.Errorf("not held: %s", strings.Join(failed, "; "))
	}
	return nil
}

// controlPlaneAttacks submits, to a real `serve daemon`, the specs and router reports that
// once got through (issue 18 items 1, 2, 5, 10), and checks each is refused with 400 while
// the daemon stays up and its status renders. It returns what did not hold.
func controlPlaneAttacks(bin, dir string) ([]string, error) {
	home := filepath.Join(dir, "home")
	api := procs.MustFreeAddr()
	daemon, err := start(filepath.Join(bin, "serve"), "daemon", "--home", home, "--control-listen", api, "--listen", procs.MustFreeAddr(), "--admin", procs.MustFreeAddr(), "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	defer stopDaemon(bin, home, daemon)
	do, err := apiClient(home, "http://"+api)
	if err != nil {
		return nil, err
	}
	const run = "run: exec replicasim -listen 127.0.0.1:$PORT\n"
	attacks := []struct {
		name, method, path, body string
	}{
		{"a billion replicas", "POST", "/v1/services", submit("huge", "service:\n  readiness_probe: /health\n  replicas: 1000000000\n"+run+"arbiter: {model: m}\n")},
		{"more replicas than the daemon's ceiling", "POST", "/v1/services", submit("big", "service:\n  readiness_probe: /health\n  replicas: 500\n"+run+"arbiter: {model: m}\n")},
		{"panic_threshold 1 (the autoscaler refuses it)", "POST", "/v1/services", submit("panicky", "service:\n  readiness_probe: /health\n  replicas: 1\n"+run+"arbiter:\n  model: m\n  autoscaling: {panic_threshold: 1}\n")},
		{"a load report of 1e308 tokens", "POST", "/v1/load", `{"router":"r1","models":[{"model":"m","tokens":1e308}]}`},
		{"a load report with a negative count", "POST", "/v1/load", `{"router":"r1","models":[{"model":"m","requests":-5}]}`},
	}
	fmt.Println("\n| control-plane attack | expected | observed | held |")
	fmt.Println("|---|---|---|---|")
	var failed []string
	for _, a := range attacks {
		code, body := do(a.method, a.path, a.body)
		held := code == 400
		fmt.Printf("| %s | 400, nothing stored | %d %.90s | %v |\n", a.name, code, strings.ReplaceAll(body, "|", "/"), held)
		if !held {
			failed = append(failed, a.name)
		}
	}
	code, body := do("GET", "/v1/services", "")
	alive := procs.Running(daemon.Process.Pid) && code == 200 && body == "[]\n"
	fmt.Printf("| afterwards: daemon up, status renders, nothing stored | 200 [] | %d %.60s | %v |\n", code, strings.TrimSpace(body), alive)
	if !alive {
		failed = append(failed, "the daemon after the attacks")
	}
	return failed, nil
}

// controlPlaneCrash kills (-9) a real `serve daemon` in the middle of a load through its
// endpoint, then starts it again, and counts the requests that failed (issue 18 item 9:
// the embedded daemon's router once died with its control plane, failing a third of the
// requests in flight). The router must keep serving throughout, and the new daemon must
// adopt it.
func controlPlaneCrash(bin, dir string) ([]string, error) {
	home := filepath.Join(dir, "crash-home")
	api, listen := procs.MustFreeAddr(), procs.MustFreeAddr()
	args := []string{"daemon", "--home", home, "--control-listen", api, "--listen", listen, "--admin", procs.MustFreeAddr(), "--log-level", "warn"}
	daemon, err := start(filepath.Join(bin, "serve"), args...)
	if err != nil {
		return nil, err
	}
	defer func() { stopDaemon(bin, home, daemon) }()
	do, err := apiClient(home, "http://"+api)
	if err != nil {
		return nil, err
	}
	svc := "service:\n  readiness_probe: /health\n  replicas: 2\nrun: exec replicasim -listen 127.0.0.1:$PORT -model m -echo -log-level warn\narbiter: {model: m}\n"
	if code, body := do("POST", "/v1/services", submit("crash", svc)); code != 201 && code != 200 {
		return nil, fmt.Errorf("submit the crash service: %d %s", code, body)
	}
	url := "http://" + listen + "/v1/chat/completions"
	if err := waitServing(url); err != nil {
		return nil, err
	}
	router := daemonRouterPID(home, 5*time.Second)
	// A bounded load: 8 workers for 6 s at most, 200,000 requests at most; the daemon is
	// killed after 1.5 s and started again after 3 s.
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	stopAt := time.Now().Add(6 * time.Second)
	client := &http.Client{Timeout: 30 * time.Second}
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8}`
	for range 8 {
		wg.Go(func() {
			for n := 0; n < 25000 && time.Now().Before(stopAt); n++ {
				resp, err := client.Post(url, "application/json", strings.NewReader(body))
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if err != nil || resp.StatusCode != 200 {
					failed.Add(1)
					time.Sleep(10 * time.Millisecond) // a refusing endpoint answers at once: do not spin
					continue
				}
				ok.Add(1)
			}
		})
	}
	time.Sleep(1500 * time.Millisecond)
	_ = syscall.Kill(daemon.Process.Pid, syscall.SIGKILL)
	_ = daemon.Wait()
	time.Sleep(1500 * time.Millisecond)
	if daemon, err = start(filepath.Join(bin, "serve"), args...); err != nil {
		return nil, err
	}
	wg.Wait()
	adopted := router != 0 && daemonRouterPID(home, 30*time.Second) == router
	held := failed.Load() == 0 && ok.Load() > 0 && adopted
	fmt.Println("\n| data-plane attack | expected | observed | held |")
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| kill -9 of the daemon under load, then a restart | 0 failed, the router adopted | %d ok, %d failed, router adopted: %v | %v |\n", ok.Load(), failed.Load(), adopted, held)
	if !held {
		return []string{"the endpoint through a control-plane crash"}, nil
	}
	return nil, nil
}

// daemonRouterPID is the router process the home's daemon published (0: none yet).
func daemonRouterPID(home string, wait time.Duration) int {
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		var info struct {
			PID       int `json:"pid"`
			RouterPID int `json:"router_pid"`
		}
		b, err := os.ReadFile(filepath.Join(home, "daemon.json"))
		if err == nil && json.Unmarshal(b, &info) == nil && info.RouterPID != 0 && procs.Running(info.PID) {
			return info.RouterPID
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0
}

// apiClient waits for a daemon's API and returns a caller that uses the home's token.
func apiClient(home, base string) (func(method, path, body string) (int, string), error) {
	var token string
	deadline := time.Now().Add(60 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(home, "token")); err == nil {
			token = strings.TrimSpace(string(b))
			if resp, err := http.Get(base + "/v1/health"); err == nil {
				resp.Body.Close()
				break
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the daemon did not come up within 60 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}, nil
}

func submit(name, spec string) string {
	b, _ := json.Marshal(map[string]string{"name": name, "spec": spec})
	return string(b)
}

// stopDaemon ends a daemon's replicas, then the daemon and its router (which runs in a
// session of its own), the way a user does, then makes sure of it.
func stopDaemon(bin, home string, daemon *exec.Cmd) {
	for _, args := range [][]string{{"down", "--all", "--wait", "60s"}, {"stop"}} {
		cmd := exec.Command(filepath.Join(bin, "serve"), append([]string{"--home", home}, args...)...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		_ = cmd.Run()
	}
	stop(daemon)
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
