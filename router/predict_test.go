package router

import (
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
)

// A replica slower than its profile (another GPU, a bigger model) is predicted right after a
// few requests: the first tokens calibrate prefill and the streams' token times decode.
func TestModelCalibratesToTheReplica(t *testing.T) {
	prof := defaultProfile()
	// The replica: this profile, 2x slower at prefill and 1.5x at decode, run by the engine
	// replicasim serves with.
	slow := *prof
	for _, f := range []*float64{&slow.PrefillBaseMs, &slow.PrefillPerTokenMs, &slow.PrefillQuadMs, &slow.PrefillCachedMs,
		&slow.PrefillReadMs, &slow.PrefillPastKneeMs, &slow.PrefillCachedSeqMs} {
		*f *= 2
	}
	for _, f := range []*float64{&slow.DecodeBaseMs, &slow.DecodePerSeqMs, &slow.DecodePerCtxMs, &slow.DecodeLogBatchMs} {
		*f *= 1.5
	}
	r := newReplica(fleet.Replica{ID: "a", Address: "127.0.0.1:1", Model: "m"}, nil, prof)
	r.rtt.observe(0)
	var first, last float64
	now := time.Unix(1000, 0)
	for i := range 30 {
		eng, err := engine.New(slow)
		if err != nil {
			t.Fatal(err)
		}
		n := 500 + (i%6)*900
		req := &Request{Model: "m", PromptTokens: n, OutTokens: 20, Now: now, Streamed: true}
		pred := r.Begin(req, time.Second)
		if err := eng.Add(engine.Request{ID: 1, PromptTokens: n, MaxTokens: 20}); err != nil {
			t.Fatal(err)
		}
		var ttft, e2e time.Duration
		for !eng.Idle() {
			res := eng.Step()
			e2e += res.Duration
			for _, em := range res.Emits {
				if em.Index == 0 {
					ttft = e2e
					r.FirstToken(pred, now.Add(ttft))
				}
			}
		}
		r.Completed(req, pred, ttft.Seconds(), e2e.Seconds(), 20, true)
		r.End(pred, now.Add(e2e))
		errTTFT := math.Abs(pred.TTFT-ttft.Seconds()) / ttft.Seconds()
		if i == 0 {
			first = errTTFT
		}
		last = errTTFT
		if i >= 10 {
			tpot := (e2e - ttft).Seconds() / 19
			if e := math.Abs(pred.TPOT-tpot) / tpot; e > 0.05 {
				t.Errorf("request %d: TPOT predicted %.4fs, took %.4fs", i, pred.TPOT, tpot)
			}
			if errTTFT > 0.05 {
				t.Errorf("request %d (%d tokens): TTFT predicted %.4fs, took %.4fs", i, n, pred.TTFT, ttft.Seconds())
			}
		}
		now = now.Add(e2e + time.Second)
	}
	if first < 0.3 || last > 0.05 {
		t.Fatalf("TTFT error %.0f %% on the first request, %.1f %% on the last: want the model to start off and learn", 100*first, 100*last)
	}
}

func TestLoadIsProjectedBetweenScrapes(t *testing.T) {
	r := newReplica(fleet.Replica{ID: "a", Address: "127.0.0.1:1", Model: "m"}, nil, defaultProfile())
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
		"sheddable_fill":         func(c *Config) { c.Queue.SheddableFill = 1.5 },
		"max_waiting":            func(c *Config) { c.Queue.MaxWaiting = 0 },
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
	// A queue section that names one key keeps the defaults of the others.
	path := filepath.Join(t.TempDir(), "router.yaml")
	if err := os.WriteFile(path, []byte("queue: {enabled: true, max_wait: 5s}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(path)
	if err != nil || !c.Queue.Enabled || c.Queue.MaxWait != 5*time.Second || c.Queue.MaxWaiting != 1024 || c.Queue.SheddableFill != 1 {
		t.Fatalf("queue: {enabled: true, max_wait: 5s} loads as %+v (%v); want the other keys at their defaults", c.Queue, err)
	}
}

// A prompt whose prefix another prompt, still queued, is computing finds that prefix cached
// only once it is computed: sent right behind it, it computes the shared part again, as the
// engine does (replicasim's engine is the reference here).
func TestSharedPrefixIsCachedOnlyOnceComputed(t *testing.T) {
	prof := defaultProfile()
	aff, err := NewAffinity(1000, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := newReplica(fleet.Replica{ID: "a", Address: "127.0.0.1:1", Model: "m"}, nil, prof)
	r.rtt.observe(0)
	p := &SLOCheapest{Affinity: aff, ResampleEvery: -1}
	now := time.Unix(1000, 0)
	// Two 4,000-token prompts of 64 blocks (62.5 tokens each), sharing their first 60.
	text := func(tail byte) string {
		b := make([]byte, 64*prefixBlockBytes)
		for i := 60 * prefixBlockBytes; i < len(b); i++ {
			b[i] = tail
		}
		return string(b)
	}
	send := func(tail byte, at time.Time) (*Request, Prediction) {
		req := &Request{Model: "m", PromptTokens: 4000, OutTokens: 10, Prefix: prefixBlocks(text(tail), 0), BlockTokens: 62.5, Now: at, Streamed: true}
		if got := p.Pick(req, []*Replica{r}, rand.New(rand.NewPCG(1, 1))); got != r {
			t.Fatal("no pick")
		}
		return req, r.Begin(req, time.Second)
	}
	_, first := send('a', now)
	_, second := send('b', now)
	if second.Uncached != 4000 {
		t.Fatalf("sent behind the prompt computing its prefix, %d tokens predicted uncached, want all 4,000", second.Uncached)
	}
	// Both fit one step: the engine computes 8,000 tokens at once, and both first tokens
	// come at its end.
	both, _ := prof.StepMs(engine.StepShape{Tokens: 8000, SumN2: 2 * 4000 * 4000})
	if math.Abs(second.TTFT-(4000*PrepPerToken).Seconds()-both/1000) > 0.002 {
		t.Fatalf("second prompt predicted %.4fs, want the shared step's %.4fs", second.TTFT, both/1000)
	}
	// Once the first is computed, a third finds the shared 3,750 tokens cached.
	done := now.Add(4000*PrepPerToken + time.Duration(both*float64(time.Millisecond)))
	r.FirstToken(first, done)
	r.FirstToken(second, done)
	_, third := send('c', done.Add(time.Millisecond))
	if third.Uncached != 250 {
		t.Fatalf("after the shared prefix was computed, %d tokens predicted uncached, want 250", third.Uncached)
	}
}

// A replica whose first tokens come later than predicted often enough is held to its record
// at the SLO's percentile: predicted 0.6 s against an SLO of 1 s at p90, it does not meet it
// when one answer in five has taken 2.5 times its prediction.
func TestSLOVerdictUsesThePredictionsSpread(t *testing.T) {
	var s spread
	if s.factor() != 0 {
		t.Fatal("a spread before any answer")
	}
	for i := range 400 {
		ratio := 1.0
		if i%5 == 0 {
			ratio = 2.5 // one in five
		}
		s.observe(ratio, 0.9)
	}
	slo := SLO{TTFT: 1, Percentile: 0.9}
	if f := s.factor(); f < 1.7 || f > 2.6 {
		t.Fatalf("spread at the 90th percentile %.2f, want near the slow answers' 2.5", f)
	}
	if slo.Meets(Prediction{TTFT: 0.6, Spread: s.factor()}) {
		t.Fatal("predicted 0.6 s with one answer in five 2.5x late: counted as meeting a 1 s SLO at p90")
	}
	if !slo.Meets(Prediction{TTFT: 0.6}) {
		t.Fatal("without a record, 0.6 s meets a 1 s SLO")
	}
	var steady spread
	for range 400 {
		steady.observe(1, 0.9)
	}
	if f := steady.factor(); f > 1.05 || !slo.Meets(Prediction{TTFT: 0.9, Spread: f}) {
		t.Fatalf("a replica answering as predicted got spread %.2f", f)
	}
}

// A replica's profile comes from its description: a built-in name is used as is, an unknown
// one falls back to the default (the pool says so), and a file path is refused, since a
// description comes over the network.
func TestDefaultProfileLoads(t *testing.T) {
	if p, err := LoadProfile(DefaultProfile); err != nil || p.Name != DefaultProfile {
		t.Fatalf("default profile: %v %v", p, err)
	}
	if _, err := LoadProfile("/etc/passwd.json"); err == nil {
		t.Fatal("a router loaded a profile file named by a replica description")
	}
	cfg := Defaults()
	pool := NewPool(&cfg, slog.New(slog.DiscardHandler), NewMetrics(prometheus.NewRegistry()), nil)
	pool.SetReplicas([]fleet.Replica{
		{ID: "a", Address: "127.0.0.1:1", Model: "m", Profile: "h200-llama-3.1-8b"},
		{ID: "b", Address: "127.0.0.1:2", Model: "m", Profile: "a100-llama-70b"},
		{ID: "c", Address: "127.0.0.1:3", Model: "m"},
	})
	for id, want := range map[string]string{"a": "h200-llama-3.1-8b", "b": DefaultProfile, "c": DefaultProfile} {
		if got, _, _ := pool.Get(id).StepScales(time.Now()); got != want {
			t.Errorf("replica %s predicted with %s, want %s", id, got, want)
		}
	}
	// A description that changes profile changes the model's.
	pool.SetReplicas([]fleet.Replica{{ID: "a", Address: "127.0.0.1:1", Model: "m", Profile: "h100-llama-3.2-1b"}})
	if got, _, _ := pool.Get("a").StepScales(time.Now()); got != "h100-llama-3.2-1b" {
		t.Errorf("after the description changed, predicted with %s", got)
	}
}
