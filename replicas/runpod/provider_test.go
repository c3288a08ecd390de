package runpod

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/runpod/runpodfake"
	"github.com/arbiter-serve/arbiter/spec"
)

// The test binary doubles as the pods' program: with envFakeReplica set it serves /health
// on $ARBITER_HOST:$PORT, echoing what a replica must see.
const envFakeReplica = "ARBITER_RUNPOD_TEST_REPLICA"

func TestMain(m *testing.M) {
	if os.Getenv(envFakeReplica) != "" {
		addr := net.JoinHostPort(os.Getenv("ARBITER_HOST"), os.Getenv("PORT"))
		http.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "replica=%s model=%s gpus=%s setup=%s", os.Getenv(EnvReplica), os.Getenv("MODEL_NAME"),
				os.Getenv("SKYPILOT_NUM_GPUS_PER_NODE"), readFile("setup.marker"))
		})
		fmt.Fprintln(os.Stderr, http.ListenAndServe(addr, nil))
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func readFile(name string) string {
	b, _ := os.ReadFile(name)
	return strings.TrimSpace(string(b))
}

const testKey = "rpa_TESTKEY0123456789SECRET"

type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type rig struct {
	fake *runpodfake.Server
	p    *Provider
}

func newRig(t *testing.T) *rig {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fake := runpodfake.New(runpodfake.Config{APIKey: testKey, Dir: t.TempDir(), PendingFor: 300 * time.Millisecond,
		Env: []string{"TEST_REPLICA_BIN=" + exe},
		GPUs: []runpodfake.GPU{
			{ID: "NVIDIA H100 80GB HBM3", DisplayName: "H100 SXM", MinimumBidPrice: 1.75, UninterruptablePrice: 2.69, StockStatus: "Medium"},
			{ID: "NVIDIA H100 PCIe", DisplayName: "H100 PCIe", MinimumBidPrice: 1.25, UninterruptablePrice: 1.99, StockStatus: ""},
			{ID: "NVIDIA L40S", DisplayName: "L40S", MinimumBidPrice: 0.53, UninterruptablePrice: 0.86, StockStatus: "High"},
		}})
	srv := httptest.NewServer(fake)
	t.Cleanup(func() { srv.Close(); fake.Close() })
	t.Setenv("RUNPOD_API_KEY", testKey)
	logs := &logBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p, err := New(ctx, Config{Account: Account{Endpoint: srv.URL, PollSeconds: 0.2}, Owner: "cp-owner", PollInterval: 100 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if strings.Contains(logs.String(), testKey) {
			t.Error("the API key reached the logs")
		}
	})
	return &rig{fake: fake, p: p}
}

func launchSpec(id string, capacity fleet.Capacity, gpu string, price float64) replicas.LaunchSpec {
	return replicas.LaunchSpec{ReplicaID: id, Service: "llama", Version: 1, Capacity: capacity, InstanceType: gpu, Accelerator: "H100",
		AcceleratorCount: 2, PricePerHour: &price, Port: 18000, Setup: "echo ready > setup.marker",
		Run:  envFakeReplica + "=1 exec \"$TEST_REPLICA_BIN\"",
		Envs: map[string]string{"MODEL_NAME": "meta-llama/Llama-3.1-70B-Instruct", "QUOTED": `it's "quoted" $X`}}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func health(t *testing.T, addr string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/health")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod at %s never answered: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestOnDemandPodLifeCycle(t *testing.T) {
	r := newRig(t)
	ctx := ctxFor(t)
	in, err := r.p.Launch(ctx, launchSpec("r-1", fleet.OnDemand, "NVIDIA H100 80GB HBM3", 5.38))
	if err != nil {
		t.Fatal(err)
	}
	if in.ReplicaID != "r-1" || in.Capacity != fleet.OnDemand || in.PricePerHour != 5.38 || !strings.HasSuffix(in.Address, ":18000") {
		t.Fatalf("instance %+v", in)
	}
	if got := health(t, in.Address); got != "replica=r-1 model=meta-llama/Llama-3.1-70B-Instruct gpus=2 setup=ready" {
		t.Fatalf("pod says %q", got)
	}
	inputs := r.fake.Inputs()
	if len(inputs) != 1 {
		t.Fatalf("%d mutations", len(inputs))
	}
	for k, want := range map[string]any{"gpuTypeId": "NVIDIA H100 80GB HBM3", "gpuCount": 2.0, "ports": "18000/tcp", "cloudType": "ALL",
		"imageName": DefaultImage, "supportPublicIp": true, "name": "arbiter-llama-r-1"} {
		if inputs[0][k] != want {
			t.Errorf("input %s = %v, want %v", k, inputs[0][k], want)
		}
	}
	if _, bid := inputs[0]["bidPerGpu"]; bid {
		t.Error("an on-demand pod bid")
	}
	if n := r.fake.Calls("podFindAndDeployOnDemand"); n != 1 {
		t.Fatalf("podFindAndDeployOnDemand called %d times", n)
	}
	list, err := r.p.List(ctx)
	if err != nil || len(list) != 1 || list[0] != in {
		t.Fatalf("List %+v %v, want [%+v]", list, err, in)
	}
	if st, _, err := r.p.Status(ctx, in.Handle); st != replicas.StatusRunning || err != nil {
		t.Fatalf("Status %s %v", st, err)
	}
	if err := r.p.Terminate(ctx, in.Handle); err != nil {
		t.Fatal(err)
	}
	if st, _, err := r.p.Status(ctx, in.Handle); st != replicas.StatusGone || err != nil {
		t.Fatalf("after Terminate: %s %v", st, err)
	}
	if err := r.p.Terminate(ctx, in.Handle); err != nil {
		t.Fatalf("Terminate again: %v", err)
	}
	if live := r.fake.Live(); len(live) != 0 {
		t.Fatalf("left behind: %v", live)
	}
}

// An interruptible pod bids its quote per GPU; RunPod stopping it is a preemption notice
// (due now: RunPod warns no one), said once, and the pod reads gone.
func TestInterruptiblePodIsANoticeWhenStopped(t *testing.T) {
	r := newRig(t)
	ctx := ctxFor(t)
	in, err := r.p.Launch(ctx, launchSpec("s-1", fleet.Spot, "NVIDIA H100 80GB HBM3", 3.85))
	if err != nil {
		t.Fatal(err)
	}
	if bid := r.fake.Inputs()[0]["bidPerGpu"]; bid != 1.925 || r.fake.Calls("podRentInterruptable") != 1 {
		t.Fatalf("bid %v: want the quote's $3.85 over 2 GPUs", bid)
	}
	if err := r.fake.Interrupt(in.Handle); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-r.p.Notices():
		if n.ReplicaID != "s-1" || n.Handle != in.Handle || !strings.Contains(n.Reason, "interruptible") || time.Until(n.Deadline) > time.Second {
			t.Fatalf("notice %+v", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notice for the interrupted pod")
	}
	if st, why, _ := r.p.Status(ctx, in.Handle); st != replicas.StatusGone || !strings.Contains(why, "outbid") {
		t.Fatalf("Status %s %q", st, why)
	}
	select {
	case n := <-r.p.Notices():
		t.Fatalf("a second notice: %+v", n)
	case <-time.After(600 * time.Millisecond):
	}
	// A pod the provider terminates itself is no interruption.
	in2, err := r.p.Launch(ctx, launchSpec("s-2", fleet.Spot, "NVIDIA L40S", 1.2))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.p.Terminate(ctx, in2.Handle); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-r.p.Notices():
		t.Fatalf("a notice for a pod terminated on purpose: %+v", n)
	case <-time.After(600 * time.Millisecond):
	}
}

func TestRefusalsThrottlingAndRelaunch(t *testing.T) {
	r := newRig(t)
	ctx := ctxFor(t)
	r.fake.Refuse("NVIDIA H100 80GB HBM3", "spot", true)
	if _, err := r.p.Launch(ctx, launchSpec("c-1", fleet.Spot, "NVIDIA H100 80GB HBM3", 3.85)); !errors.Is(err, replicas.ErrNoCapacity) {
		t.Fatalf("refused spot: %v; want ErrNoCapacity", err)
	}
	// Throttling is retried; a launch repeated for the same replica (a control plane that
	// crashed mid-launch) adopts its pod instead of renting a second.
	r.fake.Throttle(2)
	in, err := r.p.Launch(ctx, launchSpec("c-2", fleet.OnDemand, "NVIDIA H100 80GB HBM3", 5.38))
	if err != nil {
		t.Fatal(err)
	}
	again, err := r.p.Launch(ctx, launchSpec("c-2", fleet.OnDemand, "NVIDIA H100 80GB HBM3", 5.38))
	if err != nil || again.Handle != in.Handle {
		t.Fatalf("relaunch: %+v %v, want %s", again, err, in.Handle)
	}
	if live := r.fake.Live(); len(live) != 1 {
		t.Fatalf("%d pods for one replica", len(live))
	}
}

func TestQuoteFromGPUTypes(t *testing.T) {
	r := newRig(t)
	ctx := ctxFor(t)
	sp := &spec.Service{Resources: spec.Resources{Accelerators: []spec.Accelerator{{Name: "H100", Count: 2}}, UseSpot: true}}
	qs, err := r.p.Quote(ctx, "llama", sp)
	if err != nil {
		t.Fatal(err)
	}
	got := map[fleet.Capacity]float64{}
	for _, q := range qs {
		if q.InstanceType != "NVIDIA H100 80GB HBM3" || q.AcceleratorCount != 2 || q.Provider != "runpod" || !strings.HasPrefix(q.PriceSource, SourceGPUTypes) {
			t.Fatalf("quote %+v (the PCIe H100 is out of stock)", q)
		}
		got[q.Capacity] = q.PricePerHour
	}
	// On-demand 2 × $2.69; spot 2 × the $1.75 minimum bid + 10 %.
	if len(got) != 2 || fmt.Sprintf("%.3f", got[fleet.OnDemand]) != "5.380" || fmt.Sprintf("%.3f", got[fleet.Spot]) != "3.850" {
		t.Fatalf("quotes %v", got)
	}
	n := r.fake.Calls("gpuTypes")
	if _, err := r.p.Quote(ctx, "llama", sp); err != nil || r.fake.Calls("gpuTypes") != n {
		t.Fatalf("a second quote within a minute asked again (%v)", err)
	}
	if _, err := r.p.Quote(ctx, "x", &spec.Service{Resources: spec.Resources{Accelerators: []spec.Accelerator{{Name: "A10G", Count: 1}}}}); err == nil ||
		!strings.Contains(err.Error(), "A10G") {
		t.Fatalf("an accelerator RunPod lacks: %v", err)
	}
}

func TestAPIKeyIsRequiredAndChecked(t *testing.T) {
	t.Setenv("RUNPOD_API_KEY", "")
	if _, err := New(context.Background(), Config{Owner: "o"}); err == nil || !strings.Contains(err.Error(), "RUNPOD_API_KEY") {
		t.Fatalf("no key: %v", err)
	}
	fake := runpodfake.New(runpodfake.Config{APIKey: testKey})
	srv := httptest.NewServer(fake)
	defer srv.Close()
	p, err := New(context.Background(), Config{Account: Account{Endpoint: srv.URL}, Owner: "o", APIKey: "wrong"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.List(context.Background()); err == nil || !strings.Contains(err.Error(), "refused the API key") {
		t.Fatalf("wrong key: %v", err)
	}
}
