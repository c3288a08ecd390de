package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/kubetest"
	"github.com/arbiter-serve/arbiter/state"
)

// The kubernetes provider end to end: the real serve binary (control plane and router)
// against a real kube-apiserver and kube-scheduler, acting through the ServiceAccount and
// RBAC of deploy/kubernetes, with KWOK GPU nodes labelled as GKE's spot and on-demand
// pools; each running pod's command (replicasim) is a process bound to its loopback pod
// IP, so the router talks to pods over real HTTP.

// kubeSpec is a service of H100 replicas on the configured clusters.
func kubeSpec(model, policy string) string {
	return `service:
  readiness_probe: {path: /health, initial_delay_seconds: 30, timeout_seconds: 2}
  ` + policy + `
  ports: 8000
resources:
  accelerators: H100:1
  use_spot: true
  image_id: docker:ghcr.io/arbiter-serve/replicasim:test
run: exec replicasim -listen $POD_IP:$PORT -model ` + model + ` -profile h100-llama-3.2-1b -log-level warn
arbiter:
  model: ` + model + `
  providers: [kubernetes]
  scale_to_zero_after_seconds: 6
  autoscaling: {signal: concurrency, target_concurrency_per_replica: 1, stable_window_seconds: 3, panic_window_seconds: 1}
  readiness: {probe_interval_seconds: 0.3, failure_threshold: 2}
`
}

// startKube starts a cluster and installs deploy/kubernetes into it: every manifest passes
// the apiserver's dry run, and the namespace, ServiceAccounts and RBAC are applied for real,
// so the control plane below acts with exactly the rights the manifests grant.
func startKube(t *testing.T, name, cidr string) *kubetest.Cluster {
	t.Helper()
	return startKubeWith(t, kubetest.Options{Name: name, PodCIDR: cidr})
}

// startKubeWith is startKube with more of the cluster's options (Karpenter).
func startKubeWith(t *testing.T, o kubetest.Options) *kubetest.Cluster {
	t.Helper()
	o.Path = binDir
	k := kubetest.Start(t, o)
	deploy := filepath.Join("..", "deploy", "kubernetes")
	for _, args := range [][]string{
		{"apply", "-f", filepath.Join(deploy, "namespace.yaml")},
		{"apply", "--dry-run=server", "-k", deploy},
		{"apply", "-f", filepath.Join(deploy, "rbac.yaml")},
	} {
		if out, err := k.Kubectl(args...); err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	k.Namespace("arbiter") // its default ServiceAccount, which no controller-manager makes here
	return k
}

// useClusters writes a providers file naming the clusters, each reached as the control
// plane's ServiceAccount, and makes the daemon use it.
func useClusters(t *testing.T, c *cluster, ks ...*kubetest.Cluster) {
	t.Helper()
	var b strings.Builder
	b.WriteString("kubernetes:\n")
	for _, k := range ks {
		fmt.Fprintf(&b, "  - {name: %s, kubeconfig: %s, context: %s, namespace: arbiter, unschedulable_seconds: 3, grace_seconds: 2}\n",
			k.Name, k.ServiceAccountKubeconfig("arbiter", "arbiter-control"), k.Name)
	}
	path := filepath.Join(c.home, "providers.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	c.extraDaemonFlags = append(c.extraDaemonFlags, "--providers", path, "--zone-cooldown", "20s")
}

func ownerPods(k *kubetest.Cluster, c *cluster) []corev1.Pod {
	owner, err := control.ProviderOwner(c.home)
	if err != nil {
		c.t.Fatal(err)
	}
	return k.Pods("arbiter", kubernetes.LabelOwner+"="+owner)
}

// kubeReplicas is the service's live replicas by capacity and zone.
func kubeReplicas(st control.ServiceStatus) (ready map[string]int, spotZones []string) {
	ready = map[string]int{}
	for _, r := range st.Replicas {
		if r.State != "ready" {
			continue
		}
		ready[r.Capacity]++
		if r.Capacity == "spot" && !slices.Contains(spotZones, r.Zone) {
			spotZones = append(spotZones, r.Zone)
		}
	}
	return ready, spotZones
}

// podNode finds the node a replica's pod runs on.
func podNode(t *testing.T, k *kubetest.Cluster, id string) (pod, node string) {
	t.Helper()
	for _, p := range k.Pods("arbiter", kubernetes.LabelReplica+"="+id) {
		return p.Name, p.Spec.NodeName
	}
	t.Fatalf("no pod for replica %s", id)
	return "", ""
}

// openAIClient runs compat/serve.test.mjs, the official OpenAI Node client, against the
// endpoint. Without the client installed (cd compat && npm ci) it is skipped with a note,
// or fails when $ARBITER_REQUIRE_OPENAI_CLIENT is set (CI installs it first).
func openAIClient(t *testing.T, c *cluster, model string) error {
	compat := filepath.Join("..", "compat")
	if _, err := os.Stat(filepath.Join(compat, "node_modules", "openai")); err != nil {
		if os.Getenv("ARBITER_REQUIRE_OPENAI_CLIENT") != "" {
			return fmt.Errorf("the official OpenAI client is not installed in compat/ (ARBITER_REQUIRE_OPENAI_CLIENT is set): %w", err)
		}
		t.Log("the official OpenAI client is not installed (cd compat && npm ci): plain HTTP requests only")
		return nil
	}
	cmd := exec.Command("node", "--test", "serve.test.mjs")
	cmd.Dir = compat
	cmd.Env = append(os.Environ(), "ARBITER_URL=http://"+c.listen+"/v1", "ARBITER_MODEL="+model)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("the OpenAI Node client against the kubernetes service: %v\n%s", err, out)
	}
	return nil
}

// benchLine logs one row of bench/docs/kubernetes.md's table: launch-to-ready seconds of the
// replicas that got ready (min/median/max), the requests ok and failed through the fault,
// how long until the service was whole again, and the pods left after the test.
func benchLine(t *testing.T, test string, rows []state.Replica, l *load, whole time.Duration, podsLeft int) {
	var secs []float64
	for _, r := range rows {
		if !r.ReadyAt.IsZero() {
			secs = append(secs, r.ReadyAt.Sub(r.LaunchedAt).Seconds())
		}
	}
	slices.Sort(secs)
	spread := "-"
	if len(secs) > 0 {
		spread = fmt.Sprintf("%.1f / %.1f / %.1f", secs[0], secs[len(secs)/2], secs[len(secs)-1])
	}
	t.Logf("kube-bench | %s | %d | %s | %d | %d | %.1f | %d |", test, len(secs), spread, l.ok.Load(), l.failed.Load(), whole.Seconds(), podsLeft)
}

func launchToReady(rows []state.Replica) []string {
	var out []string
	for _, r := range rows {
		if !r.ReadyAt.IsZero() {
			out = append(out, fmt.Sprintf("%s %s/%s %.1fs", r.ID, r.Capacity, r.Zone, r.ReadyAt.Sub(r.LaunchedAt).Seconds()))
		}
	}
	return out
}

// From zero to three spot replicas spread over three zones with the first requests held;
// a spot node tainted for termination and then deleted while streams run; the full spot
// pools refuse its replacement, which falls back to on-demand, and spot comes back when a
// spot node does; then scale to zero and serve down, with no pod left after either.
func TestKubernetesSpotLifecycle(t *testing.T) {
	t.Parallel() // each has its own clusters, home and ports; most of their time is waiting
	k := startKube(t, "gke", "127.0.51.1/24")
	zones := []string{"us-central1-a", "us-central1-b", "us-central1-c"}
	for i, z := range zones {
		k.AddNode(kubetest.GKENode(fmt.Sprintf("spot-%d", i), "us-central1", z, true, 1))
	}
	k.AddNode(kubetest.GKENode("ondemand-a", "us-central1", "us-central1-a", false, 4))
	c := newCluster(t)
	useClusters(t, c, k)
	const name, model = "kube", "kube-model"
	out := c.up(name, kubeSpec(model, `replica_policy: {min_replicas: 0, max_replicas: 3, upscale_delay_seconds: 1, downscale_delay_seconds: 3, dynamic_ondemand_fallback: true}`))
	if !strings.Contains(out, "scaled to zero") || len(ownerPods(k, c)) != 0 {
		t.Fatalf("serve up did not park the service at zero pods:\n%s", out)
	}

	// Requests at zero are held, then answered: 0 failed. The first comes from the official
	// OpenAI Node client (compat/serve.test.mjs: held at zero, then streams, completions,
	// models and an unknown model), with three plain ones beside it.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	errs := make(chan error, 4)
	start := time.Now()
	go func() { errs <- openAIClient(t, c, model) }()
	for range 3 {
		go func() { errs <- c.requestOK(ctx, model) }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("a request held at zero replicas failed: %v\n%s", err, c.daemonLog())
		}
	}
	t.Logf("requests held at zero answered after %s", time.Since(start).Round(100*time.Millisecond))

	streams := c.startLoad(model, 2, 40, true)
	plain := c.startLoad(model, 2, 40, false)
	c.waitFor("3 ready spot replicas in 3 zones", 90*time.Second, func() bool {
		ready, zs := kubeReplicas(c.status(name))
		return ready["spot"] == 3 && len(zs) == 3
	})
	st := c.status(name)
	for _, r := range st.Replicas {
		if r.Capacity == "spot" && (r.Provider != "kubernetes:gke" || r.PricePerHour < 6 || r.PricePerHour > 7) {
			t.Errorf("replica %s: %s at $%.2f/h; want kubernetes:gke at GCP's a3-highgpu-1g spot price", r.ID, r.Provider, r.PricePerHour)
		}
	}
	table := c.serve("status")
	for _, want := range []string{"kubernetes:gke", "us-central1/us-central1-b", "spot", "6.33"} {
		if !strings.Contains(table, want) {
			t.Errorf("serve status does not show %q:\n%s", want, table)
		}
	}

	// GKE taints a spot node it is about to reclaim, then deletes it.
	var victim state.Replica
	for _, r := range st.Replicas {
		if r.Zone == "us-central1-b" && r.Capacity == "spot" && r.State == "ready" {
			victim = r
		}
	}
	pod, node := podNode(t, k, victim.ID)
	preempted := time.Now()
	k.Taint(node, corev1.Taint{Key: "cloud.google.com/impending-node-termination", Value: "true", Effect: corev1.TaintEffectNoSchedule})
	c.waitFor("the victim's pod to drain and go", 30*time.Second, func() bool {
		return len(k.Pods("arbiter", kubernetes.LabelReplica+"="+victim.ID)) == 0
	})
	k.DeleteNode(node)
	// Its zone is cooling and the other spot pools are full: the replacement is refused
	// there (unschedulable → no capacity) and falls back to on-demand.
	c.waitFor("3 ready replicas again, one on-demand, after a spot launch was refused", 90*time.Second, func() bool {
		ready, _ := kubeReplicas(c.status(name))
		return ready["spot"] == 2 && ready["on_demand"] == 1 && strings.Contains(c.serve("logs", name), "Insufficient nvidia.com/gpu")
	})
	recovered := time.Since(preempted)
	if _, running := k.Processes()[pod]; running {
		t.Errorf("the reclaimed pod's process still runs")
	}
	logs := c.serve("logs", name)
	for _, want := range []string{"preemption", "impending-node-termination", "no capacity", "Insufficient nvidia.com/gpu"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the event log does not mention %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "backoff") {
		t.Errorf("a refused launch started a crash-loop backoff:\n%s", logs)
	}

	// Spot capacity returns in the reclaimed zone: once the zone cools down placement
	// moves the on-demand replica back to spot, the replacement first.
	k.AddNode(kubetest.GKENode("spot-1b", "us-central1", "us-central1-b", true, 1))
	c.waitFor("3 ready spot replicas again, no on-demand", 120*time.Second, func() bool {
		st := c.status(name)
		ready, _ := kubeReplicas(st)
		return ready["spot"] == 3 && ready["on_demand"] == 0 && st.Live == 3
	})
	streams.finish(t, "streams through a spot node's reclaim")
	plain.finish(t, "requests through a spot node's reclaim")
	rows, _ := c.stateRows(name)
	t.Logf("launch to ready: %v; preemption to 3 ready: %s", launchToReady(rows), recovered.Round(100*time.Millisecond))

	// No load: scale to zero removes every pod.
	c.waitFor("scale to zero", 60*time.Second, func() bool { return c.status(name).Status == "scaled_to_zero" })
	c.waitFor("no pod left at zero", 30*time.Second, func() bool { return len(ownerPods(k, c)) == 0 })

	// And serve down after a last wake leaves none either.
	if code, body, err := c.request(ctx, model); err != nil || code != 200 {
		t.Fatalf("wake from zero: %d %v %s", code, err, body)
	}
	c.serve("down", name, "--wait", "60s")
	left := ownerPods(k, c)
	if len(left) != 0 {
		t.Fatalf("serve down left %d pods", len(left))
	}
	both := &load{}
	both.ok.Store(streams.ok.Load() + plain.ok.Load())
	both.failed.Store(streams.failed.Load() + plain.failed.Load())
	benchLine(t, "spot node reclaimed under load (streams + plain)", rows, both, recovered, len(left))
}

// kill -9 of the control plane while it launches pods: the restarted one adopts or ends
// every pod, none is orphaned, and serve down leaves none.
func TestKubernetesKill9DuringScaleUp(t *testing.T) {
	t.Parallel() // each has its own clusters, home and ports; most of their time is waiting
	k := startKube(t, "gke-kill", "127.0.52.1/24")
	for i, z := range []string{"us-central1-a", "us-central1-b"} {
		k.AddNode(kubetest.GKENode(fmt.Sprintf("spot-%d", i), "us-central1", z, true, 2))
	}
	c := newCluster(t)
	useClusters(t, c, k)
	const name, model = "kill", "kill-model"
	// The embedded daemon is the router too, so no request crosses the kill; the scale-up
	// is a fixed size of 4 submitted without waiting.
	c.up(name, kubeSpec(model, `replicas: 4`), "--detach")
	c.waitFor("a pod being launched", 60*time.Second, func() bool { return len(ownerPods(k, c)) > 0 })
	c.kill9()
	killedWith := len(ownerPods(k, c))
	c.startDaemon()
	c.waitFor("4 ready replicas after the restart", 90*time.Second, func() bool { return c.status(name).Ready == 4 })
	l := c.startLoad(model, 4, 40, false)
	time.Sleep(2 * time.Second)
	l.finish(t, "load after the restart")
	// Every pod belongs to a live row; none is left for nobody.
	c.waitFor("pods and live rows to agree", 60*time.Second, func() bool {
		st := c.status(name)
		live := map[string]bool{}
		for _, r := range st.Replicas {
			if r.State != "terminated" {
				live[r.ID] = true
			}
		}
		for _, p := range ownerPods(k, c) {
			if !live[p.Annotations["arbiter.dev/replica-id"]] {
				return false
			}
		}
		return true
	})
	t.Logf("killed with %d pods; after the restart: %v", killedWith, describe(c.status(name).Replicas))
	rows, _ := c.stateRows(name)
	c.serve("down", name, "--wait", "60s")
	left := ownerPods(k, c)
	if len(left) != 0 {
		t.Fatalf("serve down after a kill -9 left %d pods", len(left))
	}
	benchLine(t, "kill -9 of the control plane during scale-up (load after)", rows, l, 0, len(left))
}

// One service across two clusters; one cluster is lost mid-run (its apiserver, scheduler
// and pods all stop). The other keeps serving (0 failed requests), the lost replica is
// replaced there, and the lost cluster is reported in serve status.
func TestKubernetesTwoClustersOneLost(t *testing.T) {
	t.Parallel() // each has its own clusters, home and ports; most of their time is waiting
	east := startKube(t, "east", "127.0.53.1/24")
	central := startKube(t, "central", "127.0.54.1/24")
	east.AddNode(kubetest.GKENode("east-spot", "us-east4", "us-east4-a", true, 1))
	east.AddNode(kubetest.GKENode("east-od", "us-east4", "us-east4-a", false, 2))
	central.AddNode(kubetest.GKENode("central-spot", "us-central1", "us-central1-a", true, 1))
	central.AddNode(kubetest.GKENode("central-od", "us-central1", "us-central1-a", false, 2))
	c := newCluster(t)
	useClusters(t, c, east, central)
	const name, model = "multi", "multi-model"
	c.up(name, kubeSpec(model, `replica_policy: {min_replicas: 2, max_replicas: 2}`))
	c.waitFor("one ready spot replica in each cluster", 90*time.Second, func() bool {
		st := c.status(name)
		providers := map[string]bool{}
		for _, r := range st.Replicas {
			if r.State == "ready" && r.Capacity == "spot" {
				providers[r.Provider] = true
			}
		}
		return len(providers) == 2
	})
	l := c.startLoad(model, 4, 40, false)
	time.Sleep(2 * time.Second) // traffic on both clusters before one goes
	lost := time.Now()
	central.Stop()
	c.waitFor("2 ready replicas, both in the cluster left", 120*time.Second, func() bool {
		st := c.status(name)
		n := 0
		for _, r := range st.Replicas {
			if r.State == "ready" && r.Provider == "kubernetes:east" {
				n++
			}
		}
		return n == 2
	})
	recovered := time.Since(lost)
	l.finish(t, "load through the loss of a cluster")
	st := c.status(name)
	if !strings.Contains(st.Offers, "kubernetes:central") {
		t.Errorf("serve status does not report the lost cluster: offers problem %q", st.Offers)
	}
	if out := c.serve("status"); !strings.Contains(out, "kubernetes:central") {
		t.Errorf("serve status does not show the lost cluster:\n%s", out)
	}
	t.Logf("cluster lost; 2 ready in the other after %s: %v", recovered.Round(100*time.Millisecond), describe(st.Replicas))

	// The lost cluster comes back with its pod still there: the control plane ends it (it
	// was replaced), and serve down leaves no pod in either cluster.
	var lostID string
	for _, r := range st.Replicas {
		if r.Provider == "kubernetes:central" && r.State == "failed" {
			lostID = r.ID
		}
	}
	if lostID == "" {
		t.Fatalf("no written-off replica in the lost cluster: %v", describe(st.Replicas))
	}
	central.Restart()
	c.waitFor("the written-off pod in the returned cluster to be ended", 90*time.Second, func() bool {
		return len(central.Pods("arbiter", kubernetes.LabelReplica+"="+lostID)) == 0
	})
	rows, _ := c.stateRows(name)
	c.serve("down", name, "--wait", "60s")
	left := len(ownerPods(east, c)) + len(ownerPods(central, c))
	if left != 0 {
		t.Fatalf("serve down left %d pods", left)
	}
	benchLine(t, "one of two clusters lost under load", rows, l, recovered, left)
}
