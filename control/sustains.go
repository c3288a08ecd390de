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
// offer's GPU keeps within the service's SLO for its request mix (engine.SustainedRate,
// remembered per profile, mix and SLO), so that placement ranks the offers by $ per token
// at the SLO. Offers whose GPU has no profile, or a service whose model shape is not
// known, keep the zero value: placement then ranks by the hour, as before. A GPU the model
// does not fit gets a known 0 (it ranks last). It returns a note on what it could not
// compute, "" when nothing is amiss.
func sustain(sp *spec.Service, offers []scaling.Offer) string {
	model := serviceModel(sp)
	if model == "" {
		return ""
	}
	tpot := time.Duration(sp.Arbiter.SLO.TPOTSeconds * float64(time.Second))
	ttft := time.Duration(sp.Arbiter.SLO.TTFTSeconds * float64(time.Second))
	if tpot <= 0 && ttft <= 0 {
		tpot, ttft = defaultTPOT, defaultTTFT
	} else if tpot <= 0 {
		tpot = defaultTPOT
	}
	known := map[string]scaling.Sustains{}
	note := ""
	for i := range offers {
		acc := offers[i].Accelerator
		if acc == "" {
			continue
		}
		s, ok := known[acc]
		if !ok {
			prof, err := engine.ProfileOn(acc, model)
			if err == nil {
				var r engine.Sustained
				r, err = engine.SustainedRate(prof, defaultMixIn, defaultMixOut, tpot, ttft)
				s = scaling.Sustains{Known: err == nil, TokensPerSecond: r.TokensPerSecond,
					Why: fmt.Sprintf("%s, %d:%d tokens, TPOT %v, TTFT %v", prof, r.In, r.Out, tpot, ttft)}
				if err != nil {
					// The model does not fit this GPU: it serves nothing here.
					s = scaling.Sustains{Known: true, Why: err.Error()}
				}
			}
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
