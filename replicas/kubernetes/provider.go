// Package kubernetes is the provider that runs replicas as pods in Kubernetes clusters
// through client-go: one pod per replica, placed by node affinity on the capacity kind,
// zone and GPU the control plane chose, watched through informers. Each configured
// cluster is its own provider (kubernetes:<name>), so one service can spread across
// clusters and a cluster that stops answering is skipped while the others serve.
//
// It lives in its own package so that only the binaries that run a control plane link
// client-go.
package kubernetes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/coreclient"
)

// Provider runs replicas as pods in one cluster. It implements replicas.Provider.
type Provider struct {
	cfg     Config
	client  *coreclient.Client
	pods    cache.SharedIndexInformer // this owner's pods in the namespace
	nodes   cache.SharedIndexInformer
	notices chan replicas.Notice
	catalog func() (*pricing.Catalog, error)
	prices  func() (priceIndex, error)

	mu sync.Mutex
	// npRead is when the Karpenter NodePools were last read (npCache, npErr: what that
	// read found; karpenter.go).
	npRead  time.Time
	npCache []nodePool
	npErr   error
	// claimEnds: when Karpenter ends a node it is terminating, by node name, as its
	// NodeClaim says (karpenter.go; the zero time: it says none).
	claimEnds map[string]time.Time
	// changed is closed (and replaced) on every pod or node event, waking launches and
	// terminations that wait for the cluster to move.
	changed chan struct{}
	// noticed: pods already given a preemption notice; deleting: pods this provider is
	// deleting itself (their deletion is not a notice).
	noticed, deleting map[string]bool
	// healthErr is the last health check's error; nil when the apiserver answered.
	healthErr error
	checked   bool
	// watchErr is the informers' last list or watch error (a 403 from a Role that does not
	// grant what the provider needs), said by usable while the caches are not synced.
	watchErr error
}

const nodeIndex = "node"

var _ replicas.Provider = (*Provider)(nil)

// New returns the provider for one cluster and starts watching it until ctx ends. It
// does not wait for the cluster: one that cannot be reached is reported by every call
// (and by Quote, so placement skips it) until it answers.
func New(ctx context.Context, cfg Config) (*Provider, error) {
	if cfg.Owner == "" {
		return nil, errors.New("kubernetes provider: an owner is required")
	}
	cfg.defaults()
	rc := cfg.Rest
	if rc == nil {
		var err error
		if rc, err = cfg.restConfig(); err != nil {
			return nil, err
		}
	}
	rc.QPS, rc.Burst = max(rc.QPS, 50), max(rc.Burst, 100)
	rc.UserAgent = "arbiter-control-plane"
	client, err := coreclient.New(rc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.ProviderName(), err)
	}
	owner := labelValue(cfg.Owner)
	pods := client.Informer(coreclient.Pods, cfg.Namespace, &corev1.Pod{}, func(o *metav1.ListOptions) { o.LabelSelector = LabelOwner + "=" + owner })
	nodes := client.Informer(coreclient.Nodes, "", &corev1.Node{}, nil)
	p := &Provider{cfg: cfg, client: client, pods: pods, nodes: nodes,
		notices: make(chan replicas.Notice, 64), changed: make(chan struct{}), noticed: map[string]bool{}, deleting: map[string]bool{},
		claimEnds: map[string]time.Time{},
		catalog:   cfg.Catalog}
	if p.catalog == nil {
		p.catalog = sync.OnceValues(pricing.Embedded)
	}
	p.prices = sync.OnceValues(func() (priceIndex, error) {
		c, err := p.catalog()
		if err != nil {
			return priceIndex{}, err
		}
		return newPriceIndex(c), nil
	})
	if err := p.pods.AddIndexers(cache.Indexers{nodeIndex: func(obj any) ([]string, error) {
		if pod, ok := obj.(*corev1.Pod); ok && pod.Spec.NodeName != "" {
			return []string{pod.Spec.NodeName}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, err
	}
	for _, inf := range []cache.SharedIndexInformer{p.pods, p.nodes} {
		// A cluster that stops answering is the health check's to report, and the
		// reflector retries every second: a refusal (RBAC) is logged once per message.
		_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			p.mu.Lock()
			same := p.watchErr != nil && p.watchErr.Error() == err.Error()
			p.watchErr = err
			p.mu.Unlock()
			if !same && (apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)) {
				cfg.Log.Error("kubernetes: the control plane's account may not watch what it needs (see deploy/kubernetes/rbac.yaml)", "cluster", cfg.ProviderName(), "err", err)
			} else {
				cfg.Log.Debug("kubernetes watch error", "cluster", cfg.ProviderName(), "err", err)
			}
		})
	}
	if _, err := p.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.podEvent(obj) },
		UpdateFunc: func(_, obj any) { p.podEvent(obj) },
		DeleteFunc: func(obj any) { p.podGone(obj) },
	}); err != nil {
		return nil, err
	}
	if _, err := p.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.nodeEvent(obj, false) },
		UpdateFunc: func(_, obj any) { p.nodeEvent(obj, false) },
		DeleteFunc: func(obj any) { p.nodeEvent(obj, true) },
	}); err != nil {
		return nil, err
	}
	go p.pods.RunWithContext(ctx)
	go p.nodes.RunWithContext(ctx)
	go p.watchHealth(ctx)
	return p, nil
}

// Name implements replicas.Provider.
func (p *Provider) Name() string { return p.cfg.ProviderName() }

// Namespace is where the provider's pods are.
func (p *Provider) Namespace() string { return p.cfg.Namespace }

// Setup implements replicas.Provider: nothing here, because each pod is a fresh container
// that runs the spec's setup itself before its run (LaunchSpec.Setup).
func (p *Provider) Setup(context.Context, string, int, string, string, map[string]string) error {
	return nil
}

// Notices implements replicas.Provider.
func (p *Provider) Notices() <-chan replicas.Notice { return p.notices }

// broadcast wakes whoever waits on the cluster. Caller holds p.mu.
func (p *Provider) broadcast() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Provider) wakeup() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// usable says why the cluster cannot be used now, or nil.
func (p *Provider) usable() error {
	p.mu.Lock()
	err, checked, watchErr := p.healthErr, p.checked, p.watchErr
	p.mu.Unlock()
	switch {
	case err != nil:
		return fmt.Errorf("cluster %s does not answer: %w", p.Name(), err)
	case !p.pods.HasSynced() || !p.nodes.HasSynced():
		if watchErr != nil {
			return fmt.Errorf("cluster %s: cannot list pods and nodes yet: %w", p.Name(), watchErr)
		}
		return fmt.Errorf("cluster %s: not reached yet", p.Name())
	case !checked:
		return fmt.Errorf("cluster %s: not reached yet", p.Name())
	}
	return nil
}

// watchHealth asks the apiserver's /readyz every HealthEvery: an informer keeps serving its
// last state when the cluster goes away, and placement must not take that for capacity.
func (p *Provider) watchHealth(ctx context.Context) {
	t := time.NewTicker(p.cfg.HealthEvery)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, max(p.cfg.HealthEvery/2, 2*time.Second))
		err := p.client.Ready(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		was, first := p.healthErr, !p.checked
		p.healthErr, p.checked = err, true
		p.broadcast()
		p.mu.Unlock()
		switch {
		case err != nil && (was == nil || first):
			p.cfg.Log.Error("kubernetes cluster does not answer; skipping it until it does", "cluster", p.Name(), "err", err)
		case err == nil && was != nil:
			p.cfg.Log.Info("kubernetes cluster answers again", "cluster", p.Name())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func handleOf(pod *corev1.Pod) string { return pod.Namespace + "/" + pod.Name }

func splitHandle(h string) (ns, name string, err error) {
	ns, name, ok := strings.Cut(h, "/")
	if !ok || ns == "" || name == "" {
		return "", "", fmt.Errorf("kubernetes handle %q: want namespace/pod", h)
	}
	return ns, name, nil
}

func (p *Provider) podEvent(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.broadcast()
	switch {
	case pod.DeletionTimestamp != nil:
		// Someone else is deleting it (an eviction, a drain, `kubectl delete`): the replica
		// has until the deletion's deadline.
		p.notice(pod, pod.DeletionTimestamp.Time, "the pod is being deleted")
	case disrupted(pod):
		p.notice(pod, p.cfg.Now().Add(secondsOf(p.cfg.GraceSeconds)), "the pod is marked for disruption (eviction or preemption)")
	case pod.Spec.NodeName != "":
		// Its node may have been tainted before this pod reached the cache (a restart).
		if n, ok := p.cachedNode(pod.Spec.NodeName); ok {
			if taints := terminationTaints(n); len(taints) > 0 {
				p.notice(pod, p.noticeEnds(n, taints), fmt.Sprintf("its node %s is tainted %s", n.Name, strings.Join(taints, ", ")))
			}
		}
	}
}

func (p *Provider) podGone(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.broadcast()
	if pod, ok := obj.(*corev1.Pod); ok {
		delete(p.noticed, handleOf(pod))
		delete(p.deleting, handleOf(pod))
		// A group's notice and deletion are the group's until its last pod is gone.
		if h := p.handleFor(pod); h != handleOf(pod) && !p.groupLeft(h) {
			delete(p.noticed, h)
			delete(p.deleting, h)
		}
	}
}

// nodeEvent turns a node about to be reclaimed (a termination taint) or gone into notices
// for the replicas on it.
func (p *Provider) nodeEvent(obj any, gone bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	node, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	taints := terminationTaints(node)
	if !gone && (slices.Contains(taints, taintKarpenterDisrupt) || node.DeletionTimestamp != nil) {
		p.readClaimEnd(node) // before the lock: it may ask the apiserver
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.broadcast()
	if gone {
		defer delete(p.claimEnds, node.Name)
	}
	var why string
	deadline := p.cfg.Now()
	switch {
	case gone:
		why = "its node " + node.Name + " is gone"
	case len(taints) > 0:
		why = fmt.Sprintf("its node %s is tainted %s", node.Name, strings.Join(taints, ", "))
		deadline = p.noticeEnds(node, taints)
	case node.DeletionTimestamp != nil:
		// Karpenter deletes the node of a NodeClaim it terminates before it taints it.
		why = "its node " + node.Name + " is being deleted"
		deadline = deadline.Add(secondsOf(p.cfg.GraceSeconds))
		if end := p.claimEnds[node.Name]; !end.IsZero() {
			deadline = later(end, p.cfg.Now())
		}
	default:
		return
	}
	objs, _ := p.pods.GetIndexer().ByIndex(nodeIndex, node.Name)
	for _, o := range objs {
		if pod, ok := o.(*corev1.Pod); ok {
			p.notice(pod, deadline, why)
		}
	}
}

// notice announces a pod's reclaim once, as its replica's: one pod of a multi-node
// replica takes the whole group. Caller holds p.mu.
func (p *Provider) notice(pod *corev1.Pod, deadline time.Time, why string) {
	h := p.handleFor(pod)
	if p.noticed[h] || p.deleting[h] || p.deleting[handleOf(pod)] {
		return
	}
	if n := podNodes(pod); n > 1 {
		why = fmt.Sprintf("node %s of %d (pod %s): %s", nodeRank(pod), n, pod.Name, why)
	}
	p.noticed[h] = true
	id := pod.Annotations[annReplicaID]
	p.cfg.Log.Info("kubernetes: replica will be reclaimed", "cluster", p.Name(), "replica", id, "pod", h, "why", why, "in", time.Until(deadline).Round(time.Second))
	n := replicas.Notice{ReplicaID: id, Handle: h, Deadline: deadline, Reason: why}
	// The informer's handler must not block on a control plane that reads slowly.
	go func() { p.notices <- n }()
}

// instance describes one of the provider's pods.
func (p *Provider) instance(pod *corev1.Pod) replicas.Instance {
	a := pod.Annotations
	in := replicas.Instance{ReplicaID: a[annReplicaID], Handle: handleOf(pod), Capacity: fleet.Capacity(a[annCapacity]),
		Region: a[annRegion], Zone: a[annZone]}
	in.PricePerHour, _ = strconv.ParseFloat(a[annPrice], 64)
	in.PriceSource = a[annPriceSource]
	if pod.Status.PodIP != "" {
		in.Address = net.JoinHostPort(pod.Status.PodIP, cmp.Or(a[annPort], strconv.Itoa(DefaultPort)))
	}
	return in
}

// fromCache reads one object of an informer's cache by key (namespace/name, or name).
func fromCache[T any](inf cache.SharedIndexInformer, key string) (*T, bool) {
	obj, ok, _ := inf.GetIndexer().GetByKey(key)
	if !ok {
		return nil, false
	}
	t, ok := obj.(*T)
	return t, ok
}

func (p *Provider) cached(handle string) (*corev1.Pod, bool) {
	return fromCache[corev1.Pod](p.pods, handle)
}

// get reads a pod from the cache, and from the apiserver when the cache has not seen it
// (yet): a pod just created may not have reached the informer.
func (p *Provider) get(ctx context.Context, handle string) (*corev1.Pod, error) {
	if pod, ok := p.cached(handle); ok {
		return pod, nil
	}
	ns, name, err := splitHandle(handle)
	if err != nil {
		return nil, err
	}
	return p.fetch(ctx, ns, name)
}

// fetch reads a pod from the apiserver, bypassing the cache.
func (p *Provider) fetch(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	if err := p.client.Get(ctx, coreclient.Pods, ns, name, pod); err != nil {
		return nil, err
	}
	return pod, nil
}

// nodeGone reports whether a node no longer exists: missing from the cache and confirmed
// by the apiserver (the cache may be catching up after a relist).
func (p *Provider) nodeGone(ctx context.Context, name string) bool {
	if _, ok := p.cachedNode(name); ok {
		return false
	}
	return apierrors.IsNotFound(p.client.Get(ctx, coreclient.Nodes, "", name, &corev1.Node{}))
}

func (p *Provider) cachedNode(name string) (*corev1.Node, bool) {
	return fromCache[corev1.Node](p.nodes, name)
}

// List implements replicas.Provider: every pod with this owner's label, running or not.
// A multi-node replica's pods are one instance.
func (p *Provider) List(context.Context) ([]replicas.Instance, error) {
	if err := p.usable(); err != nil {
		return nil, err
	}
	var pods []*corev1.Pod
	for _, obj := range p.pods.GetStore().List() {
		if pod, ok := obj.(*corev1.Pod); ok && pod.Annotations[annReplicaID] != "" {
			pods = append(pods, pod)
		}
	}
	return p.groupInstances(pods), nil
}

// Status implements replicas.Provider. A pod is gone when it was deleted, ended, sits on a
// node that no longer exists (nothing collects those without a controller-manager, and a
// real cluster's pod GC takes its time), or is stuck in a state it cannot leave by itself
// (a crash loop, a bad image); the reason is the pod's own. A multi-node replica is gone
// when any of its pods is.
func (p *Provider) Status(ctx context.Context, handle string) (replicas.Status, string, error) {
	if err := p.usable(); err != nil {
		return "", "", err
	}
	if pods := groupPods(handle); pods != nil {
		return p.statusGroup(ctx, handle, pods)
	}
	pod, err := p.get(ctx, handle)
	switch {
	case apierrors.IsNotFound(err):
		return replicas.StatusGone, "its pod was deleted", nil
	case err != nil:
		return "", "", err
	}
	switch {
	case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
		return replicas.StatusGone, fmt.Sprintf("its pod %s ended (%s): %s", pod.Name, pod.Status.Phase, podReason(pod)), nil
	case pod.Spec.NodeName != "" && p.nodeGone(ctx, pod.Spec.NodeName):
		return replicas.StatusGone, fmt.Sprintf("its node %s is gone", pod.Spec.NodeName), nil
	case fatal(pod):
		return replicas.StatusGone, fmt.Sprintf("its pod %s cannot run: %s", pod.Name, podReason(pod)), nil
	}
	return replicas.StatusRunning, "", nil
}

// Launch implements replicas.Provider: creates the replica's pod and returns once it runs
// with an IP. A pod the scheduler cannot place within UnschedulableSeconds is deleted and
// the launch refused with replicas.ErrNoCapacity; one whose image cannot be pulled, whose
// container crash-loops or that does not run within StartSeconds is deleted and the launch
// fails with the pod's own reason. If ctx ends first the pod is left: the control plane
// recorded the launch, and finds the pod by its labels when it comes back.
func (p *Provider) Launch(ctx context.Context, ls replicas.LaunchSpec) (replicas.Instance, error) {
	if err := p.usable(); err != nil {
		return replicas.Instance{}, fmt.Errorf("launch %s: %w: %v", ls.ReplicaID, replicas.ErrNoCapacity, err)
	}
	pool, ok := p.poolFor(ctx, ls)
	if !ok {
		return replicas.Instance{}, fmt.Errorf("launch %s: %w: cluster %s has no schedulable %s node of %s%s any more",
			ls.ReplicaID, replicas.ErrNoCapacity, p.Name(), ls.Capacity, cmp.Or(ls.InstanceType, ls.Accelerator, "that kind"), where(ls.Region, ls.Zone))
	}
	price := 0.0
	if ls.PricePerHour != nil {
		price = *ls.PricePerHour
	}
	ps := podSpec{namespace: p.cfg.Namespace, owner: p.cfg.Owner, image: cmp.Or(ls.Image, p.cfg.Image), port: cmp.Or(ls.Port, DefaultPort),
		grace: int64(p.cfg.GraceSeconds), serviceAccount: p.cfg.ServiceAccount, pullSecrets: p.cfg.ImagePullSecrets,
		accelKey: pool.accelKey, accelValues: pool.accelValues, poolLabels: pool.poolLabels}
	if n := ls.Nodes(); n > 1 {
		// The group's pods all go to this pool (the node affinity pins it): one whose nodes
		// could not hold them even empty never will.
		if slots := pool.slots(ls.AcceleratorCount); slots < n {
			return replicas.Instance{}, fmt.Errorf("launch %s: %w: cluster %s's %s %s nodes%s hold at most %d pods of %s, and the replica spans %d nodes",
				ls.ReplicaID, replicas.ErrNoCapacity, p.Name(), ls.Capacity, cmp.Or(ls.InstanceType, ls.Accelerator, "schedulable"), where(ls.Region, ls.Zone), slots, gpus(ls.AcceleratorCount), n)
		}
		return p.launchGroup(ctx, ls, ps, price)
	}
	pod := buildPod(ls, ps, price, 0)
	created := &corev1.Pod{}
	if err := p.client.Create(ctx, coreclient.Pods, ps.namespace, pod, created); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			// The apiserver may have created it all the same (a timeout on the answer): the
			// name is the replica's own, so delete by name rather than leave a GPU running.
			p.deleteQuietly(ps.namespace + "/" + pod.Name)
		}
		// AlreadyExists: each replica is launched once, so the name is taken by something
		// that is not this launch's; never adopt it.
		return replicas.Instance{}, fmt.Errorf("launch %s on %s: create pod: %w", ls.ReplicaID, p.Name(), err)
	}
	p.cfg.Log.Info("kubernetes pod created", "cluster", p.Name(), "replica", ls.ReplicaID, "pod", handleOf(created),
		"capacity", ls.Capacity, "zone", ls.Zone, "accelerator", ls.Accelerator, "image", ps.image)
	// Budgets run on this machine's clock from now, not from the apiserver's timestamps:
	// the two clocks need not agree.
	budget := secondsOf(p.cfg.UnschedulableSeconds)
	if pool.creator != "" {
		// Karpenter or an autoscaler creates the node this pod asks for: minutes, not a
		// scheduling pass; unless it says at once that it will not.
		budget = secondsOf(p.cfg.ProvisionSeconds)
		return p.awaitRunningOn(ctx, handleOf(created), p.cfg.Now(), budget, p.provisionerRefusal)
	}
	return p.awaitRunning(ctx, handleOf(created), p.cfg.Now(), budget)
}

// lostAfter is how long a launch waits on a cluster that does not answer before giving up
// on it (the pod is left to the control plane, which ends the replica by its ID once the
// cluster answers).
const lostAfter = 30 * time.Second

// awaitRunning waits for a launched pod to run, and how long it may wait for a
// node (budget) before the launch counts as refused.
func (p *Provider) awaitRunning(ctx context.Context, handle string, created time.Time, budget time.Duration) (replicas.Instance, error) {
	return p.awaitRunningOn(ctx, handle, created, budget, nil)
}

// refusalCheckEvery is how often a pending pod's provisioner is asked whether it refused.
const refusalCheckEvery = 3 * time.Second

// awaitRunningOn is awaitRunning where refused, if not nil, says (every few seconds while
// the pod waits for a node) that what would create its node will not: the launch is then
// refused at once.
func (p *Provider) awaitRunningOn(ctx context.Context, handle string, created time.Time, budget time.Duration,
	refused func(context.Context, *corev1.Pod) string) (replicas.Instance, error) {
	var asked time.Time
	var pullFailingSince, unusableSince time.Time
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		wake := p.wakeup()
		now := p.cfg.Now()
		if err := p.usable(); err != nil {
			if unusableSince.IsZero() {
				unusableSince = now
			} else if now.Sub(unusableSince) >= lostAfter {
				return replicas.Instance{}, fmt.Errorf("%w: launching pod %s: %v", replicas.ErrNoCapacity, handle, err)
			}
		} else {
			unusableSince = time.Time{}
		}
		pod, err := p.get(ctx, handle)
		fail := ""
		switch {
		case apierrors.IsNotFound(err):
			return replicas.Instance{}, fmt.Errorf("pod %s was deleted before it ran", handle)
		case err != nil:
			if ctx.Err() != nil {
				return replicas.Instance{}, ctx.Err()
			}
			p.cfg.Log.Debug("kubernetes: reading a launching pod", "pod", handle, "err", err)
		case pod.DeletionTimestamp != nil:
			return replicas.Instance{}, fmt.Errorf("pod %s is being deleted before it ran", handle)
		case pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP != "":
			return p.instance(pod), nil
		case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
			fail = fmt.Sprintf("pod %s ended before it served (%s): %s", handle, pod.Status.Phase, podReason(pod))
		case fatal(pod):
			fail = fmt.Sprintf("pod %s cannot run: %s", handle, podReason(pod))
		case slices.Contains(pullWaiting, waitingReason(pod)):
			if pullFailingSince.IsZero() {
				pullFailingSince = now
			} else if now.Sub(pullFailingSince) >= secondsOf(p.cfg.PullSeconds) {
				fail = fmt.Sprintf("pod %s: its image cannot be pulled: %s", handle, podReason(pod))
			}
		default:
			pullFailingSince = time.Time{}
			msg, ok := unschedulable(pod)
			if !ok && pod.Spec.NodeName == "" {
				// Not even looked at: no scheduler runs, or it is far behind. Past a generous
				// budget that is as good as no capacity here.
				msg, ok = "no scheduler has placed or refused it", now.Sub(created) >= budget+time.Minute
			}
			if refused != nil && pod.Spec.NodeName == "" && now.Sub(asked) >= refusalCheckEvery {
				asked = now
				if why := refused(ctx, pod); why != "" {
					p.deleteQuietly(handle)
					return replicas.Instance{}, fmt.Errorf("%w on %s: pod %s: %s", replicas.ErrNoCapacity, p.Name(), handle, why)
				}
			}
			if ok && now.Sub(created) >= budget {
				p.deleteQuietly(handle)
				return replicas.Instance{}, fmt.Errorf("%w on %s: pod %s unschedulable for %s: %s", replicas.ErrNoCapacity, p.Name(), handle,
					now.Sub(created).Round(time.Second), msg)
			}
			if pod.Spec.NodeName != "" && now.Sub(created) >= secondsOf(p.cfg.StartSeconds) {
				fail = fmt.Sprintf("pod %s scheduled on %s but not running after %s (%s)", handle, pod.Spec.NodeName, secondsOf(p.cfg.StartSeconds), podReason(pod))
			}
		}
		if fail != "" {
			p.deleteQuietly(handle)
			return replicas.Instance{}, errors.New(fail)
		}
		select {
		case <-ctx.Done():
			return replicas.Instance{}, ctx.Err()
		case <-wake:
		case <-tick.C:
		}
	}
}

// deleteQuietly deletes a pod a failed launch leaves behind; the control plane terminates
// the replica by its ID anyway, so a failure here is only logged.
func (p *Provider) deleteQuietly(handle string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Terminate(ctx, handle); err != nil {
		p.cfg.Log.Warn("kubernetes: deleting a pod whose launch failed", "pod", handle, "err", err)
	}
}

// forceAfter is how long past its deletion deadline a pod may stay before it is deleted
// with no grace: its kubelet is gone (a reclaimed node) and nothing else will finish it.
const forceAfter = 30 * time.Second

// Terminate implements replicas.Provider: deletes the pod with its grace period and returns
// once the apiserver no longer has it. A pod whose node is gone, or that outlives its
// deletion deadline by forceAfter, is deleted with no grace, as the pod garbage collector
// of a full cluster would. A multi-node replica's pods are all deleted at once.
func (p *Provider) Terminate(ctx context.Context, handle string) error {
	if pods := groupPods(handle); pods != nil {
		return p.terminateGroup(ctx, handle, pods)
	}
	ns, name, err := splitHandle(handle)
	if err != nil {
		return err
	}
	if err := p.usable(); err != nil {
		// A cluster that does not answer cannot confirm anything; the caller retries.
		return fmt.Errorf("terminate %s: %w", handle, err)
	}
	p.mu.Lock()
	p.deleting[handle] = true
	p.mu.Unlock()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	asked, forced := false, false
	var askedAt time.Time
	for {
		wake := p.wakeup()
		// From the apiserver, not the cache: after the cluster was lost and came back, the
		// informer may take its reflector's backoff (up to a minute) to drop a deleted pod,
		// and the replica is gone once the apiserver says so.
		pod, err := p.fetch(ctx, ns, name)
		if apierrors.IsNotFound(err) {
			return nil
		} else if err != nil {
			return fmt.Errorf("terminate %s on %s: %w", handle, p.Name(), err)
		} else {
			var grace *int64
			nodeGone := pod.Spec.NodeName != "" && p.nodeGone(ctx, pod.Spec.NodeName)
			// Past the grace period and forceAfter, by this machine's clock from our own
			// delete, its kubelet is not going to finish it.
			late := asked && p.cfg.Now().After(askedAt.Add(secondsOf(p.cfg.GraceSeconds)+p.cfg.forceAfter))
			if nodeGone || late || pod.Spec.NodeName == "" {
				zero := int64(0)
				grace = &zero
			}
			if !asked || grace != nil && !forced {
				uid := pod.UID
				err := p.client.Delete(ctx, coreclient.Pods, ns, name, metav1.DeleteOptions{GracePeriodSeconds: grace, Preconditions: &metav1.Preconditions{UID: &uid}})
				switch {
				case apierrors.IsConflict(err):
					// The pod was replaced since we read it (another UID): read it again and ask again.
				case err != nil && !apierrors.IsNotFound(err):
					return fmt.Errorf("terminate %s on %s: %w", handle, p.Name(), err)
				default:
					if !asked {
						askedAt = p.cfg.Now()
					}
					asked, forced = true, grace != nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("terminate %s on %s: %w", handle, p.Name(), ctx.Err())
		case <-wake:
		case <-tick.C:
		}
	}
}

// maxLogChunk bounds one ReplicaLogs answer.
const maxLogChunk = 1 << 20

// ReplicaLogs implements control.LogFetcher: the replica container's output from offset,
// through the apiserver; while the container is restarting (a crash loop), its previous
// run's output, which says why.
func (p *Provider) ReplicaLogs(ctx context.Context, replicaID string, offset int64) ([]byte, error) {
	name := PodName(p.cfg.Owner, replicaID)
	pod, err := p.get(ctx, p.cfg.Namespace+"/"+name)
	if apierrors.IsNotFound(err) {
		// A multi-node replica launched as a LeaderWorkerSet: its leader's.
		name = LWSName(p.cfg.Owner, replicaID) + "-0"
		pod, err = p.get(ctx, p.cfg.Namespace+"/"+name)
	}
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", p.cfg.Namespace, name, err)
	}
	previous := false
	for _, cs := range pod.Status.ContainerStatuses {
		previous = cs.Name == containerName && cs.State.Running == nil && cs.RestartCount > 0
	}
	return podLogs(ctx, p.client, pod.Namespace, pod.Name, previous, offset)
}

func podLogs(ctx context.Context, client *coreclient.Client, ns, name string, previous bool, offset int64) ([]byte, error) {
	limit := offset + maxLogChunk
	b, err := client.Logs(ctx, ns, name, &corev1.PodLogOptions{Container: containerName, Previous: previous, LimitBytes: &limit})
	if err != nil {
		return nil, err
	}
	if offset >= int64(len(b)) {
		return nil, nil
	}
	return b[offset:], nil
}
