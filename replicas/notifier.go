package replicas

import "sync"

// Notifier delivers a provider's preemption notices for sources that poll (a cloud's
// status API, a queue): each instance's notice once, whichever source sees it first, and
// never blocking the poller. A notice the control plane cannot take now is forgotten, so
// the next poll says it again.
type Notifier struct {
	c    chan Notice
	mu   sync.Mutex
	sent map[string]bool // by handle
}

// NewNotifier returns a Notifier whose channel holds buffer notices.
func NewNotifier(buffer int) *Notifier {
	return &Notifier{c: make(chan Notice, buffer), sent: map[string]bool{}}
}

// C is the channel Provider.Notices returns.
func (n *Notifier) C() <-chan Notice { return n.c }

// Sent reports whether the instance's notice went out already.
func (n *Notifier) Sent(handle string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sent[handle]
}

// Send delivers the notice unless its instance had one, and says whether the instance has
// had its notice now (false: nobody read it, say it again later).
func (n *Notifier) Send(no Notice) bool {
	n.mu.Lock()
	if n.sent[no.Handle] {
		n.mu.Unlock()
		return true
	}
	n.sent[no.Handle] = true
	n.mu.Unlock()
	select {
	case n.c <- no:
		return true
	default:
		n.Forget(no.Handle)
		return false
	}
}

// Forget drops what is known of an instance (it is gone), so its handle takes a notice
// again should it be reused.
func (n *Notifier) Forget(handle string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.sent, handle)
}
