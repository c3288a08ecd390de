package scaling

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// bruteMix is the cheapest whole mix by enumeration: every count vector up to lim per type,
// each checked by Covers.
func bruteMix(classes []MixClass, types []MixType, lim, maxTotal int) ([]int, float64) {
	best, bestCost := []int(nil), math.Inf(1)
	counts := make([]int, len(types))
	var walk func(g int)
	walk = func(g int) {
		if g == len(types) {
			total, cost := 0, 0.0
			for i, n := range counts {
				total += n
				cost += float64(n) * types[i].PricePerHour
			}
			if (maxTotal > 0 && total > maxTotal) || cost >= bestCost-1e-9 {
				return
			}
			if Covers(classes, types, counts) {
				best, bestCost = append([]int(nil), counts...), cost
			}
			return
		}
		for n := types[g].Min; n <= lim && (types[g].Max == 0 || n <= types[g].Max); n++ {
			counts[g] = n
			walk(g + 1)
		}
		counts[g] = 0
	}
	walk(0)
	return best, bestCost
}

// A short-prompt class is cheapest on a small card and a long-prompt class only fits the
// big one, whose spare capacity takes part of the short load: one of each, cheaper than two
// H100s (the short class alone would overflow the one).
func TestMixSplitsShortAndLongRequests(t *testing.T) {
	classes := []MixClass{{In: 512, Out: 128, Rate: 6}, {In: 16384, Out: 256, Rate: 0.6}}
	types := []MixType{
		{Name: "L4", PricePerHour: 0.70, Rates: []float64{4.4, 0}},
		{Name: "H100", PricePerHour: 1.80 * 3, Rates: []float64{88, 0.63}},
	}
	s, err := SolveMix(classes, types, 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.Counts[0] != 1 || s.Counts[1] != 1 {
		t.Fatalf("mix %v (%s), want 1 × L4 + 1 × H100", s.Counts, DescribeMix(types, s.Counts))
	}
	if s.Share[1][1] < 0.999 {
		t.Errorf("the long class's share on the H100 = %v, want 1", s.Share[1][1])
	}
	if !Covers(classes, types, s.Counts) || Covers(classes, types, []int{5, 0}) {
		t.Error("Covers: one of each must cover the load; L4s alone cannot serve the long prompts")
	}
	if _, err := SolveMix(classes, types, 1); err == nil {
		t.Error("at most 1 replica: want ErrMixInfeasible (the long prompts need an H100, the short ones then two)")
	}
}

func TestMixMatchesEnumeration(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		nc, nt := 1+rng.IntN(4), 1+rng.IntN(3)
		classes := make([]MixClass, nc)
		for b := range classes {
			classes[b] = MixClass{In: 100, Out: 100, Rate: rng.Float64() * 6}
			if rng.IntN(5) == 0 {
				classes[b].Rate = 0
			}
		}
		types := make([]MixType, nt)
		for g := range types {
			types[g] = MixType{Name: string(rune('A' + g)), PricePerHour: 0.2 + rng.Float64()*4, Rates: make([]float64, nc)}
			if rng.IntN(4) == 0 {
				types[g].Max = 1 + rng.IntN(3)
			}
			for b := range nc {
				if rng.IntN(4) != 0 {
					types[g].Rates[b] = 0.5 + rng.Float64()*8
				}
			}
		}
		maxTotal := 0
		if rng.IntN(3) == 0 {
			maxTotal = 2 + rng.IntN(5)
		}
		want, wantCost := bruteMix(classes, types, 8, maxTotal)
		got, err := SolveMix(classes, types, maxTotal)
		if want == nil {
			// Either infeasible, or needs more than the enumeration's limit.
			if err == nil && got.Cost < 8*0.2-1e-9 && maxTotal > 0 {
				t.Errorf("trial %d: solved %v where enumeration found none", trial, got.Counts)
			}
			continue
		}
		if err != nil {
			t.Errorf("trial %d: %v; enumeration found %v ($%.3f)", trial, err, want, wantCost)
			continue
		}
		if math.Abs(got.Cost-wantCost) > 1e-6 {
			t.Errorf("trial %d: mix %v costs $%.4f, enumeration %v $%.4f", trial, got.Counts, got.Cost, want, wantCost)
		}
		if !Covers(classes, types, got.Counts) {
			t.Errorf("trial %d: mix %v does not cover the load", trial, got.Counts)
		}
	}
}

// A load past maxTotal replicas: SolveMix says it cannot; SolveMixWithin serves the largest
// share of it that maxTotal replicas can, as the planner does at max_replicas (Mélange's
// static mix for Mooncake's peak hour needed more than 32 and the simulator stopped).
func TestSolveMixWithinServesWhatTheBoundAllows(t *testing.T) {
	classes := []MixClass{{In: 500, Out: 100, Rate: 100}, {In: 16000, Out: 200, Rate: 10}}
	types := []MixType{{Name: "L4", PricePerHour: 0.7, Rates: []float64{4, 0}}, {Name: "H100", PricePerHour: 5.4, Rates: []float64{40, 0.6}}}
	if _, err := SolveMix(classes, types, 8); !errors.Is(err, ErrMixInfeasible) {
		t.Fatalf("SolveMix past the bound: %v, want ErrMixInfeasible", err)
	}
	s, err := SolveMixWithin(classes, types, 8)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.Counts[0] + s.Counts[1]; n != 8 || s.Counts[1] < 1 {
		t.Fatalf("within 8 replicas: %v, want 8 in all with the H100s the long prompts need", s.Counts)
	}
	if s2, err := SolveMixWithin(classes, types, 0); err != nil || s2.Counts[1] < 17 {
		t.Fatalf("no bound: %v %v, want the whole load served (≥ 17 H100s for 10 long prompts a second)", s2.Counts, err)
	}
}
