// Command soak is a bounded soak of the whole system as `serve up` runs it: the embedded
// daemon (control plane + router) with replicasim replicas from the local provider, mixed
// streaming and non-streaming load at high concurrency, while replicas are killed (kill -9
// of a random replica's processes; the control plane replaces it) and added and removed
// (rolling updates between two replica counts). It samples the daemon's RSS, goroutines
// and open files as it goes, and fails (exit 1) when
//   - a request was lost: anything but a stream cut mid-way by a killed replica (which ends
//     with an error event, by design: its bytes already reached the client);
//   - RSS or goroutines grew over the run (the second half's peak against the first half's);
//   - goroutines did not come back to their idle level once the load stopped;
//   - a replica process outlived `serve down`.
//
// Run it through bench/soak.sh (builds the binaries). Results: bench/docs/soak.md.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/arbiter-serve/arbiter/bench/procs"
	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/replicas"
)

const model = "soak-model"

type options struct {
	bin                    string
	duration, warmup       time.Duration
	workers                int
	streamShare            float64
	replicasA, replicasB   int
	killEvery, updateEvery time.Duration
	sampleEvery            time.Duration
	maxTokens              int
	profile                string
	tolerance              float64
	seed                   uint64
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory with the serve and replicasim binaries")
	flag.DurationVar(&o.duration, "duration", 5*time.Minute, "load duration (at most 10m)")
	flag.DurationVar(&o.warmup, "warmup", 30*time.Second, "samples before this are not compared")
	flag.IntVar(&o.workers, "workers", 256, "concurrent clients")
	flag.Float64Var(&o.streamShare, "stream-share", 0.5, "share of clients that stream")
	flag.IntVar(&o.replicasA, "replicas", 3, "replica count, alternating with -replicas-alt at each update")
	flag.IntVar(&o.replicasB, "replicas-alt", 5, "the other replica count")
	flag.DurationVar(&o.killEvery, "kill-every", 15*time.Second, "kill -9 a random replica this often")
	flag.DurationVar(&o.updateEvery, "update-every", 60*time.Second, "rolling update to the other replica count this often")
	flag.DurationVar(&o.sampleEvery, "sample-every", 5*time.Second, "sample RSS, goroutines and files this often")
	flag.IntVar(&o.maxTokens, "max-tokens", 48, "tokens per request")
	flag.StringVar(&o.profile, "profile", "h100-llama-3.2-1b", "the replicas' GPU performance profile (replicasim -profile)")
	flag.Float64Var(&o.tolerance, "tolerance", 0.25, "allowed growth of the second half's peak over the first half's")
	flag.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()), "seed for which replica is killed")
	flag.Parse()
	if o.duration > 10*time.Minute {
		fmt.Fprintln(os.Stderr, "soak: -duration is at most 10m")
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

type daemon struct {
	home, api, listen, admin string
	cmd                      *exec.Cmd
	serve                    string
}

func (d *daemon) cli(args ...string) (string, error) {
	out, err := exec.Command(d.serve, append([]string{"--home", d.home}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("serve %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func specText(o options, n int) string {
	return fmt.Sprintf(`service:
  readiness_probe: {path: /health, initial_delay_seconds: 60, timeout_seconds: 2}
  replicas: %d
run: exec replicasim -listen 127.0.0.1:$PORT -model %s -profile %s -default-max-tokens %d -log-level warn
arbiter:
  model: %s
  readiness: {probe_interval_seconds: 1, failure_threshold: 2}
`, n, model, o.profile, o.maxTokens, model)
}

func run(o options) error {
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return err
	}
	home, err := os.MkdirTemp("", "arbiter-soak")
	if err != nil {
		return err
	}
	defer os.RemoveAll(home)
	d := &daemon{home: home, api: procs.MustFreeAddr(), listen: procs.MustFreeAddr(), admin: procs.MustFreeAddr(), serve: filepath.Join(bin, "serve")}
	logf, err := os.Create(filepath.Join(home, "daemon.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	d.cmd = exec.Command(d.serve, "--home", home, "daemon", "--control-listen", d.api, "--listen", d.listen, "--admin", d.admin,
		"--tick", "250ms", "--drain-timeout", "30s", "--grace", "2s", "--log-level", "warn")
	d.cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	if err := d.cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = d.cmd.Process.Kill(); _ = d.cmd.Wait() }()
	pid := d.cmd.Process.Pid

	specs := [2]string{filepath.Join(home, "a.yaml"), filepath.Join(home, "b.yaml")}
	for i, n := range []int{o.replicasA, o.replicasB} {
		if err := os.WriteFile(specs[i], []byte(specText(o, n)), 0o644); err != nil {
			return err
		}
	}
	if err := waitFor(20*time.Second, func() bool { _, err := d.cli("status"); return err == nil }); err != nil {
		return fmt.Errorf("the daemon did not answer: %w", err)
	}
	// Registered before up: whatever fails from here on, no replica is left running.
	defer func() {
		if out, err := d.cli("down", "--all", "--wait", "2m"); err != nil {
			fmt.Fprintln(os.Stderr, out)
		}
	}()
	out, err := d.cli("up", "-n", "soak", "--wait", "2m", specs[0])
	if err != nil {
		return err
	}
	fmt.Fprint(os.Stderr, out)
	time.Sleep(2 * time.Second)
	idleBefore := sample(pid, d.admin)

	ctx, cancel := context.WithTimeout(context.Background(), o.duration)
	defer cancel()
	var res results
	var wg sync.WaitGroup
	streamers := int(float64(o.workers) * o.streamShare)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.workers, DisableCompression: true}, Timeout: 2 * time.Minute}
	start := time.Now()
	for i := range o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res.worker(ctx, client, "http://"+d.listen, i < streamers, o.maxTokens)
		}()
	}

	// Chaos: kill a random replica; roll between the two replica counts.
	var kills, updates atomic.Int64
	var chaosLog []string
	var logMu sync.Mutex
	note := func(format string, args ...any) {
		logMu.Lock()
		chaosLog = append(chaosLog, fmt.Sprintf("%6.1fs ", time.Since(start).Seconds())+fmt.Sprintf(format, args...))
		logMu.Unlock()
	}
	rng := rand.New(rand.NewPCG(o.seed, 2))
	owner := control.Owner(home)
	wg.Add(1)
	go func() {
		defer wg.Done()
		kt, ut := time.NewTicker(o.killEvery), time.NewTicker(o.updateEvery)
		defer kt.Stop()
		defer ut.Stop()
		next := 1
		for {
			select {
			case <-ctx.Done():
				return
			case <-kt.C:
				procs, err := replicas.OwnedProcesses(owner)
				if err != nil || len(procs) == 0 {
					note("kill: no replica process found (%v)", err)
					continue
				}
				ids := make([]string, 0, len(procs))
				for id := range procs {
					ids = append(ids, id)
				}
				slices.Sort(ids)
				victim := ids[rng.IntN(len(ids))]
				for _, p := range procs[victim] {
					_ = syscall.Kill(p, syscall.SIGKILL)
				}
				kills.Add(1)
				note("kill -9 %s (of %d replica processes)", victim, len(ids))
			case <-ut.C:
				if _, err := d.cli("update", "soak", "--detach", specs[next]); err != nil {
					note("update failed: %v", err)
					continue
				}
				updates.Add(1)
				note("rolling update to %d replicas", []int{o.replicasA, o.replicasB}[next])
				next = 1 - next
			}
		}
	}()

	var samples []snapshot
	st := time.NewTicker(o.sampleEvery)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-st.C:
			s := sample(pid, d.admin)
			s.at = time.Since(start)
			s.ok, s.cut, s.lost = res.ok.Load(), res.cut.Load(), res.lost.Load()
			s.live = len(mustOwned(owner))
			samples = append(samples, s)
			fmt.Fprintf(os.Stderr, "%6.0fs rss %6.1f MiB goroutines %5d fds %5d replicas %d | ok %d cut %d lost %d\n",
				s.at.Seconds(), float64(s.rssKiB)/1024, s.goroutines, s.fds, s.live, s.ok, s.cut, s.lost)
		}
	}
	st.Stop()
	wg.Wait()
	elapsed := time.Since(start)
	client.CloseIdleConnections()
	// Let the control plane finish the last update and replacements, then measure idle.
	_ = waitFor(60*time.Second, func() bool {
		out, err := d.cli("status", "soak")
		return err == nil && !strings.Contains(out, "draining") && !strings.Contains(out, "starting") && !strings.Contains(out, "provisioning")
	})
	// fasthttp keeps idle connection workers for 10 s before they exit: give them 30.
	var idleAfter snapshot
	_ = waitFor(30*time.Second, func() bool {
		idleAfter = sample(pid, d.admin)
		return idleAfter.goroutines <= idleBefore.goroutines+20
	})

	if out, err := d.cli("down", "--all", "--wait", "2m"); err != nil {
		return fmt.Errorf("serve down: %w\n%s", err, out)
	}
	left := mustOwned(owner)

	// Report.
	fmt.Printf("\n### Soak: %v, %d clients (%d streaming), replicas %d ↔ %d, kill -9 every %v, update every %v\n\n",
		o.duration, o.workers, streamers, o.replicasA, o.replicasB, o.killEvery, o.updateEvery)
	fmt.Println("| time | daemon RSS | goroutines | open files | replica processes | requests ok | streams cut | lost |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|")
	for i, s := range samples {
		if i%max(1, len(samples)/12) != 0 && i != len(samples)-1 {
			continue
		}
		fmt.Printf("| %.0fs | %.1f MiB | %d | %d | %d | %d | %d | %d |\n", s.at.Seconds(), float64(s.rssKiB)/1024, s.goroutines, s.fds, s.live, s.ok, s.cut, s.lost)
	}
	fmt.Printf("\n%d requests ok (%.0f/s), %d streams cut by a killed replica, %d lost; %d replicas killed, %d rolling updates; seed %d.\n",
		res.ok.Load(), float64(res.ok.Load())/elapsed.Seconds(), res.cut.Load(), res.lost.Load(), kills.Load(), updates.Load(), o.seed)
	fmt.Printf("Idle before the load: %d goroutines, %.1f MiB; idle after it: %d goroutines, %.1f MiB.\n",
		idleBefore.goroutines, float64(idleBefore.rssKiB)/1024, idleAfter.goroutines, float64(idleAfter.rssKiB)/1024)

	var failures []string
	if n := res.lost.Load(); n > 0 {
		failures = append(failures, fmt.Sprintf("%d requests lost; first: %v", n, res.firstErrors()))
	}
	if res.ok.Load() == 0 {
		failures = append(failures, "no request succeeded")
	}
	var steady []snapshot
	for _, s := range samples {
		if s.at >= o.warmup {
			steady = append(steady, s)
		}
	}
	if len(steady) >= 4 {
		first, second := steady[:len(steady)/2], steady[len(steady)/2:]
		peak := func(ss []snapshot, f func(snapshot) int64) int64 {
			var m int64
			for _, s := range ss {
				m = max(m, f(s))
			}
			return m
		}
		rss := func(s snapshot) int64 { return s.rssKiB }
		gor := func(s snapshot) int64 { return s.goroutines }
		if a, b := peak(first, rss), peak(second, rss); float64(b) > float64(a)*(1+o.tolerance)+8*1024 {
			failures = append(failures, fmt.Sprintf("RSS grew: peak %.1f MiB in the first half, %.1f MiB in the second", float64(a)/1024, float64(b)/1024))
		}
		if a, b := peak(first, gor), peak(second, gor); float64(b) > float64(a)*(1+o.tolerance)+20 {
			failures = append(failures, fmt.Sprintf("goroutines grew: peak %d in the first half, %d in the second", a, b))
		}
	} else {
		failures = append(failures, fmt.Sprintf("only %d samples after the warm-up: run longer", len(steady)))
	}
	if idleAfter.goroutines > idleBefore.goroutines+20 {
		failures = append(failures, fmt.Sprintf("goroutines did not come back: %d idle before the load, %d after (their stacks: %s)",
			idleBefore.goroutines, idleAfter.goroutines, dumpGoroutines(d.admin)))
	}
	if len(left) > 0 {
		failures = append(failures, fmt.Sprintf("replica processes outlived serve down: %v", left))
	}
	fmt.Fprintln(os.Stderr, "\nchaos log:\n  "+strings.Join(chaosLog, "\n  "))
	if len(failures) > 0 {
		return errors.New("FAILED:\n  " + strings.Join(failures, "\n  "))
	}
	fmt.Println("\nPASS: nothing lost but streams cut by killed replicas; RSS and goroutines flat; nothing left running.")
	return nil
}

// dumpGoroutines saves the daemon's goroutine profile (grouped stacks) for a leak report.
func dumpGoroutines(admin string) string {
	resp, err := http.Get("http://" + admin + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	f, err := os.CreateTemp("", "soak-goroutines-*.txt")
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	_, _ = io.Copy(f, resp.Body)
	return f.Name()
}

func mustOwned(owner string) map[string][]int {
	m, err := replicas.OwnedProcesses(owner)
	if err != nil {
		panic(err)
	}
	return m
}

func waitFor(d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("timed out after %v", d)
}

type snapshot struct {
	at                 time.Duration
	rssKiB, goroutines int64
	fds, live          int
	ok, cut, lost      int64
}

func sample(pid int, admin string) snapshot {
	var s snapshot
	s.rssKiB = procs.RSSKiB(pid)
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		s.fds = len(ents)
	}
	if resp, err := http.Get("http://" + admin + "/metrics"); err == nil {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				s.goroutines = int64(f)
			}
		}
		resp.Body.Close()
	}
	return s
}

// results counts what the clients saw.
type results struct {
	ok, cut, lost atomic.Int64
	mu            sync.Mutex
	errs          []string
}

func (r *results) fail(err string) {
	r.lost.Add(1)
	r.mu.Lock()
	if len(r.errs) < 5 {
		r.errs = append(r.errs, err)
	}
	r.mu.Unlock()
}

func (r *results) firstErrors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.errs)
}

var (
	errorEvent = []byte(`data: {"error"`)
	content    = []byte(`"content":`)
	done       = []byte("data: [DONE]")
)

func (r *results) worker(ctx context.Context, client *http.Client, base string, stream bool, maxTokens int) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"soak test: tell me about spot instances"}],"max_tokens":%d,"stream":%v}`, model, maxTokens, stream)
	for n := 0; n < 100000 && ctx.Err() == nil; n++ {
		req, _ := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			r.fail(err.Error())
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
			resp.Body.Close()
			r.fail(fmt.Sprintf("HTTP %d: %s", resp.StatusCode, b))
			continue
		}
		if !stream {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !bytes.Contains(b, []byte(`"usage"`)) {
				r.fail(fmt.Sprintf("non-streaming answer: %v %.200s", err, b))
				continue
			}
			r.ok.Add(1)
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		var sawContent, sawDone bool
		var errLine string
		for sc.Scan() {
			line := sc.Bytes()
			switch {
			case bytes.HasPrefix(line, errorEvent):
				errLine = string(line)
			case bytes.Equal(line, done):
				sawDone = true
			case bytes.Contains(line, content):
				sawContent = true
			}
		}
		resp.Body.Close()
		switch {
		case errLine != "" && sawContent:
			r.cut.Add(1) // bytes had reached us: the router may not retry, and says why
		case errLine != "":
			r.fail("stream failed before any content: " + errLine)
		case !sawDone:
			r.fail(fmt.Sprintf("stream ended without [DONE] or an error event (%v)", sc.Err()))
		default:
			r.ok.Add(1)
		}
	}
}
