package control

import "testing"

// A replica is predicted on the GPU it was placed on: the spec's profile names the model,
// the placement the card.
func TestReplicaProfileFollowsItsGPU(t *testing.T) {
	for _, c := range []struct{ spec, acc, want string }{
		{"h100-llama-3.1-8b", "L4", "l4-llama-3.1-8b"},
		{"h100-llama-3.1-8b", "A100-80GB", "a100-80gb-llama-3.1-8b"},
		{"h100-llama-3.1-8b", "", "h100-llama-3.1-8b"},       // the local machine: no market, no GPU known
		{"h100-llama-3.1-8b", "TPU-v5", "h100-llama-3.1-8b"}, // a card no profile is made for
		{"", "L4", ""}, // routers take the accelerator and the model name themselves
	} {
		if got := replicaProfile(c.spec, c.acc); got != c.want {
			t.Errorf("replicaProfile(%q, %q) = %q, want %q", c.spec, c.acc, got, c.want)
		}
	}
}
