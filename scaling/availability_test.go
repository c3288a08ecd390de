package scaling

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestPredictUnavailable(t *testing.T) {
	R := 264 * time.Second // a 294 s cold start less GCP's 30 s notice
	lone := PredictUnavailable([]float64{0.5}, 0, R)
	x := 0.5 * R.Hours()
	if math.Abs(lone-x/(1+x)) > 1e-12 {
		t.Errorf("a lone replica preempted every 2 h: %g, want λR/(1+λR) = %g", lone, x/(1+x))
	}
	pair := PredictUnavailable([]float64{0.5, 0.5}, 0, R)
	if math.Abs(pair-lone*lone) > 1e-12 {
		t.Errorf("two independent zones: %g, want %g", pair, lone*lone)
	}
	if withOutages := PredictUnavailable([]float64{0.5, 0.5}, 0.5, R); math.Abs(withOutages-(pair+lone)) > 1e-12 {
		t.Errorf("outages at the zones' rate add a lone replica's share: %g, want %g", withOutages, pair+lone)
	}
	if PredictUnavailable(nil, 0, R) != 1 {
		t.Error("no spot replica: always down")
	}
	if PredictUnavailable([]float64{0}, 0, R) != 0 {
		t.Error("never preempted: never down")
	}
}

func TestChooseHedge(t *testing.T) {
	lone := hedgeOption{hedgeNone, 0.01, 0}
	pair := hedgeOption{hedgeSpot, 0.0002, 4.54}
	od := hedgeOption{hedgeOnDemand, 0, 6.52}
	for _, c := range []struct {
		name   string
		target float64
		opts   []hedgeOption
		want   hedgeKind
		says   string
	}{
		{"the lone replica meets a loose target", 0.95, []hedgeOption{lone, pair, od}, hedgeNone, "no hedge"},
		{"the cheaper hedge that meets it", 0.999, []hedgeOption{lone, pair, od}, hedgeSpot, "one more zone"},
		{"only on-demand meets a tight one", 0.9999, []hedgeOption{lone, pair, od}, hedgeOnDemand, "one replica on-demand"},
		{"on-demand cheaper than a second spot", 0.999, []hedgeOption{lone, {hedgeSpot, 0.0002, 9}, od}, hedgeOnDemand, "one replica on-demand"},
		{"a prediction within the target but not DayMargin times within it", 0.9995, []hedgeOption{lone, pair, od}, hedgeOnDemand, "one replica on-demand"},
		{"nothing meets it: the most available", 0.9999, []hedgeOption{lone, pair}, hedgeSpot, "nothing offered meets the target"},
		{"exactly DayMargin times within the target meets it", 0.97, []hedgeOption{lone, pair, od}, hedgeNone, "97.00 %"},
	} {
		got := chooseHedge(c.target, c.opts, false)
		if got.kind != c.want || !strings.Contains(got.reason, c.says) {
			t.Errorf("%s: %v (%s), want %v saying %q", c.name, got.kind, got.reason, c.want, c.says)
		}
	}
}

// After an on-demand choice, spot must meet the target twice over to replace it.
func TestChooseHedgeKeepsOnDemandNearTheBoundary(t *testing.T) {
	allowed := 0.001 / DayMargin
	opts := []hedgeOption{{hedgeNone, 0.01, 0}, {hedgeSpot, 0.8 * allowed, 4.54}, {hedgeOnDemand, 0, 6.52}}
	if c := chooseHedge(0.999, opts, false); c.kind != hedgeSpot {
		t.Fatalf("from spot: %v (%s), want the pair", c.kind, c.reason)
	}
	if c := chooseHedge(0.999, opts, true); c.kind != hedgeOnDemand || !strings.Contains(c.reason, "(kept: spot must meet the target twice over") {
		t.Fatalf("from on-demand, the pair within the margin but not twice: %v (%s), want on-demand kept, and why", c.kind, c.reason)
	}
	opts[1].down = 0.4 * allowed
	if c := chooseHedge(0.999, opts, true); c.kind != hedgeSpot {
		t.Fatalf("from on-demand, the pair twice within: %v (%s), want the pair", c.kind, c.reason)
	}
}
