package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/coreclient"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/kubetest"
	"github.com/arbiter-serve/arbiter/spec"
)

var _ control.LogFetcher = (*Provider)(nil)

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
	c.AddNode(kubetest.GKENode("spot-a", "us-central1", "us-central1-a", true, 1))
	c.AddNode(kubetest.GKENode("spot-b", "us-central1", "us-central1-b", true, 1))
	c.AddNode(kubetest.GKENode("od-a", "us-central1", "us-central1-a", false, 2))
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
	if err := c.Admin.Delete(ctx, coreclient.Pods, "arbiter", PodName("arbiter-test", "svc-3"), metav1.DeleteOptions{}); err != nil {
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

// bareNode is a Ready GPU node that no KWOK stage drives: its pods stay as the test writes
// their status, standing in for a kubelet that pulls images and runs containers.
func bareNode(t *testing.T, c *kubetest.Cluster, name, zone string) {
	t.Helper()
	ctx := context.Background()
	n := kubetest.GKENode(name, "us-central1", zone, false, 1)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: n.Labels}, Spec: corev1.NodeSpec{ProviderID: n.ProviderID}}
	got := &corev1.Node{}
	if err := c.Admin.Create(ctx, coreclient.Nodes, "", node, got); err != nil {
		t.Fatal(err)
	}
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("64Gi"),
		corev1.ResourcePods: resource.MustParse("10"), resourceGPU: resource.MustParse("1")}
	got.Status = corev1.NodeStatus{Capacity: res, Allocatable: res, Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "KubeletReady"}}}
	if err := c.Admin.Update(ctx, coreclient.Nodes, "", name, "status", got, got); err != nil {
		t.Fatal(err)
	}
	c.Untaint(name, "node.kubernetes.io/not-ready")
}

// setContainer writes a pod's status as a kubelet would: phase, IP and the replica
// container's state.
func setContainer(t *testing.T, c *kubetest.Cluster, ns, name string, phase corev1.PodPhase, ip string, st corev1.ContainerState, restarts int32) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{}
	if err := c.Admin.Get(ctx, coreclient.Pods, ns, name, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase, pod.Status.PodIP = phase, ip
	if ip != "" {
		pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerName, Image: pod.Spec.Containers[0].Image, State: st, RestartCount: restarts,
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}}}}
	if err := c.Admin.Update(ctx, coreclient.Pods, ns, name, "status", pod, pod); err != nil {
		t.Fatal(err)
	}
}

// An image that cannot be pulled fails the launch once the pull has failed for
// PullSeconds, and a container that crash-loops is a replica gone, each with the pod's own
// reason; the failed launch's pod is deleted.
func TestPodFailuresCarryThePodsReason(t *testing.T) {
	c := kubetest.Start(t, kubetest.Options{Name: "bare", PodCIDR: "127.0.42.1/24"})
	c.Namespace("arbiter")
	bareNode(t, c, "bare-a", "us-central1-a")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := New(ctx, Config{Cluster: Cluster{Name: "bare", Namespace: "arbiter", PullSeconds: 1, GraceSeconds: 1},
		Owner: "arbiter-test", Rest: rest.CopyConfig(c.AdminRest), HealthEvery: time.Second, forceAfter: time.Second,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the provider to sync", func() bool { _, err := p.List(ctx); return err == nil })
	launch := func(id string) chan error {
		done := make(chan error, 1)
		go func() {
			_, err := p.Launch(ctx, replicas.LaunchSpec{ReplicaID: id, Service: "svc", Version: 1, Run: "x", Capacity: fleet.OnDemand,
				Region: "us-central1", Zone: "us-central1-a", Accelerator: "H100", AcceleratorCount: 1, InstanceType: "a3-highgpu-1g", Image: "nope/nope:0"})
			done <- err
		}()
		waitFor(t, id+"'s pod to be scheduled", func() bool {
			pods := c.Pods("arbiter", LabelReplica+"="+id)
			return len(pods) == 1 && pods[0].Spec.NodeName == "bare-a"
		})
		return done
	}

	done := launch("svc-1")
	name := PodName("arbiter-test", "svc-1")
	setContainer(t, c, "arbiter", name, corev1.PodPending, "", corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff",
		Message: `Back-off pulling image "nope/nope:0"`}}, 0)
	select {
	case err := <-done:
		if err == nil || errors.Is(err, replicas.ErrNoCapacity) || !strings.Contains(err.Error(), "ImagePullBackOff") || !strings.Contains(err.Error(), "nope/nope:0") {
			t.Fatalf("launch with an image that cannot be pulled: %v", err)
		}
		t.Logf("launch failed: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("a launch whose image cannot be pulled did not fail")
	}
	waitFor(t, "the failed launch's pod to be deleted", func() bool { return len(c.Pods("arbiter", LabelReplica+"=svc-1")) == 0 })

	done = launch("svc-2")
	name = PodName("arbiter-test", "svc-2")
	setContainer(t, c, "arbiter", name, corev1.PodRunning, "127.0.42.200", corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, 0)
	if err := <-done; err != nil {
		t.Fatalf("launch: %v", err)
	}
	setContainer(t, c, "arbiter", name, corev1.PodRunning, "127.0.42.200", corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
		Message: "back-off 40s restarting failed container"}}, 3)
	waitFor(t, "the crash loop to read as gone", func() bool {
		st, why, err := p.Status(ctx, "arbiter/"+name)
		if err == nil && st == replicas.StatusGone {
			t.Logf("status: %s", why)
		}
		return err == nil && st == replicas.StatusGone && strings.Contains(why, "CrashLoopBackOff") && strings.Contains(why, "last exit 1")
	})
	if err := p.Terminate(ctx, "arbiter/"+name); err != nil {
		t.Fatal(err)
	}
}

// podLogs asks the apiserver for no more than it returns (offset plus one chunk) and
// hands back what follows the offset; the apiserver here is an HTTP server on loopback
// that answers the log subresource as a kubelet-backed apiserver does.
func TestPodLogsFromAnOffset(t *testing.T) {
	const logs = "fake logs"
	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/namespaces/ns/pods/p/log" {
			http.NotFound(w, r)
			return
		}
		q := r.URL.Query()
		asked = append(asked, q.Get("container")+" "+q.Get("limitBytes")+" "+q.Get("previous"))
		n, _ := strconv.Atoi(q.Get("limitBytes"))
		_, _ = io.WriteString(w, logs[:min(n, len(logs))])
	}))
	defer srv.Close()
	client, err := coreclient.New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		offset int64
		want   string
	}{{0, "fake logs"}, {5, "logs"}, {9, ""}, {100, ""}} {
		b, err := podLogs(context.Background(), client, "ns", "p", c.offset == 5, c.offset)
		if err != nil || string(b) != c.want {
			t.Errorf("from %d: %q %v, want %q", c.offset, b, err, c.want)
		}
	}
	want := []string{"replica 1048576 ", "replica 1048581 true", "replica 1048585 ", "replica 1048676 "}
	if !slices.Equal(asked, want) {
		t.Errorf("asked %q, want %q", asked, want)
	}
	if _, err := podLogs(context.Background(), client, "ns", "gone", false, 0); !apierrors.IsNotFound(err) {
		t.Errorf("a missing pod's logs: %v, want NotFound", err)
	}
}
