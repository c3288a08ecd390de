package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/kubetest"
	"github.com/arbiter-serve/arbiter/spec"
)

// buildReplicasim builds the replica simulator the pods run.
func buildReplicasim(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("go", "build", "-o", dir, "github.com/arbiter-serve/arbiter/cmd/replicasim").CombinedOutput()
	if err != nil {
		t.Fatalf("build replicasim: %v\n%s", err, out)
	}
	return dir
}

// gkeNode is a fake GKE GPU node of one H100 (a3-highgpu-1g).
func gkeNode(name, zone string, spot bool, gpus int) kubetest.Node {
	labels := map[string]string{labelZone: zone, labelRegion: "us-central1", labelInstanceType: "a3-highgpu-1g",
		labelGKEAccelerator: "nvidia-h100-80gb", labelGKENodePool: "h100"}
	if spot {
		labels[labelGKESpot] = "true"
		labels[labelGKENodePool] = "h100-spot"
	}
	return kubetest.Node{Name: name, Labels: labels, GPUs: gpus, ProviderID: "gce://arbiter-test/" + zone + "/" + name}
}

func catalogPrice(t *testing.T, zone string, c fleet.Capacity) float64 {
	t.Helper()
	cat, err := pricing.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range cat.Offers(time.Time{}) {
		if o.Provider == "gcp" && o.Zone == zone && o.InstanceType == "a3-highgpu-1g" && o.Capacity == c {
			return o.PricePerGPUHour
		}
	}
	t.Fatalf("no catalog price for a3-highgpu-1g %s in %s", c, zone)
	return 0
}

const testSpec = `run: exec replicasim -listen $POD_IP:$PORT -model m -log-level warn
resources: {accelerators: "H100:1", use_spot: true, image_id: "docker:example/replicasim:1"}
service: {readiness_probe: /health, replica_policy: {min_replicas: 0, max_replicas: 4}, ports: 8000}
arbiter: {providers: [kubernetes], autoscaling: {signal: concurrency}}
`

// TestProviderOnARealCluster drives the provider against a real apiserver and scheduler:
// quotes from node labels priced by the catalog, pods placed by capacity and zone, a pod
// that serves on its IP, a full pool refused as no capacity, notices from a termination
// taint and from someone else deleting the pod, and a reclaimed node's pod ended.
func TestProviderOnARealCluster(t *testing.T) {
	bins := buildReplicasim(t)
	c := kubetest.Start(t, kubetest.Options{Name: "unit", PodCIDR: "127.0.41.1/24", Path: bins})
	c.Namespace("arbiter")
	c.AddNode(gkeNode("spot-a", "us-central1-a", true, 1))
	c.AddNode(gkeNode("spot-b", "us-central1-b", true, 1))
	c.AddNode(gkeNode("od-a", "us-central1-a", false, 2))
	c.AddNode(kubetest.Node{Name: "cpu", Labels: map[string]string{labelZone: "us-central1-a", labelRegion: "us-central1", labelInstanceType: "n2-standard-8", labelGKENodePool: "cpu"}})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rc := rest.CopyConfig(c.AdminRest)
	p, err := New(ctx, Config{Cluster: Cluster{Name: "unit", Namespace: "arbiter", UnschedulableSeconds: 3, GraceSeconds: 2},
		Owner: "arbiter-test", Rest: rc, HealthEvery: time.Second, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != "kubernetes:unit" {
		t.Fatalf("provider name %q", p.Name())
	}
	waitFor(t, "the provider to sync", func() bool { _, err := p.List(ctx); return err == nil })

	sp, err := spec.Parse("svc.yaml", []byte(testSpec))
	if err != nil {
		t.Fatal(err)
	}
	quotes, err := p.Quote(ctx, "svc", sp)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, q := range quotes {
		if q.Unpriced != "" || q.Accelerator != "H100" || q.AcceleratorCount != 1 || q.InstanceType != "a3-highgpu-1g" {
			t.Errorf("quote %+v", q)
		}
		got[string(q.Capacity)+"@"+q.Zone] = q.PricePerHour
	}
	want := map[string]float64{
		"spot@us-central1-a":      catalogPrice(t, "us-central1-a", fleet.Spot),
		"spot@us-central1-b":      catalogPrice(t, "us-central1-b", fleet.Spot),
		"on_demand@us-central1-a": catalogPrice(t, "us-central1-a", fleet.OnDemand),
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("quotes %v, want %v (the CPU node offers no H100)", got, want)
	}

	launch := func(id string, capacity fleet.Capacity, zone string) (replicas.Instance, error) {
		price := want[string(capacity)+"@"+zone]
		return p.Launch(ctx, replicas.LaunchSpec{ReplicaID: id, Service: "svc", Version: 1, Run: sp.Run, Capacity: capacity,
			Region: "us-central1", Zone: zone, Accelerator: "H100", AcceleratorCount: 1, InstanceType: "a3-highgpu-1g", PricePerHour: &price, Port: 8000})
	}
	inst, err := launch("svc-1", fleet.Spot, "us-central1-b")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(inst.Address, "127.0.41.") || inst.Capacity != fleet.Spot || inst.Zone != "us-central1-b" || inst.PricePerHour != want["spot@us-central1-b"] {
		t.Fatalf("instance %+v", inst)
	}
	pod := c.Pods("arbiter", LabelReplica+"=svc-1")
	if len(pod) != 1 || pod[0].Spec.NodeName != "spot-b" {
		t.Fatalf("pod of svc-1: %+v", pod)
	}
	waitFor(t, "svc-1 to serve on its pod IP", func() bool {
		resp, err := http.Get("http://" + inst.Address + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})

	// spot-b's only GPU is taken: the next spot pod there cannot be scheduled.
	start := time.Now()
	_, err = launch("svc-2", fleet.Spot, "us-central1-b")
	if !errors.Is(err, replicas.ErrNoCapacity) || !strings.Contains(err.Error(), "nvidia.com/gpu") {
		t.Fatalf("launch into a full pool: %v; want ErrNoCapacity with the scheduler's reason", err)
	}
	t.Logf("full pool refused after %s: %v", time.Since(start).Round(100*time.Millisecond), err)
	waitFor(t, "the unschedulable pod to be deleted", func() bool { return len(c.Pods("arbiter", LabelReplica+"=svc-2")) == 0 })

	od, err := launch("svc-3", fleet.OnDemand, "us-central1-a")
	if err != nil {
		t.Fatal(err)
	}
	if pods := c.Pods("arbiter", LabelReplica+"=svc-3"); len(pods) != 1 || pods[0].Spec.NodeName != "od-a" {
		t.Fatalf("on-demand pod not on the on-demand node: %+v", pods)
	}
	list, err := p.List(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %v %+v", err, list)
	}

	// A termination taint on spot-b is a notice for svc-1, with GKE's 30 s.
	c.Taint("spot-b", corev1.Taint{Key: taintGKETermination, Value: "true", Effect: corev1.TaintEffectNoSchedule})
	n := nextNotice(t, p)
	if n.ReplicaID != "svc-1" || time.Until(n.Deadline) < 20*time.Second || time.Until(n.Deadline) > 31*time.Second {
		t.Fatalf("notice %+v (in %s)", n, time.Until(n.Deadline))
	}
	// The tainted node is no longer offered.
	quotes, _ = p.Quote(ctx, "svc", sp)
	for _, q := range quotes {
		if q.Zone == "us-central1-b" {
			t.Errorf("a zone whose only node is about to go is still quoted: %+v", q)
		}
	}
	// The node goes: the replica is gone, and its pod (which nothing else would collect)
	// is ended by Terminate.
	c.DeleteNode("spot-b")
	waitFor(t, "svc-1 to be reported gone", func() bool {
		st, why, err := p.Status(ctx, inst.Handle)
		return err == nil && st == replicas.StatusGone && strings.Contains(why, "spot-b")
	})
	waitFor(t, "svc-1's process to stop", func() bool { _, ok := c.Processes()[pod[0].Name]; return !ok })
	if err := p.Terminate(ctx, inst.Handle); err != nil {
		t.Fatal(err)
	}
	if left := c.Pods("arbiter", LabelReplica+"=svc-1"); len(left) != 0 {
		t.Fatalf("svc-1's pod survived Terminate: %+v", left)
	}

	// Someone else deleting a pod is a notice too; a deletion the provider asked for is not.
	if err := c.Admin.CoreV1().Pods("arbiter").Delete(ctx, PodName("arbiter-test", "svc-3"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := nextNotice(t, p); n.ReplicaID != "svc-3" {
		t.Fatalf("notice %+v, want svc-3's", n)
	}
	if err := p.Terminate(ctx, od.Handle); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-p.Notices():
		t.Fatalf("unexpected notice %+v", n)
	case <-time.After(time.Second):
	}
	if list, err := p.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("after terminating everything: %v %+v", err, list)
	}

	// A cluster that stops answering quotes nothing and lists nothing, with the reason.
	c.Stop()
	waitFor(t, "the provider to notice the cluster is gone", func() bool { _, err := p.Quote(ctx, "svc", sp); return err != nil })
	if _, err := p.List(ctx); err == nil || !strings.Contains(err.Error(), "does not answer") {
		t.Fatalf("list on a stopped cluster: %v", err)
	}
	if _, err := launch("svc-4", fleet.Spot, "us-central1-a"); !errors.Is(err, replicas.ErrNoCapacity) {
		t.Fatalf("launch on a stopped cluster: %v; want ErrNoCapacity (try elsewhere)", err)
	}
}

func nextNotice(t *testing.T, p *Provider) replicas.Notice {
	t.Helper()
	select {
	case n := <-p.Notices():
		return n
	case <-time.After(30 * time.Second):
		t.Fatal("no preemption notice within 30 s")
	}
	return replicas.Notice{}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
