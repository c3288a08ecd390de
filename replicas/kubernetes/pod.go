package kubernetes

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
)

// Labels and annotations on every pod Arbiter creates. The owner label is the only thing
// that finds a control plane's pods after a crash (List selects on it); the rest say what
// the pod is to someone reading `kubectl get pods --show-labels`.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelOwner     = "arbiter.dev/owner"
	LabelService   = "arbiter.dev/service"
	LabelVersion   = "arbiter.dev/version"
	LabelReplica   = "arbiter.dev/replica"

	annReplicaID = "arbiter.dev/replica-id" // the whole ID (a label value is capped at 63)
	annCapacity  = "arbiter.dev/capacity"
	annRegion    = "arbiter.dev/region"
	annZone      = "arbiter.dev/zone"
	annPrice     = "arbiter.dev/price-per-hour"
	annPort      = "arbiter.dev/port"
	// annPriceSource is the rule that priced the replica (PRICED BY), so that a control
	// plane that reattaches after a crash still knows it.
	annPriceSource = "arbiter.dev/price-source"
	// A replica of num_nodes N is N pods (see group.go): each says its rank and N, and
	// annNodeIPs, set on every pod once all have IPs, lists them (head first) for the
	// launcher to read through the downward API.
	annNodes      = "arbiter.dev/nodes"
	annNodeRank   = "arbiter.dev/node-rank"
	annNodeIPs    = "arbiter.dev/node-ips"
	LabelNodeRank = "arbiter.dev/node-rank"

	containerName = "replica"
	// DefaultPort is the replica port when the spec names none.
	DefaultPort = 8000
)

// launcher runs the spec's setup, then execs its run, both as written (bash), from
// environment variables so that no quoting of the user's commands is needed. A node of a
// multi-node replica waits between the two for the file that lists every node's IP (the
// downward API's copy of annNodeIPs, written once all the group's pods have IPs), and
// runs with it as SKYPILOT_NODE_IPS. A worker of a LeaderWorkerSet (lws.go) takes its rank
// from the worker index the LWS controller gives it (LWS_WORKER_INDEX).
const launcher = `if [ -n "$ARBITER_SETUP" ]; then bash -c "$ARBITER_SETUP" || { echo "arbiter: setup failed (exit $?)" >&2; exit 1; }; fi; ` +
	`if [ -n "$ARBITER_NODE_IPS_FILE" ]; then export SKYPILOT_NODE_RANK="${SKYPILOT_NODE_RANK:-$LWS_WORKER_INDEX}"; echo "arbiter: node $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES waits for every node's IP" >&2; ` +
	`while [ ! -s "$ARBITER_NODE_IPS_FILE" ]; do sleep 0.5; done; export SKYPILOT_NODE_IPS="$(cat "$ARBITER_NODE_IPS_FILE")"; fi; ` +
	`exec bash -c "$ARBITER_RUN"`

// nodeInfoDir is where a multi-node replica's pods see their downward API volume, and
// nodeIPsFile the file in it that holds annNodeIPs.
const (
	nodeInfoDir  = "/etc/arbiter"
	nodeIPsFile  = "node-ips"
	nodeInfoName = "arbiter-nodes"
)

// podSpec is what buildPod needs besides the launch itself.
type podSpec struct {
	namespace, owner, image string
	port                    int
	grace                   int64
	serviceAccount          string
	pullSecrets             []string
	// accelValues are the values of accelKey that name the wanted GPU on this cluster's
	// nodes (nvidia-h100-80gb on GKE, NVIDIA-H100-80GB-HBM3 under GPU feature discovery).
	accelKey    string
	accelValues []string
	// poolLabels, if set, select the node pool a configured price was given for: they
	// replace the platform's capacity labels in the affinity.
	poolLabels map[string]string
}

// PodName is the pod a replica runs as (the head's, rank 0, for a multi-node replica):
// its ID with a hash of the owner, so that two control planes sharing a namespace never
// collide, cut to a DNS label.
func PodName(owner, replicaID string) string { return NodePodName(owner, replicaID, 0) }

// NodePodName is the pod of a replica's node rank: PodName for the head, the same with
// -n<rank> before the hash for a worker.
func NodePodName(owner, replicaID string, rank int) string {
	h := strconv.FormatUint(xxhash.Sum64String(owner+"/"+replicaID), 36)[:6]
	suffix := "-" + h
	if rank > 0 {
		suffix = "-n" + strconv.Itoa(rank) + suffix
	}
	base := dnsLabel(replicaID)
	if len(base) > 63-len(suffix) {
		base = strings.TrimRight(base[:63-len(suffix)], "-")
	}
	return base + suffix
}

// dnsLabel lower-cases s and replaces what a DNS label cannot hold with '-'.
func dnsLabel(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	return strings.Trim(string(b), "-")
}

// labelValue returns s if it is a valid label value, else a hash of it.
func labelValue(s string) string {
	ok := len(s) <= 63
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
	}
	if ok && s != "" && isAlnum(s[0]) && isAlnum(s[len(s)-1]) {
		return s
	}
	return "h-" + strconv.FormatUint(xxhash.Sum64String(s), 36)
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// buildPod is the pod for one replica, or for node rank of a multi-node one: the image,
// the setup-then-run launcher with the spec's envs, the GPU limit, and a required node
// affinity that admits only nodes of the capacity kind, zone, GPU and instance type
// placement chose.
func buildPod(ls replicas.LaunchSpec, ps podSpec, price float64, rank int) *corev1.Pod {
	seq := ls.ReplicaID[strings.LastIndexByte(ls.ReplicaID, '-')+1:]
	env := []corev1.EnvVar{
		{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "PORT", Value: strconv.Itoa(ps.port)},
		{Name: replicas.EnvReplicaID, Value: ls.ReplicaID},
		{Name: "SKYPILOT_SERVE_REPLICA_ID", Value: seq},
		{Name: "SKYPILOT_NUM_GPUS_PER_NODE", Value: strconv.Itoa(max(ls.AcceleratorCount, 0))},
		{Name: "SKYPILOT_NODE_RANK", Value: strconv.Itoa(rank)},
		{Name: "SKYPILOT_NUM_NODES", Value: strconv.Itoa(ls.Nodes())},
	}
	if ls.Nodes() == 1 {
		// One node: its own IP is the whole list, known when the container starts.
		env = append(env, corev1.EnvVar{Name: "SKYPILOT_NODE_IPS", Value: "$(POD_IP)"})
	} else {
		env = append(env, corev1.EnvVar{Name: "ARBITER_NODE_IPS_FILE", Value: nodeInfoDir + "/" + nodeIPsFile})
	}
	keys := make([]string, 0, len(ls.Envs))
	for k := range ls.Envs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = append(env, corev1.EnvVar{Name: k, Value: ls.Envs[k]})
	}
	env = append(env, corev1.EnvVar{Name: "ARBITER_SETUP", Value: ls.Setup}, corev1.EnvVar{Name: "ARBITER_RUN", Value: ls.Run})

	res := corev1.ResourceRequirements{}
	var tolerations []corev1.Toleration
	if ls.AcceleratorCount > 0 {
		q := *resource.NewQuantity(int64(ls.AcceleratorCount), resource.DecimalSI)
		res.Limits = corev1.ResourceList{resourceGPU: q}
		// GKE and AKS taint GPU nodes so that only pods asking for GPUs land there.
		tolerations = append(tolerations, corev1.Toleration{Key: string(resourceGPU), Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	}
	if ls.Capacity == fleet.Spot {
		for _, s := range spotLabels {
			if spotTolerated(s.key, s.value) {
				tolerations = append(tolerations, corev1.Toleration{Key: s.key, Operator: corev1.TolerationOpEqual, Value: s.value, Effect: corev1.TaintEffectNoSchedule})
			}
		}
	}
	noToken := false
	shm := corev1.Volume{Name: "dshm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: NodePodName(ps.owner, ls.ReplicaID, rank), Namespace: ps.namespace,
			Labels: map[string]string{LabelManagedBy: "arbiter", LabelOwner: labelValue(ps.owner), LabelService: labelValue(ls.Service),
				LabelVersion: strconv.Itoa(ls.Version), LabelReplica: labelValue(ls.ReplicaID)},
			Annotations: map[string]string{annReplicaID: ls.ReplicaID, annCapacity: string(ls.Capacity), annRegion: ls.Region, annZone: ls.Zone,
				annPrice: strconv.FormatFloat(price, 'g', -1, 64), annPort: strconv.Itoa(ps.port)},
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: containerName, Image: ps.image, Command: []string{"/bin/bash", "-c", launcher}, Env: env, Resources: res,
				Ports:        []corev1.ContainerPort{{Name: "http", ContainerPort: int32(ps.port), Protocol: corev1.ProtocolTCP}},
				VolumeMounts: []corev1.VolumeMount{{Name: shm.Name, MountPath: "/dev/shm"}},
			}},
			// A crash restarts in place (the node and the image are already there); a crash
			// loop is reported as the replica's failure and the control plane replaces it.
			RestartPolicy:                 corev1.RestartPolicyAlways,
			TerminationGracePeriodSeconds: &ps.grace,
			ServiceAccountName:            ps.serviceAccount,
			// Replicas never call the Kubernetes API.
			AutomountServiceAccountToken: &noToken,
			Tolerations:                  tolerations,
			Volumes:                      []corev1.Volume{shm},
			Affinity:                     &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: nodeTerms(ls, ps)}}},
		},
	}
	if ls.PriceSource != "" {
		pod.Annotations[annPriceSource] = ls.PriceSource
	}
	if n := ls.Nodes(); n > 1 {
		groupPod(pod, ls, ps, rank)
	}
	// config.kubernetes.custom_metadata, as SkyPilot sets it on its pods; Arbiter's own
	// keys win, since List and Status find replicas by them.
	for k, v := range ls.PodLabels {
		if _, ours := pod.Labels[k]; !ours {
			pod.Labels[k] = v
		}
	}
	for k, v := range ls.PodAnnotations {
		if _, ours := pod.Annotations[k]; !ours {
			pod.Annotations[k] = v
		}
	}
	// Karpenter moves pods to consolidate nodes, replace drifted or expired ones: Arbiter
	// places, rebalances and drains its replicas itself, and a replica moved by eviction
	// would drop the answers it is streaming. Voluntary disruption waits for Arbiter to end
	// the pod (its node is then empty, and consolidated); a spot interruption does not wait,
	// and reaches Arbiter as a notice. custom_metadata may say otherwise.
	if _, set := pod.Annotations[annKarpenterDoNotDisrupt]; !set {
		pod.Annotations[annKarpenterDoNotDisrupt] = "true"
	}
	// volumes: each an existing PersistentVolumeClaim by name, mounted at its path.
	for i, v := range ls.Volumes {
		name := "vol-" + strconv.Itoa(i)
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: name,
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.Name}}})
		c := &pod.Spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: v.Path})
	}
	for _, s := range ps.pullSecrets {
		pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
	}
	return pod
}

// groupPod makes pod node rank of a multi-node replica: its rank and the group's size as
// label and annotations, the downward API volume through which the launcher reads every
// node's IP, and a required pod affinity that keeps it in the zone of the group's other
// pods.
//
// The zone (topology.kubernetes.io/zone) is the one domain every platform labels alike
// (GKE, EKS, AKS, Karpenter); it bounds the latency and the cross-zone traffic bill
// between the nodes of a tensor- or pipeline-parallel engine. A node pool is not a finer
// domain worth naming: each platform labels pools its own way, and the node affinity
// already pins the pool's machine type and capacity kind. The affinity is only written
// where the nodes carry a zone (placement chose one): a required term's topology key must
// be on the node, and a cluster without zone labels has no domain to name.
func groupPod(pod *corev1.Pod, ls replicas.LaunchSpec, ps podSpec, rank int) {
	pod.Labels[LabelNodeRank] = strconv.Itoa(rank)
	pod.Annotations[annNodes] = strconv.Itoa(ls.Nodes())
	pod.Annotations[annNodeRank] = strconv.Itoa(rank)
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: nodeInfoName, VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
		Items: []corev1.DownwardAPIVolumeFile{{Path: nodeIPsFile, FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + annNodeIPs + "']"}}}}}})
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: nodeInfoName, MountPath: nodeInfoDir, ReadOnly: true})
	if ls.Zone != "" {
		pod.Spec.Affinity.PodAffinity = &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelOwner: labelValue(ps.owner), LabelReplica: labelValue(ls.ReplicaID)}},
			TopologyKey:   labelZone,
		}}}
	}
}

// spotTolerated says whether a spot replica's pod tolerates a NoSchedule taint key=value:
// GKE spot pools may be tainted with their label; AKS spot pools always are.
func spotTolerated(key, value string) bool {
	return slices.ContainsFunc(spotLabels, func(s struct{ key, value string }) bool {
		return s.key == key && s.value == value && (key == labelGKESpot || key == labelGKEPreemptible || key == labelAKSPriority)
	})
}

// nodeTerms is the required node affinity: any one term admits a node (terms are ORed,
// expressions within one are ANDed). Spot gets one term per platform's spot label, so the
// same pod spec works on GKE, EKS, Karpenter and AKS; on-demand excludes every spot label
// (NotIn also admits a node without the label).
func nodeTerms(ls replicas.LaunchSpec, ps podSpec) []corev1.NodeSelectorTerm {
	var common []corev1.NodeSelectorRequirement
	in := func(key string, values ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpIn, Values: values}
	}
	if ls.Zone != "" {
		common = append(common, in(labelZone, ls.Zone))
	}
	// A Karpenter NodePool creates nodes in its cluster's one region, and the region label
	// is not among those its providers all set (KWOK's does not): pinned by the pool.
	if _, created := ps.poolLabels[labelKarpenterPool]; ls.Region != "" && !created {
		common = append(common, in(labelRegion, ls.Region))
	}
	if ps.accelKey != "" && len(ps.accelValues) > 0 {
		common = append(common, in(ps.accelKey, ps.accelValues...))
	}
	if ls.InstanceType != "" {
		common = append(common, in(labelInstanceType, ls.InstanceType))
	}
	term := func(extra ...corev1.NodeSelectorRequirement) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: append(slices.Clone(common), extra...)}
	}
	if len(ps.poolLabels) > 0 {
		keys := make([]string, 0, len(ps.poolLabels))
		for k := range ps.poolLabels {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var extra []corev1.NodeSelectorRequirement
		for _, k := range keys {
			extra = append(extra, in(k, ps.poolLabels[k]))
		}
		return []corev1.NodeSelectorTerm{term(extra...)}
	}
	switch ls.Capacity {
	case fleet.Spot:
		terms := make([]corev1.NodeSelectorTerm, 0, len(spotLabels))
		for _, s := range spotLabels {
			terms = append(terms, term(in(s.key, s.value)))
		}
		return terms
	case fleet.Reserved:
		return []corev1.NodeSelectorTerm{term(in(labelKarpenterCap, "reserved"))}
	default:
		var not []corev1.NodeSelectorRequirement
		for _, s := range spotLabels {
			not = append(not, corev1.NodeSelectorRequirement{Key: s.key, Operator: corev1.NodeSelectorOpNotIn, Values: []string{s.value}})
		}
		return []corev1.NodeSelectorTerm{term(not...)}
	}
}

// podReason says why a pod cannot run: the waiting or terminated reason of its container
// with the kubelet's message, or the pod's own; "" if nothing is wrong.
func podReason(p *corev1.Pod) string {
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" && w.Reason != "PodInitializing" {
			return strings.TrimSpace(w.Reason + ": " + w.Message + lastExit(cs))
		}
		if t := cs.State.Terminated; t != nil {
			return fmt.Sprintf("%s (exit %d): %s", t.Reason, t.ExitCode, t.Message)
		}
	}
	if p.Status.Reason != "" {
		return p.Status.Reason + ": " + p.Status.Message
	}
	return ""
}

func lastExit(cs corev1.ContainerStatus) string {
	if t := cs.LastTerminationState.Terminated; t != nil {
		return fmt.Sprintf(" (last exit %d, %s, %d restarts)", t.ExitCode, t.Reason, cs.RestartCount)
	}
	return ""
}

// fatalWaiting are container waiting reasons that end a replica: the kubelet would keep
// trying, but the pod will not serve without someone changing the spec or the image.
var fatalWaiting = []string{"CrashLoopBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}

// pullWaiting are waiting reasons that may be transient (a registry hiccup): fatal only
// once they last.
var pullWaiting = []string{"ErrImagePull", "ImagePullBackOff"}

// crashLoopRestarts is how many restarts make a CrashLoopBackOff a crash loop: the kubelet
// shows that reason in the back-off after the very first crash too, and one crash is
// something a restart in place should heal.
const crashLoopRestarts = 3

// fatal reports whether the replica container is stuck where it cannot serve without a
// change to the spec or the image.
func fatal(p *corev1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != containerName || cs.State.Waiting == nil {
			continue
		}
		r := cs.State.Waiting.Reason
		if r == "CrashLoopBackOff" {
			return cs.RestartCount >= crashLoopRestarts
		}
		return slices.Contains(fatalWaiting, r)
	}
	return false
}

// waitingReason returns the replica container's waiting reason, if any.
func waitingReason(p *corev1.Pod) string {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == containerName && cs.State.Waiting != nil {
			return cs.State.Waiting.Reason
		}
	}
	return ""
}

// unschedulable returns the scheduler's message when it has found no node for the pod.
func unschedulable(p *corev1.Pod) (string, bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message, true
		}
	}
	return "", false
}

// disrupted reports whether the pod is marked for disruption (an eviction, the taint
// manager, a preemption by a higher-priority pod).
func disrupted(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
