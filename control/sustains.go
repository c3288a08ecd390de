package control

import (
	"cmp"
	"fmt"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/spec"
)

// The request mix and SLO an offer's throughput is computed for when the service says
// none: prompts of 1,024 tokens and answers of 256 (the routers' default expected output,
// router.Config.DefaultOutputTokens), a p90 TPOT of 100 ms and TTFT of 2 s (the routers'
// default SLO).
const (
	defaultMixIn  = 1024
	defaultMixOut = 256
	defaultTPOT   = 100 * time.Millisecond
	defaultTTFT   = 2 * time.Second
)

// serviceModel is the model shape a spec's replicas serve, for the performance profiles of
// the GPUs it is offered: its profile's model, else the first of its model names that is
// a known shape (a Hugging Face id such as meta-llama/Llama-3.1-8B-Instruct); "" when
// neither says.
func serviceModel(sp *spec.Service) string {
	if p := sp.Arbiter.Profile; p != "" {
		if _, err := engine.ProfileOn("h100", p); err == nil {
			return p
		}
	}
	for _, m := range sp.Arbiter.Models {
		if _, err := engine.LookupModel(m); err == nil {
			return m
		}
	}
	return ""
}

// sustain fills each offer's Sustains: what one replica of the service's model on the
// offer's GPU keeps within the service's SLO for the request mix (sizingMix: observed, else
// the spec's workload, else the default), so that placement ranks the offers by $ per token
// at the SLO. A mix of several classes is served at the rate where the classes' shares of
// each second add up to one (mixRate). Offers whose GPU has no profile, or a service whose
// model shape is not known, keep the zero value: placement then ranks by the hour, as
// before. A GPU the model does not fit, or that cannot meet the SLO for one of the mix's
// classes, gets a known 0 (it ranks last). It returns a note on what it could not compute,
// "" when nothing is amiss.
func sustain(sp *spec.Service, mix []scaling.MixClass, what string, offers []scaling.Offer) string {
	model := serviceModel(sp)
	if model == "" {
		return ""
	}
	tpot, ttft := sloTargets(sp)
	known := map[string]scaling.Sustains{}
	note := ""
	for i := range offers {
		acc := offers[i].Accelerator
		if acc == "" {
			continue
		}
		s, ok := known[acc]
		if !ok {
			s = sustainsOn(acc, model, mix, what, tpot, ttft)
			known[acc] = s
		}
		offers[i].Sustains = s
	}
	// Known for some offers and not others cannot be compared: all by the hour then.
	for _, o := range offers {
		if !o.Sustains.Known {
			for i := range offers {
				offers[i].Sustains = scaling.Sustains{}
			}
			note = fmt.Sprintf("%s has no performance profile: offers ranked by price per hour, not per token", cmp.Or(o.Accelerator, o.InstanceType, "an offer"))
			break
		}
	}
	return note
}

// sloTargets are the TPOT and TTFT a service's throughput is computed at: its SLO's, else
// the routers' defaults.
func sloTargets(sp *spec.Service) (tpot, ttft time.Duration) {
	tpot = time.Duration(sp.Arbiter.SLO.TPOTSeconds * float64(time.Second))
	ttft = time.Duration(sp.Arbiter.SLO.TTFTSeconds * float64(time.Second))
	if tpot <= 0 && ttft <= 0 {
		tpot, ttft = defaultTPOT, defaultTTFT
	} else if tpot <= 0 {
		tpot = defaultTPOT
	}
	return tpot, ttft
}

// sustainsOn is what one replica of model on accelerator sustains for mix at the targets;
// not Known when the GPU has no profile.
func sustainsOn(acc, model string, mix []scaling.MixClass, what string, tpot, ttft time.Duration) scaling.Sustains {
	prof, err := engine.ProfileOn(acc, model)
	if err != nil {
		return scaling.Sustains{}
	}
	tps, err := mixRate(prof, foldMix(mix), tpot, ttft)
	if err != nil {
		// The model does not fit this GPU, or a class is longer than its context: it
		// serves nothing of this mix here.
		return scaling.Sustains{Known: true, Why: err.Error()}
	}
	return scaling.Sustains{Known: true, TokensPerSecond: tps, Why: fmt.Sprintf("%s, %s, TPOT %v, TTFT %v", prof, what, tpot, ttft)}
}

// mixRate is the tokens a second one replica of prof keeps within the targets for a mix of
// classes: each class alone sustains r_i requests a second (engine.SustainedRate), so a
// request of class i takes 1/r_i of the replica's second, and a mix whose shares are w_i
// is served at R = 1 / Σ w_i/r_i requests a second, R × Σ w_i (in_i + out_i) tokens. A class
// the replica cannot serve at all makes the whole mix 0.
func mixRate(prof string, mix []scaling.MixClass, tpot, ttft time.Duration) (float64, error) {
	total := 0.0
	for _, c := range mix {
		total += c.Rate
	}
	if !(total > 0) {
		return 0, fmt.Errorf("an empty request mix")
	}
	busy, tokens := 0.0, 0.0
	for _, c := range mix {
		r, err := engine.SustainedRate(prof, max(c.In, 1), max(c.Out, 2), tpot, ttft)
		if err != nil {
			return 0, err
		}
		w := c.Rate / total
		if r.RequestsPerSecond <= 0 {
			return 0, nil
		}
		busy += w / r.RequestsPerSecond
		tokens += w * float64(c.In+c.Out)
	}
	return tokens / busy, nil
}
