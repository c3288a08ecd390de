package kubetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/arbiter-serve/arbiter/replicas/kubernetes/coreclient"
)

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }

// Kubelet is a test-only stand-in for the kubelets of KWOK's fake nodes: KWOK marks a pod
// Running and gives it an IP, and this runs the pod's first container's command as a local
// process with the container's environment resolved as a kubelet would ($(VAR) references,
// the downward API's status.podIP and metadata fields), so the pod really serves on its
// IP. It stops the process when the pod is being deleted, is gone, or its node is gone.
// It does not restart a process that exits (a real kubelet would, by restartPolicy).
//
// It also stands in for the node lifecycle controller in one respect: the not-ready taint
// admission puts on every new Node is removed once KWOK reports the node Ready, as that
// controller does, for nodes someone else creates (Karpenter's) as AddNode does for its own.
//
// Of volumes it knows only the downward API's, kept up to date as the pod's labels and
// annotations change, as a kubelet does. A process has no mount namespace of its own, so
// such a volume lives in the pod's folder under the stand-in's, and an environment value
// that names a path under its mountPath is rewritten to name the same file there.
type Kubelet struct {
	dir, path string
	client    *coreclient.Client
	pods      cache.SharedIndexInformer
	nodes     cache.SharedIndexInformer
	// untainting: nodes whose not-ready taint is being removed.
	untainting map[string]bool
	stop       context.CancelFunc

	mu    sync.Mutex
	procs map[types.UID]*podProc
	done  bool
}

type podProc struct {
	name string
	cmd  *exec.Cmd
	exit chan struct{}
}

func startKubelet(t testing.TB, client *coreclient.Client, dir, path string) *Kubelet {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	k := &Kubelet{dir: dir, path: path, client: client, pods: client.Informer(coreclient.Pods, "", &corev1.Pod{}, nil), nodes: client.Informer(coreclient.Nodes, "", &corev1.Node{}, nil),
		stop: cancel, procs: map[types.UID]*podProc{}, untainting: map[string]bool{}}
	sync := func(any) { k.sync() }
	h := cache.ResourceEventHandlerFuncs{AddFunc: sync, UpdateFunc: func(_, o any) { sync(o) }, DeleteFunc: sync}
	if _, err := k.pods.AddEventHandler(h); err != nil {
		t.Fatal(err)
	}
	if _, err := k.nodes.AddEventHandler(h); err != nil {
		t.Fatal(err)
	}
	go k.pods.RunWithContext(ctx)
	go k.nodes.RunWithContext(ctx)
	return k
}

// sync starts what should run and stops what should not.
func (k *Kubelet) sync() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.done {
		return
	}
	for _, obj := range k.nodes.GetStore().List() {
		if n, ok := obj.(*corev1.Node); ok && !k.untainting[n.Name] && nodeReady(n) && slices.ContainsFunc(n.Spec.Taints, notReadyTaint) {
			k.untainting[n.Name] = true
			go k.untaint(n.Name)
		}
	}
	want := map[types.UID]*corev1.Pod{}
	for _, obj := range k.pods.GetStore().List() {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || p.Spec.NodeName == "" {
			continue
		}
		if _, ok, _ := k.nodes.GetStore().GetByKey(p.Spec.NodeName); !ok {
			continue
		}
		want[p.UID] = p
	}
	for uid, pp := range k.procs {
		if want[uid] == nil {
			go pp.kill()
			delete(k.procs, uid)
		}
	}
	for uid, p := range want {
		if k.procs[uid] != nil {
			if _, err := k.downward(p); err != nil {
				fmt.Fprintf(os.Stderr, "kubetest kubelet: pod %s/%s: %v\n", p.Namespace, p.Name, err)
			}
			continue
		}
		pp, err := k.start(p)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kubetest kubelet: pod %s/%s: %v\n", p.Namespace, p.Name, err)
			continue
		}
		k.procs[uid] = pp
	}
}

func notReadyTaint(t corev1.Taint) bool {
	return strings.HasPrefix(t.Key, "node.kubernetes.io/not-ready")
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// untaint removes a Ready node's not-ready taint (retrying a conflicting update).
func (k *Kubelet) untaint(name string) {
	defer func() {
		k.mu.Lock()
		delete(k.untainting, name)
		k.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		n := &corev1.Node{}
		if err := k.client.Get(ctx, coreclient.Nodes, "", name, n); err != nil {
			return // gone
		}
		keep := slices.DeleteFunc(slices.Clone(n.Spec.Taints), notReadyTaint)
		if len(keep) == len(n.Spec.Taints) {
			return
		}
		n.Spec.Taints = keep
		if err := k.client.Update(ctx, coreclient.Nodes, "", name, "", n, n); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand replaces $(VAR) with VAR's value where VAR is defined, as the kubelet does for
// env values, command and args.
func expand(s string, vars map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		if v, ok := vars[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

func (k *Kubelet) start(p *corev1.Pod) (*podProc, error) {
	if len(p.Spec.Containers) == 0 {
		return nil, fmt.Errorf("no container")
	}
	c := p.Spec.Containers[0]
	mounts, err := k.downward(p)
	if err != nil {
		return nil, err
	}
	vars := map[string]string{}
	env := []string{"PATH=" + k.path + string(os.PathListSeparator) + os.Getenv("PATH"), "HOME=" + k.dir}
	for _, e := range c.Env {
		v := expand(e.Value, vars)
		if f := e.ValueFrom; f != nil && f.FieldRef != nil {
			switch f.FieldRef.FieldPath {
			case "status.podIP":
				v = p.Status.PodIP
			case "status.hostIP":
				v = p.Status.HostIP
			case "metadata.name":
				v = p.Name
			case "metadata.namespace":
				v = p.Namespace
			case "spec.nodeName":
				v = p.Spec.NodeName
			default:
				return nil, fmt.Errorf("env %s: field %s is not supported by the stand-in", e.Name, f.FieldRef.FieldPath)
			}
		} else if e.ValueFrom != nil {
			return nil, fmt.Errorf("env %s: only fieldRef sources are supported by the stand-in", e.Name)
		}
		for mp, dir := range mounts {
			if v == mp || strings.HasPrefix(v, mp+"/") {
				v = dir + v[len(mp):]
			}
		}
		vars[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	argv := append([]string{}, c.Command...)
	argv = append(argv, c.Args...)
	if len(argv) == 0 {
		return nil, fmt.Errorf("container %s has no command (the stand-in cannot read an image's entrypoint)", c.Name)
	}
	for i := range argv {
		argv[i] = expand(argv[i], vars)
	}
	f, err := os.OpenFile(filepath.Join(k.dir, p.Namespace+"_"+p.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = env, k.dir, f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	pp := &podProc{name: p.Name, cmd: cmd, exit: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(pp.exit) }()
	return pp, nil
}

// downward writes the files of the pod's downward API volumes that its first container
// mounts, each replaced whole (a reader never sees half a file), and returns each
// mountPath's folder here.
func (k *Kubelet) downward(p *corev1.Pod) (map[string]string, error) {
	if len(p.Spec.Containers) == 0 {
		return nil, nil
	}
	vols := map[string]*corev1.DownwardAPIVolumeSource{}
	for _, v := range p.Spec.Volumes {
		if v.DownwardAPI != nil {
			vols[v.Name] = v.DownwardAPI
		}
	}
	mounts := map[string]string{}
	for _, m := range p.Spec.Containers[0].VolumeMounts {
		src := vols[m.Name]
		if src == nil {
			continue
		}
		dir := filepath.Join(k.dir, "volumes", p.Namespace+"_"+p.Name, m.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		for _, item := range src.Items {
			if item.FieldRef == nil {
				return nil, fmt.Errorf("volume %s: only fieldRef items are supported by the stand-in", m.Name)
			}
			v, err := fieldValue(p, item.FieldRef.FieldPath)
			if err != nil {
				return nil, fmt.Errorf("volume %s: %w", m.Name, err)
			}
			path := filepath.Join(dir, item.Path)
			if old, err := os.ReadFile(path); err == nil && string(old) == v {
				continue
			}
			if err := os.WriteFile(path+".tmp", []byte(v), 0o644); err != nil {
				return nil, err
			}
			if err := os.Rename(path+".tmp", path); err != nil {
				return nil, err
			}
		}
		mounts[m.MountPath] = dir
	}
	return mounts, nil
}

// fieldMap reads metadata.annotations['key'] or metadata.labels['key'].
var fieldMap = regexp.MustCompile(`^metadata\.(annotations|labels)\['([^']+)'\]$`)

// fieldValue is a downward API volume item's content.
func fieldValue(p *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.name":
		return p.Name, nil
	case "metadata.namespace":
		return p.Namespace, nil
	}
	m := fieldMap.FindStringSubmatch(path)
	if m == nil {
		return "", fmt.Errorf("field %s is not supported by the stand-in", path)
	}
	if m[1] == "annotations" {
		return p.Annotations[m[2]], nil
	}
	return p.Labels[m[2]], nil
}

// kill stops a pod's process group: SIGTERM, then SIGKILL after 3 s.
func (pp *podProc) kill() {
	pgid := pp.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-pp.exit:
	case <-time.After(3 * time.Second):
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-pp.exit
}

// Running lists the pods whose process runs, by pod name, with the process ID.
func (k *Kubelet) Running() map[string]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string]int{}
	for _, pp := range k.procs {
		select {
		case <-pp.exit:
		default:
			out[pp.name] = pp.cmd.Process.Pid
		}
	}
	return out
}

// Stop kills every pod process and stops watching.
func (k *Kubelet) Stop() {
	k.mu.Lock()
	k.done = true
	procs := k.procs
	k.procs = map[types.UID]*podProc{}
	k.mu.Unlock()
	k.stop()
	var wg sync.WaitGroup
	for _, pp := range procs {
		wg.Add(1)
		go func() { defer wg.Done(); pp.kill() }()
	}
	wg.Wait()
}
