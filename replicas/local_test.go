package replicas

import (
	"errors"
	"github.com/arbiter-serve/arbiter/fleet"

	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func newTestLocal(t *testing.T) *Local {
	t.Helper()
	l, err := NewLocal(LocalConfig{Owner: fmt.Sprintf("test-%d-%s", os.Getpid(), t.Name()), LogDir: t.TempDir(), Grace: 300 * time.Millisecond, PricePerHour: 1.5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		insts, _ := l.List(context.Background())
		for _, in := range insts {
			_ = l.Terminate(context.Background(), in.Handle)
		}
	})
	return l
}

// A replica is a whole process group: terminating it ends its children too, and one that
// ignores SIGTERM is killed after the grace period. List finds what Launch started by its
// tag alone, as a restarted control plane must.
func TestLocalLaunchListTerminate(t *testing.T) {
	ctx := context.Background()
	l := newTestLocal(t)
	run := `trap '' TERM; sleep 30 & echo "port=$PORT id=$SKYPILOT_SERVE_REPLICA_ID mine=$MINE"; wait`
	price := 2.5
	inst, err := l.Launch(ctx, LaunchSpec{ReplicaID: "svc-7", Run: run, Envs: map[string]string{"MINE": "yes"},
		Capacity: fleet.Spot, Zone: "z1", PricePerHour: &price})
	if err != nil {
		t.Fatal(err)
	}
	if st, _, err := l.Status(ctx, inst.Handle); err != nil || st != StatusRunning {
		t.Fatalf("Status = %v, %v; want running", st, err)
	}
	var procs map[string][]int
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) { // the background sleep appears shortly after bash
		procs, _ = OwnedProcesses(l.cfg.Owner)
		if len(procs["svc-7"]) >= 2 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(procs["svc-7"]) < 2 {
		t.Fatalf("owned processes = %v; want bash and its sleep", procs)
	}
	list, err := l.List(ctx)
	if err != nil || len(list) != 1 || list[0].ReplicaID != "svc-7" || list[0].Handle != inst.Handle || list[0].Address != inst.Address {
		t.Fatalf("List = %+v, %v; want the one launched (%+v)", list, err, inst)
	}
	// After a control-plane restart, List is all there is: it must bill and label the
	// replica as it was launched (the spec's arbiter.local), not with the provider's defaults.
	if got := list[0]; got.Capacity != fleet.Spot || got.Zone != "z1" || got.PricePerHour != 2.5 || got != inst {
		t.Fatalf("List reports %+v; want the launch's labels %+v", got, inst)
	}
	start := time.Now()
	if err := l.Terminate(ctx, inst.Handle); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Errorf("Terminate took %v: a SIGTERM-ignoring replica should get its grace period", took)
	}
	if procs, _ := OwnedProcesses(l.cfg.Owner); len(procs) != 0 {
		t.Fatalf("processes left after Terminate: %v", procs)
	}
	if st, _, _ := l.Status(ctx, inst.Handle); st != StatusGone {
		t.Fatalf("Status after Terminate = %v; want gone", st)
	}
	if err := l.Terminate(ctx, inst.Handle); err != nil {
		t.Fatalf("second Terminate: %v (must be idempotent)", err)
	}
	log, _ := os.ReadFile(filepath.Join(l.cfg.LogDir, "svc-7.log"))
	port := inst.Address[strings.LastIndexByte(inst.Address, ':')+1:]
	if want := "port=" + port + " id=7 mine=yes"; !strings.Contains(string(log), want) {
		t.Fatalf("replica log %q; want %q", log, want)
	}
}

// A SkyServe run: that hard-codes its port is rewritten to the free port the provider chose.
func TestLocalRewritesHardCodedPort(t *testing.T) {
	l := newTestLocal(t)
	inst, err := l.Launch(context.Background(), LaunchSpec{ReplicaID: "svc-1", Port: 8000, Run: `echo "vllm serve m --port 8000 --x 18000"; sleep 5`})
	if err != nil {
		t.Fatal(err)
	}
	port := inst.Address[strings.LastIndexByte(inst.Address, ':')+1:]
	deadline := time.Now().Add(3 * time.Second)
	var log []byte
	for time.Now().Before(deadline) {
		log, _ = os.ReadFile(filepath.Join(l.cfg.LogDir, "svc-1.log"))
		if len(log) > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if want := "--port " + port + " --x 18000"; !strings.Contains(string(log), want) {
		t.Fatalf("log %q; want %q", log, want)
	}
}

func TestLocalSetupFailureNamesLog(t *testing.T) {
	l := newTestLocal(t)
	if err := l.Setup(context.Background(), "svc", 1, "echo ok", "", nil); err != nil {
		t.Fatal(err)
	}
	err := l.Setup(context.Background(), "svc", 2, "echo broken >&2; exit 3", "", nil)
	if err == nil || !strings.Contains(err.Error(), "svc-v2-setup.log") {
		t.Fatalf("Setup error = %v; want one naming the log", err)
	}
}

func TestProbeSemantics(t *testing.T) {
	var gotMethod, gotBody, gotHeader string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, 100)
		n, _ := r.Body.Read(b)
		gotMethod, gotBody, gotHeader = r.Method, string(b[:n]), r.Header.Get("X-Key")
		if r.URL.Path != "/ready" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	p := ProbeSpec{Path: "/ready", PostData: `{"a":1}`, Headers: map[string]string{"X-Key": "k"}, Timeout: time.Second}
	if err := Probe(context.Background(), srv.Client(), addr, p); err != nil {
		t.Fatal(err)
	}
	if gotMethod != "POST" || gotBody != `{"a":1}` || gotHeader != "k" {
		t.Fatalf("probe sent %s %q header %q", gotMethod, gotBody, gotHeader)
	}
	p.Path, p.PostData = "/other", ""
	if err := Probe(context.Background(), srv.Client(), addr, p); err == nil || gotMethod != "GET" {
		t.Fatalf("probe of a 503 = %v (method %s); want an error", err, gotMethod)
	}
}

func TestTransitions(t *testing.T) {
	if err := CheckTransition(Ready, Draining); err != nil {
		t.Fatal(err)
	}
	if err := CheckTransition(Terminated, Ready); err == nil {
		t.Fatal("terminated → ready allowed")
	}
	if err := CheckTransition(Pending, Ready); err == nil {
		t.Fatal("pending → ready allowed (skips provisioning and the probe)")
	}
}

// List sees a replica the moment Launch returns, though /proc shows a process's
// environment empty until its exec is done (bash exec'ing the run: command here): a
// control plane that lists right after a launch (recovery, terminating a replica whose
// launch was never recorded) must not take it for a stranger, or it leaks.
func TestLocalListSeesJustLaunchedReplicas(t *testing.T) {
	ctx := context.Background()
	l := newTestLocal(t)
	price := 1.0
	for i := range 40 {
		id := fmt.Sprintf("svc-%d", i)
		inst, err := l.Launch(ctx, LaunchSpec{ReplicaID: id, Run: "exec sleep 30", PricePerHour: &price})
		if err != nil {
			t.Fatal(err)
		}
		list, err := l.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(list, func(in Instance) bool { return in.ReplicaID == id }) {
			t.Fatalf("launch %d: List right after Launch does not show %s", i, id)
		}
		if procs, _ := OwnedProcesses(l.cfg.Owner); len(procs[id]) == 0 {
			t.Fatalf("launch %d: OwnedProcesses right after Launch does not show %s", i, id)
		}
		if err := l.Terminate(ctx, inst.Handle); err != nil {
			t.Fatal(err)
		}
	}
}

// The machine's limit: a launch beyond MaxReplicas is refused for want of capacity (not a
// crash), and a slot freed by a termination is usable again.
func TestLocalRefusesLaunchesBeyondItsLimit(t *testing.T) {
	ctx := context.Background()
	l := newTestLocal(t)
	l.cfg.MaxReplicas = 2
	var handles []string
	for i := range 2 {
		in, err := l.Launch(ctx, LaunchSpec{ReplicaID: fmt.Sprintf("svc-%d", i), Run: "sleep 30"})
		if err != nil {
			t.Fatal(err)
		}
		handles = append(handles, in.Handle)
	}
	_, err := l.Launch(ctx, LaunchSpec{ReplicaID: "svc-2", Run: "sleep 30"})
	if !errors.Is(err, ErrNoCapacity) || !strings.Contains(err.Error(), "--local-max-replicas") {
		t.Fatalf("third launch with a limit of 2: %v; want ErrNoCapacity naming the flag", err)
	}
	if err := l.Terminate(ctx, handles[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Launch(ctx, LaunchSpec{ReplicaID: "svc-3", Run: "sleep 30"}); err != nil {
		t.Fatalf("a launch after a termination freed a slot: %v", err)
	}
}
