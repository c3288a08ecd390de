package kubernetes

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/arbiter-serve/arbiter/fleet"
)

// Capacity the cluster creates on demand (issue 47): a Karpenter NodePool (karpenter.sh/v1)
// is read through the API and offers every GPU machine its requirements admit, in each zone
// they admit, of each capacity type they admit, priced from the catalogs of the cloud its
// node class names, although no node of it exists yet. A replica placed on such an offer is
// a pod pinned to the NodePool, the capacity type, the machine type and the zone: Karpenter
// creates the node that pod asks for, and the launch waits for it (ProvisionSeconds)
// rather than calling the pod unschedulable.

const (
	karpenterGroupVersion = "karpenter.sh/v1"
	karpenterNodePools    = "nodepools"
	// annKarpenterDoNotDisrupt keeps Karpenter's voluntary disruptions off a pod.
	annKarpenterDoNotDisrupt = "karpenter.sh/do-not-disrupt"
	// nodePoolsEvery bounds how often the NodePools are read: quotes come every tick.
	nodePoolsEvery = 15 * time.Second

	labelOS              = "kubernetes.io/os"
	labelArch            = "kubernetes.io/arch"
	labelAWSFamily       = "karpenter.k8s.aws/instance-family"
	labelAWSCategory     = "karpenter.k8s.aws/instance-category"
	labelAWSGPUCount     = "karpenter.k8s.aws/instance-gpu-count"
	labelAWSGPUMaker     = "karpenter.k8s.aws/instance-gpu-manufacturer"
	labelAWSGeneration   = "karpenter.k8s.aws/instance-generation"
	labelAWSInstanceSize = "karpenter.k8s.aws/instance-size"
)

// nodePool is the part of a karpenter.sh/v1 NodePool that says what it can create.
type nodePool struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Template struct {
			Spec struct {
				Requirements []npRequirement `json:"requirements"`
				NodeClassRef struct {
					Group string `json:"group"`
					Kind  string `json:"kind"`
					Name  string `json:"name"`
				} `json:"nodeClassRef"`
				Taints []corev1.Taint `json:"taints"`
			} `json:"spec"`
		} `json:"template"`
		Limits map[string]resource.Quantity `json:"limits"`
	} `json:"spec"`
	Status struct {
		Resources  map[string]resource.Quantity `json:"resources"`
		Conditions []struct {
			Type    string `json:"type"`
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"conditions"`
	} `json:"status"`
}

// notReady is why Karpenter says the NodePool cannot create nodes (its Ready condition
// False: its node class missing or not ready, its spec invalid), or "": ready, or not yet
// judged.
func (np *nodePool) notReady() string {
	for _, c := range np.Status.Conditions {
		if c.Type == "Ready" && c.Status == "False" {
			return cmp.Or(c.Message, "Ready is False")
		}
	}
	return ""
}

type nodePoolList struct {
	Items []nodePool `json:"items"`
}

// npRequirement is a NodePool's requirement on a node label (Karpenter's operators).
type npRequirement struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values"`
}

// admits says whether a node whose label key is value (known: the node has the label)
// meets the requirement. Gt, Lt, Gte and Lte compare integers, as Karpenter does.
func (r npRequirement) admits(value string, known bool) bool {
	switch r.Operator {
	case "In":
		return known && slices.Contains(r.Values, value)
	case "NotIn":
		return !known || !slices.Contains(r.Values, value)
	case "Exists":
		return known
	case "DoesNotExist":
		return !known
	case "Gt", "Lt", "Gte", "Lte":
		if !known || len(r.Values) != 1 {
			return false
		}
		v, err1 := strconv.Atoi(value)
		bound, err2 := strconv.Atoi(r.Values[0])
		if err1 != nil || err2 != nil {
			return false
		}
		switch r.Operator {
		case "Gt":
			return v > bound
		case "Lt":
			return v < bound
		case "Gte":
			return v >= bound
		}
		return v <= bound
	}
	return false
}

// karpenterCapacity is Karpenter's name of a capacity kind (karpenter.sh/capacity-type).
func karpenterCapacity(c fleet.Capacity) string {
	if c == fleet.OnDemand {
		return "on-demand"
	}
	return string(c)
}

// cloudOfNodeClass is the cloud a NodePool's node class creates machines in ("" when its
// group names none: KWOK's, or a provider the catalogs do not cover).
func cloudOfNodeClass(group string) string {
	switch {
	case group == "karpenter.k8s.aws":
		return "aws"
	case group == "karpenter.azure.com":
		return "azure"
	case strings.Contains(group, "gcp") || strings.Contains(group, "gke"):
		return "gcp"
	}
	return ""
}

// candidate is one machine a NodePool could create: a catalog's GPU machine type, of one
// capacity kind, in one zone (by name, as pods pin it; "" for any of the region's).
type candidate struct {
	instanceType, accel string
	count               int
	capacity            fleet.Capacity
	zone                string
}

// labels are the well-known labels a node of this machine would carry, as Karpenter's AWS
// provider sets them, for its requirements to be checked against; a label it sets that is
// not here (kubernetes.io/arch) is taken as matching.
func (c candidate) labels(cloud, region string) map[string]string {
	l := map[string]string{
		labelInstanceType: c.instanceType,
		labelKarpenterCap: karpenterCapacity(c.capacity),
		labelRegion:       region,
		labelOS:           "linux",
	}
	if c.zone != "" {
		l[labelZone] = c.zone
	}
	if cloud == "aws" {
		family, size, _ := strings.Cut(c.instanceType, ".")
		l[labelAWSFamily], l[labelAWSInstanceSize] = family, size
		i := strings.IndexFunc(family, func(r rune) bool { return r >= '0' && r <= '9' })
		if i > 0 {
			l[labelAWSCategory] = family[:i]
			gen := family[i:]
			if j := strings.IndexFunc(gen, func(r rune) bool { return r < '0' || r > '9' }); j > 0 {
				gen = gen[:j]
			}
			l[labelAWSGeneration] = gen
		}
		l[labelKarpenterGPU] = strings.ToLower(c.accel)
		l[labelAWSGPUCount] = strconv.Itoa(c.count)
		l[labelAWSGPUMaker] = "nvidia"
		if strings.HasPrefix(strings.ToUpper(c.accel), "MI") || strings.HasPrefix(strings.ToUpper(c.accel), "RADEON") {
			l[labelAWSGPUMaker] = "amd"
		}
	}
	return l
}

// admittedBy says whether every requirement of the NodePool admits the candidate, and, if
// not, the first that does not. A requirement on a label this reading does not know
// (arch, a team's own label, which Karpenter puts on the node) admits.
func (c candidate) admittedBy(reqs []npRequirement, l map[string]string) (bool, string) {
	known := map[string]bool{labelArch: true}
	for k := range l {
		known[k] = true
	}
	hasCapacity := false
	for _, r := range reqs {
		if r.Key == labelKarpenterCap {
			hasCapacity = true
		}
		if r.Key == labelArch || !known[r.Key] && r.Key != labelZone {
			continue
		}
		v, ok := l[r.Key]
		if r.Key == labelZone && !ok {
			continue // any zone: the zones it admits are offered one by one
		}
		if !r.admits(v, ok) {
			return false, fmt.Sprintf("%s %s %v", r.Key, r.Operator, r.Values)
		}
	}
	// Without a capacity-type requirement Karpenter launches on-demand only.
	if !hasCapacity && c.capacity != fleet.OnDemand {
		return false, labelKarpenterCap + " not required (on-demand only)"
	}
	return true, ""
}

// untolerated is the first of a NodePool's taints that a replica pod of capacity c does not
// tolerate (buildPod's tolerations: nvidia.com/gpu, and the platforms' spot taints on spot
// pods), or "": Karpenter would not create a node for such a pod there.
func untolerated(taints []corev1.Taint, c fleet.Capacity) string {
	for _, t := range taints {
		if t.Effect == corev1.TaintEffectPreferNoSchedule || t.Key == string(resourceGPU) {
			continue
		}
		if c == fleet.Spot && t.Effect == corev1.TaintEffectNoSchedule && spotTolerated(t.Key, t.Value) {
			continue
		}
		return fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect)
	}
	return ""
}

// zonesOf lists the zones a NodePool's requirements name (In), or nil: any zone.
func zonesOf(reqs []npRequirement) []string {
	for _, r := range reqs {
		if r.Key == labelZone && r.Operator == "In" {
			return r.Values
		}
	}
	return nil
}

// gpuRoom is how many more GPUs the NodePool's limits let it create (-1: no GPU limit).
func (np *nodePool) gpuRoom() int64 {
	limit, ok := np.Spec.Limits[string(resourceGPU)]
	if !ok {
		return -1
	}
	used := np.Status.Resources[string(resourceGPU)]
	return max(limit.Value()-used.Value(), 0)
}

// readNodePools lists the cluster's Karpenter NodePools, at most every nodePoolsEvery
// (none, without error, where Karpenter is not installed).
func (p *Provider) readNodePools(ctx context.Context) ([]nodePool, error) {
	p.mu.Lock()
	if !p.npRead.IsZero() && p.cfg.Now().Sub(p.npRead) < nodePoolsEvery {
		defer p.mu.Unlock()
		return p.npCache, p.npErr
	}
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var list nodePoolList
	err := p.client.ListJSON(ctx, karpenterGroupVersion, karpenterNodePools, "", &list)
	if apierrors.IsNotFound(err) {
		err, list.Items = nil, nil // no Karpenter here
	} else if err != nil {
		err = fmt.Errorf("read Karpenter NodePools (%s %s; deploy/kubernetes/rbac.yaml grants list): %w", karpenterGroupVersion, karpenterNodePools, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.npRead, p.npCache, p.npErr = p.cfg.Now(), list.Items, err
	return list.Items, err
}

// nodePoolPools turns the NodePools into offers of capacity to be created: one pool per
// GPU machine type, capacity kind and zone each admits and the catalogs price, skipping
// what existing nodes offer already (have). notes say what a NodePool could not offer.
func (p *Provider) nodePoolPools(nps []nodePool, nodes []nodeInfo, have map[poolKey]bool) (out []*pool, notes []string) {
	if len(nps) == 0 {
		return nil, nil
	}
	idx, err := p.prices()
	if err != nil {
		return nil, []string{"Karpenter NodePools not priced: the price catalogs did not load: " + err.Error()}
	}
	region, zoneIDs := p.cfg.Region, map[string]string{}
	for _, ni := range nodes {
		region = cmp.Or(region, ni.region)
		if ni.zone != "" && ni.zoneID != "" {
			zoneIDs[ni.zone] = ni.zoneID // the account's mapping of zone names to AZ ids
		}
	}
	for i := range nps {
		np := &nps[i]
		name := np.Metadata.Name
		reqs := np.Spec.Template.Spec.Requirements
		cloud := cloudOfNodeClass(np.Spec.Template.Spec.NodeClassRef.Group)
		if why := np.notReady(); why != "" {
			notes = append(notes, fmt.Sprintf("Karpenter NodePool %s is not ready: %s", name, why))
			continue
		}
		if region == "" {
			notes = append(notes, fmt.Sprintf("Karpenter NodePool %s: no region to price it in (no node says one; set region: in the providers file)", name))
			continue
		}
		room := np.gpuRoom()
		zones := zonesOf(reqs)
		if len(zones) == 0 {
			zones = []string{""}
		}
		seen := map[string]bool{}
		offered, untol := 0, ""
		for _, o := range idx.gpuOffers {
			if o.Region != region || cloud != "" && o.Provider != cloud ||
				cloud == "" && len(idx.clouds[o.InstanceType]) != 1 {
				continue
			}
			if room >= 0 && int64(o.AcceleratorCount) > room {
				continue
			}
			for _, z := range zones {
				c := candidate{instanceType: o.InstanceType, accel: o.Accelerator, count: o.AcceleratorCount, capacity: o.Capacity, zone: z}
				k := poolKey{region: region, zone: z, accel: o.Accelerator, instanceType: o.InstanceType, capacity: o.Capacity, nodePool: -1}
				id := fmt.Sprint(k)
				if seen[id] || have[k] {
					continue
				}
				if ok, _ := c.admittedBy(reqs, c.labels(o.Provider, region)); !ok {
					continue
				}
				if taint := untolerated(np.Spec.Template.Spec.Taints, o.Capacity); taint != "" {
					untol = taint
					continue
				}
				seen[id] = true
				ni := nodeInfo{cloud: o.Provider, cloudBy: "Karpenter NodePool " + name, region: region, zone: z, zoneID: zoneIDs[z],
					instanceType: o.InstanceType, capacity: o.Capacity}
				price, source, why := idx.lookup(ni)
				pl := &pool{key: k, cloud: o.Provider, zoneID: ni.zoneID, gpusPerNode: int64(o.AcceleratorCount), accelKey: "",
					creator: "Karpenter NodePool " + name, pricePerGPU: price, priced: why == "", priceSource: source, unpricedWhy: why}
				pl.poolLabels = map[string]string{labelKarpenterPool: name, labelKarpenterCap: karpenterCapacity(o.Capacity)}
				out = append(out, pl)
				offered++
			}
		}
		switch {
		case offered > 0:
		case untol != "":
			notes = append(notes, fmt.Sprintf("Karpenter NodePool %s taints its nodes %s, which Arbiter's replica pods do not tolerate", name, untol))
		case room == 0:
			limit := np.Spec.Limits[string(resourceGPU)]
			notes = append(notes, fmt.Sprintf("Karpenter NodePool %s is at its nvidia.com/gpu limit (%s)", name, limit.String()))
		default:
			notes = append(notes, fmt.Sprintf("Karpenter NodePool %s: no GPU machine type of the %s catalog in %s meets its requirements", name, cmp.Or(cloud, "matching"), region))
		}
	}
	slices.SortFunc(out, func(a, b *pool) int {
		return cmp.Or(strings.Compare(a.creator, b.creator), strings.Compare(a.key.zone, b.key.zone), strings.Compare(string(a.key.capacity), string(b.key.capacity)),
			strings.Compare(a.key.instanceType, b.key.instanceType))
	})
	return out, notes
}

// provisionerRefusal is the answer of what creates nodes on demand that it will not create
// one for a pending pod, from the pod's events, or "" if it has said none: Karpenter's
// "Failed to schedule pod, …" (FailedScheduling: the NodePool at its limits, the offering
// out of capacity, nothing compatible); the cluster autoscaler's NotTriggerScaleUp ("pod
// didn't trigger scale-up: … max node group size reached") and FailedScaleUp ("Node scale
// up in zones … associated with this pod failed: GCE out of resources"). Without one a
// launch on such capacity waits out ProvisionSeconds.
func (p *Provider) provisionerRefusal(ctx context.Context, pod *corev1.Pod) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var evs corev1.EventList
	if err := p.client.List(ctx, "events", pod.Namespace, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod.Name}, &evs); err != nil {
		p.cfg.Log.Debug("kubernetes: reading a pending pod's events", "pod", handleOf(pod), "err", err)
		return ""
	}
	for _, e := range evs.Items {
		if e.InvolvedObject.UID != pod.UID {
			continue
		}
		switch from := cmp.Or(e.Source.Component, e.ReportingController); {
		case from == "karpenter" && e.Reason == "FailedScheduling":
			return "Karpenter: " + e.Message
		case from == "cluster-autoscaler" && (e.Reason == "NotTriggerScaleUp" || e.Reason == "FailedScaleUp"):
			return "cluster autoscaler: " + e.Message
		}
	}
	return ""
}

const (
	karpenterNodeClaims = "nodeclaims"
	// annClaimEnds is when Karpenter will end a NodeClaim it is deleting, whatever still
	// runs on it: written (RFC 3339) when a NodeClaim of a NodePool with a
	// terminationGracePeriod is deleted (an interruption, an expiry, a drift).
	annClaimEnds = "karpenter.sh/nodeclaim-termination-timestamp"
	// awsSpotNotice is EC2's spot interruption notice: Karpenter's interruption handling
	// deletes the NodeClaim when the warning arrives, two minutes before the reclaim.
	awsSpotNotice = 2 * time.Minute
)

// readClaimEnd records when Karpenter ends a node it is terminating (deleted, tainted
// karpenter.sh/disrupted), from the NodeClaim that owns it: read once per node, and again
// only if the read failed. A node no NodeClaim owns records none.
func (p *Provider) readClaimEnd(node *corev1.Node) {
	p.mu.Lock()
	_, known := p.claimEnds[node.Name]
	p.mu.Unlock()
	if known {
		return
	}
	claim := ""
	for _, o := range node.OwnerReferences {
		if o.Kind == "NodeClaim" && strings.HasPrefix(o.APIVersion, "karpenter.sh/") {
			claim = o.Name
		}
	}
	var end time.Time
	if claim != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var nc struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := p.client.GetJSON(ctx, karpenterGroupVersion, karpenterNodeClaims, "", claim, &nc); err != nil {
			p.cfg.Log.Warn("kubernetes: reading the NodeClaim of a node Karpenter is terminating (deploy/kubernetes/rbac.yaml grants get)", "node", node.Name, "nodeclaim", claim, "err", err)
			return
		}
		if v := nc.Metadata.Annotations[annClaimEnds]; v != "" {
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				p.cfg.Log.Warn("kubernetes: a NodeClaim's termination time is not RFC 3339; the notice is the default", "nodeclaim", claim, annClaimEnds, v)
			}
			end = t
		}
	}
	p.mu.Lock()
	p.claimEnds[node.Name] = end
	p.mu.Unlock()
}

// noticeEnds is when a node with termination taints goes: the end its Karpenter NodeClaim
// says (readClaimEnd), else for a spot node of EC2 that Karpenter is terminating the spot
// notice, else the platform's notice (noticeFor). Caller holds p.mu.
func (p *Provider) noticeEnds(node *corev1.Node, taints []string) time.Time {
	now := p.cfg.Now()
	if !slices.Contains(taints, taintKarpenterDisrupt) {
		return now.Add(noticeFor(taints))
	}
	if end := p.claimEnds[node.Name]; !end.IsZero() {
		return later(end, now)
	}
	if isSpot(node.Labels) && strings.HasPrefix(node.Spec.ProviderID, "aws://") {
		return now.Add(awsSpotNotice)
	}
	return now.Add(noticeFor(taints))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
