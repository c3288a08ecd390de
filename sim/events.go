package sim

import "time"

type eventKind uint8

const (
	evStep      eventKind = iota // a replica's forward pass ends
	evReady                      // a replica finished its cold start
	evDrop                       // a spot capacity drop is announced (its notice)
	evKill                       // a preempted VM is gone
	evDetect                     // a balancer without notices finds a dead replica
	evTerminate                  // a fixed drain is over
	evRetry                      // a request is tried again after a backoff
	evScrape                     // routers read engine queues
	evSample                     // the autoscaler records a load sample
	evDecide                     // the autoscaler decides and placement reconciles
	evSync                       // a polling balancer refreshes its ready list
	evWake                       // a held request wakes the control plane (one decision)
	evEnqueue                    // a request reaches a replica's engine, its prompt prepared
	evPeer                       // a router applies what a peer told it (Inputs.PeerDelay)
)

type event struct {
	at   time.Duration
	seq  uint64 // ties keep scheduling order, so runs are deterministic
	kind eventKind
	rep  *replica
	req  *request
	gen  uint32 // a replica event is stale when the replica's gen moved on
	idx  int    // evDrop: index into the drop list
	fn   func() // evPeer: what the router applies
}

// queue is a binary min-heap of events by (at, seq).
type queue struct {
	ev  []event
	seq uint64
}

func (q *queue) less(i, j int) bool {
	a, b := &q.ev[i], &q.ev[j]
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

func (q *queue) push(e event) {
	q.seq++
	e.seq = q.seq
	q.ev = append(q.ev, e)
	for i := len(q.ev) - 1; i > 0; {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q.ev[i], q.ev[p] = q.ev[p], q.ev[i]
		i = p
	}
}

func (q *queue) len() int { return len(q.ev) }

func (q *queue) peek() *event { return &q.ev[0] }

func (q *queue) pop() event {
	top := q.ev[0]
	last := len(q.ev) - 1
	q.ev[0] = q.ev[last]
	q.ev = q.ev[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < last && q.less(l, m) {
			m = l
		}
		if r < last && q.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		q.ev[i], q.ev[m] = q.ev[m], q.ev[i]
		i = m
	}
	return top
}
