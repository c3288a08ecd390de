package inferencepool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/coreclient"
)

// SourceName names the pool's endpoints among a router pool's sources (router.Pool.SetSource):
// after the control plane's, whose entry for a pod it placed wins.
const SourceName = "inferencepool"

// Config says which pool to watch and how to reach its cluster.
type Config struct {
	Rest            *rest.Config
	Namespace, Name string
	// Model is the model of a pod that does not name its own (AnnotationModel).
	Model string
	// Cluster reads and prices nodes as a providers file's cluster entry does
	// (accelerator_label, accelerator_names, node_pools); the zero value reads the
	// platforms' labels and prices from the catalogs.
	Cluster kubernetes.Cluster
	// Catalog prices nodes; nil: the embedded catalogs.
	Catalog func() (*pricing.Catalog, error)
	Log     *slog.Logger
}

// Watcher keeps an endpoint set up to date with a pool.
type Watcher struct {
	cfg    Config
	apply  func([]fleet.Replica)
	pricer *kubernetes.NodePricer
	pool   cache.SharedIndexInformer
	pods   cache.SharedIndexInformer
	nodes  cache.SharedIndexInformer
	wake   chan struct{}
	synced atomic.Bool

	last     []fleet.Replica
	problems []string
}

// Watch starts watching the pool, its namespace's pods and the nodes until ctx ends,
// calling apply with the endpoint set each time it changes (the first time once the
// caches have synced, even if empty).
func Watch(ctx context.Context, cfg Config, apply func([]fleet.Replica)) (*Watcher, error) {
	if cfg.Name == "" || cfg.Namespace == "" {
		return nil, errors.New("inferencepool: the pool's name and namespace are required (-pool-name, -pool-namespace)")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Catalog == nil {
		cfg.Catalog = pricing.Embedded
	}
	rc := rest.CopyConfig(cfg.Rest)
	rc.UserAgent = "arbiter-picker"
	core, err := coreclient.New(rc)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("inferencepool: %w", err)
	}
	cat, catErr := cfg.Catalog()
	w := &Watcher{cfg: cfg, apply: apply, pricer: kubernetes.NewNodePricer(cat, catErr, cfg.Cluster), wake: make(chan struct{}, 1)}
	if catErr != nil {
		cfg.Log.Error("the price catalogs did not load: endpoints are unpriced", "err", catErr)
	}
	ri := dyn.Resource(GVR).Namespace(cfg.Namespace)
	byName := func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + cfg.Name }
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			byName(&o)
			return ri.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			byName(&o)
			return ri.Watch(ctx, o)
		},
	}
	w.pool = cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, cache.Indexers{})
	w.pods = core.Informer(coreclient.Pods, cfg.Namespace, &corev1.Pod{}, nil)
	w.nodes = core.Informer(coreclient.Nodes, "", &corev1.Node{}, nil)
	poke := func(any) { w.poke() }
	h := cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke}
	nh := cache.ResourceEventHandlerFuncs{AddFunc: poke, DeleteFunc: poke, UpdateFunc: func(o, n any) {
		if nodeChanged(o, n) {
			w.poke()
		}
	}}
	for name, inf := range map[string]cache.SharedIndexInformer{"InferencePool " + cfg.Namespace + "/" + cfg.Name: w.pool, "pods in " + cfg.Namespace: w.pods, "nodes": w.nodes} {
		handler := h
		if inf == w.nodes {
			handler = nh
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return nil, err
		}
		var said atomic.Value
		_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			// A refusal (RBAC, a missing CRD) repeats every retry: said once per message.
			if prev, _ := said.Load().(string); prev != err.Error() {
				said.Store(err.Error())
				hint := ""
				switch {
				case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
					hint = ": the picker's account may not read it (deploy/kubernetes/gateway/rbac.yaml grants what it needs)"
				case apierrors.IsNotFound(err) && inf == w.pool:
					hint = ": is GIE's InferencePool CRD (" + GVR.Group + "/" + GVR.Version + ") installed?"
				}
				cfg.Log.Error("inferencepool: cannot watch "+name+hint, "err", err)
			}
		})
		go inf.RunWithContext(ctx)
	}
	go w.run(ctx)
	return w, nil
}

// Synced says whether the endpoint set has been given once.
func (w *Watcher) Synced() bool { return w.synced.Load() }

func (w *Watcher) poke() {
	select {
	case w.wake <- struct{}{}:
	default: // a recompute is already due
	}
}

func (w *Watcher) run(ctx context.Context) {
	if !cache.WaitForCacheSync(ctx.Done(), w.pool.HasSynced, w.pods.HasSynced, w.nodes.HasSynced) {
		return
	}
	w.sync()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
			w.sync()
		}
	}
}

// sync computes the endpoint set from the caches and applies it if it changed; new
// problems are logged once each.
func (w *Watcher) sync() {
	set, problems := w.compute()
	for _, p := range problems {
		if !slices.Contains(w.problems, p) {
			w.cfg.Log.Warn("inferencepool: " + p)
		}
	}
	for _, p := range w.problems {
		if !slices.Contains(problems, p) {
			w.cfg.Log.Info("inferencepool: resolved: " + p)
		}
	}
	w.problems = problems
	if w.synced.Load() && reflect.DeepEqual(set, w.last) {
		return
	}
	w.last = set
	w.apply(set)
	w.synced.Store(true)
	w.cfg.Log.Info("inferencepool: endpoints", "pool", w.cfg.Namespace+"/"+w.cfg.Name, "count", len(set))
}

func (w *Watcher) compute() ([]fleet.Replica, []string) {
	where := "InferencePool " + w.cfg.Namespace + "/" + w.cfg.Name
	obj, ok, _ := w.pool.GetStore().GetByKey(w.cfg.Namespace + "/" + w.cfg.Name)
	if !ok {
		return nil, []string{where + " not found: no endpoints until it exists"}
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, []string{where + ": not an object"}
	}
	p, err := ParsePool(u)
	if err != nil {
		return nil, []string{err.Error() + ": no endpoints"}
	}
	var pods []*corev1.Pod
	for _, o := range w.pods.GetStore().List() {
		if pod, ok := o.(*corev1.Pod); ok {
			pods = append(pods, pod)
		}
	}
	var nodes []*corev1.Node
	for _, o := range w.nodes.GetStore().List() {
		if n, ok := o.(*corev1.Node); ok {
			nodes = append(nodes, n)
		}
	}
	slices.SortFunc(nodes, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	return Endpoints(p, pods, nodes, w.pricer, w.cfg.Model)
}

// nodeChanged says whether a node's update changes what it is priced by: its labels,
// provider ID or GPUs (not the status heartbeats every node sends).
func nodeChanged(oldObj, newObj any) bool {
	a, ok1 := oldObj.(*corev1.Node)
	b, ok2 := newObj.(*corev1.Node)
	if !ok1 || !ok2 {
		return true
	}
	return !maps.Equal(a.Labels, b.Labels) || a.Spec.ProviderID != b.Spec.ProviderID ||
		!a.Status.Allocatable[resourceGPU].Equal(b.Status.Allocatable[resourceGPU])
}
