package scaling

import (
	"math"
	"testing"
	"time"
)

func TestOwnWishPaysForWholeReplicasAndACostlyRemainder(t *testing.T) {
	o := &Own{StepCost: 0.51}
	for _, c := range []struct {
		b    float64
		want int
	}{
		{0, 0}, {-1, 0}, {math.NaN(), 0},
		{0.6, 0},      // 0.6 × 1.51 = 0.91 of a shared replica: cheaper than one of its own
		{0.7, 1},      // 1.06: dearer than one of its own
		{1.5, 1},      // one full, and 0.5 × 1.51 = 0.76 shared
		{1.7, 2},      // 0.7 left: its own
		{8 * 0.66, 5}, // 5.28: 0.28 left goes to shared
	} {
		if got := o.Wish(c.b*10, 10); got != c.want {
			t.Errorf("load %.2f replicas' worth: %d of its own, want %d", c.b, got, c.want)
		}
	}
	if got := (&Own{StepCost: 0.51}).Wish(5, 0); got != 0 {
		t.Errorf("no target per replica: %d", got)
	}
}

func TestOwnMovesOnlyOnceWantedForTheDelay(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	o := &Own{StepCost: 0.51, Window: 60 * time.Second, UpscaleDelay: 30 * time.Second, DownscaleDelay: 300 * time.Second}
	cur := 0
	step := func(at time.Duration, load float64) int {
		o.Record(OwnSample{At: t0.Add(at), Load: load})
		cur, _ = o.Decide(t0.Add(at), 10, cur, 4)
		return cur
	}
	// A hot adapter: 1.8 replicas' worth. Nothing moves for 30 s.
	for s := 0; s < 30; s += 5 {
		if n := step(time.Duration(s)*time.Second, 18); n != 0 {
			t.Fatalf("at %ds: %d of its own before the upscale delay", s, n)
		}
	}
	if n := step(30*time.Second, 18); n != 2 {
		t.Fatalf("after the upscale delay: %d, want 2", n)
	}
	// A dip of two minutes (within the downscale delay): kept.
	for s := 35; s <= 155; s += 5 {
		if n := step(time.Duration(s)*time.Second, 0); n != 2 {
			t.Fatalf("at %ds, in a dip: %d, want 2 kept", s, n)
		}
	}
	for s := 160; s < 600; s += 5 {
		step(time.Duration(s)*time.Second, 18)
	}
	// Cold for good: down a step per downscale delay, to the most conservative wish of
	// the hold (one, while the window still held the load), then to none.
	var n int
	for s := 600; s < 900; s += 5 {
		if n = step(time.Duration(s)*time.Second, 0); n != 2 {
			t.Fatalf("at %ds, before the downscale delay: %d", s, n)
		}
	}
	for s := 900; s < 1300; s += 5 {
		n = step(time.Duration(s)*time.Second, 0)
		if s == 1000 && n != 1 {
			t.Fatalf("after one downscale delay: %d, want 1", n)
		}
	}
	if n != 0 {
		t.Fatalf("cold for 700 s: %d of its own, want 0", n)
	}
	// The room max_replicas leaves bounds it.
	o2 := &Own{StepCost: 0.51, Window: time.Minute}
	o2.Record(OwnSample{At: t0, Load: 50})
	if n, _ := o2.Decide(t0, 10, 0, 2); n != 2 {
		t.Errorf("five replicas' worth with room for 2: %d", n)
	}
	// The room shrinks below what runs: held at once, as a bound.
	if n, _ := o2.Decide(t0.Add(time.Second), 10, 4, 1); n != 1 {
		t.Errorf("4 running, room for 1: %d", n)
	}
	o2.Record(OwnSample{At: t0, Load: math.Inf(1)})
	if got := o2.load(); got != 25 {
		t.Errorf("an infinite load counted: mean %v", got)
	}
}
