package kubernetes

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/coreclient"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/kubetest"
	"github.com/arbiter-serve/arbiter/spec"
)

// A replica of num_nodes 2 on a real apiserver and scheduler: offered only where one pool
// holds both pods; its two pods land together in the zone placement chose, each runs its
// command with SkyPilot's node variables (every node's IP, head first, reached through the
// downward API once both pods have IPs); the replica is the head's address and one handle
// for both; a group that cannot be placed whole is refused and leaves no pod; someone
// deleting the worker is a notice for the whole replica, which reads as gone, and
// Terminate ends both pods.
func TestMultiNodeReplicaIsOnePodGroup(t *testing.T) {
	bins := buildReplicasim(t)
	c := kubetest.Start(t, kubetest.Options{Name: "group", PodCIDR: "127.0.44.1/24", Path: bins})
	c.Namespace("arbiter")
	c.AddNode(kubetest.GKENode("spot-a", "us-central1", "us-central1-a", true, 1))
	c.AddNode(kubetest.GKENode("spot-b1", "us-central1", "us-central1-b", true, 1))
	c.AddNode(kubetest.GKENode("spot-b2", "us-central1", "us-central1-b", true, 1))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := New(ctx, Config{Cluster: Cluster{Name: "group", Namespace: "arbiter", UnschedulableSeconds: 3, GraceSeconds: 2},
		Owner: "arbiter-test", Rest: rest.CopyConfig(c.AdminRest), HealthEvery: time.Second, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the provider to sync", func() bool { _, err := p.List(ctx); return err == nil })

	// Each node writes what it was started with, then serves on its own IP.
	run := `printf '%s %s %s\n' "$SKYPILOT_NODE_RANK" "$SKYPILOT_NUM_NODES" "$(echo $SKYPILOT_NODE_IPS)" > node-$SKYPILOT_NODE_RANK.env && ` +
		`exec replicasim -listen $POD_IP:$PORT -model m -log-level warn`
	sp, err := spec.Parse("svc.yaml", []byte(strings.Replace(testSpec, "run: exec replicasim", "num_nodes: 2\nrun: exec replicasim", 1)))
	if err != nil {
		t.Fatal(err)
	}
	quotes, err := p.Quote(ctx, "svc", sp)
	if err != nil {
		t.Fatal(err)
	}
	var zones []string
	for _, q := range quotes {
		zones = append(zones, q.Zone)
	}
	if !slices.Equal(zones, []string{"us-central1-b"}) {
		t.Fatalf("2-node offers in %v; want only us-central1-b, the one zone whose pool holds both pods", zones)
	}

	launch := func(id, zone string) (replicas.Instance, error) {
		price := 6.0
		return p.Launch(ctx, replicas.LaunchSpec{ReplicaID: id, Service: "svc", Version: 1, Run: run, Capacity: fleet.Spot,
			Region: "us-central1", Zone: zone, Accelerator: "H100", AcceleratorCount: 1, InstanceType: "a3-highgpu-1g",
			PricePerHour: &price, Port: 8000, NumNodes: 2})
	}
	if _, err := launch("svc-0", "us-central1-a"); !errors.Is(err, replicas.ErrNoCapacity) || !strings.Contains(err.Error(), "spans 2 nodes") {
		t.Fatalf("a 2-node launch into a 1-node pool: %v; want ErrNoCapacity saying why", err)
	}
	if pods := c.Pods("arbiter", LabelReplica+"=svc-0"); len(pods) != 0 {
		t.Fatalf("a refused group left pods: %d", len(pods))
	}

	inst, err := launch("svc-1", "us-central1-b")
	if err != nil {
		t.Fatal(err)
	}
	pods := c.Pods("arbiter", LabelReplica+"=svc-1")
	if len(pods) != 2 {
		t.Fatalf("svc-1 has %d pods, want 2", len(pods))
	}
	ips := map[string]string{} // rank → pod IP
	var nodes []string
	for _, pod := range pods {
		ips[pod.Labels[LabelNodeRank]] = pod.Status.PodIP
		nodes = append(nodes, pod.Spec.NodeName)
		if a := pod.Spec.Affinity.PodAffinity; a == nil || a.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey != labelZone {
			t.Errorf("pod %s has no required pod affinity to its group's zone: %+v", pod.Name, a)
		}
	}
	slices.Sort(nodes)
	if !slices.Equal(nodes, []string{"spot-b1", "spot-b2"}) {
		t.Fatalf("svc-1's pods run on %v; want both us-central1-b nodes", nodes)
	}
	wantHandle := "arbiter/" + PodName("arbiter-test", "svc-1") + "," + NodePodName("arbiter-test", "svc-1", 1)
	if inst.Handle != wantHandle || inst.Address != net.JoinHostPort(ips["0"], "8000") || inst.Zone != "us-central1-b" {
		t.Fatalf("instance %+v; want handle %s and the head's address %s:8000", inst, wantHandle, ips["0"])
	}
	for rank, ip := range ips {
		waitFor(t, "node "+rank+" to serve on its pod IP", func() bool {
			resp, err := http.Get("http://" + net.JoinHostPort(ip, "8000") + "/health")
			if err == nil {
				resp.Body.Close()
			}
			return err == nil && resp.StatusCode == 200
		})
		b, err := os.ReadFile(filepath.Join(c.Dir, "pods", "node-"+rank+".env"))
		if want := rank + " 2 " + ips["0"] + " " + ips["1"] + "\n"; err != nil || string(b) != want {
			t.Errorf("node %s started with %q (%v); want %q (rank, nodes, every IP head first)", rank, b, err, want)
		}
	}
	list, err := p.List(ctx)
	if err != nil || len(list) != 1 || list[0].Handle != inst.Handle || list[0].Address != inst.Address || list[0].ReplicaID != "svc-1" {
		t.Fatalf("list: %v %+v; want the one group as %+v", err, list, inst)
	}

	// Zone b's GPUs are taken: a second group there is created, left pending by the
	// scheduler, and refused whole.
	if _, err := launch("svc-2", "us-central1-b"); !errors.Is(err, replicas.ErrNoCapacity) || !strings.Contains(err.Error(), "nvidia.com/gpu") {
		t.Fatalf("a group into a full pool: %v; want ErrNoCapacity with the scheduler's reason", err)
	}
	waitFor(t, "the refused group's pods to be deleted", func() bool { return len(c.Pods("arbiter", LabelReplica+"=svc-2")) == 0 })

	// Someone deletes the worker: the replica's notice, naming the node; the group reads
	// as gone; Terminate ends the head too.
	if err := c.Admin.Delete(ctx, coreclient.Pods, "arbiter", NodePodName("arbiter-test", "svc-1", 1), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	n := nextNotice(t, p)
	if n.ReplicaID != "svc-1" || n.Handle != inst.Handle || !strings.Contains(n.Reason, "node 1 of 2") {
		t.Fatalf("notice %+v; want svc-1's, for the whole group, naming node 1 of 2", n)
	}
	waitFor(t, "the group to read as gone", func() bool {
		st, why, err := p.Status(ctx, inst.Handle)
		return err == nil && st == replicas.StatusGone && strings.Contains(why, "node 1 of 2")
	})
	if err := p.Terminate(ctx, inst.Handle); err != nil {
		t.Fatal(err)
	}
	if left := c.Pods("arbiter", LabelReplica+"=svc-1"); len(left) != 0 {
		t.Fatalf("Terminate left %d of the group's pods", len(left))
	}
	waitFor(t, "the head's process to stop", func() bool { _, ok := c.Processes()[PodName("arbiter-test", "svc-1")]; return !ok })
	select {
	case n := <-p.Notices():
		t.Fatalf("a second notice for one group: %+v", n)
	case <-time.After(time.Second):
	}
}
