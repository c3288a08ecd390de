package sim

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/spec"
)

// Result is one system's run.
type Result struct {
	System    System
	Simulated time.Duration
	// Requests is every arrival; Succeeded were answered in full.
	Requests, Succeeded int
	// Failed counts the others by why: no_replica (503), preempted (stream cut by a VM
	// going away), connection (retries used up on dead replicas), timeout (held past the
	// deadline), too_long (prompt + output larger than the KV cache).
	Failed map[string]int
	// Tokens are prompt + completion tokens of succeeded requests.
	InputTokens, OutputTokens int64
	Dollars                   float64
	// SpotDollars is the part of Dollars paid for spot replicas.
	SpotDollars float64
	// SLOMet counts succeeded requests within every SLO bound.
	SLOMet int
	// Percentile is the spec's SLO percentile; TTFT and TPOT are measured at it (seconds).
	Percentile, TTFT, TPOT float64
	SLO                    struct{ TTFT, TPOT float64 }
	// ReplicaHours by "capacity/provider", e.g. "spot/gcp".
	ReplicaHours map[string]float64
	// GPUHours and GPUDollars by accelerator (as the offers name it).
	GPUHours, GPUDollars map[string]float64
	// Mix says the mix MelangeStatic held (empty for other systems).
	Mix string
	// Headroom is each offered GPU type's headroom at the run's end, as ArbiterMix's
	// planner learned it (Inputs.LearnHeadroom) or set it; nil for the other systems.
	Headroom    map[string]float64
	Preemptions int
	// Launches and LaunchFailures (spot refused by the zone).
	Launches, LaunchFailures int
	// ZeroWaits is how many requests waited for a replica because none was ready, and the
	// longest such wait.
	ZeroWaits   int
	MaxZeroWait time.Duration
	// HeldLong counts the succeeded requests that first waited longer than HoldBound for a
	// replica (none was ready): answered, but not served as a user would call it.
	// HoldBound is the SLO's end-to-end bound, or 60 s where it has none.
	HeldLong  int
	HoldBound time.Duration
	// PeakReplicas is the most replicas alive at once; PeakSpotInZone the most spot VMs
	// held at once in one capacity domain (a catalog zone).
	PeakReplicas   int
	PeakSpotInZone int
	Events         int
	Wall           time.Duration

	ttfts, tpots   []float64
	requestSeconds float64
	// predicted and sentTTFT pair each succeeded request's TTFT as the router predicted it
	// when sending it and as it came, from sending (seconds).
	predicted, sentTTFT []float64
	// burst marks the requests that reached their replica in the same instant as another.
	burst []bool
}

// PredictionError is how far the router's TTFT predictions were from what the engine did:
// the mean and 90th percentile of the absolute percentage error over n requests, and the
// share of SLO verdicts (predicted to meet the TTFT target or not) that were right.
func (r *Result) PredictionError() (mape, p90, verdicts float64, n int) {
	return r.predictionError(func(int) bool { return true })
}

// LoneArrivalPredictionError is PredictionError over the requests that reached their
// replica alone: not in the same instant as another. Requests that arrive together are
// prefilled in one engine step, and each one's first token waits for all of that step,
// which no prediction made when one of them is sent can know of (the later ones are not
// sent yet). Traces whose timestamps have a coarse resolution are full of them (Mooncake's:
// 5,719 requests at 600 distinct instants).
func (r *Result) LoneArrivalPredictionError() (mape, p90, verdicts float64, n int) {
	return r.predictionError(func(i int) bool { return !r.burst[i] })
}

func (r *Result) predictionError(include func(i int) bool) (mape, p90, verdicts float64, n int) {
	apes := make([]float64, 0, len(r.predicted))
	right := 0
	for i, p := range r.predicted {
		obs := r.sentTTFT[i]
		if obs <= 0 || !include(i) {
			continue
		}
		apes = append(apes, math.Abs(p-obs)/obs)
		if (p <= r.SLO.TTFT) == (obs <= r.SLO.TTFT) {
			right++
		}
	}
	if len(apes) == 0 {
		return math.NaN(), math.NaN(), math.NaN(), 0
	}
	sum := 0.0
	for _, a := range apes {
		sum += a
	}
	return sum / float64(len(apes)), percentile(apes, 0.9), float64(right) / float64(len(apes)), len(apes)
}

// CapacityHours sums ReplicaHours of one capacity kind over providers.
func (r *Result) CapacityHours(capacity fleet.Capacity) float64 {
	h := 0.0
	for k, v := range r.ReplicaHours {
		if strings.HasPrefix(k, string(capacity)+"/") {
			h += v
		}
	}
	return h
}

// SpotPricePerHour is the mean price paid per spot replica-hour (NaN with none).
func (r *Result) SpotPricePerHour() float64 {
	h := r.CapacityHours(fleet.Spot)
	if h == 0 {
		return math.NaN()
	}
	return r.SpotDollars / h
}

// MeanConcurrency is the time-averaged number of requests being answered (Little's law).
func (r *Result) MeanConcurrency() float64 { return r.requestSeconds / r.Simulated.Seconds() }

// QPS is the mean arrival rate.
func (r *Result) QPS() float64 { return float64(r.Requests) / r.Simulated.Seconds() }

// DollarsPerMillionTokens is the run's cost per million prompt + completion tokens served.
func (r *Result) DollarsPerMillionTokens() float64 {
	t := r.InputTokens + r.OutputTokens
	if t == 0 {
		return math.Inf(1)
	}
	return r.Dollars / float64(t) * 1e6
}

// Availability is the share of requests answered successfully.
func (r *Result) Availability() float64 {
	if r.Requests == 0 {
		return 1
	}
	return float64(r.Succeeded) / float64(r.Requests)
}

// HoldBound is how long a request may wait for a replica and still count as served: the
// SLO's end-to-end bound, or 60 s where it has none.
func HoldBound(sp *spec.Service) time.Duration {
	if e2e := sp.Arbiter.SLO.E2ESeconds; e2e > 0 {
		return time.Duration(e2e * float64(time.Second))
	}
	return time.Minute
}

// Served is Availability without the requests held longer than HoldBound: the share
// answered without a wait no user would sit through.
func (r *Result) Served() float64 {
	if r.Requests == 0 {
		return 1
	}
	return float64(r.Succeeded-r.HeldLong) / float64(r.Requests)
}

// SLOAttainment is the share of all requests answered successfully within the SLO.
func (r *Result) SLOAttainment() float64 {
	if r.Requests == 0 {
		return 1
	}
	return float64(r.SLOMet) / float64(r.Requests)
}

// FailedTotal sums Failed.
func (r *Result) FailedTotal() int {
	n := 0
	for _, v := range r.Failed {
		n += v
	}
	return n
}

func (r *Result) finish() {
	r.TTFT = percentile(r.ttfts, r.Percentile)
	r.TPOT = percentile(r.tpots, r.Percentile)
	r.ttfts, r.tpots = nil, nil
}

// percentile is the nearest-rank percentile (p a fraction); NaN for no data.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	i := int(math.Ceil(p*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}
