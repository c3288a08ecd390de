// Package kubetest runs a real Kubernetes control plane on loopback for tests: etcd,
// kube-apiserver (token auth and RBAC on) and kube-scheduler, with fake nodes from KWOK
// whose pods get loopback IPs, and a kubelet stand-in that runs each running pod's own
// command as a local process bound to its pod IP. The binaries come from
// scripts/kube-bins.sh.
package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/arbiter-serve/arbiter/replicas/kubernetes/coreclient"
)

// Versions names the folder of binaries under the cache root: which Kubernetes, etcd, KWOK
// and Karpenter (its controller with the KWOK provider; v1.14.1 is the newest whose go.mod
// the Go here, 1.26.8, accepts), and how they were compiled (-noopt: without optimisation or inlining). It is the
// one place these are written: scripts/kube-bins.sh reads the versions it builds, and the
// folder it builds into, from this line (keep it one line, `const Versions = "…"`).
const Versions = "k8s-v1.37.2-etcd-v3.7.0-kwok-v0.8.0-karpenter-v1.14.1-noopt"

// DefaultDir is the folder Bins looks in when $ARBITER_KUBE_BIN is not set, and the one
// scripts/kube-bins.sh builds into: $ARBITER_KUBE_CACHE, else $XDG_CACHE_HOME/arbiter/kube,
// else ~/.cache/arbiter/kube, then Versions.
func DefaultDir() string {
	root := os.Getenv("ARBITER_KUBE_CACHE")
	if root == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache")
		}
		root = filepath.Join(cache, "arbiter", "kube")
	}
	return filepath.Join(root, Versions)
}

// Bins returns the folder scripts/kube-bins.sh filled (bin/ and stages/): $ARBITER_KUBE_BIN,
// else the script's default cache. Without it the test is skipped, or fails when
// $ARBITER_REQUIRE_KUBE is set (CI sets it, so a missing build step cannot pass unseen).
func Bins(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("ARBITER_KUBE_BIN")
	if dir == "" {
		dir = DefaultDir()
	}
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err != nil {
		if os.Getenv("ARBITER_REQUIRE_KUBE") != "" {
			t.Fatalf("no Kubernetes binaries at %s (ARBITER_REQUIRE_KUBE is set): run `bash scripts/kube-bins.sh`", dir)
		}
		t.Skipf("no Kubernetes binaries at %s: run `bash scripts/kube-bins.sh` (about 6 minutes once) or set ARBITER_KUBE_BIN", dir)
	}
	return dir
}

// Options configures a cluster.
type Options struct {
	// Name is the kubeconfig context (and cluster) name.
	Name string
	// PodCIDR is the loopback range KWOK gives pod IPs from, e.g. "127.0.10.1/24"; two
	// clusters in one test need two ranges.
	PodCIDR string
	// Path is prepended to PATH for pod processes (where replicasim is).
	Path string
	// Karpenter, if set, runs Karpenter's own controller with its KWOK cloud provider
	// (built by scripts/kube-bins.sh) on the cluster, with Karpenter's CRDs and a
	// KWOKNodeClass named default: a NodePool's nodes are then created when a pod asks.
	Karpenter *Karpenter
}

// Karpenter configures the Karpenter controller of a test cluster.
type Karpenter struct {
	// InstanceTypes is the machine types it may create, in its KWOK provider's JSON
	// (name, offerings with Price, Available and Requirements on capacity type and zone,
	// architecture, operatingSystems, resources).
	InstanceTypes string
	// NodeRegistrationDelay is how long a node it creates takes to join the cluster (a
	// machine's boot and kubelet start), as the KWOKNodeClass's nodeRegistrationDelay.
	NodeRegistrationDelay time.Duration
}

// Cluster is a running control plane.
type Cluster struct {
	Name string
	Dir  string
	// Server is the apiserver's URL; Kubeconfig a file whose context Name reaches it as
	// the admin (system:masters).
	Server, Kubeconfig string
	Admin              *coreclient.Client
	AdminRest          *rest.Config

	t       testing.TB
	bins    string
	opts    Options
	procs   []*exec.Cmd
	kubelet *Kubelet
	stopped bool
	// started is each component as started, for Restart.
	started []component
}

type component struct {
	name string
	args []string
	env  []string // added to the test's environment
}

// Start brings a cluster up and registers its Stop with t.Cleanup.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	bins := Bins(t)
	dir := filepath.Join(t.TempDir(), o.Name)
	if err := os.MkdirAll(filepath.Join(dir, "certs"), 0o700); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{Name: o.Name, Dir: dir, t: t, bins: bins, opts: o}
	t.Cleanup(c.Stop)

	etcdClient, etcdPeer := freePort(t), freePort(t)
	c.run("etcd", "--name", "default", "--data-dir", filepath.Join(dir, "etcd"), "--log-level", "warn",
		"--listen-client-urls", "http://127.0.0.1:"+etcdClient, "--advertise-client-urls", "http://127.0.0.1:"+etcdClient,
		"--listen-peer-urls", "http://127.0.0.1:"+etcdPeer, "--initial-advertise-peer-urls", "http://127.0.0.1:"+etcdPeer,
		"--initial-cluster", "default=http://127.0.0.1:"+etcdPeer, "--quota-backend-bytes", "1073741824")

	token := randomHex(t)
	writeFile(t, filepath.Join(dir, "tokens.csv"), token+",admin,admin-uid,system:masters\n")
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "sa.key"), string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})))
	port := freePort(t)
	c.run("kube-apiserver", "--etcd-servers", "http://127.0.0.1:"+etcdClient,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", port,
		// A loopback advertise address is refused by the endpoint reconciler, which no test
		// needs (nothing uses the kubernetes Service).
		"--endpoint-reconciler-type", "none",
		"--token-auth-file", filepath.Join(dir, "tokens.csv"), "--authorization-mode", "RBAC",
		"--service-account-key-file", filepath.Join(dir, "sa.key"), "--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc", "--api-audiences", "https://kubernetes.default.svc",
		"--cert-dir", filepath.Join(dir, "certs"), "--service-cluster-ip-range", "10.96.0.0/16", "--profiling=false")
	c.Server = "https://127.0.0.1:" + port
	c.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	c.writeKubeconfig(c.Kubeconfig, "admin", token)
	c.AdminRest = &rest.Config{Host: c.Server, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 100, Burst: 200}
	admin, err := coreclient.New(c.AdminRest, authv1.AddToScheme)
	if err != nil {
		t.Fatal(err)
	}
	c.Admin = admin
	c.waitFor("the apiserver to be ready", 2*time.Minute, c.ready)
	// Without a controller-manager, no namespace gets its default service account, and pod
	// admission refuses pods until it exists.
	c.waitFor("the default namespace", time.Minute, func() error {
		return c.Admin.Get(context.Background(), coreclient.Namespaces, "", "default", &corev1.Namespace{})
	})
	c.Namespace("default")

	c.run("kube-scheduler", "--kubeconfig", c.Kubeconfig, "--authentication-kubeconfig", c.Kubeconfig,
		"--authorization-kubeconfig", c.Kubeconfig, "--bind-address", "127.0.0.1", "--secure-port", freePort(t), "--leader-elect=false")
	stages, err := filepath.Glob(filepath.Join(bins, "stages", "*.yaml"))
	if err != nil || len(stages) == 0 {
		t.Fatalf("no kwok stages in %s/stages", bins)
	}
	kwokArgs := []string{"--kubeconfig", c.Kubeconfig, "--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake", "--cidr=" + o.PodCIDR,
		"--node-ip=127.0.0.1", "--server-address=127.0.0.1:" + freePort(t)}
	for _, s := range stages {
		kwokArgs = append(kwokArgs, "--config", s)
	}
	c.run("kwok", kwokArgs...)
	c.kubelet = startKubelet(t, c.Admin, filepath.Join(dir, "pods"), o.Path)
	if o.Karpenter != nil {
		c.startKarpenter(*o.Karpenter)
	}
	return c
}

// startKarpenter installs Karpenter's CRDs (from its module, as kube-bins.sh copied them)
// and a KWOKNodeClass named default, and runs its controller with the KWOK provider.
func (c *Cluster) startKarpenter(k Karpenter) {
	c.t.Helper()
	crds, err := filepath.Glob(filepath.Join(c.bins, "karpenter", "*.yaml"))
	if err != nil || len(crds) == 0 {
		c.t.Fatalf("no Karpenter CRDs in %s/karpenter: run scripts/kube-bins.sh", c.bins)
	}
	for _, crd := range crds {
		if out, err := c.Kubectl("apply", "--server-side", "-f", crd); err != nil {
			c.t.Fatalf("kubectl apply %s: %v\n%s", crd, err, out)
		}
	}
	if out, err := c.Kubectl("wait", "--for", "condition=established", "--timeout", "60s", "crd/nodepools.karpenter.sh", "crd/nodeclaims.karpenter.sh",
		"crd/kwoknodeclasses.karpenter.kwok.sh"); err != nil {
		c.t.Fatalf("Karpenter's CRDs: %v\n%s", err, out)
	}
	c.Apply("kwoknodeclass", fmt.Sprintf("apiVersion: karpenter.kwok.sh/v1alpha1\nkind: KWOKNodeClass\nmetadata:\n  name: default\nspec:\n  nodeRegistrationDelay: %s\n", k.NodeRegistrationDelay))
	c.Namespace("karpenter")
	types := filepath.Join(c.Dir, "karpenter-instance-types.json")
	writeFile(c.t, types, k.InstanceTypes)
	c.started = append(c.started, component{name: "karpenter-kwok",
		args: []string{"--disable-leader-election", "--metrics-port", freePort(c.t), "--health-probe-port", freePort(c.t),
			"--instance-types-file-path", types, "--log-level", "debug"},
		env: []string{"KUBECONFIG=" + c.Kubeconfig, "SYSTEM_NAMESPACE=karpenter"}})
	comp := c.started[len(c.started)-1]
	c.spawn(comp.name, comp.args, comp.env...)
}

// run starts one of the cluster's binaries, its output in <dir>/<name>.log.
func (c *Cluster) run(name string, args ...string) {
	c.t.Helper()
	c.started = append(c.started, component{name: name, args: args})
	c.spawn(name, args)
}

func (c *Cluster) spawn(name string, args []string, env ...string) {
	c.t.Helper()
	f, err := os.OpenFile(filepath.Join(c.Dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(filepath.Join(c.bins, "bin", name), args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = cmd.Wait() }()
	c.procs = append(c.procs, cmd)
}

// Log returns the tail of one component's log (etcd, kube-apiserver, kube-scheduler, kwok).
func (c *Cluster) Log(name string) string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, name+".log"))
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

// Stop ends the whole cluster as if its machines were lost: the pods' processes, KWOK, the
// scheduler, the apiserver and etcd. Idempotent.
func (c *Cluster) Stop() {
	if c.stopped {
		return
	}
	c.stopped = true
	if c.kubelet != nil {
		c.kubelet.Stop()
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
	}
	for _, p := range c.procs {
		for range 100 {
			if syscall.Kill(p.Process.Pid, 0) != nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// Restart brings a stopped cluster back on its own data, as after an outage: the same
// etcd, so its nodes and pods are as they were, and the pods' processes start again.
func (c *Cluster) Restart() {
	c.t.Helper()
	if !c.stopped {
		c.t.Fatal("Restart of a cluster that runs")
	}
	c.stopped, c.procs = false, nil
	for _, comp := range c.started {
		c.spawn(comp.name, comp.args, comp.env...)
		if comp.name == "kube-apiserver" {
			c.waitFor("the apiserver to be ready again", 2*time.Minute, c.ready)
		}
	}
	c.kubelet = startKubelet(c.t, c.Admin, filepath.Join(c.Dir, "pods"), c.opts.Path)
}

// Processes lists the pod processes the kubelet stand-in runs now, by pod name.
func (c *Cluster) Processes() map[string]int { return c.kubelet.Running() }

func (c *Cluster) writeKubeconfig(path, user, token string) {
	c.t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[c.Name] = &clientcmdapi.Cluster{Server: c.Server, InsecureSkipTLSVerify: true}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[c.Name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: user}
	cfg.CurrentContext = c.Name
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		c.t.Fatal(err)
	}
}

// Namespace creates a namespace (if missing) with its default service account.
func (c *Cluster) Namespace(name string) {
	c.t.Helper()
	ctx := context.Background()
	err := c.Admin.Create(ctx, coreclient.Namespaces, "", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, &corev1.Namespace{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatal(err)
	}
	err = c.Admin.Create(ctx, coreclient.ServiceAccounts, name, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, &corev1.ServiceAccount{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatal(err)
	}
}

// ServiceAccountKubeconfig writes a kubeconfig (context Name) that acts as a service
// account, with a token from the TokenRequest API: what a pod running as that account
// would use, so that RBAC decides what it may do.
func (c *Cluster) ServiceAccountKubeconfig(namespace, account string) string {
	c.t.Helper()
	secs := int64(24 * 3600)
	tr := &authv1.TokenRequest{}
	if err := c.Admin.CreateSub(context.Background(), coreclient.ServiceAccounts, namespace, account, "token",
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &secs}}, tr); err != nil {
		c.t.Fatalf("token for %s/%s: %v", namespace, account, err)
	}
	path := filepath.Join(c.Dir, namespace+"-"+account+".kubeconfig")
	c.writeKubeconfig(path, account, tr.Status.Token)
	return path
}

// Apply writes manifest (YAML, one document or several) to <name>.yaml in the cluster's
// folder and applies it with kubectl as the admin; a refusal fails the test.
func (c *Cluster) Apply(name, manifest string) {
	c.t.Helper()
	path := filepath.Join(c.Dir, name+".yaml")
	writeFile(c.t, path, manifest)
	if out, err := c.Kubectl("apply", "-f", path); err != nil {
		c.t.Fatalf("kubectl apply %s: %v\n%s", name, err, out)
	}
}

// Kubectl runs the kubectl built with the cluster as the admin.
func (c *Cluster) Kubectl(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(c.bins, "bin", "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// waitFor polls cond until it returns nil; past timeout it fails the test with cond's last
// error and the control plane's logs.
func (c *Cluster) waitFor(what string, timeout time.Duration, cond func() error) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for err := cond(); err != nil; err = cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("cluster %s: timed out after %s waiting for %s: %v\napiserver:\n%s\netcd:\n%s", c.Name, timeout, what, err, c.Log("kube-apiserver"), c.Log("etcd"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *Cluster) ready() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return c.Admin.Ready(ctx)
}

func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}

func randomHex(t testing.TB) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

func writeFile(t testing.TB, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Node is a fake GPU node.
type Node struct {
	Name   string
	Labels map[string]string
	GPUs   int
	// ProviderID, e.g. gce://project/us-central1-a/name, says which cloud it is in.
	ProviderID string
	Taints     []corev1.Taint
}

// AddNode registers a KWOK node and waits until it is Ready and schedulable (the
// not-ready taint that admission adds is removed: no node lifecycle controller runs).
func (c *Cluster) AddNode(n Node) {
	c.t.Helper()
	ctx := context.Background()
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    mustQuantity("64"),
		corev1.ResourceMemory: mustQuantity("512Gi"),
		corev1.ResourcePods:   mustQuantity("110"),
	}
	if n.GPUs > 0 {
		capacity["nvidia.com/gpu"] = mustQuantity(fmt.Sprint(n.GPUs))
	}
	labels := map[string]string{"kubernetes.io/hostname": n.Name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "kwok"}
	for k, v := range n.Labels {
		labels[k] = v
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels, Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"}},
		Spec:       corev1.NodeSpec{ProviderID: n.ProviderID, Taints: n.Taints},
		Status:     corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
	if err := c.Admin.Create(ctx, coreclient.Nodes, "", node, &corev1.Node{}); err != nil {
		c.t.Fatalf("create node %s: %v", n.Name, err)
	}
	c.waitFor("node "+n.Name+" Ready", time.Minute, func() error {
		got := &corev1.Node{}
		if err := c.Admin.Get(ctx, coreclient.Nodes, "", n.Name, got); err != nil {
			return err
		}
		ready := false
		for _, cond := range got.Status.Conditions {
			ready = ready || cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue
		}
		if !ready {
			return errors.New("not Ready yet")
		}
		var keep []corev1.Taint
		for _, t := range got.Spec.Taints {
			if !strings.HasPrefix(t.Key, "node.kubernetes.io/not-ready") {
				keep = append(keep, t)
			}
		}
		if len(keep) == len(got.Spec.Taints) {
			return nil
		}
		got.Spec.Taints = keep
		if err := c.Admin.Update(ctx, coreclient.Nodes, "", got.Name, "", got, got); err != nil {
			return fmt.Errorf("remove the not-ready taint: %w", err)
		}
		return errors.New("the not-ready taint was just removed") // check again: the update may have raced
	})
}

// Taint adds a taint to a node.
func (c *Cluster) Taint(node string, t corev1.Taint) {
	c.t.Helper()
	c.updateNode(node, func(n *corev1.Node) { n.Spec.Taints = append(n.Spec.Taints, t) })
}

// Untaint removes every taint with key from a node.
func (c *Cluster) Untaint(node, key string) {
	c.t.Helper()
	c.updateNode(node, func(n *corev1.Node) {
		var keep []corev1.Taint
		for _, t := range n.Spec.Taints {
			if t.Key != key {
				keep = append(keep, t)
			}
		}
		n.Spec.Taints = keep
	})
}

func (c *Cluster) updateNode(name string, change func(*corev1.Node)) {
	c.t.Helper()
	ctx := context.Background()
	for try := 0; ; try++ {
		n := &corev1.Node{}
		if err := c.Admin.Get(ctx, coreclient.Nodes, "", name, n); err != nil {
			c.t.Fatal(err)
		}
		change(n)
		err := c.Admin.Update(ctx, coreclient.Nodes, "", name, "", n, n)
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) || try > 20 {
			c.t.Fatalf("update node %s: %v", name, err)
		}
	}
}

// DeleteNode removes a node, as a cloud reclaiming the machine does; the kubelet stand-in
// kills the processes of its pods.
func (c *Cluster) DeleteNode(name string) {
	c.t.Helper()
	if err := c.Admin.Delete(context.Background(), coreclient.Nodes, "", name, metav1.DeleteOptions{}); err != nil {
		c.t.Fatalf("delete node %s: %v", name, err)
	}
}

// Pods lists the pods in a namespace that match a label selector.
func (c *Cluster) Pods(namespace, selector string) []corev1.Pod {
	c.t.Helper()
	l := &corev1.PodList{}
	if err := c.Admin.List(context.Background(), coreclient.Pods, namespace, metav1.ListOptions{LabelSelector: selector}, l); err != nil {
		c.t.Fatalf("list pods: %v", err)
	}
	return l.Items
}

// GKENode is a node as GKE labels an a3-highgpu-1g (H100) in a spot or an on-demand pool:
// zone, region, machine type, accelerator, node pool, Spot, and a gce:// provider ID.
func GKENode(name, region, zone string, spot bool, gpus int) Node {
	labels := map[string]string{"topology.kubernetes.io/zone": zone, "topology.kubernetes.io/region": region,
		"node.kubernetes.io/instance-type": "a3-highgpu-1g", "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
		"cloud.google.com/gke-nodepool": "h100"}
	if spot {
		labels["cloud.google.com/gke-spot"] = "true"
		labels["cloud.google.com/gke-nodepool"] = "h100-spot"
	}
	return Node{Name: name, Labels: labels, GPUs: gpus, ProviderID: "gce://arbiter-test/" + zone + "/" + name}
}

// GPUTaint is the taint GPU node pools carry so that only pods asking for GPUs land
// there: the NVIDIA device plugin's resource name as the key, NoSchedule. Karpenter GPU
// NodePools set it in spec.template.taints (e.g. walidshaari/sample-aws-eks-auto-mode,
// nodepool-templates/gpu-nodepool.yaml.tpl: key nvidia.com/gpu, value "true", NoSchedule).
var GPUTaint = corev1.Taint{Key: "nvidia.com/gpu", Value: "true", Effect: corev1.TaintEffectNoSchedule}

// KarpenterNode is a node as Karpenter on AWS (karpenter-provider-aws, v1 well-known
// labels) labels a g6.xlarge (one L4) it launched for NodePool pool: karpenter.sh/nodepool,
// karpenter.sh/capacity-type (spot | on-demand), karpenter.k8s.aws/instance-gpu-name and its
// siblings, the well-known instance-type, zone and region labels, topology.k8s.aws/zone-id,
// and an aws:///<zone>/<instance id> provider ID; tainted as its NodePool's GPU taint says.
// bare leaves out the provider ID and every karpenter.k8s.aws/* and topology.k8s.aws/*
// label, as issue 34 found an on-demand sibling: nothing on it says AWS but its instance
// type and its pool.
func KarpenterNode(name, pool, zone, capacity string, bare bool) Node {
	region := zone[:len(zone)-1] // us-east-1a → us-east-1
	labels := map[string]string{"karpenter.sh/nodepool": pool, "karpenter.sh/capacity-type": capacity,
		"karpenter.sh/registered": "true", "karpenter.sh/initialized": "true",
		"node.kubernetes.io/instance-type": "g6.xlarge", "topology.kubernetes.io/zone": zone, "topology.kubernetes.io/region": region}
	n := Node{Name: name, Labels: labels, GPUs: 1, Taints: []corev1.Taint{GPUTaint}}
	if !bare {
		for k, v := range map[string]string{"karpenter.k8s.aws/instance-gpu-name": "l4", "karpenter.k8s.aws/instance-gpu-count": "1",
			"karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia", "karpenter.k8s.aws/instance-family": "g6",
			"karpenter.k8s.aws/instance-size": "xlarge", "topology.k8s.aws/zone-id": awsZoneIDs[zone]} {
			labels[k] = v
		}
		n.ProviderID = "aws:///" + zone + "/i-0" + hex.EncodeToString([]byte(name))
	}
	return n
}

// awsZoneIDs maps the zone names KarpenterNode is given to AZ ids, as one account sees them.
var awsZoneIDs = map[string]string{"us-east-1a": "use1-az1", "us-east-1b": "use1-az2", "us-east-1c": "use1-az4"}

// AKSNode is a node of an AKS node pool of Standard_NC40ads_H100_v5 (one H100) as AKS
// labels it: kubernetes.azure.com/agentpool, the well-known instance-type, region and zone
// labels (AKS zones are <region>-<n>: eastus-1), kubernetes.azure.com/accelerator=nvidia,
// and an azure:///subscriptions/…/virtualMachineScaleSets/aks-<pool>-<id>-vmss/
// virtualMachines/<n> provider ID (the form cluster-autoscaler logs and CAPZ lists). In a
// spot pool it also carries kubernetes.azure.com/scalesetpriority=spot, as a label and as
// the NoSchedule taint AKS puts on every spot pool's nodes (learn.microsoft.com/azure/aks/
// spot-node-pool; gkaleta/AKS-Spot-Instances). No label names the GPU model (AKS sets none
// without NVIDIA's feature discovery): only the instance type says H100.
func AKSNode(name, pool, region string, zone, index int, spot bool) Node {
	n := Node{Name: name, GPUs: 1, Labels: map[string]string{"kubernetes.azure.com/agentpool": pool,
		"kubernetes.azure.com/accelerator": "nvidia", "kubernetes.azure.com/mode": "user",
		"node.kubernetes.io/instance-type": "Standard_NC40ads_H100_v5", "topology.kubernetes.io/region": region,
		"topology.kubernetes.io/zone": fmt.Sprintf("%s-%d", region, zone)},
		ProviderID: fmt.Sprintf("azure:///subscriptions/00000000-0000-0000-0000-000000000034/resourceGroups/mc_arbiter_aks_%s/providers/"+
			"Microsoft.Compute/virtualMachineScaleSets/aks-%s-34343434-vmss/virtualMachines/%d", region, pool, index)}
	if spot {
		n.Labels["kubernetes.azure.com/scalesetpriority"] = "spot"
		n.Taints = []corev1.Taint{{Key: "kubernetes.azure.com/scalesetpriority", Value: "spot", Effect: corev1.TaintEffectNoSchedule}}
	}
	return n
}
