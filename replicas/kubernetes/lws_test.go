package kubernetes

import (
	"context"
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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/coreclient"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/kubetest"
)

// A replica of num_nodes 2 on a cluster that serves the LeaderWorkerSet API is one
// LeaderWorkerSet (one group of two pods, restart policy RecreateGroupOnPodRestart) whose
// templates are the pod group's pods; the router's address is the leader's; each node
// runs with SkyPilot's variables (the worker's rank from the controller's worker index);
// a deleted worker is the whole replica's notice, and the group the controller recreates
// reads as gone (it is not the one launched); Terminate deletes the LeaderWorkerSet and
// every pod, and nothing recreates them.
//
// NOTE: the LeaderWorkerSet CRD here is a STAND-IN written from the API's reference, and
// its controller a TEST-ONLY SIMULATION (kubetest.LWSController): the sigs.k8s.io/lws
// module is not served by the module proxy this project uses, so the real controller
// cannot run in-process. The apiserver and scheduler are real; what the simulation does
// is what the API's reference says the controller does (pod names, labels, LWS_*
// variables, recreating the group whole).
func TestMultiNodeReplicaIsALeaderWorkerSet(t *testing.T) {
	bins := buildReplicasim(t)
	c := kubetest.Start(t, kubetest.Options{Name: "lws", PodCIDR: "127.0.45.1/24", Path: bins})
	c.Namespace("arbiter")
	c.AddNode(kubetest.GKENode("spot-b1", "us-central1", "us-central1-b", true, 1))
	c.AddNode(kubetest.GKENode("spot-b2", "us-central1", "us-central1-b", true, 1))
	c.InstallLeaderWorkerSet()
	ctrl := c.StartLWSController("arbiter")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := New(ctx, Config{Cluster: Cluster{Name: "lws", Namespace: "arbiter", UnschedulableSeconds: 3, GraceSeconds: 2},
		Owner: "arbiter-test", Rest: rest.CopyConfig(c.AdminRest), HealthEvery: time.Second, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the provider to sync", func() bool { _, err := p.List(ctx); return err == nil })

	run := `printf '%s %s %s\n' "$SKYPILOT_NODE_RANK" "$SKYPILOT_NUM_NODES" "$(echo $SKYPILOT_NODE_IPS)" > lws-node-$SKYPILOT_NODE_RANK.env && ` +
		`exec replicasim -listen $POD_IP:$PORT -model m -log-level warn`
	price := 6.0
	inst, err := p.Launch(ctx, replicas.LaunchSpec{ReplicaID: "svc-1", Service: "svc", Version: 1, Run: run, Capacity: fleet.Spot,
		Region: "us-central1", Zone: "us-central1-b", Accelerator: "H100", AcceleratorCount: 1, InstanceType: "a3-highgpu-1g",
		PricePerHour: &price, Port: 8000, NumNodes: 2})
	if err != nil {
		t.Fatal(err)
	}

	// The object as the apiserver stored it (the CRD's schema admitted it).
	name := LWSName("arbiter-test", "svc-1")
	var lws LeaderWorkerSet
	if err := c.Admin.GetJSON(ctx, lwsGroupVersion, lwsResource, "arbiter", name, &lws); err != nil {
		t.Fatalf("no LeaderWorkerSet %s: %v", name, err)
	}
	tmpl := lws.Spec.LeaderWorkerTemplate
	if *lws.Spec.Replicas != 1 || *tmpl.Size != 2 || tmpl.RestartPolicy != LWSRecreateGroup || tmpl.LeaderTemplate == nil {
		t.Fatalf("LeaderWorkerSet spec %+v; want one group of 2, RecreateGroupOnPodRestart, a leader template", lws.Spec)
	}
	for role, pt := range map[string]corev1.PodTemplateSpec{"leader": *tmpl.LeaderTemplate, "worker": tmpl.WorkerTemplate} {
		s := pt.Spec
		if a := s.Affinity; a == nil || a.NodeAffinity == nil || a.PodAffinity == nil || a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey != labelZone {
			t.Errorf("%s template: no node affinity or no zone affinity to the group: %+v", role, a)
		}
		if len(s.Containers) != 1 || len(s.Containers[0].Ports) != 1 || s.Containers[0].Ports[0].ContainerPort != 8000 {
			t.Errorf("%s template: containers %+v; want the replica's, on port 8000", role, s.Containers)
		}
		if pt.Labels[LabelReplica] != "svc-1" || pt.Annotations[annNodes] != "2" {
			t.Errorf("%s template: labels %v annotations %v; want the replica's and its size", role, pt.Labels, pt.Annotations)
		}
	}

	pods := c.Pods("arbiter", LabelLWSName+"="+name)
	if len(pods) != 2 {
		t.Fatalf("the LeaderWorkerSet has %d pods, want 2", len(pods))
	}
	ips := map[string]string{} // rank → pod IP
	var nodes []string
	for _, pod := range pods {
		ips[pod.Labels[LabelLWSWorkerIndex]] = pod.Status.PodIP
		nodes = append(nodes, pod.Spec.NodeName)
	}
	slices.Sort(nodes)
	if !slices.Equal(nodes, []string{"spot-b1", "spot-b2"}) {
		t.Fatalf("the group runs on %v; want both us-central1-b nodes", nodes)
	}
	wantHandle := "arbiter/" + name + "-0," + name + "-0-1"
	if inst.Handle != wantHandle || inst.Address != net.JoinHostPort(ips["0"], "8000") {
		t.Fatalf("instance %+v; want handle %s and the leader's address %s:8000", inst, wantHandle, ips["0"])
	}
	for rank, ip := range ips {
		waitFor(t, "node "+rank+" to serve on its pod IP", func() bool {
			resp, err := http.Get("http://" + net.JoinHostPort(ip, "8000") + "/health")
			if err == nil {
				resp.Body.Close()
			}
			return err == nil && resp.StatusCode == 200
		})
		b, err := os.ReadFile(filepath.Join(c.Dir, "pods", "lws-node-"+rank+".env"))
		if want := rank + " 2 " + ips["0"] + " " + ips["1"] + "\n"; err != nil || string(b) != want {
			t.Errorf("node %s started with %q (%v); want %q (rank, nodes, every IP head first)", rank, b, err, want)
		}
	}
	list, err := p.List(ctx)
	if err != nil || len(list) != 1 || list[0].Handle != inst.Handle || list[0].Address != inst.Address {
		t.Fatalf("list: %v %+v; want the one group as %+v", err, list, inst)
	}
	if st, why, err := p.Status(ctx, inst.Handle); err != nil || st != replicas.StatusRunning {
		t.Fatalf("status of the running group: %s %s %v", st, why, err)
	}

	// The worker is deleted: the whole replica's notice; the controller recreates the
	// group, which is not the replica launched: gone, even once its new pods run.
	if err := c.Admin.Delete(ctx, coreclient.Pods, "arbiter", name+"-0-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	n := nextNotice(t, p)
	if n.ReplicaID != "svc-1" || n.Handle != inst.Handle || !strings.Contains(n.Reason, "node 1 of 2") {
		t.Fatalf("notice %+v; want svc-1's, for the whole group, naming node 1 of 2", n)
	}
	waitFor(t, "the controller to recreate the group and its pods to run", func() bool {
		pods := c.Pods("arbiter", LabelLWSName+"="+name)
		running := 0
		for _, pod := range pods {
			if pod.Status.Phase == corev1.PodRunning && pod.DeletionTimestamp == nil {
				running++
			}
		}
		return ctrl.Recreated() == 1 && running == 2
	})
	if st, why, err := p.Status(ctx, inst.Handle); err != nil || st != replicas.StatusGone || !strings.Contains(why, "recreated") {
		t.Fatalf("status of a recreated group: %s %q %v; want gone, saying the group was recreated", st, why, err)
	}

	if err := p.Terminate(ctx, inst.Handle); err != nil {
		t.Fatal(err)
	}
	if err := c.Admin.GetJSON(ctx, lwsGroupVersion, lwsResource, "arbiter", name, &LeaderWorkerSet{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the LeaderWorkerSet after Terminate: %v; want it deleted", err)
	}
	if left := c.Pods("arbiter", LabelLWSName+"="+name); len(left) != 0 {
		t.Fatalf("Terminate left %d of the group's pods", len(left))
	}
	time.Sleep(time.Second) // the controller polls every 100 ms: it must create nothing now
	if left := c.Pods("arbiter", LabelLWSName+"="+name); len(left) != 0 {
		t.Fatalf("%d pods came back after Terminate", len(left))
	}
}
