package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/arbiter-serve/arbiter/bench/procs"
	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
)

// daemonAttacks runs a real `serve daemon` (control plane, and its router process) and:
// submits the specs and router reports that once got through (issue 18 items 1, 2, 5,
// 10), each of which must be refused with 400 and leave nothing stored; kills the daemon
// under load and starts it again (item 9); holds the state file's write lock while a
// replica dies (item 4); checks its files' modes (item 7); and ends with its resources.
func daemonAttacks(bin, dir string) ([]row, error) {
	home := filepath.Join(dir, "home")
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
	const run = "run: exec replicasim -listen 127.0.0.1:$PORT\n"
	attacks := []struct {
		name, method, path, body string
	}{
		{"a billion replicas", "POST", "/v1/services", submit("huge", "service:\n  readiness_probe: /health\n  replicas: 1000000000\n"+run+"arbiter: {model: m}\n")},
		{"more replicas than the daemon's ceiling", "POST", "/v1/services", submit("big", "service:\n  readiness_probe: /health\n  replicas: 500\n"+run+"arbiter: {model: m}\n")},
		{"panic_threshold 1 (the autoscaler refuses it)", "POST", "/v1/services", submit("panicky", "service:\n  readiness_probe: /health\n  replicas: 1\n"+run+"arbiter:\n  model: m\n  autoscaling: {panic_threshold: 1}\n")},
		{"a load report of 1e308 tokens", "POST", "/v1/load", `{"router":"r1","models":[{"model":"m","tokens":1e308}]}`},
		{"a load report with a negative count", "POST", "/v1/load", `{"router":"r1","models":[{"model":"m","requests":-5}]}`},
		{"a 5 MiB spec (the API takes 4 MiB bodies)", "POST", "/v1/services", submit("fat", "service:\n  readiness_probe: /health\n  replicas: 1\n"+run+"arbiter: {model: m}\n# "+strings.Repeat("x", 5<<20)+"\n")},
	}
	var rows []row
	for _, a := range attacks {
		code, body := do(a.method, a.path, a.body)
		want := 400
		if strings.HasPrefix(a.name, "a 5 MiB") {
			want = 413
		}
		rows = append(rows, row{a.name, fmt.Sprintf("%d, nothing stored", want), fmt.Sprintf("%d %.90s", code, body), code == want})
	}
	code, body := do("GET", "/v1/services", "")
	rows = append(rows, row{"afterwards", "daemon up, status renders, nothing stored: 200 []", fmt.Sprintf("%d %.60s", code, strings.TrimSpace(body)),
		procs.Running(daemon.Process.Pid) && code == 200 && body == "[]\n"})

	svc := "service:\n  readiness_probe: /health\n  replicas: 2\nrun: exec replicasim -listen 127.0.0.1:$PORT -model m -echo -log-level warn\narbiter: {model: m}\n"
	if code, body := do("POST", "/v1/services", submit("crash", svc)); code != 201 && code != 200 {
		return nil, fmt.Errorf("submit the crash service: %d %s", code, body)
	}
	url := "http://" + listen + "/v1/chat/completions"
	if err := waitServing(url); err != nil {
		return nil, err
	}
	r, restarted, err := crashUnderLoad(bin, home, url, args, daemon)
	if restarted != nil {
		daemon = restarted
	}
	if err != nil {
		return nil, err
	}
	rows = append(rows, r)
	if _, err := apiClient(home, "http://"+api); err != nil {
		return nil, err
	}
	r, err = lockedStateFile(home, do)
	if err != nil {
		return nil, err
	}
	rows = append(rows, r, badUpdate(do))
	r, restarted, err = storedSpecBroken(bin, home, args, do, daemon)
	if restarted != nil {
		daemon = restarted
	}
	if err != nil {
		return nil, err
	}
	rows = append(rows, r, fileModes(home), resources(home, daemon.Process.Pid))
	return rows, nil
}

// badUpdate sends `serve update` an autoscaling section the decider would refuse (issue 18
// item 10: it answered 500): 400 with the reason, and the service keeps its version.
func badUpdate(do func(method, path, body string) (int, string)) row {
	version := func() int {
		var st control.ServiceStatus
		if code, body := do("GET", "/v1/services/crash", ""); code != 200 || json.Unmarshal([]byte(body), &st) != nil {
			return -1
		}
		return st.Version
	}
	before := version()
	spec := "service:\n  readiness_probe: /health\n  replicas: 2\nrun: exec replicasim -listen 127.0.0.1:$PORT -model m -echo -log-level warn\narbiter:\n  model: m\n  autoscaling: {panic_threshold: 1}\n"
	code, body := do("PUT", "/v1/services/crash", submit("crash", spec))
	after := version()
	return row{"`serve update` with panic_threshold 1", "400 with the reason, the version unchanged",
		fmt.Sprintf("%d %.80s; version %d → %d", code, body, before, after), code == 400 && before == after && before > 0}
}

// storedSpecBroken stops the daemon, damages one service's stored spec (as a downgrade
// or a hand edit would), and starts it again (issue 18 item 2: such a spec once kept the
// daemon from starting): that service alone is failed, with the reason, and the other
// one serves.
func storedSpecBroken(bin, home string, args []string, do func(method, path, body string) (int, string), daemon *exec.Cmd) (row, *exec.Cmd, error) {
	if code, body := do("POST", "/v1/services", submit("zero", "service:\n  readiness_probe: /health\n  replica_policy: {min_replicas: 0, max_replicas: 1}\n"+
		"run: exec replicasim -listen 127.0.0.1:$PORT -model z -echo\narbiter: {model: z, autoscaling: {signal: concurrency}}\n")); code != 201 && code != 200 {
		return row{}, nil, fmt.Errorf("submit the zero service: %d %s", code, body)
	}
	cmd := exec.Command(filepath.Join(bin, "serve"), "--home", home, "stop")
	if out, err := cmd.CombinedOutput(); err != nil {
		return row{}, nil, fmt.Errorf("serve stop: %v: %s", err, out)
	}
	_ = daemon.Wait()
	db, err := sql.Open("sqlite", "file:"+control.StatePath(home)+"?_pragma=busy_timeout(5000)")
	if err != nil {
		return row{}, nil, err
	}
	_, err = db.Exec(`UPDATE versions SET spec = 'service: {replicas: [' WHERE service = 'zero'`)
	db.Close()
	if err != nil {
		return row{}, nil, fmt.Errorf("damage the stored spec: %w", err)
	}
	restarted, err := start(filepath.Join(bin, "serve"), args...)
	if err != nil {
		return row{}, nil, err
	}
	status := map[string]control.ServiceStatus{}
	_ = waitFor(60*time.Second, func() bool {
		var sts []control.ServiceStatus
		code, body := do("GET", "/v1/services", "")
		if code != 200 || json.Unmarshal([]byte(body), &sts) != nil {
			return false
		}
		for _, st := range sts {
			status[st.Name] = st
		}
		return status["crash"].Ready == 2 && status["zero"].Status == "failed"
	})
	z, c := status["zero"], status["crash"]
	return row{"a stored spec that no longer loads, at the daemon's start", "the daemon starts; that service alone failed, with the reason; the other serves",
			fmt.Sprintf("zero: %s (%.70s); crash: %s, %d ready", z.Status, z.Failed, c.Status, c.Ready),
			z.Status == "failed" && z.Failed != "" && c.Ready == 2},
		restarted, nil
}

// crashUnderLoad kills (-9) the daemon in the middle of a load through its endpoint, then
// starts it again, and counts the requests that failed (issue 18 item 9: the embedded
// daemon's router once died with its control plane, failing a third of the requests in
// flight). The router must keep serving throughout, and the new daemon must adopt it.
func crashUnderLoad(bin, home, url string, args []string, daemon *exec.Cmd) (row, *exec.Cmd, error) {
	router := daemonRouterPID(home, 5*time.Second)
	// A bounded load: 8 workers for 6 s at most, 200,000 requests at most; the daemon is
	// killed after 1.5 s and started again after 3 s.
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	stopAt := time.Now().Add(6 * time.Second)
	client := &http.Client{Timeout: 30 * time.Second}
	for range 8 {
		wg.Go(func() {
			for n := 0; n < 25000 && time.Now().Before(stopAt); n++ {
				resp, err := client.Post(url, "application/json", strings.NewReader(chatBody))
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
	restarted, err := start(filepath.Join(bin, "serve"), args...)
	wg.Wait()
	if err != nil {
		return row{}, nil, err
	}
	adopted := router != 0 && daemonRouterPID(home, 30*time.Second) == router
	return row{"kill -9 of the daemon under load, then a restart", "0 failed, the router adopted",
		fmt.Sprintf("%d ok, %d failed, router adopted: %v", ok.Load(), failed.Load(), adopted),
		failed.Load() == 0 && ok.Load() > 0 && adopted}, restarted, nil
}

// lockedStateFile holds the state file's write lock for 5 s (another process's
// transaction, as a backup tool or a stuck CLI would) while one of the service's replicas
// is killed. Once the file frees, the replica's end must be recorded, dated when it
// happened rather than when the write got through (it is billed to there), and the
// replica replaced.
func lockedStateFile(home string, do func(method, path, body string) (int, string)) (row, error) {
	ready := func() int {
		code, body := do("GET", "/v1/services/crash", "")
		var st control.ServiceStatus
		if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
			return -1
		}
		return st.Ready
	}
	if err := waitFor(60*time.Second, func() bool { return ready() == 2 }); err != nil {
		return row{}, fmt.Errorf("the crash service before the lock: %w", err)
	}
	owned, err := replicas.OwnedProcesses(control.Owner(home))
	if err != nil || len(owned) == 0 {
		return row{}, fmt.Errorf("the service's replica processes: %v (%d found)", err, len(owned))
	}
	var victim string
	for id := range owned {
		victim = id
		break
	}
	db, err := sql.Open("sqlite", "file:"+control.StatePath(home)+"?_pragma=busy_timeout(5000)")
	if err != nil {
		return row{}, err
	}
	defer db.Close()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		return row{}, err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
		return row{}, fmt.Errorf("take the state file's write lock: %w", err)
	}
	killed := time.Now()
	for _, pid := range owned[victim] {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	// The lock is held until the control plane has ended the replica in memory (its API
	// shows it gone), and 3 s more: the row written after the release must carry the end
	// as it happened, not the time the write got through.
	gone := func() bool {
		code, body := do("GET", "/v1/services/crash", "")
		var st control.ServiceStatus
		if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
			return false
		}
		for _, r := range st.Replicas {
			if r.ID == victim {
				return false
			}
		}
		return true
	}
	if err := waitFor(60*time.Second, gone); err != nil {
		_, _ = conn.ExecContext(ctx, `ROLLBACK`)
		return row{}, fmt.Errorf("the control plane did not end the killed replica while the state file was locked: %w", err)
	}
	known := time.Now()
	time.Sleep(3 * time.Second)
	if _, err := conn.ExecContext(ctx, `ROLLBACK`); err != nil {
		return row{}, fmt.Errorf("release the lock: %w", err)
	}
	released := time.Now()
	var ended time.Time
	_ = waitFor(60*time.Second, func() bool {
		st, err := state.Open(control.StatePath(home))
		if err != nil {
			return false
		}
		defer st.Close()
		rs, err := st.Replicas(ctx, "crash", true)
		if err != nil {
			return false
		}
		for _, r := range rs {
			if r.ID == victim && !r.EndedAt.IsZero() {
				ended = r.EndedAt
			}
		}
		return !ended.IsZero() && ready() == 2
	})
	obs := "no end recorded within 60 s of the release"
	if !ended.IsZero() {
		obs = fmt.Sprintf("lock held %s; the end recorded %s after the kill, %s before the lock freed; %d ready", released.Sub(killed).Round(100*time.Millisecond),
			ended.Sub(killed).Round(10*time.Millisecond), released.Sub(ended).Round(10*time.Millisecond), ready())
	}
	return row{"the state file write-locked from a replica's kill until 3 s after the control plane ended it", "its end recorded once the file frees, dated when it happened (billed to there, not to the write); replaced",
		obs, !ended.IsZero() && ended.Before(known.Add(time.Second)) && ready() == 2}, nil
}

// fileModes checks that nothing in the home is readable by others: the home 0700, every
// file in it (state, token, logs, the daemon's and router's addresses) 0600.
func fileModes(home string) row {
	var loose []string
	n := 0
	_ = filepath.WalkDir(home, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		n++
		if info.Mode().Perm()&0o077 != 0 {
			rel, _ := filepath.Rel(home, path)
			loose = append(loose, fmt.Sprintf("%s %o", rel, info.Mode().Perm()))
		}
		return nil
	})
	return row{"the home's files (state, token, logs, addresses)", "none readable by group or others",
		fmt.Sprintf("%d entries; open to others: %v", n, loose), len(loose) == 0 && n > 3}
}

// resources is the closing row: the daemon's and its router's memory and descriptors,
// and the replica processes against the state's live rows.
func resources(home string, daemonPID int) row {
	router := daemonRouterPID(home, 5*time.Second)
	fds := func(pid int) int {
		es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			return -1
		}
		return len(es)
	}
	owned, _ := replicas.OwnedProcesses(control.Owner(home))
	live := -1
	if st, err := state.Open(control.StatePath(home)); err == nil {
		if rs, err := st.Replicas(context.Background(), "", false); err == nil {
			live = len(rs)
		}
		st.Close()
	}
	up := procs.Running(daemonPID) && procs.Running(router)
	return row{"at the end", "daemon and router up; replica processes = live rows",
		fmt.Sprintf("daemon %.0f MiB, %d fds; router %.0f MiB, %d fds; %d replica processes, %d live rows",
			rssMiB(daemonPID), fds(daemonPID), rssMiB(router), fds(router), len(owned), live),
		up && len(owned) == live}
}

// daemonRouterPID is the router process the home's daemon published (0: none within wait).
func daemonRouterPID(home string, wait time.Duration) int {
	pid := 0
	_ = waitFor(wait, func() bool {
		var info struct {
			PID       int `json:"pid"`
			RouterPID int `json:"router_pid"`
		}
		b, err := os.ReadFile(filepath.Join(home, "daemon.json"))
		if err == nil && json.Unmarshal(b, &info) == nil && info.RouterPID != 0 && procs.Running(info.PID) {
			pid = info.RouterPID
		}
		return pid != 0
	})
	return pid
}

// apiClient waits for a daemon's API and returns a caller that uses the home's token.
func apiClient(home, base string) (func(method, path, body string) (int, string), error) {
	var token string
	err := waitFor(60*time.Second, func() bool {
		b, err := os.ReadFile(filepath.Join(home, "token"))
		if err != nil {
			return false
		}
		token = strings.TrimSpace(string(b))
		resp, err := http.Get(base + "/v1/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	if err != nil {
		return nil, fmt.Errorf("the daemon's API: %w", err)
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
