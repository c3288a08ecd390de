package router

import (
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// A replica that was sent a prompt is predicted to find its prefix cached, whichever
// replica the affinity table names as the prefix's holder; one that was not, is not.
// Once about its KV capacity in newer prompts has gone through it, it has forgotten.
func TestEachReplicaRemembersWhatItWasSent(t *testing.T) {
	prof := defaultProfile()
	a := newReplica(fleet.Replica{ID: "a", Address: "127.0.0.1:1", Model: "m"}, nil, prof)
	b := newReplica(fleet.Replica{ID: "b", Address: "127.0.0.1:2", Model: "m"}, nil, prof)
	now := time.Unix(1000, 0)
	blocks := func(seed uint64, n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = mix(seed + uint64(i))
		}
		return out
	}
	conv := blocks(1, 64) // a 4,096-token conversation at 64 tokens a block
	send := func(r *Replica, prefix []uint64, tokens int) Prediction {
		req := &Request{Model: "m", PromptTokens: tokens, OutTokens: 8, Prefix: prefix, BlockTokens: 64, Now: now}
		p := r.Begin(req, time.Second)
		now = now.Add(time.Minute) // each one done long before the next
		r.End(p, now)
		return p
	}
	uncached := func(r *Replica, prefix []uint64, tokens int) int {
		req := &Request{Model: "m", PromptTokens: tokens, OutTokens: 8, Prefix: prefix, BlockTokens: 64, Now: now}
		return r.predict(now, req.shape(), 8, time.Second).Uncached
	}
	if u := uncached(a, conv, 4096); u != 4096 {
		t.Fatalf("before anything was sent: %d uncached, want all 4096", u)
	}
	send(a, conv[:32], 2048) // the conversation's first turn went to a
	send(b, conv, 4096)      // its second to b (the holder the affinity table names now)
	// Its third turn extends it: a holds the first 2,048 tokens, b all 4,096.
	third := append(append([]uint64{}, conv...), blocks(1<<40, 16)...)
	if u := uncached(a, third, 5120); u != 5120-2048 {
		t.Errorf("on a, the first turn's replica: %d uncached, want %d", u, 5120-2048)
	}
	if u := uncached(b, third, 5120); u != 5120-4096 {
		t.Errorf("on b: %d uncached, want %d", u, 5120-4096)
	}
	// Other conversations through a, about its KV capacity in all, push the first one out.
	capacity := prof.KVTokens
	for i := 0; i*8192 < capacity+8192; i++ {
		send(a, blocks(uint64(100+i)<<20, 128), 8192)
	}
	if u := uncached(a, third, 5120); u != 5120 {
		t.Errorf("on a after %d tokens of other prompts: %d uncached, want all 5120 (forgotten)", capacity+8192, u)
	}
	if u := uncached(b, third, 5120); u != 5120-4096 {
		t.Errorf("on b, which had none of them: %d uncached, want %d", u, 5120-4096)
	}
}

// The calibration is a median: an answer off by 3× for a reason the model does not see
// moves nothing, and a replica that really is 2× slower is learnt in a handful of answers.
func TestCalibrationIgnoresOutliersAndLearnsADifference(t *testing.T) {
	now := time.Unix(1000, 0)
	var c calib
	for i := range 20 {
		ratio := 1.0
		if i%7 == 3 {
			ratio = 3 // an outlier now and then
		}
		if i%11 == 5 {
			ratio = 0.3
		}
		c.observe(now, ratio)
		now = now.Add(time.Second)
	}
	if f := c.factor(now); f != 1 {
		t.Fatalf("after 20 answers on profile with 4 outliers: factor %.3f, want 1", f)
	}
	for i := range calibWindow/2 + 1 {
		c.observe(now, 2)
		now = now.Add(time.Second)
		if f := c.factor(now); i == 0 && f != 1 {
			t.Fatalf("after one answer at 2×: factor %.3f; one answer should not move a median", f)
		}
	}
	if f := c.factor(now); f < 1.95 || f > 2.05 {
		t.Fatalf("after %d answers at 2×: factor %.3f, want 2", calibWindow/2+1, f)
	}
	// Without traffic, it fades back to the profile.
	if f := c.factor(now.Add(10 * calibForget)); f > 1.01 {
		t.Fatalf("after a long silence: factor %.3f, want about 1", f)
	}
}
