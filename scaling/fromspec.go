package scaling

import (
	"time"

	"github.com/arbiter-serve/arbiter/spec"
)

// ConfigFromSpec maps a service.yaml onto the decider's configuration; the control plane
// and the simulator both build their deciders with it.
func ConfigFromSpec(sp *spec.Service) Config {
	rp, as := sp.Service.ReplicaPolicy, sp.Arbiter.Autoscaling
	cfg := Config{
		Signal:           Signal(as.Signal),
		MinReplicas:      rp.MinReplicas,
		MaxReplicas:      rp.MaxReplicas,
		NumOverprovision: rp.NumOverprovision,
		StableWindow:     seconds(as.StableWindowSeconds),
		PanicWindow:      seconds(as.PanicWindowSeconds),
		PanicThreshold:   as.PanicThreshold,
		MaxScaleUpRate:   as.MaxScaleUpRate,
		UpscaleDelay:     seconds(rp.UpscaleDelaySeconds),
		DownscaleDelay:   seconds(rp.DownscaleDelaySeconds),
		ScaleToZeroAfter: seconds(sp.Arbiter.ScaleToZeroAfterSeconds),
	}
	switch cfg.Signal {
	case SignalQPS:
		cfg.TargetPerReplica = rp.TargetQPSPerReplica
	case SignalTokens:
		cfg.TargetPerReplica = as.TargetTokensPerSecondPerReplica
	default:
		cfg.TargetPerReplica = as.TargetConcurrencyPerReplica
	}
	if cfg.TargetPerReplica <= 0 {
		// A fixed-size service has no load target; any positive one works because min = max.
		cfg.TargetPerReplica = 1
	}
	return cfg
}

// PlacementFromSpec maps a service.yaml onto its purchasing policy. Reserved slots come
// from arbiter.reserved; the zone cooldown is cooldown and the refusal backoff the default
// (deployment settings, not the spec's).
func PlacementFromSpec(sp *spec.Service, cooldown time.Duration) PlacementPolicy {
	rp := sp.Service.ReplicaPolicy
	p := PlacementPolicy{
		UseSpot:             sp.Resources.UseSpot,
		MaxSpotPriceRatio:   sp.Arbiter.SpotPolicy.MaxPriceRatio,
		RebalanceMinSaving:  sp.Arbiter.SpotPolicy.RebalanceMinSaving,
		RebalanceWhenItPays: sp.Arbiter.SpotPolicy.RebalanceWhenItPays,
		BaseOnDemand:        rp.BaseOndemandFallbackReplicas,
		DynamicFallback:     rp.DynamicOndemandFallback,
		Overprovision:       rp.NumOverprovision,
		ZoneCooldown:        cooldown,
		RefusalBackoff:      DefaultRefusalBackoff,
		MaxReplicas:         rp.MaxReplicas,
		SpotMinZones:        sp.Arbiter.SpotPolicy.MinZones,
		Availability:        sp.Arbiter.Availability,
		RelaunchCosts:       true,
	}
	for _, r := range sp.Arbiter.Reserved {
		p.Reserved = append(p.Reserved, Slot{Provider: r.Provider, Region: r.Region, Zone: r.Zone, Count: r.Count, PricePerHour: r.PricePerHour})
	}
	return p
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
