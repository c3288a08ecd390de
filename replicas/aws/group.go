package aws

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/arbiter-serve/arbiter/replicas"
)

// A replica of num_nodes N > 1 is N instances in one cluster placement group, EC2's way
// of packing instances close together in one Availability Zone for the low latency and
// high throughput a tensor- or pipeline-parallel engine needs between its nodes
// (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-strategies.html#placement-groups-cluster).
// The provider creates the group (CreatePlacementGroup, strategy cluster), launches node
// rank 0 (the head, whose address is the replica's) to N-1 into it one RunInstances each
// (each with its own client token and user data that knows its rank), and once all run
// tags every instance with every node's private IP, head first (tagNodeIPs), which each
// script reads from its instance metadata (tags in IMDS, enabled at launch) and exports as
// SKYPILOT_NODE_IPS after its setup, before its run (as a kubernetes group's pods do). The
// group is all or nothing: a node EC2 refuses (InsufficientInstanceCapacity for the group:
// its hardware is full) or that does not run terminates the nodes already launched and
// deletes the group, and the launch is ErrNoCapacity where EC2 said so, so placement tries
// elsewhere.
//
// The replica's handle is region/i-head,i-1,…/group: Status is gone as soon as one
// instance is (an interrupted spot node takes the whole replica, whose notice names it),
// and Terminate ends every instance, then deletes the placement group.

// Tags of a multi-node replica's instances.
const (
	TagNodes    = "arbiter:nodes"     // N
	TagNodeRank = "arbiter:node-rank" // this instance's rank, 0 for the head
	TagGroup    = "arbiter:placement-group"
	tagNodeIPs  = "arbiter:node-ips" // every node's private IP, head first, space-separated
	tagNodeIDs  = "arbiter:node-ids" // every node's instance id, head first, comma-separated
)

// MaxNodes is the most nodes one replica spans on aws: every node's IP travels in one tag
// value, which EC2 caps at 256 characters (16 IPv4 addresses of up to 15 characters and a
// space; https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_Tags.html#tag-restrictions).
const MaxNodes = 16

// member is one instance of a multi-node replica.
type member struct {
	group     string // the replica's handle
	replicaID string
	rank, n   int
}

// groupName is a replica's placement group: its ID with a hash of the owner, so that two
// control planes in one account never share one (names are unique per account and region).
func (p *Provider) groupName(replicaID string) string {
	sum := sha256.Sum256([]byte(p.cfg.Owner + "/" + replicaID))
	return "arbiter-" + replicaID + "-" + hex.EncodeToString(sum[:6])
}

func groupHandle(region string, ids []string, group string) string {
	return region + "/" + strings.Join(ids, ",") + "/" + group
}

// splitGroup reads a multi-node replica's handle; ok is false for one instance's.
func splitGroup(h string) (region string, ids []string, group string, ok bool) {
	parts := strings.SplitN(h, "/", 3)
	if len(parts) != 3 || !strings.HasPrefix(parts[1], "i-") || parts[2] == "" {
		return "", nil, "", false
	}
	return parts[0], strings.Split(parts[1], ","), parts[2], true
}

// launchGroup launches a multi-node replica (see above) and returns the head as the
// replica, with the group's handle.
func (p *Provider) launchGroup(ctx context.Context, c *ec2.Client, ls replicas.LaunchSpec, region string, image ami, port int, price float64, what string, wd *workdirFetch) (replicas.Instance, error) {
	n := ls.Nodes()
	if n > MaxNodes {
		return replicas.Instance{}, fmt.Errorf("%s: num_nodes %d: the aws provider launches at most %d nodes a replica (every node's IP travels in one 256-character tag)", what, n, MaxNodes)
	}
	group := p.groupName(ls.ReplicaID)
	_, err := c.CreatePlacementGroup(ctx, &ec2.CreatePlacementGroupInput{GroupName: aws.String(group), Strategy: types.PlacementStrategyCluster,
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypePlacementGroup, Tags: []types.Tag{
			{Key: aws.String(TagOwner), Value: aws.String(p.cfg.Owner)}, {Key: aws.String(TagService), Value: aws.String(ls.Service)},
			{Key: aws.String(TagReplica), Value: aws.String(ls.ReplicaID)}}}}})
	// Duplicate: this owner's group for this replica, from a launch retried after a crash
	// (the name holds the owner's hash).
	if err != nil && errorCode(err) != "InvalidPlacementGroup.Duplicate" {
		return replicas.Instance{}, classify(err, what+": create its cluster placement group "+group)
	}
	ids := make([]string, n)
	teardown := func() { p.teardownGroup(c, region, ids, group) }
	for rank := range n {
		script, err := userData(ls, port, rank, wd)
		if err != nil {
			teardown()
			return replicas.Instance{}, err
		}
		in := p.runInput(ls, image, script, price, port)
		if in.Placement == nil {
			in.Placement = &types.Placement{}
		}
		in.Placement.GroupName = aws.String(group)
		in.ClientToken = aws.String(p.clientToken(ls.ReplicaID + "/node-" + strconv.Itoa(rank)))
		// The script reads every node's IP from its tags in the instance metadata.
		in.MetadataOptions = &types.InstanceMetadataOptionsRequest{HttpEndpoint: types.InstanceMetadataEndpointStateEnabled,
			HttpTokens: types.HttpTokensStateRequired, InstanceMetadataTags: types.InstanceMetadataTagsStateEnabled}
		for i := range in.TagSpecifications {
			in.TagSpecifications[i].Tags = append(in.TagSpecifications[i].Tags,
				types.Tag{Key: aws.String(TagNodes), Value: aws.String(strconv.Itoa(n))},
				types.Tag{Key: aws.String(TagNodeRank), Value: aws.String(strconv.Itoa(rank))},
				types.Tag{Key: aws.String(TagGroup), Value: aws.String(group)})
		}
		out, err := p.runInstances(ctx, c, in)
		if err == nil && (len(out.Instances) != 1 || out.Instances[0].InstanceId == nil) {
			err = fmt.Errorf("RunInstances answered %d instances", len(out.Instances))
		}
		if err != nil {
			teardown()
			return replicas.Instance{}, classify(err, fmt.Sprintf("%s: node %d of %d in placement group %s", what, rank, n, group))
		}
		ids[rank] = aws.ToString(out.Instances[0].InstanceId)
		p.mu.Lock()
		p.launched[handleOf(region, ids[rank])] = p.cfg.Now()
		p.mu.Unlock()
	}
	handle := groupHandle(region, ids, group)
	p.cfg.Log.Info("aws instances launched in a placement group", "replica", ls.ReplicaID, "instances", strings.Join(ids, ","),
		"group", group, "region", region, "zone", ls.Zone, "type", ls.InstanceType, "capacity", ls.Capacity)

	ins := make([]replicas.Instance, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for rank, id := range ids {
		wg.Go(func() { ins[rank], errs[rank] = p.awaitRunning(ctx, c, region, id) })
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			teardown()
			return replicas.Instance{}, fmt.Errorf("%s: node %d of %d (instance %s): %w", what, rank, n, ids[rank], err)
		}
	}
	ips := make([]string, n)
	for rank, in := range ins {
		ip, _, _ := strings.Cut(in.Address, ":")
		ips[rank] = ip
	}
	if _, err := c.CreateTags(ctx, &ec2.CreateTagsInput{Resources: ids, Tags: []types.Tag{
		{Key: aws.String(tagNodeIPs), Value: aws.String(strings.Join(ips, " "))},
		{Key: aws.String(tagNodeIDs), Value: aws.String(strings.Join(ids, ","))}}}); err != nil {
		teardown()
		return replicas.Instance{}, classify(err, what+": give every node the nodes' IPs (CreateTags)")
	}
	p.remember(handle, ls.ReplicaID, region, ids)
	head := ins[0]
	head.Handle = handle
	return head, nil
}

// remember maps each instance of a group to it, for its notices.
func (p *Provider) remember(handle, replicaID, region string, ids []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for rank, id := range ids {
		p.members[handleOf(region, id)] = member{group: handle, replicaID: replicaID, rank: rank, n: len(ids)}
	}
}

// teardownGroup ends what a failed group launch made: its instances, then (once they are
// terminated: EC2 refuses to delete a group in use) its placement group. On its own
// deadline: the launch's context may be what ended.
func (p *Provider) teardownGroup(c *ec2.Client, region string, ids []string, group string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := p.endGroup(ctx, c, region, slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == "" }), group); err != nil {
		p.cfg.Log.Error("aws: cannot clean up a multi-node launch that failed; List finds its instances by their tags", "group", group, "err", err)
	}
}

// endGroup terminates ids, waits until EC2 says each is terminated, and deletes the
// placement group.
func (p *Provider) endGroup(ctx context.Context, c *ec2.Client, region string, ids []string, group string) error {
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() { errs[i] = p.Terminate(ctx, handleOf(region, id)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for {
		_, err := c.DeletePlacementGroup(ctx, &ec2.DeletePlacementGroupInput{GroupName: aws.String(group)})
		switch code := errorCode(err); {
		case err == nil || code == "InvalidPlacementGroup.Unknown":
			return nil
		case code != "InvalidPlacementGroup.InUse":
			return classify(err, "aws: delete placement group "+group)
		}
		// In use: EC2 may take a moment to see the instances terminated.
		select {
		case <-ctx.Done():
			return fmt.Errorf("aws: delete placement group %s: still in use: %w", group, ctx.Err())
		case <-time.After(p.cfg.PollInterval):
		}
	}
}

// statusGroup is Status for a group: gone as soon as one instance is, saying which.
func (p *Provider) statusGroup(ctx context.Context, region string, ids []string) (replicas.Status, string, error) {
	for rank, id := range ids {
		st, why, err := p.Status(ctx, handleOf(region, id))
		if err != nil || st != replicas.StatusRunning {
			return st, fmt.Sprintf("node %d of %d (instance %s): %s", rank, len(ids), id, why), err
		}
	}
	return replicas.StatusRunning, "", nil
}

// terminateGroup ends every instance of a group and deletes its placement group.
func (p *Provider) terminateGroup(ctx context.Context, handle, region string, ids []string, group string) error {
	c, err := p.client(region)
	if err != nil {
		return err
	}
	if err := p.endGroup(ctx, c, region, ids, group); err != nil {
		return fmt.Errorf("aws: terminate %s: %w", handle, err)
	}
	p.mu.Lock()
	for _, id := range ids {
		delete(p.members, handleOf(region, id))
	}
	p.mu.Unlock()
	p.notices.Forget(handle)
	return nil
}

// groupInstances folds the instances of each multi-node replica List found into one: the
// head's, with the group's handle (from the ids the launch tagged every node with, else
// those found, by rank); a group whose head is gone is still listed, without an address,
// so that the control plane ends what is left of it.
func (p *Provider) groupInstances(region string, found []types.Instance) []replicas.Instance {
	var out []replicas.Instance
	type fold struct {
		at   int
		ids  map[int]string
		tags string
	}
	groups := map[string]*fold{}
	for _, inst := range found {
		tags := tagsOf(inst)
		n, _ := strconv.Atoi(tags[TagNodes])
		in := p.instance(region, inst)
		if n < 2 || tags[TagGroup] == "" {
			out = append(out, in)
			continue
		}
		rank, _ := strconv.Atoi(tags[TagNodeRank])
		g := groups[tags[TagGroup]]
		if g == nil {
			g = &fold{at: len(out), ids: map[int]string{}}
			groups[tags[TagGroup]] = g
			out = append(out, replicas.Instance{})
		}
		g.ids[rank] = aws.ToString(inst.InstanceId)
		if ids := tags[tagNodeIDs]; ids != "" {
			g.tags = ids
		}
		if rank != 0 {
			in.Address = "" // a worker: the replica's address is the head's
		}
		if rank == 0 || out[g.at].ReplicaID == "" {
			out[g.at] = in
		}
	}
	for name, g := range groups {
		ids := strings.Split(g.tags, ",")
		if g.tags == "" {
			ids = nil
			for _, r := range slices.Sorted(maps.Keys(g.ids)) {
				ids = append(ids, g.ids[r])
			}
		}
		h := groupHandle(region, ids, name)
		out[g.at].Handle = h
		p.remember(h, out[g.at].ReplicaID, region, ids)
	}
	return out
}
