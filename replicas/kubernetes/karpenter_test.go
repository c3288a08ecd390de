package kubernetes

import (
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/arbiter-serve/arbiter/fleet"
)

// Karpenter's requirement operators, as its NodePool API defines them (In, NotIn, Exists,
// DoesNotExist, Gt, Lt, Gte, Lte), on a node that has the label or not.
func TestNodePoolRequirementOperators(t *testing.T) {
	for _, tc := range []struct {
		op     string
		values []string
		value  string
		known  bool
		want   bool
	}{
		{"In", []string{"spot", "on-demand"}, "spot", true, true},
		{"In", []string{"spot"}, "on-demand", true, false},
		{"In", []string{"spot"}, "", false, false},
		{"NotIn", []string{"p5"}, "g6", true, true},
		{"NotIn", []string{"g6"}, "g6", true, false},
		{"NotIn", []string{"g6"}, "", false, true},
		{"Exists", nil, "x", true, true},
		{"Exists", nil, "", false, false},
		{"DoesNotExist", nil, "", false, true},
		{"DoesNotExist", nil, "x", true, false},
		{"Gt", []string{"4"}, "5", true, true},
		{"Gt", []string{"4"}, "4", true, false},
		{"Gte", []string{"4"}, "4", true, true},
		{"Lt", []string{"2"}, "1", true, true},
		{"Lt", []string{"2"}, "4", true, false},
		{"Lte", []string{"2"}, "2", true, true},
		{"Gt", []string{"4"}, "many", true, false},
		{"Gt", []string{"4"}, "", false, false},
		{"Sometimes", []string{"x"}, "x", true, false},
	} {
		r := npRequirement{Key: "k", Operator: tc.op, Values: tc.values}
		if got := r.admits(tc.value, tc.known); got != tc.want {
			t.Errorf("%s %v on %q (labelled %v) = %v; want %v", tc.op, tc.values, tc.value, tc.known, got, tc.want)
		}
	}
}

// Which machines a NodePool admits, read from the labels Karpenter's AWS provider puts on
// its nodes (instance family, category, generation, size, GPU name, count and maker, the
// capacity type, the zone): requirements written as Karpenter's docs and EKS's GPU
// examples write them. Without a capacity-type requirement Karpenter launches on-demand
// only; a requirement on a label this reading does not know (the architecture, a team's
// own label) admits.
func TestNodePoolAdmitsMachines(t *testing.T) {
	g6 := candidate{instanceType: "g6.xlarge", accel: "L4", count: 1, capacity: fleet.Spot, zone: "us-east-1a"}
	p5 := candidate{instanceType: "p5.48xlarge", accel: "H100", count: 8, capacity: fleet.OnDemand}
	g6od := g6
	g6od.capacity = fleet.OnDemand
	req := func(key, op string, values ...string) npRequirement {
		return npRequirement{Key: key, Operator: op, Values: values}
	}
	spotOrOD := req(labelKarpenterCap, "In", "spot", "on-demand")
	for _, tc := range []struct {
		name string
		c    candidate
		reqs []npRequirement
		want bool
	}{
		{"family g6, spot or on-demand", g6, []npRequirement{spotOrOD, req(labelAWSFamily, "In", "g6", "g6e")}, true},
		{"category g, generation over 5", g6, []npRequirement{spotOrOD, req(labelAWSCategory, "In", "g"), req(labelAWSGeneration, "Gt", "5")}, true},
		{"category p only", g6, []npRequirement{spotOrOD, req(labelAWSCategory, "In", "p")}, false},
		{"GPU name l4", g6, []npRequirement{spotOrOD, req(labelKarpenterGPU, "In", "l4")}, true},
		{"GPU name h100", g6, []npRequirement{spotOrOD, req(labelKarpenterGPU, "In", "h100")}, false},
		{"at least 8 GPUs", p5, []npRequirement{req(labelAWSGPUCount, "Gte", "8")}, true},
		{"fewer than 2 GPUs", p5, []npRequirement{req(labelAWSGPUCount, "Lt", "2")}, false},
		{"nvidia", p5, []npRequirement{req(labelAWSGPUMaker, "In", "nvidia")}, true},
		{"spot not required: on-demand only", g6, []npRequirement{req(labelAWSFamily, "In", "g6")}, false},
		{"spot not required, on-demand machine", g6od, []npRequirement{req(labelAWSFamily, "In", "g6")}, true},
		{"spot only", g6od, []npRequirement{req(labelKarpenterCap, "In", "spot")}, false},
		{"its zone", g6, []npRequirement{spotOrOD, req(labelZone, "In", "us-east-1a", "us-east-1b")}, true},
		{"another zone", g6, []npRequirement{spotOrOD, req(labelZone, "In", "us-east-1c")}, false},
		{"instance type named", g6, []npRequirement{spotOrOD, req(labelInstanceType, "In", "g6.xlarge")}, true},
		{"instance type excluded", g6, []npRequirement{spotOrOD, req(labelInstanceType, "NotIn", "g6.xlarge")}, false},
		{"arch and a team label", g6, []npRequirement{spotOrOD, req(labelArch, "In", "amd64"), req("team", "In", "ml")}, true},
		{"linux", g6, []npRequirement{spotOrOD, req(labelOS, "In", "linux")}, true},
	} {
		ok, why := tc.c.admittedBy(tc.reqs, tc.c.labels("aws", "us-east-1"))
		if ok != tc.want {
			t.Errorf("%s: admitted %v (%s); want %v", tc.name, ok, why, tc.want)
		}
	}
}

// A NodePool Karpenter judged not ready (its node class missing, say) offers nothing; one
// not yet judged (no conditions) does.
func TestNodePoolReadiness(t *testing.T) {
	var np nodePool
	if why := np.notReady(); why != "" {
		t.Errorf("a NodePool with no conditions: not ready (%s)", why)
	}
	if err := json.Unmarshal([]byte(`{"status":{"conditions":[{"type":"NodeClassReady","status":"False","message":"NodeClass not found"},
		{"type":"Ready","status":"False","message":"NodeClassReady=False"}]}}`), &np); err != nil {
		t.Fatal(err)
	}
	if why := np.notReady(); why != "NodeClassReady=False" {
		t.Errorf("notReady = %q; want Karpenter's message", why)
	}
	if err := json.Unmarshal([]byte(`{"status":{"conditions":[{"type":"Ready","status":"True"}]}}`), &np); err != nil {
		t.Fatal(err)
	}
	if why := np.notReady(); why != "" {
		t.Errorf("a ready NodePool: %q", why)
	}
}

// A NodePool whose nodes carry a taint the replica pods do not tolerate offers nothing
// there: Karpenter would make no node for them. The pods tolerate the GPU taint, and the
// platforms' spot taints when spot.
func TestNodePoolTaints(t *testing.T) {
	gpu := corev1.Taint{Key: "nvidia.com/gpu", Effect: corev1.TaintEffectNoSchedule}
	aksSpot := corev1.Taint{Key: labelAKSPriority, Value: "spot", Effect: corev1.TaintEffectNoSchedule}
	team := corev1.Taint{Key: "team", Value: "ml", Effect: corev1.TaintEffectNoSchedule}
	soft := corev1.Taint{Key: "team", Value: "ml", Effect: corev1.TaintEffectPreferNoSchedule}
	for _, tc := range []struct {
		taints []corev1.Taint
		c      fleet.Capacity
		want   string
	}{
		{nil, fleet.Spot, ""},
		{[]corev1.Taint{gpu, soft}, fleet.OnDemand, ""},
		{[]corev1.Taint{gpu, aksSpot}, fleet.Spot, ""},
		{[]corev1.Taint{aksSpot}, fleet.OnDemand, labelAKSPriority + "=spot:NoSchedule"},
		{[]corev1.Taint{gpu, team}, fleet.Spot, "team=ml:NoSchedule"},
	} {
		if got := untolerated(tc.taints, tc.c); got != tc.want {
			t.Errorf("%v for %s: %q; want %q", tc.taints, tc.c, got, tc.want)
		}
	}
}

// A node Karpenter is terminating goes when its NodeClaim says (a NodePool with a
// terminationGracePeriod), else, a spot node of EC2, at the spot notice, else at the
// default; other platforms' taints keep their own notices.
func TestKarpenterTerminationNotice(t *testing.T) {
	now := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	p := &Provider{cfg: Config{Now: func() time.Time { return now }}, claimEnds: map[string]time.Time{}}
	disrupted := corev1.Taint{Key: taintKarpenterDisrupt, Effect: corev1.TaintEffectNoSchedule}
	spot := map[string]string{labelKarpenterCap: "spot"}
	onDemand := map[string]string{labelKarpenterCap: "on-demand"}
	for _, tc := range []struct {
		name   string
		node   *corev1.Node
		aws    bool
		claim  time.Time
		wantIn time.Duration
	}{
		{"NodeClaim says when", node(onDemand, disrupted), true, now.Add(7 * time.Minute), 7 * time.Minute},
		{"NodeClaim's time past", node(spot, disrupted), true, now.Add(-time.Minute), 0},
		{"EC2 spot, no time said", node(spot, disrupted), true, time.Time{}, 2 * time.Minute},
		{"KWOK spot, no time said", node(spot, disrupted), false, time.Time{}, 30 * time.Second},
		{"on-demand, no time said", node(onDemand, disrupted), true, time.Time{}, 30 * time.Second},
		{"GKE's taint", node(nil, corev1.Taint{Key: taintGKETermination}), false, now.Add(time.Hour), 30 * time.Second},
	} {
		tc.node.Name = "n"
		if tc.aws {
			tc.node.Spec.ProviderID = "aws:///us-east-1a/i-0123"
		}
		p.claimEnds["n"] = tc.claim
		if got := p.noticeEnds(tc.node, terminationTaints(tc.node)).Sub(now); got != tc.wantIn {
			t.Errorf("%s: notice ends in %s, want %s", tc.name, got, tc.wantIn)
		}
	}
}
