// Command proxybench measures the router against nginx on the same echo replicas, in one
// run on one machine: closed-loop throughput (wrk), added latency at a fixed request rate
// (an open-loop Go generator), and a streaming soak of many concurrent SSE streams through
// the router (its RSS and the latency it adds to each chunk). Results print as Markdown.
//
// Run it through bench/proxy.sh, which builds the binaries and checks for nginx and wrk.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/bench/procs"
)

const model = "bench-model"

var (
	binDir   = flag.String("bin", "bin", "directory with replicasim and router binaries")
	replicas = flag.Int("replicas", 2, "echo replicas")
	duration = flag.Duration("duration", 4*time.Second, "wrk run length per target and round")
	rounds   = flag.Int("rounds", 3, "interleaved closed-loop rounds over all targets")
	conns    = flag.Int("connections", 64, "wrk connections")
	rate     = flag.Int("rate", 2000, "fixed request rate for the added-latency runs (req/s)")
	rateFor  = flag.Duration("rate-duration", 5*time.Second, "length of each fixed-rate run")
	streams  = flag.Int("streams", 5000, "concurrent SSE streams in the soak (0 skips it)")
	tokens   = flag.Int("stream-tokens", 40, "tokens per soak stream")
	interval = flag.Duration("stream-interval", 100*time.Millisecond, "gap between a soak stream's tokens")
	// minimal runs this program as the reference Go proxy (see serveMinimal) instead.
	minimal  = flag.String("minimal-proxy", "", "internal: serve the minimal fasthttp proxy on ADDR (upstreams are the arguments)")
	evloop   = flag.String("eventloop-proxy", "", "internal: serve the reference epoll event-loop proxy on ADDR (upstreams are the arguments)")
	variants = flag.String("router-variants", "", "extra round_robin router targets, ';'-separated, each a space-separated environment (e.g. 'GOMAXPROCS=1;GOGC=400')")
)

func main() {
	flag.Parse()
	if *minimal != "" {
		serveMinimal(*minimal, flag.Args())
		return
	}
	if *evloop != "" {
		serveEventLoop(*evloop, flag.Args())
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "proxybench:", err)
		os.Exit(1)
	}
}

type proc struct{ cmd *exec.Cmd }

func start(env []string, name string, args ...string) (*proc, error) {
	cmd := exec.Command(name, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &proc{cmd: cmd}, nil
}

// stop asks the process to end (SIGTERM: nginx's master then stops its workers, which a
// SIGKILL would leave running and listening) and kills it after 5 s.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func waitUp(addr string) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not come up", addr)
}

func run() error {
	tmp, err := os.MkdirTemp("", "proxybench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var started []*proc
	defer func() {
		for _, p := range started {
			p.stop()
		}
	}()
	// pidOf maps a listening address to the process serving it, for CPU accounting.
	pidOf := map[string]int{}
	// spawnEnv starts a process with env added to this one's environment and waits for it
	// to listen on addr.
	spawnEnv := func(env []string, addr, name string, args ...string) error {
		p, err := start(env, name, args...)
		if err != nil {
			return err
		}
		started = append(started, p)
		pidOf[addr] = p.cmd.Process.Pid
		return waitUp(addr)
	}
	spawn := func(addr, name string, args ...string) error { return spawnEnv(nil, addr, name, args...) }

	// Echo replicas: fast ones for throughput, paced ones for the streaming soak.
	var fast, paced []string
	for i := 0; i < *replicas; i++ {
		for _, pace := range []bool{false, true} {
			addr := fmt.Sprintf("127.0.0.1:%d", freePort())
			args := []string{"-listen", addr, "-model", model, "-echo", "-default-max-tokens", "16", "-log-level", "error"}
			if pace {
				args = append(args, "-echo-token-interval", interval.String())
			}
			if err := spawn(addr, filepath.Join(*binDir, "replicasim"), args...); err != nil {
				return err
			}
			if pace {
				paced = append(paced, addr)
			} else {
				fast = append(fast, addr)
			}
		}
	}

	nginxAddr := fmt.Sprintf("127.0.0.1:%d", freePort())
	if err := startNginx(tmp, nginxAddr, fast, spawn); err != nil {
		return err
	}
	routers := map[string]string{}
	var routerPID int
	for _, pol := range []string{"round_robin", "slo_cheapest"} {
		addr := fmt.Sprintf("127.0.0.1:%d", freePort())
		if err := startRouter(tmp, addr, pol, fast, spawn); err != nil {
			return err
		}
		routers[pol] = addr
	}
	soakRouter := fmt.Sprintf("127.0.0.1:%d", freePort())
	if err := startRouter(tmp, soakRouter, "least_load", paced, spawn); err != nil {
		return err
	}
	// nginx in front of the same paced replicas: the soak's reference proxy.
	soakNginx := fmt.Sprintf("127.0.0.1:%d", freePort())
	if *streams > 0 {
		dir := filepath.Join(tmp, "soak-nginx")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := startNginx(dir, soakNginx, paced, spawn); err != nil {
			return err
		}
	}
	routerPID = pidOf[soakRouter]
	self, err := os.Executable()
	if err != nil {
		return err
	}
	minimalAddr := fmt.Sprintf("127.0.0.1:%d", freePort())
	if err := spawn(minimalAddr, self, append([]string{"-minimal-proxy", minimalAddr}, fast...)...); err != nil {
		return err
	}
	evloopAddr := fmt.Sprintf("127.0.0.1:%d", freePort())
	if err := spawn(evloopAddr, self, append([]string{"-eventloop-proxy", evloopAddr}, fast...)...); err != nil {
		return err
	}

	body := `{"model":"` + model + `","messages":[{"role":"user","content":"Say hello to the benchmark."}],"max_tokens":16}`
	luaPath := filepath.Join(tmp, "post.lua")
	lua := fmt.Sprintf("wrk.method = \"POST\"\nwrk.body = %q\nwrk.headers[\"Content-Type\"] = \"application/json\"\n", body)
	if err := os.WriteFile(luaPath, []byte(lua), 0o644); err != nil {
		return err
	}

	targets := []struct{ name, addr string }{
		{"direct (one replica, no proxy)", fast[0]},
		{"nginx round-robin, keep-alive upstreams", nginxAddr},
		{"minimal Go proxy (fasthttp.HostClient round-robin, no parsing)", minimalAddr},
		{"reference Go event loop (epoll per core, framing only)", evloopAddr},
		{"arbiter router, round_robin", routers["round_robin"]},
		{"arbiter router, slo_cheapest", routers["slo_cheapest"]},
	}
	if *variants != "" {
		for _, v := range strings.Split(*variants, ";") {
			addr, env := fmt.Sprintf("127.0.0.1:%d", freePort()), strings.Fields(v)
			withEnv := func(addr, name string, args ...string) error { return spawnEnv(env, addr, name, args...) }
			if err := startRouter(tmp, addr, "round_robin", fast, withEnv); err != nil {
				return err
			}
			targets = append(targets, struct{ name, addr string }{"arbiter router, round_robin, " + v, addr})
		}
	}
	type row struct {
		name             string
		rps              float64
		user, sys        float64 // the target's CPU per request, µs
		p50, p99         time.Duration
		ratioLo, ratioHi float64 // the round-by-round ratio to nginx
		fixedP50, fixP99 time.Duration
		errs             int64
	}
	rows := make([]row, len(targets))
	for i, tg := range targets {
		rows[i].name = tg.name
	}
	// Closed-loop rounds interleave the targets (each round in a rotated order), so a noisy
	// spell on this shared machine hits every target alike; medians are reported.
	runs := make([][]wrkResult, len(targets))
	for round := 0; round < *rounds; round++ {
		for k := range targets {
			i := (k + round) % len(targets)
			// nginx serves from its master's worker processes.
			pids := append([]int{pidOf[targets[i].addr]}, childrenOf(pidOf[targets[i].addr])...)
			u0, s0 := cpuTime(pids)
			res, err := wrk(luaPath, "http://"+targets[i].addr+"/v1/chat/completions")
			u1, s1 := cpuTime(pids)
			if res.requests > 0 {
				res.user = float64((u1 - u0).Microseconds()) / float64(res.requests)
				res.sys = float64((s1 - s0).Microseconds()) / float64(res.requests)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", targets[i].name, err)
			}
			runs[i] = append(runs[i], res)
		}
	}
	const nginxRow = 1
	for i := range rows {
		r := &rows[i]
		r.rps = median(runs[i], func(w wrkResult) float64 { return w.rps })
		r.user = median(runs[i], func(w wrkResult) float64 { return w.user })
		r.sys = median(runs[i], func(w wrkResult) float64 { return w.sys })
		r.p50 = time.Duration(median(runs[i], func(w wrkResult) float64 { return float64(w.p50) }))
		r.p99 = time.Duration(median(runs[i], func(w wrkResult) float64 { return float64(w.p99) }))
		r.ratioLo, r.ratioHi = math.Inf(1), 0
		for k, w := range runs[i] {
			q := w.rps / runs[nginxRow][k].rps
			r.ratioLo, r.ratioHi = math.Min(r.ratioLo, q), math.Max(r.ratioHi, q)
		}
	}
	for i, tg := range targets {
		rows[i].fixedP50, rows[i].fixP99, rows[i].errs = fixedRate(tg.addr, []byte(body), *rate, *rateFor)
	}

	fmt.Printf("\n### Throughput and latency, %d echo replicas, %d cores\n\n", *replicas, numCPU())
	fmt.Printf("wrk: %d connections, one thread, %d interleaved rounds of %v per target (medians; the range is the per-round ratio to nginx). Fixed rate: %d req/s for %v (open loop; added = target − direct).\n\n",
		*conns, *rounds, *duration, *rate, *rateFor)
	fmt.Println("| target | req/s (wrk) | ratio to nginx | per-round range | CPU µs/request (user + sys) | wrk p50 | wrk p99 | fixed-rate p50 | fixed-rate p99 | added p50 | added p99 | errors |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
	ng := rows[nginxRow].rps
	for _, r := range rows {
		fmt.Printf("| %s | %.0f | %.2f | %.2f–%.2f | %.1f + %.1f = %.1f | %v | %v | %v | %v | %v | %v | %d |\n", r.name, r.rps, r.rps/ng, r.ratioLo, r.ratioHi,
			r.user, r.sys, r.user+r.sys, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond),
			r.fixedP50, r.fixP99, r.fixedP50-rows[0].fixedP50, r.fixP99-rows[0].fixP99, r.errs)
	}

	if *streams > 0 {
		// Same number of streams straight to the replicas (split over them), so the client
		// and replicas do the same work and the difference is the router's.
		direct := soakSplit(paced, *streams, *tokens)
		ng := soak(soakNginx, *streams, *tokens, func() int64 { return procs.TreeRSSKiB(pidOf[soakNginx]) })
		st := soak(soakRouter, *streams, *tokens, func() int64 { return procs.RSSKiB(routerPID) })
		fmt.Printf("\n### Streaming soak: %d concurrent SSE streams through the router\n\n", *streams)
		fmt.Printf("Each stream: %d tokens, one every %v, from paced echo replicas; chunk latency = receive time − the replica's send time (same host clock).\n\n", *tokens, *interval)
		fmt.Println("| path | streams ok | streams failed | chunks | chunk latency p50 | chunk latency p99 | proxy peak RSS |")
		fmt.Println("|---|---|---|---|---|---|---|")
		fmt.Printf("| direct to the replicas | %d | %d | %d | %v | %v | — |\n", direct.ok, direct.failed, direct.chunks, direct.p50, direct.p99)
		fmt.Printf("| through nginx | %d | %d | %d | %v | %v | %.1f MiB |\n", ng.ok, ng.failed, ng.chunks, ng.p50, ng.p99, float64(ng.peakRSS)/1024)
		fmt.Printf("| through router | %d | %d | %d | %v | %v | %.1f MiB |\n", st.ok, st.failed, st.chunks, st.p50, st.p99, float64(st.peakRSS)/1024)
		fmt.Printf("\nAdded per-chunk latency over direct: nginx p50 %v, p99 %v; router p50 %v, p99 %v.\n",
			ng.p50-direct.p50, ng.p99-direct.p99, st.p50-direct.p50, st.p99-direct.p99)
	}
	return nil
}

// serveMinimal is the floor of what a Go proxy on fasthttp costs: round-robin over
// fasthttp.HostClient, no parsing, routing, metrics or cancellation. It tells how much of
// the router's gap to nginx is the Go networking stack and how much is the router's work.
func serveMinimal(addr string, upstreams []string) {
	var clients []*fasthttp.HostClient
	for _, u := range upstreams {
		clients = append(clients, &fasthttp.HostClient{Addr: u, MaxConns: 4096})
	}
	var n atomic.Uint64
	err := fasthttp.ListenAndServe(addr, func(ctx *fasthttp.RequestCtx) {
		c := clients[n.Add(1)%uint64(len(clients))]
		if err := c.Do(&ctx.Request, &ctx.Response); err != nil {
			ctx.Error(err.Error(), fasthttp.StatusBadGateway)
		}
	})
	fmt.Fprintln(os.Stderr, "minimal proxy:", err)
	os.Exit(1)
}

func numCPU() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return bytes.Count(b, []byte("\nprocessor")) + 1
}

func startNginx(tmp, addr string, ups []string, spawn func(string, string, ...string) error) error {
	var servers strings.Builder
	for _, u := range ups {
		fmt.Fprintf(&servers, "    server %s;\n", u)
	}
	conf := fmt.Sprintf(`worker_processes auto;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log error;
events { worker_connections 16384; }
http {
  access_log off;
  client_body_temp_path %[1]s; proxy_temp_path %[1]s; fastcgi_temp_path %[1]s; uwsgi_temp_path %[1]s; scgi_temp_path %[1]s;
  upstream replicas {
%[2]s    keepalive 512;
  }
  server {
    listen %[3]s;
    location / {
      proxy_pass http://replicas;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`, tmp, servers.String(), addr)
	path := filepath.Join(tmp, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return err
	}
	return spawn(addr, "nginx", "-c", path, "-p", tmp)
}

func startRouter(tmp, addr, policy string, ups []string, spawn func(string, string, ...string) error) error {
	var b strings.Builder
	b.WriteString("replicas:\n")
	for i, u := range ups {
		fmt.Fprintf(&b, "  - {id: r%d, address: %q, model: %s, capacity: reserved}\n", i, u, model)
	}
	path := filepath.Join(tmp, "replicas-"+strings.ReplaceAll(addr, ":", "_")+".yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return err
	}
	return spawn(addr, filepath.Join(*binDir, "router"), "-listen", addr, "-admin", fmt.Sprintf("127.0.0.1:%d", freePort()),
		"-replicas", path, "-policy", policy, "-log-level", "error")
}

var wrkLine = regexp.MustCompile(`(?m)^\s*(50|99)%\s+([\d.]+)(us|ms|s)\s*$`)

type wrkResult struct {
	rps       float64
	requests  int64
	p50, p99  time.Duration
	user, sys float64 // the target's CPU per request, µs
}

// cpuTime sums the user and system CPU time of processes (their exited threads included).
func cpuTime(pids []int) (user, sys time.Duration) {
	const tick = 10 * time.Millisecond // USER_HZ is 100 on Linux
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the command (which may hold spaces), from field 3 on.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		user += time.Duration(u) * tick
		sys += time.Duration(s) * tick
	}
	return user, sys
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}

func median[T any](xs []T, f func(T) float64) float64 {
	v := make([]float64, len(xs))
	for i, x := range xs {
		v[i] = f(x)
	}
	sort.Float64s(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func wrk(lua, url string) (wrkResult, error) {
	var res wrkResult
	out, err := exec.Command("wrk", "-t1", "-c"+strconv.Itoa(*conns), "-d"+duration.String(), "--latency", "-s", lua, url).CombinedOutput()
	if err != nil {
		return res, fmt.Errorf("wrk: %w: %s", err, out)
	}
	if bytes.Contains(out, []byte("Non-2xx")) || bytes.Contains(out, []byte("Socket errors")) {
		return res, fmt.Errorf("wrk saw errors:\n%s", out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "Requests/sec:" {
			res.rps, _ = strconv.ParseFloat(f[1], 64)
		} else if len(f) > 2 && f[1] == "requests" && f[2] == "in" {
			res.requests, _ = strconv.ParseInt(f[0], 10, 64)
		}
	}
	for _, m := range wrkLine.FindAllStringSubmatch(string(out), -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second}[m[3]]
		d := time.Duration(v * float64(unit))
		if m[1] == "50" {
			res.p50 = d
		} else {
			res.p99 = d
		}
	}
	if res.rps == 0 {
		return res, errors.New("could not parse wrk output:\n" + string(out))
	}
	return res, nil
}

// fixedRate sends requests on a fixed schedule (open loop) and reports latency quantiles
// measured from each request's scheduled start, so queueing is not hidden.
func fixedRate(addr string, body []byte, rate int, d time.Duration) (p50, p99 time.Duration, errs int64) {
	client := &fasthttp.HostClient{Addr: addr, MaxConns: 4096, ReadTimeout: 10 * time.Second}
	n := int(float64(rate) * d.Seconds())
	lat := make([]time.Duration, n)
	var bad atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < n; i++ {
		at := start.Add(time.Duration(float64(i) / float64(rate) * float64(time.Second)))
		time.Sleep(time.Until(at))
		wg.Add(1)
		go func(i int, at time.Time) {
			defer wg.Done()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://" + addr + "/v1/chat/completions")
			req.Header.SetMethod("POST")
			req.Header.SetContentType("application/json")
			req.SetBodyRaw(body)
			if err := client.Do(req, resp); err != nil || resp.StatusCode() != 200 {
				bad.Add(1)
			}
			lat[i] = time.Since(at)
		}(i, at)
	}
	wg.Wait()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat[n/2].Round(time.Microsecond), lat[n*99/100].Round(time.Microsecond), bad.Load()
}

type soakResult struct {
	ok, failed, chunks int
	p50, p99           time.Duration
	peakRSS            int64
}

var sentRe = []byte(`"sent_unix_nano":`)

// soak opens n concurrent streams and measures each chunk's delivery latency.
func soak(addr string, n, maxTokens int, rss func() int64) soakResult {
	r, _ := soakLat(addr, n, maxTokens, rss)
	return r
}

func soakLat(addr string, n, maxTokens int, rss func() int64) (soakResult, []time.Duration) {
	tr := &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: 0, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: 5 * time.Minute}
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"stream please"}],"max_tokens":%d,"stream":true}`, model, maxTokens)
	var mu sync.Mutex
	var lats []time.Duration
	var ok, failed atomic.Int64
	var peak atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	if rss != nil {
		go func() {
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if v := rss(); v > peak.Load() {
						peak.Store(v)
					}
				}
			}
		}()
	}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				failed.Add(1)
				return
			}
			defer resp.Body.Close()
			local := make([]time.Duration, 0, maxTokens)
			sc := bufio.NewScanner(resp.Body)
			done := false
			for sc.Scan() {
				line := sc.Bytes()
				if i := bytes.Index(line, sentRe); i >= 0 {
					rest := line[i+len(sentRe):]
					j := bytes.IndexAny(rest, ",}")
					if ns, err := strconv.ParseInt(string(rest[:j]), 10, 64); err == nil {
						local = append(local, time.Duration(time.Now().UnixNano()-ns))
					}
				}
				if bytes.Equal(line, []byte("data: [DONE]")) {
					done = true
				}
			}
			if !done || len(local) < maxTokens {
				failed.Add(1)
				return
			}
			ok.Add(1)
			mu.Lock()
			lats = append(lats, local...)
			mu.Unlock()
		}()
		if i%100 == 99 {
			time.Sleep(10 * time.Millisecond) // ramp up rather than a SYN flood
		}
	}
	wg.Wait()
	cancel()
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	r := soakResult{ok: int(ok.Load()), failed: int(failed.Load()), chunks: len(lats), peakRSS: peak.Load()}
	if len(lats) > 0 {
		r.p50, r.p99 = lats[len(lats)/2].Round(time.Microsecond), lats[len(lats)*99/100].Round(time.Microsecond)
	}
	return r, lats
}

// soakSplit runs a soak of n streams straight to the replicas, n/len(addrs) on each, at once.
func soakSplit(addrs []string, n, maxTokens int) soakResult {
	var mu sync.Mutex
	var all soakResult
	var lats []time.Duration
	var wg sync.WaitGroup
	for _, a := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, l := soakLat(a, n/len(addrs), maxTokens, nil)
			mu.Lock()
			all.ok += r.ok
			all.failed += r.failed
			all.chunks += r.chunks
			lats = append(lats, l...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	if len(lats) > 0 {
		all.p50, all.p99 = lats[len(lats)/2].Round(time.Microsecond), lats[len(lats)*99/100].Round(time.Microsecond)
	}
	return all
}
