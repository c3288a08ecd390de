package kubernetes

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/arbiter-serve/arbiter/replicas"
)

// Where the cluster serves the LeaderWorkerSet API (leaderworkerset.x-k8s.io/v1, the
// kubernetes-sigs/lws project: https://lws.sigs.k8s.io/docs/reference/leaderworkerset.v1/),
// a multi-node replica is one LeaderWorkerSet of one group (replicas: 1) of num_nodes pods
// instead of bare pods: its controller creates the leader (the head, rank 0) from the
// leader template and the workers from the worker template, and with the restart policy
// RecreateGroupOnPodRestart recreates the whole group when any of its pods or containers
// restarts, so a group never runs half-restarted. Both templates are the pod group's pods
// (buildPod): the same env, ports, node affinity, zone affinity to the group's other pods
// and downward API volume for every node's IP. Where the API is absent (discovery answers
// 404), the provider creates the pod group itself (group.go).
//
// The controller names the pods from the LeaderWorkerSet's name: the leader <name>-0 and
// worker i <name>-0-i (the API's documented naming, group index 0), so the replica's
// handle is the pod group's form over those names, and everything that reads a group
// (Status, List, notices) reads an LWS group alike. A worker's rank is the worker index
// the controller gives it (the LWS_WORKER_INDEX variable and the worker-index label): one
// worker template serves every worker.
//
// A recreated group is a new group to Arbiter: its pods get new IPs, and the head's
// address is the replica's. So the first failure of any node is the replica's end, as
// for the pod group (its notice, then Status gone), and a group the controller has
// recreated since (its pods lack the node-IP annotation the launch gave them) reads as
// gone; the control plane replaces the replica by a new one (a new LeaderWorkerSet) and
// Terminate deletes the old LeaderWorkerSet and its pods.

// The LeaderWorkerSet API as far as the provider uses it (fields and names from the
// API reference above).
const (
	lwsGroupVersion = "leaderworkerset.x-k8s.io/v1"
	lwsResource     = "leaderworkersets"
	// LabelLWSName and LabelLWSWorkerIndex are set by the LeaderWorkerSet controller on
	// every pod it creates.
	LabelLWSName        = "leaderworkerset.sigs.k8s.io/name"
	LabelLWSWorkerIndex = "leaderworkerset.sigs.k8s.io/worker-index"
	// LWSRecreateGroup is the restart policy that recreates the whole group.
	LWSRecreateGroup = "RecreateGroupOnPodRestart"
)

// LeaderWorkerSet is the object the provider creates (apiVersion leaderworkerset.x-k8s.io/v1).
type LeaderWorkerSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              LeaderWorkerSetSpec `json:"spec"`
}

// LeaderWorkerSetSpec is a LeaderWorkerSet's spec.
type LeaderWorkerSetSpec struct {
	Replicas             *int32               `json:"replicas,omitempty"`
	LeaderWorkerTemplate LeaderWorkerTemplate `json:"leaderWorkerTemplate"`
	// StartupPolicy LeaderCreated starts the workers with the leader (they wait for every
	// node's IP anyway).
	StartupPolicy string `json:"startupPolicy,omitempty"`
}

// LeaderWorkerTemplate is the group's shape: its size (pods, leader included), the
// leader's and the workers' pod templates, and the restart policy.
type LeaderWorkerTemplate struct {
	LeaderTemplate *corev1.PodTemplateSpec `json:"leaderTemplate,omitempty"`
	WorkerTemplate corev1.PodTemplateSpec  `json:"workerTemplate"`
	Size           *int32                  `json:"size,omitempty"`
	RestartPolicy  string                  `json:"restartPolicy,omitempty"`
}

// LWSName is the LeaderWorkerSet of a multi-node replica: its ID with a hash of the owner,
// cut so that its workers' pod names (<name>-0-<index>) stay DNS labels.
func LWSName(owner, replicaID string) string {
	name := NodePodName(owner, replicaID, 0)
	const room = 63 - len("-0-") - 3 // up to 999 workers
	if len(name) > room {
		// Keep the hash at the end: it is what tells two long IDs apart.
		h := name[strings.LastIndexByte(name, '-'):]
		name = strings.TrimRight(name[:room-len(h)], "-") + h
	}
	return name
}

// lwsHandle is the handle of an LWS group of n pods: its pods as the controller names them.
func lwsHandle(ns, name string, n int) string {
	names := []string{name + "-0"}
	for i := 1; i < n; i++ {
		names = append(names, name+"-0-"+strconv.Itoa(i))
	}
	return ns + "/" + strings.Join(names, groupSep)
}

// lwsOf is the LeaderWorkerSet a group handle's pods belong to, or "" for a pod group:
// an LWS leader's name ends in its group index, -0, where a pod group's head ends in
// the 6-character hash of NodePodName.
func lwsOf(handle string) string {
	pods := groupPods(handle)
	if pods == nil {
		return ""
	}
	_, head, _ := strings.Cut(pods[0], "/")
	if name, ok := strings.CutSuffix(head, "-0"); ok {
		return name
	}
	return ""
}

// nodeRank is a group pod's rank: Arbiter's annotation on a pod group's pods and an LWS
// leader, the controller's worker index on an LWS worker.
func nodeRank(pod *corev1.Pod) string {
	if r, ok := pod.Annotations[annNodeRank]; ok {
		return r
	}
	return pod.Labels[LabelLWSWorkerIndex]
}

// servesLWS asks the apiserver (discovery) whether it serves LeaderWorkerSets now: asked on
// each multi-node launch, so a cluster that installs the API later gets it.
func (p *Provider) servesLWS(ctx context.Context) bool {
	ok, err := p.client.Serves(ctx, lwsGroupVersion, lwsResource)
	if err != nil {
		p.cfg.Log.Warn("kubernetes: discovery of the LeaderWorkerSet API failed; launching a pod group", "cluster", p.Name(), "err", err)
	}
	return ok
}

// buildLWS is the LeaderWorkerSet of a multi-node replica: the leader template is the pod
// group's head pod, the worker template its rank-1 pod without the rank (the controller
// gives each worker its index).
func buildLWS(ls replicas.LaunchSpec, ps podSpec, price float64) *LeaderWorkerSet {
	n := int32(ls.Nodes())
	one := int32(1)
	name := LWSName(ps.owner, ls.ReplicaID)
	leader, worker := buildPod(ls, ps, price, 0), buildPod(ls, ps, price, 1)
	delete(worker.Labels, LabelNodeRank)
	delete(worker.Annotations, annNodeRank)
	env := worker.Spec.Containers[0].Env[:0]
	for _, e := range worker.Spec.Containers[0].Env {
		if e.Name != "SKYPILOT_NODE_RANK" { // the launcher takes it from LWS_WORKER_INDEX
			env = append(env, e)
		}
	}
	worker.Spec.Containers[0].Env = env
	template := func(pod *corev1.Pod) corev1.PodTemplateSpec {
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: pod.Labels, Annotations: pod.Annotations}, Spec: pod.Spec}
	}
	lt := template(leader)
	return &LeaderWorkerSet{
		TypeMeta: metav1.TypeMeta{APIVersion: lwsGroupVersion, Kind: "LeaderWorkerSet"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ps.namespace,
			Labels: map[string]string{LabelManagedBy: "arbiter", LabelOwner: labelValue(ps.owner), LabelService: labelValue(ls.Service),
				LabelVersion: strconv.Itoa(ls.Version), LabelReplica: labelValue(ls.ReplicaID)},
			Annotations: map[string]string{annReplicaID: ls.ReplicaID}},
		Spec: LeaderWorkerSetSpec{Replicas: &one, StartupPolicy: "LeaderCreated", LeaderWorkerTemplate: LeaderWorkerTemplate{
			LeaderTemplate: &lt, WorkerTemplate: template(worker), Size: &n, RestartPolicy: LWSRecreateGroup}},
	}
}

// createLWS creates a multi-node replica's LeaderWorkerSet and returns its group's handle.
func (p *Provider) createLWS(ctx context.Context, ls replicas.LaunchSpec, ps podSpec, price float64) (string, error) {
	lws := buildLWS(ls, ps, price)
	handle := lwsHandle(ps.namespace, lws.Name, ls.Nodes())
	if err := p.client.CreateJSON(ctx, lwsGroupVersion, lwsResource, ps.namespace, lws, nil); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			p.deleteQuietly(handle) // the apiserver may have created it all the same
		}
		return "", fmt.Errorf("launch %s on %s: create the LeaderWorkerSet %s: %w", ls.ReplicaID, p.Name(), lws.Name, err)
	}
	p.cfg.Log.Info("kubernetes LeaderWorkerSet created", "cluster", p.Name(), "replica", ls.ReplicaID, "leaderworkerset", lws.Name,
		"size", ls.Nodes(), "capacity", ls.Capacity, "zone", ls.Zone, "accelerator", ls.Accelerator, "image", ps.image)
	return handle, nil
}

// deleteLWS deletes a group's LeaderWorkerSet (first, so its controller recreates
// nothing while its pods go); gone already is fine.
func (p *Provider) deleteLWS(ctx context.Context, handle string) error {
	name := lwsOf(handle)
	if name == "" {
		return nil
	}
	ns, _, _ := strings.Cut(handle, "/")
	background := metav1.DeletePropagationBackground
	err := p.client.DeleteJSON(ctx, lwsGroupVersion, lwsResource, ns, name, metav1.DeleteOptions{PropagationPolicy: &background})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("terminate %s on %s: delete the LeaderWorkerSet %s: %w", handle, p.Name(), name, err)
	}
	return nil
}

// recreated reports whether an LWS group's pod is not the one the launch started: the
// launch annotated each of its pods with the nodes' IPs, and a pod the controller made
// since (recreating the group) has only its template's annotations. Read from the
// apiserver before saying so: the cache may not have the launch's annotation yet.
func (p *Provider) recreated(ctx context.Context, pod *corev1.Pod) bool {
	if _, ok := pod.Annotations[annNodeIPs]; ok {
		return false
	}
	fresh, err := p.fetch(ctx, pod.Namespace, pod.Name)
	if err != nil {
		return false // Status reads it as gone by itself if it is
	}
	_, ok := fresh.Annotations[annNodeIPs]
	return !ok
}
