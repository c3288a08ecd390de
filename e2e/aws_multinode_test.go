package e2e

import (
	"strings"
	"testing"
	"time"

	"slices"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/replicas/aws"
	"github.com/arbiter-serve/arbiter/replicas/aws/ec2fake"
	"github.com/arbiter-serve/arbiter/state"
)

// Two replicas of num_nodes: 2 on aws (the fake EC2 account): each is two spot instances in
// one cluster placement group running replicasim as head and worker, each started only
// once it knows both nodes' IPs (SKYPILOT_NODE_IPS from its instance metadata, head
// first); the router talks to the head; each replica is billed two nodes at EC2's spot
// price. One worker's spot interruption replaces the whole group while a non-streaming
// load sees no request fail; serve down leaves no instance and no placement group.
func TestAWSMultiNodeGroupReplacedWhole(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	fake := awsAccount(t, c, "127.0.67", false)
	const name, model = "ec2mn", "ec2mn-model"
	yaml := strings.Replace(strings.Replace(awsSpec(model), "min_replicas: 2, max_replicas: 2, dynamic_ondemand_fallback: true", "min_replicas: 2, max_replicas: 2", 1),
		"run: exec replicasim",
		`num_nodes: 2
run: test "$SKYPILOT_NUM_NODES" = 2 && test "$(echo "$SKYPILOT_NODE_IPS" | wc -l)" = 2 && test "$(echo "$SKYPILOT_NODE_IPS" | sed -n "$((SKYPILOT_NODE_RANK+1))p")" = "$ARBITER_HOST" && exec replicasim`, 1)
	c.up(name, yaml)
	c.waitFor("2 ready 2-node replicas on aws", 90*time.Second, func() bool {
		return c.status(name).Ready == 2 && len(fake.Live()) == 4
	})
	st := c.status(name)
	for _, r := range st.Replicas {
		// g5.xlarge spot in the fake account's zones: $0.3801–0.4102/h a node.
		if r.State == "ready" && (r.PricePerHour < 2*0.38 || r.PricePerHour > 2*0.42) {
			t.Errorf("replica %s billed $%.4f/h; want two nodes at g5.xlarge's spot price", r.ID, r.PricePerHour)
		}
	}
	if groups := fake.PlacementGroups(); len(groups) != 2 {
		t.Fatalf("placement groups %v; want one a replica", groups)
	}
	var victim state.Replica
	for _, r := range st.Replicas {
		if r.State == "ready" {
			victim = r
			break
		}
	}
	var worker, head string
	for id, tags := range fake.Live() {
		if tags[aws.TagReplica] != victim.ID {
			continue
		}
		switch tags[aws.TagNodeRank] {
		case "0":
			head = id
		case "1":
			worker = id
		}
	}
	if head == "" || worker == "" || fake.InstanceGroup(head) != fake.InstanceGroup(worker) || fake.InstanceGroup(head) == "" {
		t.Fatalf("replica %s: head %q and worker %q; want both in one placement group", victim.ID, head, worker)
	}

	l := c.startLoad(model, 4, 60, false)
	time.Sleep(time.Second) // traffic on both replicas before the fault
	interrupted := time.Now()
	if err := fake.Interrupt(worker, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the group replaced whole", 90*time.Second, func() bool {
		st := c.status(name)
		return st.Ready == 2 && !slices.Contains(replicaIDs(st), victim.ID)
	})
	replaced := time.Since(interrupted)
	l.finish(t, "non-streaming load through a worker's spot interruption")
	c.waitFor("the old group's instances and placement group gone", 60*time.Second, func() bool {
		for _, tags := range fake.Live() {
			if tags[aws.TagReplica] == victim.ID {
				return false
			}
		}
		_, ok := fake.PlacementGroups()[fake.InstanceGroup(head)]
		return !ok
	})
	if ev := c.serve("logs", name); !strings.Contains(ev, "node 1 of 2") {
		t.Errorf("no event naming the interrupted node:\n%s", ev)
	}
	c.serve("down", name, "--wait", "60s")
	left := len(ownerInstancesAll(t, fake, c))
	if left != 0 || len(fake.PlacementGroups()) != 0 {
		t.Fatalf("serve down left %d instances and placement groups %v", left, fake.PlacementGroups())
	}
	t.Logf("worker instance of a 2-node aws replica interrupted under load: replaced whole in %.1f s; %d requests ok, %d failed",
		replaced.Seconds(), l.ok.Load(), l.failed.Load())
}

// ownerInstancesAll is every live instance tagged with this home's owner.
func ownerInstancesAll(t *testing.T, fake *ec2fake.Server, c *cluster) []string {
	owner, err := control.ProviderOwner(c.home)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for id, tags := range fake.Live() {
		if tags[aws.TagOwner] == owner {
			out = append(out, id)
		}
	}
	return out
}
