package router

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

func TestPredictorLearnsTheReplicasSpeed(t *testing.T) {
	p := newPredictor()
	// A replica twice as slow at prefill as the prior, measured over varied prompt lengths.
	truth := func(n int) float64 { return 0.02 + 60e-6*float64(n) }
	for i := range 200 {
		n := 200 + (i%10)*400
		p.learn(time.Time{}, measurement{uncached: n, outTokens: 1, ttft: truth(n) + p.rtt.v, e2e: truth(n) + p.rtt.v, streamed: true})
	}
	for _, n := range []int{500, 3000} {
		got := p.predict(0, n, 0, 1).TTFT - p.rtt.v
		if math.Abs(got-truth(n))/truth(n) > 0.05 {
			t.Errorf("prefill of %d tokens: predicted %.4fs, truth %.4fs", n, got, truth(n))
		}
	}
}

func TestLoadIsProjectedBetweenScrapes(t *testing.T) {
	r := newReplica(fleet.Replica{ID: "a", Address: "127.0.0.1:1", Model: "m"}, nil)
	now := time.Unix(1000, 0)
	r.inflight.Add(2)
	r.observeScrape(now, 10, 5, 0.3) // 15 in the engine, 2 of them ours
	r.inflight.Add(3)                // we sent 3 more since
	if got := r.Load(now.Add(100*time.Millisecond), time.Second); got != 18 {
		t.Fatalf("projected load %v, want 15 + 3 = 18", got)
	}
	r.inflight.Add(-5) // ours all finished
	if got := r.Load(now.Add(200*time.Millisecond), time.Second); got != 13 {
		t.Fatalf("projected load %v, want 15 - 2 = 13", got)
	}
	if got := r.Load(now.Add(2*time.Second), time.Second); got != 0 {
		t.Fatalf("stale scrape: load %v, want our own in-flight count 0", got)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for name, mod := range map[string]func(*Config){
		"policy":                 func(c *Config) { c.Policy = "fastest" },
		"scrape_interval":        func(c *Config) { c.ScrapeInterval = time.Second },
		"max_attempts":           func(c *Config) { c.MaxAttempts = 0 },
		"probe.path":             func(c *Config) { c.Probe.Path = "health" },
		"slos[\"m\"].percentile": func(c *Config) { c.SLOs = map[string]SLO{"m": {Percentile: 90}} },
		"tokenizer":              func(c *Config) { c.Tokenizer = "words" },
	} {
		c := Defaults()
		mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: got %v, want an error naming the field", name, err)
		}
	}
	if err := func() error { c := Defaults(); return c.Validate() }(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}
