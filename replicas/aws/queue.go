package aws

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/arbiter-serve/arbiter/replicas"
)

// EC2 sends its spot interruption warnings and rebalance recommendations to EventBridge
// as well; a rule that matches them and targets an SQS queue lets the control plane hear
// of an interruption the moment EC2 decides it, instead of at its next poll, and of a
// rebalance recommendation, which the spot request's status never shows. Event shapes:
// https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html
// ("EC2 Spot Instance Interruption Warning") and
// https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html
// ("EC2 Instance Rebalance Recommendation"); deploy/aws/interruption-queue.yaml makes the
// rule and the queue.
const (
	interruptionWarning     = "EC2 Spot Instance Interruption Warning"
	rebalanceRecommendation = "EC2 Instance Rebalance Recommendation"
)

// queueWait is ReceiveMessage's long poll: SQS's longest, so an idle queue costs one
// call per 20 s and a message is delivered as soon as it arrives.
const queueWait = 20

// ec2Event is the part of an EventBridge event the provider reads
// (https://docs.aws.amazon.com/eventbridge/latest/ref/events-structure.html).
type ec2Event struct {
	DetailType string    `json:"detail-type"`
	Source     string    `json:"source"`
	Time       time.Time `json:"time"`
	Region     string    `json:"region"`
	Detail     struct {
		InstanceID     string `json:"instance-id"`
		InstanceAction string `json:"instance-action"`
	} `json:"detail"`
}

// watchQueue long-polls one region's interruption queue until ctx ends.
func (p *Provider) watchQueue(ctx context.Context, region, url string) {
	c := sqs.NewFromConfig(p.base, func(o *sqs.Options) {
		o.Region = region
		if p.cfg.SQSEndpoint != "" {
			o.BaseEndpoint = aws.String(p.cfg.SQSEndpoint)
		}
	})
	log := p.cfg.Log.With("region", region, "queue", url)
	const maxBackoff = time.Minute
	backoff := time.Second
	for ctx.Err() == nil {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: queueWait})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// The spot requests' poll still reports interruptions; say so once per failure
			// and try again later rather than spin.
			log.Warn("aws: cannot receive from the interruption queue; spot requests are still polled", "err", classify(err, "sqs:ReceiveMessage"), "retry_in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff = time.Second
		for _, m := range out.Messages {
			if !p.queuedEvent(region, m) {
				continue // left for SQS to deliver again after its visibility timeout
			}
			if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil && ctx.Err() == nil {
				log.Warn("aws: cannot delete a message from the interruption queue; it will come again", "message", aws.ToString(m.MessageId), "err", classify(err, "sqs:DeleteMessage"))
			}
		}
	}
}

// queuedEvent acts on one message and says whether it is done with (to delete). A
// message it cannot read, or about an instance that is not one of this owner's spot
// replicas, is done with too: left on the queue, it would come back forever. The queue
// is therefore this control plane's own.
func (p *Provider) queuedEvent(region string, m types.Message) bool {
	var ev ec2Event
	if err := json.Unmarshal([]byte(aws.ToString(m.Body)), &ev); err != nil || ev.Source != "aws.ec2" || ev.Detail.InstanceID == "" {
		p.cfg.Log.Warn("aws: the interruption queue holds a message that is not an EC2 event; deleting it (is the rule's target raw, not through SNS?)",
			"region", region, "message", aws.ToString(m.MessageId))
		return true
	}
	var reason string
	switch ev.DetailType {
	case interruptionWarning:
		reason = "EC2 Spot Instance Interruption Warning (EventBridge): instance-action " + ev.Detail.InstanceAction
	case rebalanceRecommendation:
		// No deadline comes with it: the instance's risk of interruption has risen, and a
		// warning with two minutes' notice may follow at any time. Replacing it now, while
		// it still serves, is cheaper than losing it with two minutes to go.
		reason = "EC2 Instance Rebalance Recommendation (EventBridge): elevated risk of interruption; replaced before it comes"
	default:
		p.cfg.Log.Debug("aws: ignoring an EC2 event the provider does not act on", "detail_type", ev.DetailType, "instance", ev.Detail.InstanceID)
		return true
	}
	if ev.Region != "" {
		region = ev.Region
	}
	h := handleOf(region, ev.Detail.InstanceID)
	p.mu.Lock()
	w, ours := p.spotReqs[h]
	p.mu.Unlock()
	if !ours {
		p.cfg.Log.Debug("aws: an EC2 event about an instance that is not one of this control plane's spot replicas", "detail_type", ev.DetailType, "instance", h)
		return true
	}
	at := ev.Time
	if at.IsZero() {
		at = p.cfg.Now()
	}
	return p.notify(replicas.Notice{ReplicaID: w.replicaID, Handle: h, Deadline: at.Add(spotNotice), Reason: reason})
}

// notify sends one notice per replica, whichever source saw it first, and says whether
// the replica has had it (false: nobody read it now, and its source says it again).
func (p *Provider) notify(n replicas.Notice) bool {
	// One node of a multi-node replica takes the whole replica: one notice, for its handle.
	p.mu.Lock()
	m, inGroup := p.members[n.Handle]
	p.mu.Unlock()
	if inGroup {
		_, id, _ := strings.Cut(n.Handle, "/")
		n.Reason = fmt.Sprintf("node %d of %d (instance %s): %s", m.rank, m.n, id, n.Reason)
		n.Handle, n.ReplicaID = m.group, m.replicaID
	}
	first := !p.notices.Sent(n.Handle)
	ok := p.notices.Send(n)
	if first && ok {
		p.cfg.Log.Info("aws spot interruption notice", "replica", n.ReplicaID, "instance", n.Handle, "reason", n.Reason, "deadline", n.Deadline)
	}
	return ok
}
