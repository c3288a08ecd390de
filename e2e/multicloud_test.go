package e2e

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/runpod"
	"github.com/arbiter-serve/arbiter/replicas/runpod/runpodfake"
)

// One service whose resources both clouds offer (an A10G on EC2 or an L40S on RunPod),
// placed by price across providers: EC2 spot first, its cheapest; when EC2 interrupts it
// and refuses spot in every zone, RunPod's interruptible L40S (dearer than EC2 spot, and
// within max_price_ratio of the cheapest on-demand, RunPod's) takes its place with no
// failed request; when RunPod stops
// that pod unannounced, a replacement serves again; serve down leaves nothing in either.
func TestSpotAcrossAWSAndRunPod(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ec2 := awsAccount(t, c, "127.0.62", false)
	pods := runpodAccount(t, c, "127.0.63")

	const name, model = "multi", "multi-model"
	defer func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(c.home, "daemon.log"))
			_ = os.WriteFile("/tmp/mc-daemon.log", b, 0o644)
		}
	}()
	c.up(name, `service:
  readiness_probe: {path: /health, initial_delay_seconds: 30, timeout_seconds: 2}
  replica_policy: {min_replicas: 1, max_replicas: 1}
  ports: 8000
resources:
  accelerators: {A10G: 1, L40S: 1}
  use_spot: true
run: exec replicasim -listen $ARBITER_HOST:$PORT -model `+model+` -profile h100-llama-3.2-1b -log-level warn
arbiter:
  model: `+model+`
  providers: [aws, runpod]
  readiness: {probe_interval_seconds: 0.3, failure_threshold: 2}
`)
	readyOn := func(provider, capacity string) func() bool {
		return func() bool {
			st := c.status(name)
			for _, r := range st.Replicas {
				if r.State == "ready" && r.Provider == provider && r.Capacity == capacity {
					return st.Live == 1
				}
			}
			return false
		}
	}
	c.waitFor("one ready replica on EC2 spot, the cheapest offer", 90*time.Second, readyOn("aws", "spot"))

	load := c.startLoad(model, 2, 40, true)
	time.Sleep(time.Second)
	for _, z := range []string{"use1-az4", "use1-az6", "use1-az1", "use1-az2"} {
		ec2.RefuseCapacity("us-east-1", z, "spot", "InsufficientInstanceCapacity")
	}
	var victim string
	for _, inst := range ownerInstances(t, ec2, c) {
		victim = inst
	}
	if err := ec2.Interrupt(victim, 4*time.Second); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the replacement on RunPod's interruptible L40S", 90*time.Second, readyOn("runpod", "spot"))
	served := load.ok.Load()
	c.waitFor("streams served by the RunPod replica", 60*time.Second, func() bool { return load.ok.Load() >= served+10 })
	load.finish(t, "streams through an EC2 interruption into RunPod")
	st := c.status(name)
	for _, r := range st.Replicas {
		if r.State == "ready" && (r.PricePerHour < 0.428 || r.PricePerHour > 0.43) {
			t.Errorf("RunPod replica at $%.4f/h; want the minimum bid $0.39 + 10 %%", r.PricePerHour)
		}
	}
	if table := c.serve("status"); !strings.Contains(table, runpod.SourcePodCost) {
		t.Errorf("serve status does not say the RunPod replica is priced by what RunPod bills it:\n%s", table)
	}
	logs := c.serve("logs", name)
	if !strings.Contains(logs, "priced by "+runpod.SourceGPUTypes) {
		t.Errorf("the launch on RunPod does not say where its price came from:\n%s", logs)
	}

	// RunPod stops the pod unannounced: a replacement serves again.
	mine := livePods(t, pods, c)
	if len(mine) != 1 {
		t.Fatalf("RunPod runs %d pods of this control plane; want 1: %v", len(mine), mine)
	}
	pod := mine[0]
	if err := pods.Interrupt(pod); err != nil {
		t.Fatal(err)
	}
	c.waitFor("a ready replacement after RunPod stopped the pod", 90*time.Second, func() bool {
		st := c.status(name)
		return st.Ready == 1 && st.Live == 1 && !strings.Contains(fmt.Sprint(st.Replicas), pod)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if code, body, err := c.request(ctx, model); err != nil || code != 200 {
		t.Fatalf("request after the RunPod interruption: %d %v %s", code, err, body)
	}
	if logs := c.serve("logs", name); !strings.Contains(logs, "RunPod stopped the interruptible pod") {
		t.Errorf("the event log does not say RunPod stopped the pod:\n%s", logs)
	}

	c.serve("down", name, "--wait", "60s")
	if left := ownerInstances(t, ec2, c); len(left) != 0 {
		t.Errorf("serve down left EC2 instances: %v", left)
	}
	if left := livePods(t, pods, c); len(left) != 0 {
		t.Errorf("serve down left RunPod pods: %v", left)
	}
}

// One service on [local, aws, runpod]: the machine's own slot (arbiter.reserved, already
// paid for) is filled first, then the cheapest offers across both clouds (EC2's g5.xlarge
// spot, below RunPod's L40S bid); scaling to zero ends every replica in all three, and
// leaves no instance or pod behind.
func TestLocalBesideTheClouds(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ec2 := awsAccount(t, c, "127.0.64", false)
	pods := runpodAccount(t, c, "127.0.65")

	const name, model = "mixed", "mixed-model"
	svc := func(min int) string {
		return fmt.Sprintf(`service:
  readiness_probe: {path: /health, initial_delay_seconds: 30, timeout_seconds: 2}
  replica_policy: {min_replicas: %d, max_replicas: 3, target_qps_per_replica: 50}
  ports: 8000
resources:
  accelerators: {A10G: 1, L40S: 1}
  use_spot: true
run: exec replicasim -listen ${ARBITER_HOST:-127.0.0.1}:$PORT -model %s -profile h100-llama-3.2-1b -log-level warn
arbiter:
  model: %[2]s
  providers: [local, aws, runpod]
  reserved: [{provider: local, region: local, zone: local, accelerator: "A10G:1", count: 1, price_per_hour: 0}]
  scale_to_zero_after_seconds: 3
  readiness: {probe_interval_seconds: 0.3, failure_threshold: 2}
`, min, model)
	}
	c.up(name, svc(3))
	c.waitFor("3 ready replicas: the local slot and two on EC2 spot", 120*time.Second, func() bool {
		st := c.status(name)
		where := map[string]int{}
		for _, r := range st.Replicas {
			if r.State == "ready" {
				where[r.Provider+"/"+r.Capacity]++
			}
		}
		return st.Live == 3 && where["local/reserved"] == 1 && where["aws/spot"] == 2
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 6 {
		if code, body, err := c.request(ctx, model); err != nil || code != 200 {
			t.Fatalf("request: %d %v %s", code, err, body)
		}
	}
	logs := c.serve("logs", name)
	if !strings.Contains(logs, "reserved slot local/local/local") || !strings.Contains(logs, "priced by ec2:DescribeSpotPriceHistory") {
		t.Errorf("the event log does not say why each replica went where it did:\n%s", logs)
	}

	// Scale to zero: nothing left running anywhere.
	c.serve("update", name, c.writeSpec(name, svc(0)))
	c.waitFor("zero replicas in all three providers", 90*time.Second, func() bool {
		return c.status(name).Live == 0 && len(ownerInstances(t, ec2, c)) == 0 && len(livePods(t, pods, c)) == 0
	})
	if left := localReplicaProcesses(t, c); len(left) != 0 {
		t.Errorf("local replica processes left after scaling to zero: %v", left)
	}
	c.serve("down", name, "--wait", "60s")
}

// livePods is the fake RunPod account's live pods launched by this home's control plane.
func livePods(t *testing.T, pods *runpodfake.Server, c *cluster) []string {
	owner, err := control.ProviderOwner(c.home)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for id, env := range pods.Live() {
		if slices.Contains(env, runpod.EnvOwner+"="+owner) {
			out = append(out, id)
		}
	}
	return out
}

// localReplicaProcesses lists the local provider's replicas of this home's control plane
// still running, found as the provider itself finds them after a crash.
func localReplicaProcesses(t *testing.T, c *cluster) []replicas.Instance {
	owner, err := control.ProviderOwner(c.home)
	if err != nil {
		t.Fatal(err)
	}
	l, err := replicas.NewLocal(replicas.LocalConfig{Owner: owner, LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in, err := l.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// runpodAccount starts a fake RunPod account with L40S GPUs, adds it to the providers file
// awsAccount wrote, and gives the CLI and daemon its API key.
func runpodAccount(t *testing.T, c *cluster, network string) *runpodfake.Server {
	t.Helper()
	pods := runpodfake.New(runpodfake.Config{APIKey: "rpa_e2e_key", Dir: t.TempDir(), PendingFor: 500 * time.Millisecond, Network: network,
		Env: []string{"PATH=" + binDir + string(os.PathListSeparator) + os.Getenv("PATH")},
		// A minimum bid low enough that spot passes the spec's default max_price_ratio (0.6)
		// against the cheapest on-demand offer, RunPod's own $0.86.
		GPUs: []runpodfake.GPU{{ID: "NVIDIA L40S", DisplayName: "L40S", MinimumBidPrice: 0.39, UninterruptablePrice: 0.86, StockStatus: "High"}}})
	srv := httptest.NewServer(pods)
	t.Cleanup(func() { srv.Close(); pods.Close() })
	f, err := os.OpenFile(filepath.Join(c.home, "providers.yaml"), os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "runpod:\n  endpoint: %s\n  poll_seconds: 0.5\n  start_seconds: 60\n", srv.URL)
	f.Close()
	c.env = append(c.env, "RUNPOD_API_KEY=rpa_e2e_key")
	return pods
}
