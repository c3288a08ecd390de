package scaling

import (
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// Each place's cold start, learned from its own launches. What a preemption, a relaunch
// or a failed swap costs is a cold start at some price, and cold starts differ by place and
// kind: a Karpenter node that joins 30 s after its NodeClaim and a 46.5 s image pull (the
// e2e run in bench/docs/kubernetes.md) is ready in 78 s, a cloud VM with nothing cached in
// about 5 minutes (DefaultColdStart). The policy's ColdStart is the prior; a place that has
// launched replicas is judged by them.

// coldStartWeight is the weight of a place's newest cold start in its estimate: the last
// four launches carry about 70 % of it, so a place whose image cache warms (or whose node
// pool scales from zero) is judged by what its launches take now.
const coldStartWeight = 0.25

// coldStarts is the placer's record of launch-to-ready times.
type coldStarts struct {
	byKey  map[coldStartKey]time.Duration
	pooled time.Duration // every place's, for a place not seen yet (0: none seen)
}

type coldStartKey struct {
	place    string
	capacity fleet.Capacity
}

// learn counts the cold start of each replica that became ready (fresh: readiness.fresh)
// whose launch and readiness times are known.
func (c *coldStarts) learn(fresh []Placed) {
	for _, r := range fresh {
		if r.LaunchedAt.IsZero() || r.ReadyAt.Before(r.LaunchedAt) || r.ReadyAt.IsZero() {
			continue
		}
		d := r.ReadyAt.Sub(r.LaunchedAt)
		if c.byKey == nil {
			c.byKey = map[coldStartKey]time.Duration{}
		}
		k := coldStartKey{r.place(), r.Capacity}
		c.byKey[k] = ewma(c.byKey[k], d)
		c.pooled = ewma(c.pooled, d)
	}
}

func ewma(old, d time.Duration) time.Duration {
	if old == 0 {
		return d
	}
	return old + time.Duration(coldStartWeight*float64(d-old))
}

// at is the cold start expected of a launch of capacity in place: its own launches', else
// every place's, else prior.
func (c *coldStarts) at(place string, capacity fleet.Capacity, prior time.Duration) time.Duration {
	if d, ok := c.byKey[coldStartKey{place, capacity}]; ok {
		return d
	}
	if c.pooled > 0 {
		return c.pooled
	}
	return prior
}

// coldStartAt is the cold start expected of a launch of o's capacity in o's place.
func (pl *Placer) coldStartAt(o Offer) time.Duration {
	return pl.starts.at(o.place(), o.Capacity, pl.coldStart())
}
