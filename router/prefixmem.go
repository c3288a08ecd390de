package router

// prefixMemory is what one replica's prefix cache holds, as far as this router knows: the
// prompts it sent there, at the affinity table's checkpoints, forgotten after about the
// replica's KV capacity in newer tokens. vLLM keeps a finished request's blocks in its
// cache and, when it needs room, reuses the least recently used first
// (vllm/v1/core/block_pool.py, FreeKVCacheBlockQueue). Without it, the router knew a
// prompt's prefix only on its last holder, and predicted every other replica that had
// served the conversation (it moves when its holder is busy) to compute it all again.
//
// Two generations of a hash set make the LRU cheap and allocation-free to look up: a
// prompt sent is recorded in the new generation (its shared checkpoints included, which
// refreshes them), and when the new one has taken half the capacity in tokens, the old is
// dropped and the new becomes old. An entry lives on for half to all of the capacity.
type prefixMemory struct {
	cur, old  map[uint64]struct{}
	curTokens float64
}

// match is how many tokens of prefix the replica holds: the longest recorded run of its
// blocks from the first, at blockTokens tokens a block.
func (m *prefixMemory) match(prefix []uint64, blockTokens float64) int {
	if len(m.cur)+len(m.old) == 0 || len(prefix) == 0 {
		return 0
	}
	if blockTokens <= 0 {
		blockTokens = defaultBlockTokens
	}
	// The checkpoints of a recorded prompt are a run from the first: binary search for
	// its end, as Affinity.lookup does.
	held := 0
	lo, hi := 1, len(prefix)
	for lo <= hi {
		mid := (lo + hi) / 2
		k := nextCheckpoint(mid, hi)
		if k == 0 {
			hi = mid - 1
			continue
		}
		if m.has(prefix[k-1]) {
			held, lo = k, k+1
		} else {
			hi = k - 1
		}
	}
	return int(float64(held) * blockTokens)
}

func (m *prefixMemory) has(h uint64) bool {
	if _, ok := m.cur[h]; ok {
		return true
	}
	_, ok := m.old[h]
	return ok
}

// add records a prompt sent to the replica, which fills tokens of its cache (what it
// computes and generates), under a capacity of capacity tokens.
func (m *prefixMemory) add(prefix []uint64, tokens, capacity float64) {
	if len(prefix) == 0 {
		return
	}
	if m.cur == nil {
		m.cur = make(map[uint64]struct{}, len(prefix))
	}
	for k := len(prefix); k >= 1; k-- {
		if checkpoint(k) {
			m.cur[prefix[k-1]] = struct{}{}
		}
	}
	m.curTokens += max(tokens, 0)
	if capacity > 0 && m.curTokens >= capacity/2 {
		m.old, m.cur, m.curTokens = m.cur, nil, 0
	}
}

// reset forgets everything (the replica restarted, or its cache was found empty).
func (m *prefixMemory) reset() { *m = prefixMemory{} }
