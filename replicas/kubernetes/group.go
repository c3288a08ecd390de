package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/kubernetes/coreclient"
)

// A replica of num_nodes N > 1 is a group of N pods: the head (rank 0, named as a
// one-node replica's pod, so its logs are the replica's) and N-1 workers, all labelled
// with the replica, placed in one zone (groupPod), launched, probed through the head,
// billed, noticed and terminated together. Its handle is the namespace and every pod,
// head first: "ns/head,worker-1,…", so that Status finds the group gone when any pod is
// gone and Terminate ends them all, as the local provider's process groups do.
//
// SKYPILOT_NODE_IPS needs every pod's IP, known only once each pod has one. SkyPilot
// sets it when it submits the job, after provisioning. Here each pod's launcher waits
// for it: once every pod of the group runs with an IP, the provider annotates each
// with the list (head first), and the kubelet writes the annotation into the pod's
// downward API volume, where the launcher reads it. A kubelet refreshes such a volume on
// its periodic sync of the pod, so on a real cluster the nodes start their run: up to
// about a minute (the kubelet's sync period) after the last pod runs.

// groupSep joins a group's pod names in its handle (a pod name never holds one).
const groupSep = ","

// groupHandle is the handle of replicaID's n pods in ns.
func (p *Provider) groupHandle(ns, replicaID string, n int) string {
	names := make([]string, n)
	for r := range n {
		names[r] = NodePodName(p.cfg.Owner, replicaID, r)
	}
	return ns + "/" + strings.Join(names, groupSep)
}

// handleFor is the handle of the replica pod belongs to: its own, or its group's.
func (p *Provider) handleFor(pod *corev1.Pod) string {
	if n := podNodes(pod); n > 1 && pod.Labels[LabelLWSName] != "" {
		return lwsHandle(pod.Namespace, pod.Labels[LabelLWSName], n)
	} else if n > 1 {
		return p.groupHandle(pod.Namespace, pod.Annotations[annReplicaID], n)
	}
	return handleOf(pod)
}

// podNodes is how many nodes the replica of pod spans (1 for a one-pod replica).
func podNodes(pod *corev1.Pod) int {
	n, err := strconv.Atoi(pod.Annotations[annNodes])
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// groupPods splits a group's handle into one handle per pod, head first; nil for a
// one-pod handle.
func groupPods(handle string) []string {
	ns, names, ok := strings.Cut(handle, "/")
	if !ok || !strings.Contains(names, groupSep) {
		return nil
	}
	var out []string
	for _, n := range strings.Split(names, groupSep) {
		out = append(out, ns+"/"+n)
	}
	return out
}

// launchGroup creates a multi-node replica's pods (through a LeaderWorkerSet where the
// cluster serves the API, lws.go, else itself), waits until every one runs with an IP
// (the same budgets as one pod's launch: a pod the scheduler cannot place in time is no
// capacity for the whole group), gives each the list of IPs, and returns the replica with
// the head's address. When one pod fails the others are deleted too: the group is all or
// nothing. If ctx ends first the pods are left, as for one pod.
func (p *Provider) launchGroup(ctx context.Context, ls replicas.LaunchSpec, ps podSpec, price float64) (replicas.Instance, error) {
	n := ls.Nodes()
	created := p.cfg.Now()
	var handle string
	if p.servesLWS(ctx) {
		h, err := p.createLWS(ctx, ls, ps, price)
		if err != nil {
			return replicas.Instance{}, err
		}
		handle = h
		if err := p.awaitControllerPods(ctx, handle, created); err != nil {
			if ctx.Err() == nil {
				p.deleteQuietly(handle)
			}
			return replicas.Instance{}, fmt.Errorf("launch %s: %w", ls.ReplicaID, err)
		}
	} else {
		handle = p.groupHandle(ps.namespace, ls.ReplicaID, n)
		for rank := range n {
			pod := buildPod(ls, ps, price, rank)
			if err := p.client.Create(ctx, coreclient.Pods, ps.namespace, pod, &corev1.Pod{}); err != nil {
				// The name is the replica's own: delete every pod of the group by name, those
				// this launch made and any the apiserver made despite an error, but never one
				// that existed before (AlreadyExists on the first pod: someone else's).
				if rank > 0 || !apierrors.IsAlreadyExists(err) {
					p.deleteQuietly(handle)
				}
				return replicas.Instance{}, fmt.Errorf("launch %s on %s: create the pod of node %d of %d: %w", ls.ReplicaID, p.Name(), rank, n, err)
			}
		}
		p.cfg.Log.Info("kubernetes pod group created", "cluster", p.Name(), "replica", ls.ReplicaID, "pods", handle,
			"capacity", ls.Capacity, "zone", ls.Zone, "accelerator", ls.Accelerator, "image", ps.image)
	}
	pods := groupPods(handle)

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ins := make([]replicas.Instance, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for rank := range n {
		wg.Go(func() {
			ins[rank], errs[rank] = p.awaitRunning(wctx, pods[rank], created, secondsOf(p.cfg.UnschedulableSeconds))
			if errs[rank] != nil {
				cancel() // one node failed: the group will not run, stop waiting for the others
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return replicas.Instance{}, ctx.Err()
	}
	for rank, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			p.deleteQuietly(handle)
			return replicas.Instance{}, fmt.Errorf("launch %s: node %d of %d: %w", ls.ReplicaID, rank, n, err)
		}
	}

	ips := make([]string, n)
	for rank, in := range ins {
		host, _, err := net.SplitHostPort(in.Address)
		if err != nil {
			p.deleteQuietly(handle)
			return replicas.Instance{}, fmt.Errorf("launch %s: node %d of %d: address %q: %w", ls.ReplicaID, rank, n, in.Address, err)
		}
		ips[rank] = host
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{annNodeIPs: strings.Join(ips, "\n")}}})
	if err != nil {
		return replicas.Instance{}, err
	}
	for rank, h := range pods {
		ns, name, _ := splitHandle(h)
		if err := p.client.MergePatch(ctx, coreclient.Pods, ns, name, patch, &corev1.Pod{}); err != nil {
			if ctx.Err() != nil {
				return replicas.Instance{}, ctx.Err()
			}
			p.deleteQuietly(handle)
			return replicas.Instance{}, fmt.Errorf("launch %s: give node %d of %d the nodes' IPs: %w", ls.ReplicaID, rank, n, err)
		}
	}
	head := ins[0]
	head.Handle = handle
	return head, nil
}

// statusGroup is Status for a group: gone as soon as one pod is, with that pod's reason,
// or, for an LWS group, as soon as its controller has recreated one.
func (p *Provider) statusGroup(ctx context.Context, handle string, pods []string) (replicas.Status, string, error) {
	lws := lwsOf(handle) != ""
	for rank, h := range pods {
		st, why, err := p.Status(ctx, h)
		if err != nil || st != replicas.StatusRunning {
			if why != "" {
				why = fmt.Sprintf("node %d of %d: %s", rank, len(pods), why)
			}
			return st, why, err
		}
		if pod, err := p.get(ctx, h); lws && err == nil && p.recreated(ctx, pod) {
			return replicas.StatusGone, fmt.Sprintf("node %d of %d: its LeaderWorkerSet recreated the group (pod %s is a new one)", rank, len(pods), pod.Name), nil
		}
	}
	return replicas.StatusRunning, "", nil
}

// awaitControllerPods waits until the LeaderWorkerSet controller has created every pod
// of an LWS group. A cluster that serves the API but runs no controller (or one far
// behind) is as good as no capacity past the budget for a pod no scheduler looks at.
func (p *Provider) awaitControllerPods(ctx context.Context, handle string, created time.Time) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		wake := p.wakeup()
		missing := ""
		for _, h := range groupPods(handle) {
			if _, err := p.get(ctx, h); apierrors.IsNotFound(err) {
				missing = h
				break
			} else if err != nil && ctx.Err() == nil {
				p.cfg.Log.Debug("kubernetes: reading a LeaderWorkerSet's pod", "pod", h, "err", err)
				missing = h
			}
		}
		if missing == "" {
			return nil
		}
		if budget := secondsOf(p.cfg.UnschedulableSeconds) + time.Minute; p.cfg.Now().Sub(created) >= budget {
			return fmt.Errorf("%w on %s: no LeaderWorkerSet controller created pod %s within %s (is the LeaderWorkerSet controller running?)",
				replicas.ErrNoCapacity, p.Name(), missing, budget)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		case <-tick.C:
		}
	}
}

// terminateGroup ends every pod of a group at once and returns when all are gone.
func (p *Provider) terminateGroup(ctx context.Context, handle string, pods []string) error {
	p.mu.Lock()
	p.deleting[handle] = true
	p.mu.Unlock()
	if err := p.deleteLWS(ctx, handle); err != nil {
		return err
	}
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i, h := range pods {
		wg.Go(func() { errs[i] = p.Terminate(ctx, h) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// groupInstances folds the pods of each multi-node replica into one instance: the
// head's, with the group's handle; a group whose head is gone is still listed (without
// an address), so the control plane ends what is left of it.
func (p *Provider) groupInstances(pods []*corev1.Pod) []replicas.Instance {
	var out []replicas.Instance
	groups := map[string]int{} // group handle → index in out
	for _, pod := range pods {
		in := p.instance(pod)
		if podNodes(pod) == 1 {
			out = append(out, in)
			continue
		}
		h := p.handleFor(pod)
		in.Handle = h
		head := nodeRank(pod) == "0"
		if !head {
			in.Address = ""
		}
		if i, ok := groups[h]; ok {
			if head {
				out[i] = in
			}
			continue
		}
		groups[h] = len(out)
		out = append(out, in)
	}
	return out
}

// groupLeft reports whether any pod of the group handle is still in the cache.
func (p *Provider) groupLeft(handle string) bool {
	for _, h := range groupPods(handle) {
		if _, ok := p.cached(h); ok {
			return true
		}
	}
	return false
}
