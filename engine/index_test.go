package engine

import (
	"math/rand/v2"
	"testing"
)

// The index answers as a map would under the prefix cache's churn: sets, overwrites and
// deletes of hashes drawn from a small range (so probes collide and wrap around the table).
func TestBlockIndexAgreesWithAMap(t *testing.T) {
	const blocks = 100
	x := newBlockIndex(blocks)
	m := map[uint64]int32{}
	rng := rand.New(rand.NewPCG(1, 2))
	for step := range 200_000 {
		h := rng.Uint64N(300)
		switch op := rng.IntN(3); {
		case op == 0 && (len(m) < blocks || m[h] != 0):
			id := int32(rng.IntN(blocks)) + 1
			old, had := x.set(h, id)
			if want, wok := m[h]; had != wok || had && old != want {
				t.Fatalf("step %d: set(%d) replaced %d, %v; the map had %d, %v", step, h, old, had, want, wok)
			}
			m[h] = id
		case op == 1:
			x.del(h)
			delete(m, h)
		}
		id, ok := x.get(h)
		if want, wok := m[h]; ok != wok || id != want && wok {
			t.Fatalf("step %d: get(%d) = %d, %v; the map has %d, %v", step, h, id, ok, want, wok)
		}
		if x.n != len(m) {
			t.Fatalf("step %d: %d entries, the map has %d", step, x.n, len(m))
		}
	}
	for h, want := range m {
		if id, ok := x.get(h); !ok || id != want {
			t.Fatalf("get(%d) = %d, %v; want %d", h, id, ok, want)
		}
	}
}
