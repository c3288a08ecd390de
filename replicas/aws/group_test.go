package aws

import (
	"encoding/base64"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
)

// A replica of num_nodes 2 on aws: one cluster placement group, tagged with the owner;
// two spot instances launched into it in the quote's zone, each with IMDS tags enabled and
// its own client token; each node's script runs with SkyPilot's node variables (its rank,
// the count, every node's IP head first, read from its instance metadata once both run);
// the replica is the head's address with one handle for the group, and List folds the
// two instances into it; one node interrupted is one notice for the whole replica, naming
// the node, and the replica reads as gone; Terminate ends both instances and deletes the
// group. A group EC2 cannot fit whole (InsufficientInstanceCapacity for its second node)
// is ErrNoCapacity and leaves neither instance nor group.
func TestMultiNodeReplicaIsOnePlacementGroup(t *testing.T) {
	r := newRig(t, nil)
	ctx := ctxFor(t, 2*time.Minute)
	out := t.TempDir()
	ls := r.launchSpec("mn-1", fleet.Spot, "use1-az4")
	ls.NumNodes = 2
	ls.Envs["NODE_OUT"] = out
	ls.Run = `printf '%s %s %s\n' "$SKYPILOT_NODE_RANK" "$SKYPILOT_NUM_NODES" "$(echo $SKYPILOT_NODE_IPS)" > "$NODE_OUT/node-$SKYPILOT_NODE_RANK.env" && ` + ls.Run
	in, err := r.p.Launch(ctx, ls)
	if err != nil {
		t.Fatal(err)
	}

	groups := r.fake.PlacementGroups()
	if len(groups) != 1 {
		t.Fatalf("placement groups %v; want one", groups)
	}
	var group string
	for name, tags := range groups {
		group = name
		if tags["strategy"] != "cluster" || tags[TagOwner] != "cp-test-owner" || tags[TagReplica] != "mn-1" {
			t.Errorf("placement group %s: %v; want a cluster group tagged with the owner and replica", name, tags)
		}
	}
	reqs := r.fake.Requests("RunInstances")
	if len(reqs) != 2 {
		t.Fatalf("%d RunInstances calls; want one a node", len(reqs))
	}
	if reqs[0].Get("ClientToken") == reqs[1].Get("ClientToken") {
		t.Error("both nodes launched with one client token: EC2 would answer the second with the first instance")
	}
	for rank, f := range reqs {
		for k, want := range map[string]string{"Placement.GroupName": group, "Placement.AvailabilityZoneId": "use1-az4",
			"MetadataOptions.InstanceMetadataTags": "enabled", "MetadataOptions.HttpTokens": "required", "InstanceMarketOptions.MarketType": "spot"} {
			if got := f.Get(k); got != want {
				t.Errorf("node %d: RunInstances %s = %q, want %q", rank, k, got, want)
			}
		}
		ud, _ := base64.StdEncoding.DecodeString(f.Get("UserData"))
		if !strings.Contains(string(ud), "export SKYPILOT_NODE_RANK='"+string(rune('0'+rank))+"'") {
			t.Errorf("node %d's user data does not export its rank:\n%s", rank, ud)
		}
	}
	wantHandle := "us-east-1/"
	ips := make([]string, 2)
	for rank := range 2 {
		id := ""
		for iid, tags := range r.fake.Live() {
			if tags[TagNodeRank] == string(rune('0'+rank)) {
				id = iid
				ips[rank] = strings.Fields(tags[tagNodeIPs])[rank]
			}
		}
		if id == "" || r.fake.InstanceGroup(id) != group {
			t.Fatalf("node %d: instance %q in group %q; want one in %s", rank, id, r.fake.InstanceGroup(id), group)
		}
		if rank > 0 {
			wantHandle += ","
		}
		wantHandle += id
	}
	wantHandle += "/" + group
	if in.Handle != wantHandle || in.Address != net.JoinHostPort(ips[0], "18080") || in.Capacity != fleet.Spot || in.ReplicaID != "mn-1" {
		t.Fatalf("instance %+v; want handle %s and the head's address %s:18080", in, wantHandle, ips[0])
	}
	for rank := range 2 {
		path := filepath.Join(out, "node-"+string(rune('0'+rank))+".env")
		want := string(rune('0'+rank)) + " 2 " + ips[0] + " " + ips[1] + "\n"
		deadline := time.Now().Add(30 * time.Second)
		for {
			b, err := os.ReadFile(path)
			if err == nil && string(b) == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d started with %q (%v); want %q (rank, nodes, every IP head first)", rank, b, err, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if got := get(t, in.Address); !strings.HasPrefix(got, "replica=mn-1 ") {
		t.Fatalf("the head says %q", got)
	}
	list, err := r.p.List(ctx)
	if err != nil || len(list) != 1 || list[0] != in {
		t.Fatalf("List %+v %v; want the one group as %+v", list, err, in)
	}

	// The worker is interrupted: one notice, the replica's, naming the node.
	worker := strings.Split(strings.Split(in.Handle, "/")[1], ",")[1]
	if err := r.fake.Interrupt(worker, time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-r.p.Notices():
		if n.ReplicaID != "mn-1" || n.Handle != in.Handle || !strings.Contains(n.Reason, "node 1 of 2 (instance "+worker+")") {
			t.Fatalf("notice %+v; want mn-1's, for the whole group, naming node 1 of 2", n)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no interruption notice")
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, why, err := r.p.Status(ctx, in.Handle)
		if err != nil {
			t.Fatal(err)
		}
		if st == replicas.StatusGone {
			if !strings.Contains(why, "node 1 of 2") || !strings.Contains(why, "Server.SpotInstanceTermination") {
				t.Fatalf("gone for %q; want node 1's interruption", why)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the group never read as gone after its worker's interruption")
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case n := <-r.p.Notices():
		t.Fatalf("a second notice for one group: %+v", n)
	case <-time.After(500 * time.Millisecond):
	}
	if err := r.p.Terminate(ctx, in.Handle); err != nil {
		t.Fatal(err)
	}
	if live := r.fake.Live(); len(live) != 0 {
		t.Fatalf("Terminate left %v", live)
	}
	if groups := r.fake.PlacementGroups(); len(groups) != 0 {
		t.Fatalf("Terminate left placement groups %v", groups)
	}
	if err := r.p.Terminate(ctx, in.Handle); err != nil {
		t.Fatalf("Terminate is idempotent: %v", err)
	}

	// The group's hardware holds one instance: the second node is refused, the first
	// terminated, the group deleted.
	r.fake.GroupCapacity(1)
	ls.ReplicaID = "mn-2"
	if _, err := r.p.Launch(ctx, ls); !errors.Is(err, replicas.ErrNoCapacity) || !strings.Contains(err.Error(), "node 1 of 2") {
		t.Fatalf("a group EC2 cannot fit: %v; want ErrNoCapacity naming node 1 of 2", err)
	}
	if live := r.fake.Live(); len(live) != 0 {
		t.Fatalf("a refused group left instances %v", live)
	}
	if groups := r.fake.PlacementGroups(); len(groups) != 0 {
		t.Fatalf("a refused group left placement groups %v", groups)
	}
	for _, a := range []string{"CreatePlacementGroup", "DeletePlacementGroup", "CreateTags"} {
		if !grantedActions(t)["ec2:"+a] {
			t.Errorf("the provider calls %s, which deploy/aws/iam-policy.json does not grant", a)
		}
	}
}
