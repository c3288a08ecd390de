package router

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// BenchmarkSLOCheapestPick measures one pick over n candidates of mixed prices, with a
// prompt prefix and prefix affinity on, as the proxy calls it (issue 22 §4 wants it nearly
// flat in n and free of allocations).
func BenchmarkSLOCheapestPick(b *testing.B) {
	for _, n := range []int{4, 16, 64, 512, 4096} {
		b.Run(fmt.Sprintf("candidates=%d", n), func(b *testing.B) {
			now := time.Unix(1000, 0)
			rs := make([]*Replica, n)
			for i := range rs {
				rs[i] = newReplica(fleet.Replica{ID: fmt.Sprintf("r%04d", i), Address: "127.0.0.1:1", Model: "m",
					Capacity: fleet.OnDemand, PricePerHour: float64(1 + i%4), TokensPerSecond: 5000}, nil)
				rs[i].observeScrape(now, float64(i%8), 0, 0.3)
			}
			aff, err := NewAffinity(100_000, 64)
			if err != nil {
				b.Fatal(err)
			}
			p := &SLOCheapest{Affinity: aff, StaleAfter: time.Second, ResampleEvery: -1}
			prefix := prefixBlocks(string(make([]byte, 8*prefixBlockBytes)))
			req := &Request{Model: "m", PromptTokens: 2000, OutTokens: 200, Prefix: prefix, SLO: SLO{TTFT: 1, TPOT: 0.1}}
			rng := rand.New(rand.NewPCG(1, 1))
			b.ReportAllocs()
			for b.Loop() {
				req.Now = now
				p.Pick(req, rs, rng)
			}
		})
	}
}
