package engine

import "math/bits"

// blockIndex maps a block's hash to the block that answers lookups of it: open addressing
// with linear probing and backward-shift deletion, at most half full. The prefix cache
// inserts a hash for every block it publishes and deletes one for every cached block it
// evicts; with Go's map that churn left probe sequences long (tombstones), and lookups took
// a third of the simulator's time on a day of Mooncake's long prompts. A slot keeps its
// hash and block together, so a probe touches one cache line.
type blockIndex struct {
	slots []slot
	shift uint
	n     int
}

type slot struct {
	hash uint64
	id   int32 // -1: empty
}

// newBlockIndex holds up to n hashes (one per KV block).
func newBlockIndex(n int) blockIndex {
	size := 1 << bits.Len(uint(2*max(n, 4)-1))
	x := blockIndex{slots: make([]slot, size), shift: uint(64 - bits.TrailingZeros(uint(size)))}
	for i := range x.slots {
		x.slots[i].id = -1
	}
	return x
}

// home is where a hash's probe starts (Fibonacci hashing: callers' hashes may be small
// integers in tests, not uniformly spread).
func (x *blockIndex) home(h uint64) int { return int((h * 0x9E3779B97F4A7C15) >> x.shift) }

func (x *blockIndex) next(i int) int { return (i + 1) & (len(x.slots) - 1) }

// find returns the slot holding h, or the empty slot where it would go.
func (x *blockIndex) find(h uint64) int {
	i := x.home(h)
	for s := &x.slots[i]; s.id >= 0 && s.hash != h; s = &x.slots[i] {
		i = x.next(i)
	}
	return i
}

func (x *blockIndex) get(h uint64) (int32, bool) {
	s := x.slots[x.find(h)]
	return s.id, s.id >= 0
}

// set makes h answer id and returns the block that answered it before, if any.
func (x *blockIndex) set(h uint64, id int32) (old int32, had bool) {
	s := &x.slots[x.find(h)]
	if s.id < 0 {
		if 2*(x.n+1) > len(x.slots) {
			panic("engine: block index over capacity") // one hash per block: cannot happen
		}
		x.n++
	}
	old, had = s.id, s.id >= 0
	s.hash, s.id = h, id
	return old, had
}

// del removes h, shifting back the entries after it that probed past its slot, so that no
// tombstone is left for lookups to walk over.
func (x *blockIndex) del(h uint64) {
	i := x.find(h)
	if x.slots[i].id < 0 {
		return
	}
	x.n--
	for {
		x.slots[i].id = -1
		j := i
		for {
			j = x.next(j)
			if x.slots[j].id < 0 {
				return
			}
			// The entry at j stays if its home lies cyclically in (i, j].
			k := x.home(x.slots[j].hash)
			if (i <= j && i < k && k <= j) || (i > j && (i < k || k <= j)) {
				continue
			}
			x.slots[i] = x.slots[j]
			i = j
			break
		}
	}
}
