package replicas

import (
	"testing"
	"time"
)

// One notice per instance whichever source says it first; one the channel cannot take is
// forgotten so that the next poll says it again; a forgotten handle takes one again.
func TestNotifierSendsOncePerInstance(t *testing.T) {
	n := NewNotifier(1)
	a := Notice{ReplicaID: "r1", Handle: "h1", Deadline: time.Unix(1, 0), Reason: "poll"}
	if !n.Send(a) || !n.Sent("h1") {
		t.Fatal("the first notice was not delivered")
	}
	if !n.Send(Notice{ReplicaID: "r1", Handle: "h1", Reason: "queue"}) {
		t.Fatal("a second source's notice for the same instance: want true (it had its notice)")
	}
	b := Notice{ReplicaID: "r2", Handle: "h2"}
	if n.Send(b) || n.Sent("h2") {
		t.Fatal("a notice the full channel could not take counts as sent")
	}
	if got := <-n.C(); got != a {
		t.Fatalf("got %+v, want %+v", got, a)
	}
	if !n.Send(b) {
		t.Fatal("said again once there is room: not delivered")
	}
	if got := <-n.C(); got != b {
		t.Fatalf("got %+v", got)
	}
	select {
	case got := <-n.C():
		t.Fatalf("a second notice for one instance: %+v", got)
	default:
	}
	n.Forget("h1")
	if n.Sent("h1") || !n.Send(a) {
		t.Fatal("a forgotten handle does not take a notice again")
	}
}
