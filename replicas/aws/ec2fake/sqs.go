package ec2fake

import (
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// The fake also serves the SQS queue an EventBridge rule feeds with EC2's interruption
// warnings and rebalance recommendations: the SDK's SQS client speaks the AWS JSON 1.0
// protocol (POST /, X-Amz-Target: AmazonSQS.<Action>), so one endpoint can answer both
// APIs. Shapes follow the SQS API Reference
// (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ReceiveMessage.html,
// API_DeleteMessage.html, CommonErrors.html); the events follow EC2's EventBridge
// documentation (cited on Interrupt and Rebalance).

// account is the fake account's id, in ARNs and queue URLs.
const account = "123456789012"

// visibility is SQS's default visibility timeout: a message received and not deleted
// is delivered again after it.
const visibility = 30 * time.Second

type queue struct {
	msgs []*message
	// wake is closed (and replaced) when a message arrives, for long polls waiting on it.
	wake chan struct{}
}

type message struct {
	id, body, receipt string
	visibleAt         time.Time
	received          int
}

// QueueURL is the URL of the fake's interruption queue for region, as SQS names queues
// (https://sqs.<region>.amazonaws.com/<account>/<name>); the SDK sends it in the request
// body, and the requests themselves go to the fake's endpoint.
func QueueURL(region string) string {
	return fmt.Sprintf("https://sqs.%s.amazonaws.com/%s/arbiter-interruptions", region, account)
}

// Send puts a message on region's queue as EventBridge (or anyone with sqs:SendMessage)
// would; tests use it for messages that are not EC2's events.
func (s *Server) Send(region, body string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sendLocked(region, body)
}

func (s *Server) sendLocked(region, body string) {
	if !s.cfg.Queues {
		return
	}
	q := s.queueLocked(QueueURL(region))
	s.seq++
	q.msgs = append(q.msgs, &message{id: fmt.Sprintf("%08x-fake-4000-8000-%012x", s.seq, time.Now().UnixNano()), body: body})
	close(q.wake)
	q.wake = make(chan struct{})
}

func (s *Server) queueLocked(url string) *queue {
	q := s.queues[url]
	if q == nil {
		q = &queue{wake: make(chan struct{})}
		s.queues[url] = q
	}
	return q
}

// Queued is how many messages region's queue holds, received or not (deleted ones are gone).
func (s *Server) Queued(region string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.queues[QueueURL(region)]; q != nil {
		return len(q.msgs)
	}
	return 0
}

// ec2Event is an EventBridge event from EC2
// (https://docs.aws.amazon.com/eventbridge/latest/ref/events-structure.html).
type ec2Event struct {
	Version    string            `json:"version"`
	ID         string            `json:"id"`
	DetailType string            `json:"detail-type"`
	Source     string            `json:"source"`
	Account    string            `json:"account"`
	Time       string            `json:"time"`
	Region     string            `json:"region"`
	Resources  []string          `json:"resources"`
	Detail     map[string]string `json:"detail"`
}

// emitLocked sends EC2's event about an instance to its region's queue.
func (s *Server) emitLocked(in *instance, detailType string, detail map[string]string) {
	s.seq++
	ev := ec2Event{Version: "0", ID: fmt.Sprintf("%08x-fake-4000-8000-%012x", s.seq, time.Now().UnixNano()), DetailType: detailType,
		Source: "aws.ec2", Account: account, Time: time.Now().UTC().Format(time.RFC3339), Region: in.region,
		Resources: []string{fmt.Sprintf("arn:aws:ec2:%s:%s:instance/%s", in.region, account, in.id)}, Detail: detail}
	b, err := json.Marshal(ev)
	if err != nil {
		panic(err) // a map of strings always marshals
	}
	s.sendLocked(in.region, string(b))
}

// Rebalance sends EC2's rebalance recommendation for a spot instance: its risk of
// interruption has risen, and nothing else changes
// (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/rebalance-recommendations.html,
// "EventBridge" example).
func (s *Server) Rebalance(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instances[id]
	if in == nil || !in.spot {
		return fmt.Errorf("ec2fake: %s is not a spot instance", id)
	}
	s.emitLocked(in, "EC2 Instance Rebalance Recommendation", map[string]string{"instance-id": id})
	return nil
}

// serveSQS answers one SQS JSON 1.0 call.
func (s *Server) serveSQS(w http.ResponseWriter, r *http.Request, action string) {
	var in struct {
		QueueURL            string `json:"QueueUrl"`
		MaxNumberOfMessages int
		WaitTimeSeconds     int
		ReceiptHandle       string
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err == nil {
		err = json.Unmarshal(body, &in)
	}
	if err != nil {
		writeSQSError(w, http.StatusBadRequest, "InvalidParameterValue", "AWS.SimpleQueueService.InvalidParameterValue", err.Error())
		return
	}
	s.mu.Lock()
	s.calls["sqs:"+action]++
	q := s.queues[in.QueueURL]
	s.mu.Unlock()
	if q == nil || !s.cfg.Queues {
		writeSQSError(w, http.StatusBadRequest, "QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue", "The specified queue does not exist.")
		return
	}
	var out any
	switch action {
	case "ReceiveMessage":
		out = s.receive(r, in.QueueURL, min(max(in.MaxNumberOfMessages, 1), 10), time.Duration(min(in.WaitTimeSeconds, 20))*time.Second)
	case "DeleteMessage":
		if !s.deleteMessage(in.QueueURL, in.ReceiptHandle) {
			writeSQSError(w, http.StatusBadRequest, "ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid", "The input receipt handle is invalid.")
			return
		}
		out = struct{}{}
	default:
		writeSQSError(w, http.StatusBadRequest, "InvalidAction", "AWS.SimpleQueueService.InvalidAction", "The action "+action+" is not valid for this endpoint.")
		return
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	_ = json.NewEncoder(w).Encode(out)
}

type sqsMessage struct {
	MessageID     string `json:"MessageId"`
	ReceiptHandle string
	MD5OfBody     string
	Body          string
}

// receive hands out up to n visible messages, waiting up to wait for one (a long poll).
func (s *Server) receive(r *http.Request, url string, n int, wait time.Duration) any {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		q := s.queues[url]
		now := time.Now()
		var got []sqsMessage
		for _, m := range q.msgs {
			if len(got) == n || now.Before(m.visibleAt) {
				continue
			}
			s.seq++
			m.received++
			m.visibleAt = now.Add(visibility)
			m.receipt = fmt.Sprintf("fake-receipt-%s-%d", m.id, s.seq)
			sum := md5.Sum([]byte(m.body))
			got = append(got, sqsMessage{MessageID: m.id, ReceiptHandle: m.receipt, MD5OfBody: hex.EncodeToString(sum[:]), Body: m.body})
		}
		wake := q.wake
		s.mu.Unlock()
		if len(got) > 0 {
			return struct{ Messages []sqsMessage }{got}
		}
		select {
		case <-wake:
		case <-deadline.C:
			return struct{}{}
		case <-r.Context().Done():
			return struct{}{}
		}
	}
}

func (s *Server) deleteMessage(url, receipt string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[url]
	for i, m := range q.msgs {
		if m.receipt != "" && m.receipt == receipt {
			q.msgs = append(q.msgs[:i], q.msgs[i+1:]...)
			return true
		}
	}
	// SQS deletes a message given any receipt it was received with, and answers a
	// well-formed receipt of a message already gone without error; the fake only hands out
	// receipts it can recognise, so an unknown one is malformed.
	return strings.HasPrefix(receipt, "fake-receipt-")
}

// writeSQSError writes the JSON protocol's error: the shape's name in __type, and the
// Query-compatible code in x-amzn-query-error, as SQS does since it moved to JSON.
func writeSQSError(w http.ResponseWriter, status int, typ, queryCode, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Header().Set("x-amzn-query-error", queryCode+";Sender")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazonaws.sqs#" + typ, "message": msg})
}
