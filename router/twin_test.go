package router

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// mergeEnds must leave the ends sorted by step with every entry kept, whatever the sizes
// (a prediction runs it on its scratch, so a lost or doubled end would skew KV and batch).
func TestMergeEndsKeepsEveryEndInOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for trial := range 500 {
		ended := make([]seqEnd, rng.IntN(40))
		for i := range ended {
			ended[i] = seqEnd{steps: float64(rng.IntN(30)), ctx: float64(trial*1000 + i)}
		}
		slices.SortFunc(ended, bySteps)
		joins := make([]seqEnd, rng.IntN(10))
		for i := range joins {
			joins[i] = seqEnd{steps: float64(rng.IntN(30)), ctx: float64(-i - 1)}
		}
		want := append(slices.Clone(ended), joins...)
		got := mergeEnds(slices.Clone(ended), slices.Clone(joins))
		if !slices.IsSortedFunc(got, bySteps) {
			t.Fatalf("trial %d: not sorted: %v", trial, got)
		}
		key := func(a, b seqEnd) int {
			if c := bySteps(a, b); c != 0 {
				return c
			}
			return int(a.ctx - b.ctx)
		}
		slices.SortFunc(want, key)
		slices.SortFunc(got, key)
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d: merged %v, want %v", trial, got, want)
		}
	}
}
