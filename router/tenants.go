package router

import (
	"fmt"
	"strings"

	"github.com/arbiter-serve/arbiter/fleet"
)

// Tenants and priority bands (issue 52). A tenant is an API key, or the keys that name
// the same `tenant:` in the keys file; without keys every request is the tenant
// "default". A request runs in one of three priority bands, named as the Gateway API
// Inference Extension's InferenceModel named its criticality: critical, standard (the
// default) and sheddable. A key's `priority:` is both its requests' band and the highest
// one its requests may claim: a request may ask for a lower band (a batch job on an
// interactive key), never a higher one, which is capped at the key's and said so in the
// answer's X-Arbiter-Priority header.

// Band is a priority band; a lower value is served first.
type Band uint8

const (
	Critical Band = iota
	Standard
	Sheddable
	numBands
)

var bandNames = [numBands]string{"critical", "standard", "sheddable"}

func (b Band) String() string {
	if b < numBands {
		return bandNames[b]
	}
	return fmt.Sprintf("band(%d)", uint8(b))
}

// ParseBand reads a band's name; "" is standard.
func ParseBand(s string) (Band, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "standard":
		return Standard, nil
	case "critical":
		return Critical, nil
	case "sheddable":
		return Sheddable, nil
	}
	return 0, fmt.Errorf("unknown priority %q: want critical, standard or sheddable", s)
}

// PriorityHeader names a request's band. The Gateway API Inference Extension's objective
// header (whose value names an InferenceObjective) is read too when its value is a band's
// name, so a client written for a gateway keeps its band here; any other objective name is
// refused, not guessed at.
const (
	PriorityHeader     = "X-Arbiter-Priority"
	gieObjectiveHeader = "X-Gateway-Inference-Objective"
)

// DefaultTenant is the tenant of requests without a key.
const DefaultTenant = "default"

// serviceBand is the band a key's requests to a service run at (keyed: there is one; else
// no ceiling, and standard unless asked) and its tenant's weight: the service's own for the
// key's tenant (arbiter.tenants), where it gives them, else the keys file's.
func serviceBand(k *Key, svc []fleet.TenantBand) (band Band, keyed bool, weight float64) {
	band, keyed, weight = Critical, k != nil, weightOf(k)
	if k != nil {
		band = k.band
	}
	for _, t := range svc {
		if t.Name != tenantOf(k) {
			continue
		}
		if b, err := ParseBand(t.Priority); err == nil && t.Priority != "" {
			band, keyed = b, true
		}
		if t.Weight > 0 {
			weight = t.Weight
		}
		break
	}
	return band, keyed, weight
}

// requestBand is the band a request runs in: the one its headers ask for, capped at
// ceiling when keyed (else no ceiling, and standard unless asked). capped says a higher
// band was asked for than the ceiling allows.
func requestBand(ceiling Band, keyed bool, header func(string) []byte) (b Band, capped bool, err error) {
	b = Standard
	if keyed {
		b = ceiling
	} else {
		ceiling = Critical
	}
	name, from := header(PriorityHeader), PriorityHeader
	if len(name) == 0 {
		name, from = header(gieObjectiveHeader), gieObjectiveHeader
	}
	if len(name) == 0 {
		return b, false, nil
	}
	asked, err := ParseBand(string(name))
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", from, err)
	}
	if asked < ceiling {
		return ceiling, true, nil
	}
	return asked, false, nil
}

// tenantOf is the tenant a key's requests are counted and shared under.
func tenantOf(k *Key) string {
	if k == nil {
		return DefaultTenant
	}
	return k.tenant
}

// weightOf is a key's share weight within its band (1 without a key).
func weightOf(k *Key) float64 {
	if k == nil || k.weight <= 0 {
		return 1
	}
	return k.weight
}
