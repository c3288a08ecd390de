package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
	"github.com/arbiter-serve/arbiter/state/pgtest"
)

// Several control planes on one PostgreSQL (issue 41 §3): three cmd/autoscaler processes
// with homes of their own and a lease in the store, two standalone routers each given all
// three (in opposite orders), and replicasim replicas on loopback. The leader is killed (kill -9), paused past its lease
// (kill -STOP) or cut off from the store in the middle of decisions; the standby takes over
// and finishes them, adopting every replica the old leader launched (the owner tag is the
// deployment's, state/owner.go): nothing is launched twice, nothing leaks, no request
// fails.

// haLease is the lease of the control planes under test: a takeover comes within it plus
// a renewal period (a third of it). $ARBITER_E2E_LEASE sets another (bench/docs/failover.md
// times takeovers at the lease a deployment would use).
var haLease = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("ARBITER_E2E_LEASE")); err == nil && d >= 2*time.Second {
		return d
	}
	return 3 * time.Second
}()

type haControl struct {
	name, home, api, admin string
	dsn                    string // the store it is given: the rig's, or through a relay
	p                      *proc
}

func (h *haControl) url() string { return "http://" + h.api }

func (h *haControl) log() string {
	b, _ := os.ReadFile(filepath.Join(h.home, "autoscaler.log"))
	return string(b)
}

type haRig struct {
	t     *testing.T
	pg    *pgtest.Cluster
	dsn   string
	st    *state.Store // the test's own look at the store: reads only
	cps   []*haControl
	cl    *cluster // the CLI and the first router's endpoint; its apiURL is a live control plane
	cl2   *cluster // the second router's endpoint (requests only)
	owner string   // the deployment's local owner tag, as the store keeps it
	// leaseFlags choose the lease (none: the store's own).
	leaseFlags []string
}

func newHARig(t *testing.T) *haRig { return newHARigWith(t, nil) }

// newHARigWith starts the rig with more autoscaler flags (another lease).
func newHARigWith(t *testing.T, leaseFlags []string) *haRig { return newHARigOpts(t, leaseFlags, nil) }

// newHARigOpts starts the rig; leaderDSN, if not nil, rewrites the store's DSN the first
// control plane (the first leader) is given (to reach it through a relay).
func newHARigOpts(t *testing.T, leaseFlags []string, leaderDSN func(r *haRig, dsn string) string) *haRig {
	pg := pgtest.Start(t)
	r := &haRig{t: t, pg: pg, dsn: pg.NewDatabase(t), leaseFlags: leaseFlags}
	token := "ha-e2e-token"
	for i, name := range []string{"cp-a", "cp-b", "cp-c"} {
		h := &haControl{name: name, home: t.TempDir(), api: freeAddr(t), admin: freeAddr(t), dsn: r.dsn}
		if i == 0 && leaderDSN != nil {
			h.dsn = leaderDSN(r, r.dsn)
		}
		if err := os.WriteFile(control.TokenPath(h.home), []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r.cps = append(r.cps, h)
	}
	// api and admin are never listened on: the CLI is given apiURL and starts no daemon.
	r.cl = &cluster{t: t, home: r.cps[0].home, listen: freeAddr(t), api: freeAddr(t), admin: freeAddr(t), apiURL: r.cps[0].url()}
	ctx := context.Background()
	r.start(r.cps[0])
	r.waitFor("cp-a leads", 30*time.Second, func() bool { return r.leader() == r.cps[0] })
	r.start(r.cps[1])
	r.start(r.cps[2])
	var err error
	if r.st, err = state.OpenPostgres(ctx, r.dsn, state.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.st.Close() })
	if r.owner, err = r.st.DeploymentValue(ctx, state.LocalOwnerKey, nil); err != nil {
		t.Fatal(err)
	}
	// The deployment's owner is the first control plane's home's; the test checks the
	// process table under it, and the standby (another home) must use it too.
	if want := control.Owner(r.cps[0].home); r.owner != want {
		t.Fatalf("the deployment's owner %q; want cp-a's home's %q", r.owner, want)
	}
	// Two routers, each given every control plane, in opposite orders: the first tries cp-a
	// (the first leader) first, the second cp-c (a standby).
	cl2 := *r.cl
	r.cl2 = &cl2
	r.cl2.listen = freeAddr(t)
	for i, cl := range []*cluster{r.cl, r.cl2} {
		urls := []string{r.cps[0].url(), r.cps[1].url(), r.cps[2].url()}
		if i == 1 {
			slices.Reverse(urls)
		}
		routerAdmin := freeAddr(t)
		startProc(t, filepath.Join(r.cps[0].home, fmt.Sprintf("router%d.log", i+1)), "router", "-listen", cl.listen, "-admin", routerAdmin,
			"-control", strings.Join(urls, ","), "-token-file", control.TokenPath(r.cps[0].home), "-log-level", "warn")
		r.waitFor(fmt.Sprintf("router %d", i+1), 20*time.Second, func() bool {
			resp, err := http.Get("http://" + routerAdmin + "/health")
			if err == nil {
				resp.Body.Close()
			}
			return err == nil && resp.StatusCode == 200
		})
	}
	r.waitFor("cp-b and cp-c standing by", 30*time.Second, func() bool { return r.cps[1].leads() == 0 && r.cps[2].leads() == 0 })
	t.Cleanup(r.cleanup)
	return r
}

// up brings a service up through the CLI and waits until both routers list its model: the
// second router learns it through a standby (which reads it from the store), a moment later
// than the first.
func (r *haRig) up(name, yaml string) string {
	r.t.Helper()
	out := r.cl.up(name, yaml)
	model := ""
	for _, line := range strings.Split(yaml, "\n") {
		if m, ok := strings.CutPrefix(strings.TrimSpace(line), "model: "); ok {
			model = m
		}
	}
	if model == "" {
		r.t.Fatalf("no arbiter.model in the spec of %s", name)
	}
	for i, cl := range []*cluster{r.cl, r.cl2} {
		r.waitFor(fmt.Sprintf("router %d listing %s", i+1, model), 30*time.Second, func() bool {
			resp, err := http.Get("http://" + cl.listen + "/v1/models/" + model)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		})
	}
	return out
}

// haLoad is a load loop through each router.
type haLoad []*load

// startLoad runs workers load loops, split between the two routers.
func (r *haRig) startLoad(model string, workers, maxTokens int, stream bool) haLoad {
	return haLoad{r.cl.startLoad(model, (workers+1)/2, maxTokens, stream), r.cl2.startLoad(model, max(workers/2, 1), maxTokens, stream)}
}

func (l haLoad) finish(t *testing.T, what string) {
	t.Helper()
	for i, one := range l {
		one.finish(t, fmt.Sprintf("%s (router %d)", what, i+1))
	}
}

// checkEventsOnce: no event is recorded twice. A replica's events (its launch, readiness,
// drain, end, preemption) happen once each; one written by a deposed leader and again by
// its successor would be the same (service, replica, kind, message) twice.
func (r *haRig) checkEventsOnce(when string) {
	r.t.Helper()
	evs, err := r.st.Events(context.Background(), "", "", 0, 100000)
	if err != nil {
		r.t.Fatal(err)
	}
	seen := map[[4]string]int64{}
	twice := 0
	for _, e := range evs {
		if e.Replica == "" {
			continue
		}
		k := [4]string{e.Service, e.Replica, e.Kind, e.Message}
		if first, dup := seen[k]; dup {
			r.t.Errorf("%s: event recorded twice (ids %d and %d): %s %s %s: %s", when, first, e.ID, e.Service, e.Replica, e.Kind, e.Message)
			twice++
		}
		seen[k] = e.ID
	}
	r.t.Logf("%s: %d events, %d distinct of replicas, %d twice", when, len(evs), len(seen), twice)
}

// start runs a control plane (again).
func (r *haRig) start(h *haControl) {
	args := append([]string{"-home", h.home, "-state", h.dsn, "-api", h.api, "-admin", h.admin,
		"-lease-duration", haLease.String(), "-lease-holder", h.name,
		"-tick", "200ms", "-drain-timeout", "5s", "-grace", "2s", "-log-level", "debug"}, r.leaseFlags...)
	h.p = startProc(r.t, filepath.Join(h.home, "autoscaler.log"), "autoscaler", args...)
}

// cleanup takes every service down through a leader, then checks that nothing is left.
func (r *haRig) cleanup() {
	for _, h := range r.cps {
		if h.p != nil {
			_ = syscall.Kill(h.p.cmd.Process.Pid, syscall.SIGCONT)
		}
	}
	if l := r.waitLeader(30 * time.Second); l != nil {
		r.cl.apiURL = l.url()
		_, _ = r.cl.serveErr("down", "--all", "--wait", "60s")
	}
	for _, h := range r.cps {
		if log := h.log(); strings.Contains(log, "DATA RACE") || strings.Contains(log, "panic:") {
			r.t.Errorf("%s reported a race or a panic:\n%s", h.name, tail(log, 20000))
		}
		if h.p != nil {
			h.p.kill()
		}
	}
	left, _ := replicas.OwnedProcesses(r.owner)
	if len(left) > 0 {
		r.t.Errorf("replica processes left behind: %v", left)
		for _, pids := range left {
			for _, p := range pids {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// leader is the control plane that holds the lease by the store, or nil.
func (r *haRig) leader() *haControl {
	st := r.st
	if st == nil {
		var err error
		if st, err = state.OpenPostgres(context.Background(), r.dsn, state.Options{}); err != nil {
			return nil
		}
		defer st.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	holder, _, expires, err := st.Current(ctx)
	if err != nil || !time.Now().Before(expires) {
		return nil
	}
	for _, h := range r.cps {
		if h.name == holder {
			return h
		}
	}
	return nil
}

// term is the store's lease term (0 when unreadable).
func (r *haRig) term() int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, term, _, _ := r.st.Current(ctx)
	return term
}

func (r *haRig) waitLeader(within time.Duration) *haControl {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if l := r.leader(); l != nil {
			return l
		}
	}
	return nil
}

// logTime is the time of the last line of a control plane's log holding msg (zero if none).
func (h *haControl) logTime(msg string) time.Time {
	log := h.log()
	i := strings.LastIndex(log, msg)
	if i < 0 {
		return time.Time{}
	}
	line := log[strings.LastIndex(log[:i], "\n")+1 : i]
	ts, ok := strings.CutPrefix(line, "time=")
	if !ok {
		return time.Time{}
	}
	t, _ := time.Parse(time.RFC3339Nano, strings.Fields(ts)[0])
	return t
}

// leadingByLog says whether a control plane's log last said it leads (its metrics, which
// read the store, are not served while the store is out of reach).
func (h *haControl) leadingByLog() bool {
	log := h.log()
	return strings.LastIndex(log, "msg=leading ") > strings.LastIndex(log, `msg="no longer leading`)
}

// leads reads a control plane's arbiter_control_leader gauge: 1, 0, or -1 when unreadable.
func (h *haControl) leads() int {
	resp, err := http.Get("http://" + h.admin + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "arbiter_control_leader "); ok {
			if v == "1" {
				return 1
			}
			return 0
		}
	}
	return -1
}

func (r *haRig) waitFor(what string, within time.Duration, ok func() bool) {
	r.t.Helper()
	for deadline := time.Now().Add(within); !ok(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			var logs strings.Builder
			for _, h := range r.cps {
				fmt.Fprintf(&logs, "--- %s log (tail):\n%s\n", h.name, tail(h.log(), 6000))
			}
			r.t.Fatalf("timed out after %v waiting for %s\n%s", within, what, logs.String())
		}
	}
}

// owned is the replica processes carrying the deployment's owner tag, by replica ID.
func (r *haRig) owned() map[string][]int {
	procs, err := replicas.OwnedProcesses(r.owner)
	if err != nil {
		r.t.Fatal(err)
	}
	return procs
}

// checkAccounted: every replica process has a live row (one a leader adopts or ends), and
// no replica ID runs twice.
func (r *haRig) checkAccounted(when string) {
	r.t.Helper()
	rows, err := r.st.Replicas(context.Background(), "", false)
	if err != nil {
		r.t.Fatal(err)
	}
	live := map[string]bool{}
	for _, row := range rows {
		live[row.ID] = true
	}
	procs := r.owned()
	for id, pids := range procs {
		if !live[id] {
			r.t.Fatalf("%s: replica process %s (pids %v) has no live row", when, id, pids)
		}
		if len(pids) != 1 {
			r.t.Fatalf("%s: replica %s runs as %d processes %v: launched twice", when, id, len(pids), pids)
		}
	}
	r.t.Logf("%s: %d replica processes, %d live rows", when, len(procs), len(rows))
}

// takeover waits for a leader other than old, with a later term, and returns it and how
// long it took from since.
func (r *haRig) takeover(old *haControl, oldTerm int64, since time.Time) (*haControl, time.Duration) {
	r.t.Helper()
	var l *haControl
	r.waitFor("a new leader", 4*haLease+30*time.Second, func() bool {
		l = r.leader()
		return l != nil && l != old && r.term() > oldTerm
	})
	took := time.Since(since)
	r.cl.apiURL, r.cl.home = l.url(), l.home
	r.t.Logf("TAKEOVER %s → %s (term %d → %d) in %v (lease %v)", old.name, l.name, oldTerm, r.term(), took.Round(time.Millisecond), haLease)
	return l, took
}

// converged waits until the service runs its target, all ready, through the new leader,
// with exactly its replicas in the process table.
func (r *haRig) converged(name string, target int, version int) {
	r.t.Helper()
	r.waitFor(fmt.Sprintf("%s converged to %d ready replicas of version %d", name, target, version), 120*time.Second, func() bool {
		st, ok := r.cl.apiStatus(name)
		if !ok || st.Ready != target || len(st.Replicas) != target {
			return false
		}
		for _, rep := range st.Replicas {
			if rep.Version != version {
				return false
			}
		}
		return slices.Equal(keys(r.owned()), replicaIDs(st))
	})
}

// kill9 kills the leader and returns it, its term and when.
func (r *haRig) kill9Leader() (*haControl, int64, time.Time) {
	r.t.Helper()
	l := r.leader()
	if l == nil {
		r.t.Fatal("no leader to kill")
	}
	term := r.term()
	l.p.kill()
	at := time.Now()
	r.t.Logf("kill -9 of the leader %s (term %d)", l.name, term)
	return l, term, at
}

// kill -9 of the leader in the middle of a scale-up under load: the standby takes over
// within the lease, adopts the replicas starting, finishes the scale-up without launching
// any twice, and no request fails. The killed control plane comes back as a standby.
func TestFailoverKill9DuringScaleUp(t *testing.T) {
	failoverDuringScaleUp(t, newHARig(t))
}

// The same with a Kubernetes Lease electing the leader (--lease kubernetes, on the test
// apiserver, as the control plane's service account with deploy/kubernetes's RBAC): the
// Lease elects, the store's term fences.
func TestKubernetesLeaseFailoverKill9DuringScaleUp(t *testing.T) {
	k := startKube(t, "halease", "127.0.59.1/24")
	r := newHARigWith(t, []string{"-lease", "kubernetes", "-lease-namespace", "arbiter",
		"-lease-kubeconfig", k.ServiceAccountKubeconfig("arbiter", "arbiter-control")})
	failoverDuringScaleUp(t, r)
	if out, err := k.Kubectl("-n", "arbiter", "get", "lease", "arbiter-control", "-o", "jsonpath={.spec.holderIdentity}"); err != nil || strings.TrimSpace(out) != r.leader().name {
		t.Errorf("the Lease's holder %q (%v); want the store's leader %s", out, err, r.leader().name)
	}
}

func failoverDuringScaleUp(t *testing.T, r *haRig) {
	r.up("haup", simService("haup-model", `  replica_policy: {min_replicas: 1, max_replicas: 3, upscale_delay_seconds: 1, downscale_delay_seconds: 30}`,
		"-listen-delay 1s -ready-delay 3s"))
	l := r.startLoad("haup-model", 4, 400, true)
	r.waitFor("a scale-up in progress", 90*time.Second, func() bool {
		st, ok := r.cl.apiStatus("haup")
		return ok && st.Live >= 3 && st.Ready < st.Live
	})
	old, term, at := r.kill9Leader()
	r.checkAccounted("after kill -9 during scale-up")
	_, took := r.takeover(old, term, at)
	if took > haLease+haLease/3+5*time.Second {
		t.Errorf("takeover took %v; want within the lease (%v) plus a renewal period and a few seconds", took, haLease)
	}
	// The CLI given every control plane, the dead leader first (serve --api a,b,c).
	all := *r.cl
	all.apiURL = r.cps[0].url() + "," + r.cps[1].url() + "," + r.cps[2].url()
	if old != r.cps[0] {
		t.Fatalf("the first leader is %s; want cp-a", old.name)
	}
	if out := all.serve("status", "haup"); !strings.Contains(out, "haup") {
		t.Fatalf("serve status with the leader dead:\n%s", out)
	}
	r.converged("haup", 3, 1)
	r.t.Logf("scale-up finished by the new leader %v after the kill", time.Since(at).Round(time.Millisecond))
	r.checkAccounted("after the takeover")
	r.start(old)
	r.waitFor(old.name+" back, standing by", 30*time.Second, func() bool { return old.leads() == 0 })
	l.finish(t, "streaming load through the failover")
	r.checkAccounted("with the old leader back")
	r.checkEventsOnce("after the scale-up")
}

// kill -9 of the leader while the last replica drains to zero: the new leader finishes the
// scale to zero (nothing left running), and a request held at zero wakes the service
// through the new leader (the router's wake moves to it).
func TestFailoverKill9DuringScaleToZero(t *testing.T) {
	r := newHARig(t)
	r.up("hazero", simService("hazero-model", `  replica_policy: {min_replicas: 0, max_replicas: 2, upscale_delay_seconds: 1, downscale_delay_seconds: 2}`,
		"-ready-delay 500ms"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if code, body, err := r.cl.request(ctx, "hazero-model"); err != nil || code != 200 {
		t.Fatalf("the first request: %d %v %s", code, err, body)
	}
	// The service is idle now: watch for its replica leaving (draining or ending).
	r.waitFor("the scale to zero under way", 60*time.Second, func() bool {
		st, ok := r.cl.apiStatus("hazero")
		if !ok || len(st.Replicas) == 0 {
			return false
		}
		for _, rep := range st.Replicas {
			if rep.State != "ready" && rep.State != "starting" && rep.State != "provisioning" && rep.State != "pending" {
				return true
			}
		}
		return st.Target == 0
	})
	old, term, at := r.kill9Leader()
	r.checkAccounted("after kill -9 during scale to zero")
	r.takeover(old, term, at)
	r.waitFor("zero replicas, nothing running", 90*time.Second, func() bool {
		st, ok := r.cl.apiStatus("hazero")
		return ok && len(st.Replicas) == 0 && len(r.owned()) == 0
	})
	r.t.Logf("scale to zero finished by the new leader %v after the kill", time.Since(at).Round(time.Millisecond))
	start := time.Now()
	if code, body, err := r.cl.request(ctx, "hazero-model"); err != nil || code != 200 {
		t.Fatalf("a request held at zero after the takeover: %d %v %s", code, err, body)
	}
	r.t.Logf("a request held at zero answered in %v through the new leader", time.Since(start).Round(time.Millisecond))
	r.checkAccounted("after the wake")
	r.checkEventsOnce("after the wake")
}

// kill -9 of the leader in the middle of a rolling update under load: the new leader
// finishes the update (two replicas of version 2, the old ones drained and gone), and no
// request fails.
func TestFailoverKill9DuringRollingUpdate(t *testing.T) {
	r := newHARig(t)
	r.up("haroll", simService("haroll-model", `  replicas: 2`, "-default-max-tokens 32 -ready-delay 2s"))
	l := r.startLoad("haroll-model", 3, 60, true)
	path := r.cl.writeSpec("haroll-v2", simService("haroll-model", `  replicas: 2`, "-default-max-tokens 48 -ready-delay 2s"))
	// The update is sent to the standby, which forwards it to the leader.
	if r.leader() != r.cps[0] {
		t.Fatal("cp-a does not lead")
	}
	viaStandby := *r.cl
	viaStandby.apiURL = r.cps[1].url()
	out, err := viaStandby.serveErr("update", "--detach", "haroll", path)
	if err != nil {
		t.Fatalf("serve update through the standby: %v\n%s", err, out)
	}
	t.Logf("serve update through the standby: %s", strings.TrimSpace(out))
	r.waitFor("the update under way", 60*time.Second, func() bool {
		st, ok := r.cl.apiStatus("haroll")
		if !ok || st.Version != 2 {
			return false
		}
		v1, v2 := 0, 0
		for _, rep := range st.Replicas {
			if rep.Version == 1 {
				v1++
			} else {
				v2++
			}
		}
		return v1 > 0 && v2 > 0
	})
	old, term, at := r.kill9Leader()
	r.checkAccounted("after kill -9 during the rolling update")
	r.takeover(old, term, at)
	r.converged("haroll", 2, 2)
	r.t.Logf("rolling update finished by the new leader %v after the kill", time.Since(at).Round(time.Millisecond))
	l.finish(t, "streaming load through the update and the failover")
	r.checkAccounted("after the update")
	r.checkEventsOnce("after the update")
}

// kill -STOP of the leader for longer than its lease: the standby takes over; on -CONT the
// old leader finds its lease gone and writes nothing (its writes are fenced by the term),
// steps down and stays a standby; the service is untouched.
func TestFailoverStoppedLeaderIsFenced(t *testing.T) {
	r := newHARig(t)
	r.up("hastop", simService("hastop-model", `  replicas: 2`, ""))
	l := r.startLoad("hastop-model", 2, 60, false)
	old := r.leader()
	term := r.term()
	before := replicaIDs(r.cl.status("hastop"))
	if err := syscall.Kill(old.p.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	t.Logf("kill -STOP of the leader %s (term %d)", old.name, term)
	newL, _ := r.takeover(old, term, at)
	// Paused past its lease: twice the lease, then resumed.
	for time.Since(at) < 2*haLease {
		time.Sleep(100 * time.Millisecond)
	}
	newTerm := r.term()
	if err := syscall.Kill(old.p.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("kill -CONT of %s after %v", old.name, time.Since(at).Round(time.Millisecond))
	r.waitFor(old.name+" standing by after it woke", 30*time.Second, func() bool { return old.leads() == 0 })
	for range 3 * int(haLease/(100*time.Millisecond)) { // three lease periods
		time.Sleep(100 * time.Millisecond)
		if r.leader() != newL || r.term() != newTerm {
			t.Fatalf("the lease moved after %s woke: leader %v, term %d (want %s, %d)", old.name, r.leader(), r.term(), newL.name, newTerm)
		}
		if old.leads() == 1 {
			t.Fatalf("%s leads again after waking", old.name)
		}
	}
	if after := replicaIDs(r.cl.status("hastop")); !slices.Equal(after, before) {
		t.Fatalf("replicas %v after the pause; want the same %v", after, before)
	}
	l.finish(t, "load through the pause")
	r.checkAccounted("after the pause")
	r.checkEventsOnce("after the pause")
	if log := old.log(); !strings.Contains(log, "no longer leading") {
		t.Errorf("%s never logged that it stopped leading:\n%s", old.name, tail(log, 4000))
	}
}

// The store out of reach: no control plane can renew the lease, so within it none leads
// and none acts; the replicas and the router go on serving. When the store is back, one
// leads again and the service is as it was.
func TestFailoverStoreUnreachable(t *testing.T) {
	r := newHARig(t)
	r.up("hastore", simService("hastore-model", `  replicas: 2`, ""))
	before := replicaIDs(r.cl.status("hastore"))
	// A real Prometheus scrapes the three control planes with the repository's alerts
	// (issue 46 §3): through the outage every scrape stands and says the store is out of
	// reach.
	prom := startPrometheusOn(t, []string{r.cps[0].admin, r.cps[1].admin, r.cps[2].admin}, "")
	r.waitFor("Prometheus scraping the three control planes, the store up", 30*time.Second, func() bool {
		return len(prom.query(`arbiter_control_state_up == 1`)) == 3
	})
	l := r.startLoad("hastore-model", 2, 60, false)
	r.pg.Stop()
	at := time.Now()
	t.Log("PostgreSQL stopped")
	r.waitFor("no control plane leads", haLease+10*time.Second, func() bool {
		return !r.cps[0].leadingByLog() && !r.cps[1].leadingByLog() && !r.cps[2].leadingByLog()
	})
	t.Logf("no leader %v after the store went away (lease %v)", time.Since(at).Round(time.Millisecond), haLease)
	for _, h := range r.cps {
		code, body := httpGet(t, "http://"+h.admin+"/metrics")
		if code != 200 || !strings.Contains(body, "\narbiter_control_state_up 0\n") || !strings.Contains(body, "\narbiter_control_leader 0\n") {
			t.Fatalf("%s's /metrics with the store out of reach: HTTP %d; want 200 with state_up 0 and leader 0:\n%s", h.name, code, tail(body, 3000))
		}
	}
	r.waitFor("Prometheus seeing the store down on every control plane, the alert pending, every scrape up", 30*time.Second, func() bool {
		return len(prom.query(`arbiter_control_state_up == 0`)) == 3 && len(prom.query(`up{job="arbiter"} == 1`)) == 3 &&
			len(prom.query(`ALERTS{alertname="ArbiterStateStoreUnreachable"}`)) == 3
	})
	t.Logf("Prometheus: the store out of reach on 3 control planes, ArbiterStateStoreUnreachable pending, %v after it stopped", time.Since(at).Round(time.Millisecond))
	for range 2 * int(haLease/(100*time.Millisecond)) {
		time.Sleep(100 * time.Millisecond)
		if r.cps[0].leadingByLog() || r.cps[1].leadingByLog() || r.cps[2].leadingByLog() {
			t.Fatal("a control plane leads with the store out of reach")
		}
	}
	if got := keys(r.owned()); !slices.Equal(got, before) {
		t.Fatalf("replica processes %v with the store out of reach; want %v untouched", got, before)
	}
	if err := r.pg.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	t.Log("PostgreSQL restarted")
	r.waitFor("a leader again", 60*time.Second, func() bool { return r.leader() != nil })
	lead := r.leader()
	r.cl.apiURL, r.cl.home = lead.url(), lead.home
	t.Logf("%s leads %v after the store came back", lead.name, time.Since(back).Round(time.Millisecond))
	r.converged("hastore", 2, 1)
	if after := replicaIDs(r.cl.status("hastore")); !slices.Equal(after, before) {
		t.Fatalf("replicas %v after the outage; want the same %v", after, before)
	}
	l.finish(t, "load through the store's outage")
	r.checkAccounted("after the outage")
	r.checkEventsOnce("after the outage")
}

// kill -9 of the leader during a scale from zero, with requests held: they are sent through
// both routers while the service is at zero, the leader decides to wake it, and is killed
// either as soon as its replica has a row (its launch may not have completed: the new leader
// fails it and launches again) or once the replica's process runs (the new leader adopts
// it). Every held request is answered after the kill; none launched twice, none leaked.
func TestFailoverKill9DuringScaleFromZeroHeld(t *testing.T) {
	for _, launched := range []bool{false, true} {
		name := "decided"
		if launched {
			name = "launched"
		}
		t.Run(name, func(t *testing.T) { failoverScaleFromZeroHeld(t, launched) })
	}
}

func failoverScaleFromZeroHeld(t *testing.T, launched bool) {
	r := newHARig(t)
	out := r.up("hawake", simService("hawake-model", `  replica_policy: {min_replicas: 0, max_replicas: 2, upscale_delay_seconds: 1, downscale_delay_seconds: 30}`,
		"-listen-delay 1s -ready-delay 3s"))
	if !strings.Contains(out, "scaled to zero") {
		t.Fatalf("serve up does not say the service waits at zero:\n%s", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*haLease+120*time.Second)
	defer cancel()
	type answer struct {
		code int
		body string
		err  error
		at   time.Time
	}
	const held = 6
	answers := make(chan answer, held)
	sent := time.Now()
	for i := range held {
		cl := []*cluster{r.cl, r.cl2}[i%2]
		go func() {
			code, body, err := cl.request(ctx, "hawake-model")
			answers <- answer{code, body, err, time.Now()}
		}()
	}
	// The leader has acted on the wake: a replica has a row (and, if launched, its process
	// runs), not ready (it takes 4 s).
	r.waitFor("the wake's replica decided", 60*time.Second, func() bool {
		st, ok := r.cl.apiStatus("hawake")
		return ok && len(st.Replicas) > 0 && st.Ready == 0 && (!launched || len(r.owned()) > 0)
	})
	if len(answers) > 0 {
		t.Fatal("a held request was answered before the replica could be ready")
	}
	old, term, at := r.kill9Leader()
	t.Logf("%d requests held for %v when the leader died", held, at.Sub(sent).Round(time.Millisecond))
	r.checkAccounted("after kill -9 during the scale from zero")
	_, took := r.takeover(old, term, at)
	if took > haLease+haLease/3+5*time.Second {
		t.Errorf("takeover took %v; want within the lease (%v) plus a renewal period and a few seconds", took, haLease)
	}
	var last time.Time
	for range held {
		a := <-answers
		if a.err != nil || a.code != 200 {
			t.Errorf("a request held through the failover: %d %v %.300s", a.code, a.err, a.body)
		}
		if a.at.Before(at) {
			t.Errorf("a held request was answered %v before the kill", at.Sub(a.at))
		}
		last = a.at
	}
	t.Logf("%d held requests answered, the last %v after the kill (%v after it was sent)", held, last.Sub(at).Round(time.Millisecond), last.Sub(sent).Round(time.Millisecond))
	// Its target: the held requests' concurrency, at most max_replicas.
	st, _ := r.cl.apiStatus("hawake")
	r.converged("hawake", max(st.Target, 1), 1)
	r.checkAccounted("after the wake")
	r.checkEventsOnce("after the wake")
}

// kill -9 of the leader while a preempted replica is being replaced: the provider announces
// the preemption (serve preempt --notice), the leader drains the victim and launches its
// replacement, and dies before the replacement is ready. The new leader finishes: the
// replacement ready, the victim gone, nothing launched twice, no request failed.
func TestFailoverKill9DuringPreemptionReplacement(t *testing.T) {
	r := newHARig(t)
	r.up("hapre", simService("hapre-model", `  replicas: 2`, "-listen-delay 1s -ready-delay 3s"))
	before := replicaIDs(r.cl.status("hapre"))
	victim := before[0]
	l := r.startLoad("hapre-model", 3, 40, true)
	r.cl.serve("preempt", victim, "--notice", "6s")
	r.waitFor("the replacement launched", 60*time.Second, func() bool {
		st, ok := r.cl.apiStatus("hapre")
		if !ok {
			return false
		}
		for _, rep := range st.Replicas {
			if !slices.Contains(before, rep.ID) && rep.State != "ready" {
				return true
			}
		}
		return false
	})
	old, term, at := r.kill9Leader()
	r.checkAccounted("after kill -9 during the replacement")
	_, took := r.takeover(old, term, at)
	if took > haLease+haLease/3+5*time.Second {
		t.Errorf("takeover took %v; want within the lease (%v) plus a renewal period and a few seconds", took, haLease)
	}
	r.converged("hapre", 2, 1)
	r.t.Logf("replacement finished by the new leader %v after the kill", time.Since(at).Round(time.Millisecond))
	if ids := replicaIDs(r.cl.status("hapre")); slices.Contains(ids, victim) {
		t.Fatalf("the victim %s is still a replica: %v", victim, ids)
	}
	l.finish(t, "streaming load through the preemption and the failover")
	r.checkAccounted("after the replacement")
	r.checkEventsOnce("after the replacement")
}

// relay is a TCP relay on loopback between one control plane and PostgreSQL: cut closes
// its listener and every connection through it (the store out of reach for that control
// plane only), heal listens again on the same address.
type relay struct {
	t            *testing.T
	addr, target string
	mu           sync.Mutex
	ln           net.Listener
	conns        map[net.Conn]bool
}

func startRelay(t *testing.T, target string) *relay {
	rl := &relay{t: t, addr: freeAddr(t), target: target, conns: map[net.Conn]bool{}}
	rl.heal()
	t.Cleanup(rl.cut)
	return rl
}

func (rl *relay) heal() {
	rl.t.Helper()
	ln, err := net.Listen("tcp", rl.addr)
	if err != nil {
		rl.t.Fatalf("relay: %v", err)
	}
	rl.mu.Lock()
	rl.ln = ln
	rl.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.DialTimeout("tcp", rl.target, 5*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			rl.mu.Lock()
			if rl.ln != ln { // cut meanwhile
				rl.mu.Unlock()
				c.Close()
				up.Close()
				return
			}
			rl.conns[c], rl.conns[up] = true, true
			rl.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close(); c.Close() }()
			go func() { _, _ = io.Copy(c, up); up.Close(); c.Close() }()
		}
	}()
}

func (rl *relay) cut() {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.ln != nil {
		rl.ln.Close()
		rl.ln = nil
	}
	for c := range rl.conns {
		c.Close()
	}
	clear(rl.conns)
}

// The store out of reach for the leader only (its connections go through a relay that is
// cut; the standbys' are direct): the leader cannot renew, stops leading and writes
// nothing more; a standby leads within the lease plus a renewal period and the service runs
// on untouched. When the relay is healed the old leader comes back as a standby.
func TestFailoverStoreCutForLeaderOnly(t *testing.T) {
	var rl *relay
	r := newHARigOpts(t, nil, func(r *haRig, dsn string) string {
		direct := fmt.Sprintf("127.0.0.1:%d", r.pg.Port())
		rl = startRelay(t, direct)
		if !strings.Contains(dsn, direct) {
			t.Fatalf("the DSN %q does not name %s", dsn, direct)
		}
		return strings.Replace(dsn, direct, rl.addr, 1)
	})
	r.up("hacut", simService("hacut-model", `  replicas: 2`, ""))
	before := replicaIDs(r.cl.status("hacut"))
	l := r.startLoad("hacut-model", 2, 60, false)
	old := r.leader()
	if old != r.cps[0] {
		t.Fatalf("the leader is %v; want cp-a, whose store goes through the relay", old)
	}
	term := r.term()
	rl.cut()
	at := time.Now()
	t.Logf("the store cut off from the leader %s (term %d)", old.name, term)
	r.waitFor(old.name+" no longer leading", haLease+10*time.Second, func() bool { return !old.leadingByLog() })
	newL, took := r.takeover(old, term, at)
	if took > haLease+haLease/3+5*time.Second {
		t.Errorf("takeover took %v; want within the lease (%v) plus a renewal period and a few seconds", took, haLease)
	}
	// When each said so, by their logs (one clock): whichever comes first, the cut-off leader
	// can write nothing (the store is out of its reach, and its term is fenced once it is back).
	stepped, led := old.logTime(`msg="no longer leading`), newL.logTime("msg=leading ")
	t.Logf("%s logged it stopped leading %v after the cut; %s that it leads %v after it", old.name,
		stepped.Sub(at).Round(time.Millisecond), newL.name, led.Sub(at).Round(time.Millisecond))
	r.converged("hacut", 2, 1)
	if after := replicaIDs(r.cl.status("hacut")); !slices.Equal(after, before) {
		t.Fatalf("replicas %v after the cut; want the same %v", after, before)
	}
	rl.heal()
	t.Log("relay healed")
	newTerm := r.term()
	r.waitFor(old.name+" standing by with the store back", 30*time.Second, func() bool { return old.leads() == 0 })
	for range 2 * int(haLease/(100*time.Millisecond)) { // two lease periods
		time.Sleep(100 * time.Millisecond)
		if r.leader() != newL || r.term() != newTerm {
			t.Fatalf("the lease moved after the relay healed: leader %v, term %d (want %s, %d)", r.leader(), r.term(), newL.name, newTerm)
		}
	}
	l.finish(t, "load through the cut")
	r.checkAccounted("after the cut")
	r.checkEventsOnce("after the cut")
}

// httpGet is a GET's status and body (status 0 and the error when it got no answer).
func httpGet(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
