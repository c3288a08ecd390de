package router

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-serve/arbiter/fleet"
)

// benchPick measures finding a model's candidates and picking one, as the proxy does it,
// with a prompt prefix and prefix affinity on: issue 22 §4 wants it nearly flat in the
// fleet's size and free of allocations.
func benchPick(b *testing.B, models, perModel int, scanAll int) {
	now := time.Unix(1000, 0)
	var set []fleet.Replica
	for m := range models {
		for i := range perModel {
			set = append(set, fleet.Replica{ID: fmt.Sprintf("m%03d-r%04d", m, i), Address: "127.0.0.1:1", Model: fmt.Sprintf("m%03d", m),
				Capacity: fleet.OnDemand, PricePerHour: float64(1 + i%4), TokensPerSecond: 5000})
		}
	}
	pool := NewPool(&Config{}, slog.New(slog.NewTextHandler(io.Discard, nil)), NewMetrics(prometheus.NewRegistry()), nil)
	pool.SetReplicas(set)
	for i, r := range pool.Snapshot() {
		r.observeScrape(now, float64(i%8), 0, 0.3)
	}
	aff, err := NewAffinity(100_000, 64)
	if err != nil {
		b.Fatal(err)
	}
	p := &SLOCheapest{Affinity: aff, StaleAfter: time.Second, ResampleEvery: -1, ScanAll: scanAll}
	prefix := prefixBlocks(string(make([]byte, 8*prefixBlockBytes)), 0)
	req := &Request{Model: "m000", PromptTokens: 2000, OutTokens: 200, Prefix: prefix, SLO: SLO{TTFT: 1, TPOT: 0.1}}
	rng := rand.New(rand.NewPCG(1, 1))
	b.ReportAllocs()
	for b.Loop() {
		req.Now = now
		if p.Pick(req, pool.candidates(req.Model), rng) == nil {
			b.Fatal("no pick")
		}
	}
}

// BenchmarkSLOCheapestPick: one model of n replicas in four price tiers; "scan" predicts
// every candidate (what every pick did before sampling), "sample" is the default.
func BenchmarkSLOCheapestPick(b *testing.B) {
	for _, n := range []int{4, 16, 64, 512, 4096} {
		b.Run(fmt.Sprintf("candidates=%d/sample", n), func(b *testing.B) { benchPick(b, 1, n, 0) })
		b.Run(fmt.Sprintf("candidates=%d/scan", n), func(b *testing.B) { benchPick(b, 1, n, n) })
	}
}

// BenchmarkPickAmongModels: a router holding many models routes one model's request as
// cheaply as a router holding that model alone.
func BenchmarkPickAmongModels(b *testing.B) {
	for _, models := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("models=%d×40", models), func(b *testing.B) { benchPick(b, models, 40, 0) })
	}
}

// BenchmarkRequestAccounting is a request's routing work besides the network, as the proxy
// does it under closed-loop load: pick among two replicas, Begin, and Completed and End for
// the request that came in inflight requests earlier, with the clock moving 100 µs a request
// (10,000 req/s). A prediction runs the replica's model over what is in flight on it, so this
// is the part of the router's CPU per request that grows with its load.
func BenchmarkRequestAccounting(b *testing.B) {
	for _, inflight := range []int{1, 64, 512} {
		for _, streamed := range []bool{false, true} {
			b.Run(fmt.Sprintf("inflight=%d/streamed=%v", inflight, streamed), func(b *testing.B) {
				benchAccounting(b, inflight, streamed)
			})
		}
	}
}

func benchAccounting(b *testing.B, inflight int, streamed bool) {
	pool := NewPool(&Config{}, slog.New(slog.NewTextHandler(io.Discard, nil)), NewMetrics(prometheus.NewRegistry()), nil)
	pool.SetReplicas([]fleet.Replica{
		{ID: "a", Address: "127.0.0.1:1", Model: "m", Capacity: fleet.OnDemand, PricePerHour: 1, TokensPerSecond: 5000},
		{ID: "b", Address: "127.0.0.1:2", Model: "m", Capacity: fleet.OnDemand, PricePerHour: 2, TokensPerSecond: 5000},
	})
	aff, err := NewAffinity(100_000, 64)
	if err != nil {
		b.Fatal(err)
	}
	p := &SLOCheapest{Affinity: aff, StaleAfter: time.Second, ResampleEvery: -1}
	type live struct {
		r    *Replica
		req  Request
		pred Prediction
	}
	ring := make([]live, inflight)
	now := time.Unix(1000, 0)
	rng := rand.New(rand.NewPCG(1, 1))
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(100 * time.Microsecond)
		slot := &ring[n%inflight]
		if slot.r != nil { // the oldest request's answer came: 2 ms, 16 tokens
			slot.req.Now = now.Add(-2 * time.Millisecond)
			slot.r.Completed(&slot.req, slot.pred, 0.001, 0.002, 16, streamed)
			slot.r.End(slot.pred, now)
		}
		slot.req = Request{Model: "m", PromptTokens: 24, OutTokens: 16, SLO: SLO{TTFT: 1, TPOT: 0.1}, Now: now, Streamed: streamed}
		r := p.Pick(&slot.req, pool.candidates("m"), rng)
		if r == nil {
			b.Fatal("no pick")
		}
		slot.r, slot.pred = r, r.Begin(&slot.req, time.Second)
		n++
	}
}
