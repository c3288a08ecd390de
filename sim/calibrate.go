package sim

import (
	"fmt"
	"time"
)

// Calibration is how much one replica carries within the SLO on a request trace: the
// smallest fixed on-demand fleet n whose SLO attainment reaches the spec's percentile, and
// the trace's QPS and measured concurrency divided by n − ½: at the trace's mean load the
// autoscaler then asks for exactly n (n − 1 replicas missed the SLO, n met it, and a target
// of load ÷ n would sit on the boundary where noise flips the count). Both systems'
// per-replica targets are set from it, so neither is tuned against the other.
type Calibration struct {
	Replicas          int
	Attainment        float64
	QPSPerReplica     float64
	ConcurrencyPerRep float64
}

// Calibrate runs fixed fleets of 1..maxReplicas on-demand replicas for d and returns the
// first that meets the SLO percentile.
func Calibrate(in Inputs, d time.Duration, maxReplicas int) (Calibration, error) {
	sp := *in.Spec
	in.Spec = &sp
	in.Duration, in.Warm = d, true
	want := sp.Arbiter.SLO.Percentile
	for n := 1; n <= maxReplicas; n++ {
		sp.Service.ReplicaPolicy.MinReplicas, sp.Service.ReplicaPolicy.MaxReplicas = n, n
		r, err := Run(OnDemand, in)
		if err != nil {
			return Calibration{}, err
		}
		if r.SLOAttainment() >= want {
			per := float64(n) - 0.5
			return Calibration{Replicas: n, Attainment: r.SLOAttainment(), QPSPerReplica: r.QPS() / per,
				ConcurrencyPerRep: r.MeanConcurrency() / per}, nil
		}
	}
	return Calibration{}, fmt.Errorf("sim: calibration: %d replicas do not reach SLO attainment %v on %s", maxReplicas, want, in.Requests.Name)
}

// Apply sets both systems' per-replica targets from the calibration.
func (c Calibration) Apply(in *Inputs) {
	sp := *in.Spec
	sp.Service.ReplicaPolicy.TargetQPSPerReplica = c.QPSPerReplica
	sp.Arbiter.Autoscaling.TargetConcurrencyPerReplica = c.ConcurrencyPerRep
	in.Spec = &sp
}
