package aws

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/arbiter-serve/arbiter/replicas"
)

// spotNotice is the warning EC2 gives before it reclaims a spot instance: its spot
// request's status becomes marked-for-termination about two minutes ahead
// (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-request-status.html,
// https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
const spotNotice = 2 * time.Minute

// Spot request status codes that announce the instance's end.
var endingCodes = map[string]bool{
	"marked-for-termination":                      true,
	"marked-for-stop":                             true,
	"marked-for-hibernation":                      true,
	"instance-terminated-by-price":                true,
	"instance-terminated-no-capacity":             true,
	"instance-terminated-capacity-oversubscribed": true,
}

// watchSpot polls this owner's spot requests for interruption notices until ctx ends.
func (p *Provider) watchSpot(ctx context.Context) {
	t := time.NewTicker(seconds(p.cfg.NoticePollSeconds))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, region := range p.cfg.Regions {
			if err := p.pollSpot(ctx, region); err != nil && ctx.Err() == nil {
				p.cfg.Log.Warn("aws: cannot poll spot requests for interruption notices", "region", region, "err", err)
			}
		}
	}
}

func (p *Provider) pollSpot(ctx context.Context, region string) error {
	p.mu.Lock()
	watched := map[string]spotWatch{} // by request id
	handles := map[string]string{}
	for h, w := range p.spotReqs {
		if r, _, err := splitHandle(h); err == nil && r == region && w.requestID != "" && !p.notices.Sent(p.replicaHandle(h)) {
			watched[w.requestID] = w
			handles[w.requestID] = h
		}
	}
	p.mu.Unlock()
	if len(watched) == 0 {
		return nil
	}
	ids := make([]string, 0, len(watched))
	for id := range watched {
		ids = append(ids, id)
	}
	c, err := p.client(region)
	if err != nil {
		return err
	}
	out, err := c.DescribeSpotInstanceRequests(ctx, &ec2.DescribeSpotInstanceRequestsInput{SpotInstanceRequestIds: ids})
	if err != nil {
		return classify(err, "DescribeSpotInstanceRequests")
	}
	for _, r := range out.SpotInstanceRequests {
		p.noticeFrom(r, watched, handles)
	}
	return nil
}

func (p *Provider) noticeFrom(r types.SpotInstanceRequest, watched map[string]spotWatch, handles map[string]string) {
	id := aws.ToString(r.SpotInstanceRequestId)
	w, ok := watched[id]
	if !ok || r.Status == nil || !endingCodes[aws.ToString(r.Status.Code)] {
		return
	}
	h := handles[id]
	at := aws.ToTime(r.Status.UpdateTime)
	if at.IsZero() {
		at = p.cfg.Now()
	}
	p.notify(replicas.Notice{ReplicaID: w.replicaID, Handle: h, Deadline: at.Add(spotNotice),
		Reason: aws.ToString(r.Status.Code) + ": " + aws.ToString(r.Status.Message)})
}

// replicaHandle is the handle of the replica an instance is (its group's for a node of a
// multi-node replica). Caller holds p.mu.
func (p *Provider) replicaHandle(h string) string {
	if m, ok := p.members[h]; ok {
		return m.group
	}
	return h
}
