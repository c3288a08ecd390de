package replicas

import "fmt"

// State is where a replica is in its life. The control plane moves replicas only along
// the edges in transitions, and records every move with its reason.
type State string

const (
	Pending      State = "pending"      // wanted; the launch intent is recorded, the provider not yet asked
	Provisioning State = "provisioning" // the provider is launching it
	Starting     State = "starting"     // running; not yet answering its readiness probe
	Ready        State = "ready"        // answering; routers send it traffic
	NotReady     State = "not_ready"    // was ready, now failing probes; no traffic
	Draining     State = "draining"     // being removed: no new requests, in-flight ones finish
	Preempted    State = "preempted"    // the provider took it back (or announced it will)
	Failed       State = "failed"       // died, never got ready in its budget, or failed to launch
	Terminated   State = "terminated"   // gone, and the provider confirmed it
)

// Live reports whether a replica in this state may still hold a provider resource (and so
// still costs money and must be terminated eventually).
func (s State) Live() bool { return s != Terminated }

// Serving reports whether routers should know the replica (ready, or draining its last
// requests).
func (s State) Serving() bool { return s == Ready || s == Draining }

var transitions = map[State][]State{
	Pending:      {Provisioning, Failed, Terminated},
	Provisioning: {Starting, Failed, Preempted, Draining},
	Starting:     {Ready, Failed, Preempted, Draining},
	Ready:        {NotReady, Draining, Preempted, Failed},
	NotReady:     {Ready, Draining, Preempted, Failed},
	Draining:     {Terminated, Failed, Preempted},
	Preempted:    {Terminated, Failed},
	Failed:       {Terminated},
	Terminated:   {},
}

// CheckTransition returns an error when from → to is not an edge of the state machine.
func CheckTransition(from, to State) error {
	for _, s := range transitions[from] {
		if s == to {
			return nil
		}
	}
	return fmt.Errorf("replica state %s → %s is not allowed", from, to)
}
