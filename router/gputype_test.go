package router

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// On a fleet of two GPU types each replica is predicted with its own GPU's profile, named
// by its accelerator alone (as the control plane's placement or a replicas file's label
// gives it): slo_cheapest sends short requests to the L4, the cheaper one that meets the
// SLO, and a 40k-token prompt, which the L4 cannot prefill within the TTFT target (its
// profile says some 20 s), to the H100; nor does its re-sampling of a cheaper replica send
// it there, since the L4 misses by its profile, not by anything it was seen to do. Both
// are real replicasims running those GPUs' profiles.
func TestEachReplicaIsPredictedOnItsOwnGPU(t *testing.T) {
	l4 := startSim(t, simOpts{profile: "l4-llama-3.1-8b"})
	h100 := startSim(t, simOpts{profile: "h100-llama-3.1-8b"})
	// Prices as the catalogs give them (an L4 at $0.80/h, an H100 at $4/h); the replicas
	// carry no throughput, so marginal cost ranks them by price and the L4 comes first.
	a := fleet.Replica{ID: "l4", Address: l4.addr, Model: testModel, Capacity: fleet.OnDemand, PricePerHour: 0.8, Accelerator: "L4"}
	b := fleet.Replica{ID: "h100", Address: h100.addr, Model: testModel, Capacity: fleet.OnDemand, PricePerHour: 4, Accelerator: "H100"}
	rg := startRouter(t, func(c *Config) {
		c.SLOs = map[string]SLO{"*": {TTFT: 5, TPOT: 0.1, Percentile: 0.9}}
		c.RoutingHeaders = true
	}, a, b)
	waitFor(t, "both replicas' round trips measured", func() bool {
		return rg.pool.Get("l4").rttKnown() && rg.pool.Get("h100").rttKnown()
	})
	if prof, _, _ := rg.pool.Get("l4").StepScales(time.Now()); prof != "l4-llama-3.1-8b" {
		t.Fatalf("the L4 replica is predicted with profile %q, want l4-llama-3.1-8b", prof)
	}

	long := strings.Repeat("lorem ipsum dolor sit amet ", 6000) // about 40k tokens
	send := func(content string) (replica string, ttft time.Duration) {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":8,"stream":true}`, testModel, content)
		start := time.Now()
		resp, out := post(t, rg.url+"/v1/chat/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d from %s: %.300s", resp.StatusCode, resp.Header.Get("X-Arbiter-Replica"), out)
		}
		return resp.Header.Get("X-Arbiter-Replica"), time.Since(start)
	}
	// The long prompt first: nothing any replica answered has corrected its prediction
	// yet, so only the profile tells the L4 from the H100.
	if got, took := send(long); got != "h100" {
		t.Fatalf("a 40k-token prompt went to %s, want the H100 (the L4 cannot meet the 5 s TTFT)", got)
	} else if took > 5*time.Second {
		t.Errorf("the 40k-token prompt took %v on the H100, want it within the 5 s TTFT target", took)
	}
	for i := range 5 {
		if got, took := send(fmt.Sprintf("a short question, number %d", i)); got != "l4" {
			t.Fatalf("short request %d went to %s, want the L4 (cheaper, and it meets the SLO)", i, got)
		} else if took > 5*time.Second {
			t.Errorf("short request %d took %v, want it within the 5 s TTFT target", i, took)
		}
	}
	if got, _ := send(long + " again"); got != "h100" {
		t.Fatalf("the second 40k-token prompt went to %s, want the H100", got)
	}
}

// A replicas file's accelerator and profile are checked when the file is read.
func TestReplicaFileRefusesAnUnknownGPU(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{"{id: a, address: 127.0.0.1:8001, model: m, accelerator: TPU-v5}", `replicas[0] (a): accelerator: unknown GPU "TPU-v5"`},
		{"{id: a, address: 127.0.0.1:8001, model: m, profile: l4-gpt-9}", `replicas[0] (a): profile: profile "l4-gpt-9"`},
	} {
		_, err := ParseReplicaFile([]byte("replicas:\n  - " + c.line + "\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.line, err, c.want)
		}
	}
	set, err := ParseReplicaFile([]byte("replicas:\n  - {id: a, address: 127.0.0.1:8001, model: m, accelerator: A100-80GB}\n"))
	if err != nil || set[0].Accelerator != "A100-80GB" {
		t.Fatalf("got %+v, %v", set, err)
	}
}
