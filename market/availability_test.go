package market_test

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/traces"
)

// spotHistory is a trace's spot record over [0, until): each zone's preemptions (falls to
// no capacity) and hours with capacity, and the market-wide outages (onsets of no zone
// with capacity).
func spotHistory(tr *traces.SpotTrace, until time.Duration) (drops map[string]int, hours map[string]float64, outages int) {
	drops, hours = map[string]int{}, map[string]float64{}
	prev := map[string]bool{}
	prevAny := true
	for t := time.Duration(0); t < until; t += tr.Step {
		any := false
		for _, z := range tr.Zones {
			v, ok := tr.Available(z, t)
			up := ok && v > 0
			if up {
				hours[z] += tr.Step.Hours()
				any = true
			} else if prev[z] {
				drops[z]++
			}
			prev[z] = up
		}
		if !any && prevAny {
			outages++
		}
		prevAny = any
	}
	return drops, hours, outages
}

// replayDay measures, on the trace's day [from, from+24h), the share of time with no ready
// replica for k replicas kept on spot in k distinct zones with on-demand fallback, as
// Arbiter's placer keeps them: a replica goes with its zone's capacity (a fall to none);
// its replacement launches at the provider's notice in the zone of lowest rate with
// capacity and none of the others, or on-demand where no zone has any (never preempted),
// and is ready cold later; an on-demand replica launches a spot one as soon as a zone has
// room and leaves once that one is ready.
func replayDay(tr *traces.SpotTrace, from time.Duration, k int, rates map[string]float64, cold, notice time.Duration) float64 {
	type rep struct {
		zone    string // "" on-demand
		readyAt time.Duration
		swapTo  string // on-demand: the spot replica launched to take its place
		swapAt  time.Duration
	}
	reps := make([]rep, k)
	zones := slices.Clone(tr.Zones)
	slices.SortFunc(zones, func(a, b string) int { return cmp.Compare(rates[a], rates[b]) })
	avail := func(z string, t time.Duration) bool { v, ok := tr.Available(z, t); return ok && v > 0 }
	free := func(t time.Duration) string {
		for _, z := range zones {
			if avail(z, t) && !slices.ContainsFunc(reps, func(r rep) bool { return r.zone == z || r.swapTo == z }) {
				return z
			}
		}
		return ""
	}
	for i := range reps {
		reps[i] = rep{zone: "-"}
		if z := free(from); z != "" {
			reps[i] = rep{zone: z, readyAt: from} // running at the day's start
		} else {
			reps[i] = rep{readyAt: from}
		}
	}
	down, total := 0.0, 0.0
	for t := from; t < from+24*time.Hour; t += tr.Step {
		if _, ok := tr.Available(tr.Zones[0], t); !ok {
			break
		}
		for i := range reps {
			r := &reps[i]
			switch {
			case r.zone != "" && !avail(r.zone, t): // preempted: replaced at the notice
				r.zone = "-"
				if z := free(t); z != "" {
					*r = rep{zone: z, readyAt: t - notice + cold}
				} else {
					*r = rep{readyAt: t - notice + cold}
				}
			case r.zone == "" && r.swapTo != "" && !avail(r.swapTo, t):
				r.swapTo = "" // the swap's spot replica was preempted before ready
			case r.zone == "" && r.swapTo != "" && t >= r.swapAt:
				*r = rep{zone: r.swapTo, readyAt: r.swapAt}
			case r.zone == "" && r.swapTo == "":
				if z := free(t); z != "" {
					r.swapTo, r.swapAt = z, t+cold
				}
			}
		}
		total += tr.Step.Hours()
		if !slices.ContainsFunc(reps, func(r rep) bool { return r.readyAt <= t }) {
			down += tr.Step.Hours()
		}
	}
	if total == 0 {
		return math.NaN()
	}
	return down / total
}

// The availability model (scaling.PredictUnavailable) against the spot traces, each day
// held out (issue 49): a day's share of time with no replica ready is predicted from the
// days before it (each zone's preemptions per hour with capacity, the prior weighed in as
// the placer weighs it; the market's outages, onsets of no zone with capacity, per hour)
// and measured by replaying that day (replayDay: GCP's 30 s notice, a 294 s cold start),
// for one spot replica and for two in two zones. Each day's measurement is one day's luck
// (a single outage is 0.2–0.5 % of a day): the model is judged on the mean over the days
// and on how many days come out above it. Figures: bench/docs/simulator.md.
func TestAvailabilityModelHeldOut(t *testing.T) {
	cold, notice := scaling.DefaultColdStart, 30*time.Second
	type sum struct {
		pred, meas   float64
		days, over2x int
	}
	var ratios []float64 // each day's measured ÷ predicted
	for _, c := range []struct {
		name string
		// days measured above twice their prediction, at most, per spot replicas (1, 2), as
		// it stands; the mean measured over the mean predicted is held within [1/4, 2]
		// (2026-11-30: 0.89× and 0.33× on the first, 0.89× and 0.57× on the second).
		maxOver [2]int
	}{
		{"skypilot-preemption-aws-04-22-2023-v100_1", [2]int{1, 1}},
		{"skypilot-availability-aws-02-15-2023-v100_1", [2]int{9, 6}},
	} {
		tr, err := traces.NamedSpot(c.name)
		if err != nil {
			t.Fatal(err)
		}
		var sums [2]sum
		for d := 1; d < int(tr.End()/(24*time.Hour)); d++ {
			from := time.Duration(d) * 24 * time.Hour
			drops, hours, outages := spotHistory(tr, from)
			rates := map[string]float64{}
			var pooledN, pooledH float64
			for _, z := range tr.Zones {
				pooledN, pooledH = pooledN+float64(drops[z]), pooledH+hours[z]
			}
			pooled := scaling.PooledPreemptionRate(pooledN, pooledH)
			for _, z := range tr.Zones {
				rates[z] = scaling.ZonePreemptionRate(float64(drops[z]), hours[z], pooled)
			}
			mu := float64(outages) / from.Hours()
			zs := slices.Clone(tr.Zones)
			slices.SortFunc(zs, func(a, b string) int { return cmp.Compare(rates[a], rates[b]) })
			line := fmt.Sprintf("%s day %2d: market outages %.3f/h", c.name, d, mu)
			for k := 1; k <= 2; k++ {
				var rs []float64
				for _, z := range zs[:k] {
					rs = append(rs, rates[z])
				}
				pred := scaling.PredictUnavailable(rs, mu, cold-notice)
				meas := replayDay(tr, from, k, rates, cold, notice)
				s := &sums[k-1]
				s.pred, s.meas, s.days = s.pred+pred, s.meas+meas, s.days+1
				if meas > 2*pred {
					s.over2x++
				}
				ratios = append(ratios, meas/pred)
				line += fmt.Sprintf("; %d spot: predicted %.2f %%, measured %.2f %%", k, 100*pred, 100*meas)
			}
			t.Log(line)
		}
		for k, s := range sums {
			ratio := s.meas / s.pred
			t.Logf("%s, %d spot replica(s), %d days: mean predicted %.3f %%, measured %.3f %% (%.2f×); %d days above twice their prediction",
				c.name, k+1, s.days, 100*s.pred/float64(s.days), 100*s.meas/float64(s.days), ratio, s.over2x)
			if ratio < 0.25 || ratio > 2 || s.over2x > c.maxOver[k] {
				t.Errorf("%s, %d spot: measured %.2f× the predicted on average, %d days above twice it; held at [0.25, 2] and %d",
					c.name, k+1, ratio, s.over2x, c.maxOver[k])
			}
		}
	}
	slices.Sort(ratios)
	p90 := ratios[int(math.Ceil(0.9*float64(len(ratios))))-1]
	t.Logf("a day's measured ÷ predicted, over %d held-out days and fleets: median %.2f, 90th percentile %.2f (scaling's dayMargin: %g)",
		len(ratios), ratios[len(ratios)/2], p90, scaling.DayMargin)
	if p90 > scaling.DayMargin {
		t.Errorf("the 90th percentile of a day's measured ÷ predicted is %.2f, above the margin the placer keeps (%g)", p90, scaling.DayMargin)
	}
}
