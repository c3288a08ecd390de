package engine

import (
	"testing"
)

// chain returns n block hashes starting at base (distinct bases give distinct prompts).
func chain(base uint64, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = base + uint64(i)
	}
	return h
}

// runUntilFirstToken steps until request id has its first token.
func runUntilFirstToken(t *testing.T, e *Engine, id uint64) {
	t.Helper()
	for range 10_000 {
		for _, em := range e.Step().Emits {
			if em.ID == id && em.Index == 0 {
				return
			}
		}
	}
	t.Fatalf("request %d never produced a token", id)
}

func TestRunningRequestsShareCachedBlocks(t *testing.T) {
	e := newEngine(t, nil)
	hashes := chain(1000, 64) // 1,024-token prompt
	must(t, e.Add(Request{ID: 1, PromptTokens: 1024, MaxTokens: 500, BlockHashes: hashes}))
	runUntilFirstToken(t, e, 1)
	before := e.kv.used()
	must(t, e.Add(Request{ID: 2, PromptTokens: 1024, MaxTokens: 500, BlockHashes: hashes}))
	var cached int
	for range 100 {
		for _, em := range e.Step().Emits {
			if em.ID == 2 && em.Index == 0 {
				cached = em.CachedTokens
			}
		}
		if cached > 0 {
			break
		}
	}
	if cached != 1008 {
		t.Fatalf("second request found %d cached tokens while the first still runs, want 1008 (63 blocks)", cached)
	}
	// The second request holds only what it does not share: its last prompt block and
	// its output blocks, not another copy of the prompt.
	if grown := e.kv.used() - before; grown > 1+(500/16)+2 {
		t.Errorf("second request took %d more blocks although it shares 63 of its prompt's 64", grown)
	}
}

func TestBlocksInUseAreNeverEvicted(t *testing.T) {
	// 4,096 tokens of cache: a running 1,600-token request holds 100 of 256 blocks.
	e := newEngine(t, func(p *Profile) { p.KVTokens = 4096 })
	held := chain(1, 100)
	must(t, e.Add(Request{ID: 1, PromptTokens: 1600, MaxTokens: 200, BlockHashes: held}))
	runUntilFirstToken(t, e, 1)
	// Others churn through the rest of the cache with prompts of their own.
	for i := range 6 {
		id := uint64(10 + i)
		must(t, e.Add(Request{ID: id, PromptTokens: 2000, MaxTokens: 1, BlockHashes: chain(uint64(1000*(i+1)), 125)}))
		runUntilFirstToken(t, e, id)
	}
	if n := len(e.kv.hits(nil, held, len(held))); n != len(held) {
		t.Errorf("only %d of the running request's %d blocks are still cached", n, len(held))
	}
}

func TestFreedBlocksAreEvictedLeastRecentlyUsedAndTailFirst(t *testing.T) {
	e := newEngine(t, func(p *Profile) { p.KVTokens = 4096 }) // 256 blocks
	a, b := chain(1, 100), chain(1000, 100)
	for i, h := range [][]uint64{a, b, a} { // a, then b, then a again: b is least recently used
		must(t, e.Add(Request{ID: uint64(i + 1), PromptTokens: 1600, MaxTokens: 1, BlockHashes: h}))
		drive(t, e)
	}
	// 116 more blocks: the never-used ones go first, then b's, the least recently freed
	// prompt, from its tail: b keeps its first 40 blocks, a keeps all.
	must(t, e.Add(Request{ID: 9, PromptTokens: 116 * 16, MaxTokens: 1}))
	drive(t, e)
	if n := len(e.kv.hits(nil, a, 100)); n != 100 {
		t.Errorf("recently used prompt a: %d of 100 blocks cached, want 100", n)
	}
	if n := len(e.kv.hits(nil, b, 100)); n != 40 {
		t.Errorf("older prompt b: leading %d blocks cached, want 40 (its tail evicted first)", n)
	}
	if e.kv.used() != 0 {
		t.Errorf("%d blocks held after every request finished", e.kv.used())
	}
}

// A conversation's next turn repeats the last answer after its prompt: vLLM caches the
// answer's full blocks as they are computed, so the next turn finds the prompt and the
// answer cached, not the prompt alone.
func TestGeneratedBlocksAreCached(t *testing.T) {
	e := newEngine(t, nil)
	// Turn 1: a 1,000-token prompt (62 full blocks) and a 300-token answer. Its sequence's
	// full blocks: 1,299 computed tokens (the last token's KV is never computed), 81 blocks.
	turn1 := chain(5000, 81)
	must(t, e.Add(Request{ID: 1, PromptTokens: 1000, MaxTokens: 300, BlockHashes: turn1}))
	drive(t, e)
	// Turn 2: the same 1,300 tokens and 200 more: its first 81 blocks are turn 1's.
	turn2 := append(append([]uint64(nil), turn1...), chain(9000, 12)...)
	must(t, e.Add(Request{ID: 2, PromptTokens: 1500, MaxTokens: 1, BlockHashes: turn2}))
	var cached int
	for !e.Idle() {
		for _, em := range e.Step().Emits {
			if em.ID == 2 && em.Index == 0 {
				cached = em.CachedTokens
			}
		}
	}
	if cached != 81*16 {
		t.Fatalf("turn 2 found %d tokens cached, want the 81 full blocks of turn 1's prompt and answer (%d)", cached, 81*16)
	}
}
