// Package engine is the performance model of a GPU serving engine (vLLM-like): continuous
// batching under a max batch size and a KV-cache token budget, a FIFO waiting queue, chunked
// prefill whose cost grows with uncached prompt tokens, decode steps whose cost grows with
// the batch and its context, and prefix caching by prompt block with LRU eviction.
//
// It is pure and clock-free: Step says how long the next forward pass takes and what it
// produced; the caller decides how time passes (replicasim sleeps, the simulator advances
// virtual time). An Engine is not safe for concurrent use.
package engine

import (
	"fmt"
	"time"

	lru "github.com/hashicorp/golang-lru/v2/simplelru"
)

// Request is one generation request as the engine sees it.
type Request struct {
	ID           uint64
	PromptTokens int
	// MaxTokens is the number of tokens to generate (the simulator has no EOS).
	MaxTokens int
	// BlockHashes are chained hashes of the prompt's full BlockSize-token blocks, in order;
	// nil disables prefix caching for the request.
	BlockHashes []uint64
}

// Emit is one token produced by a step.
type Emit struct {
	ID    uint64
	Index int  // 0-based index of the generated token
	Done  bool // the request has generated all its tokens
	// CachedTokens is the prompt tokens served from the prefix cache (set on Index 0).
	CachedTokens int
}

// StepResult is what one forward pass did. Emits is reused by the next Step.
type StepResult struct {
	Duration time.Duration
	Emits    []Emit
	// Preempted counts sequences evicted back to the queue for lack of KV cache.
	Preempted int
}

// Stats is the engine's state in vLLM's metric terms.
type Stats struct {
	Running, Waiting int
	KVUsage          float64 // used KV blocks / total, 0..1
	// PrefixQueries and PrefixHits count prompt tokens looked up and found in the prefix cache.
	PrefixQueries, PrefixHits int64
	Preemptions               int64
}

type seq struct {
	req       Request
	computed  int // tokens whose KV is computed (prompt, then generated)
	generated int
	cached    int // prompt tokens that came from the prefix cache on admission
	blocks    int // KV blocks held
	emitted   int // tokens already handed to the caller (survives preemption)
}

// total is the number of tokens the sequence must have in cache to generate the next token.
func (s *seq) total() int { return s.req.PromptTokens + s.generated }

// Engine is one replica's serving engine.
type Engine struct {
	p          Profile
	totalBlock int
	usedBlocks int
	waiting    []*seq
	running    []*seq
	// prefix holds block hashes whose KV is kept after their sequence ended, LRU-evicted
	// as running sequences need the memory.
	prefix *lru.LRU[uint64, struct{}]
	stats  Stats
	emits  []Emit
}

// New returns an engine for the profile.
func New(p Profile) (*Engine, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	total := p.KVTokens / p.BlockSize
	cache, err := lru.NewLRU[uint64, struct{}](total, nil)
	if err != nil {
		return nil, fmt.Errorf("prefix cache: %w", err)
	}
	return &Engine{p: p, totalBlock: total, prefix: cache}, nil
}

// Profile returns the engine's profile.
func (e *Engine) Profile() Profile { return e.p }

// Add queues a request. MaxTokens < 1 is treated as 1. A request whose prompt and output
// could never fit in the KV cache is refused, as vLLM refuses one longer than max_model_len.
func (e *Engine) Add(r Request) error {
	r.MaxTokens = max(r.MaxTokens, 1)
	r.PromptTokens = max(r.PromptTokens, 1)
	if e.blocksFor(r.PromptTokens+r.MaxTokens) > e.totalBlock {
		return fmt.Errorf("prompt (%d tokens) plus max_tokens (%d) exceeds the KV cache (%d tokens)",
			r.PromptTokens, r.MaxTokens, e.totalBlock*e.p.BlockSize)
	}
	e.waiting = append(e.waiting, &seq{req: r})
	return nil
}

// MaxContext is the largest prompt plus output the engine accepts.
func (e *Engine) MaxContext() int { return e.totalBlock * e.p.BlockSize }

// Cancel drops a request wherever it is; it reports whether it was found.
func (e *Engine) Cancel(id uint64) bool {
	for i, s := range e.waiting {
		if s.req.ID == id {
			e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
			return true
		}
	}
	for i, s := range e.running {
		if s.req.ID == id {
			e.release(s)
			e.running = append(e.running[:i], e.running[i+1:]...)
			return true
		}
	}
	return false
}

// Idle reports whether there is nothing to compute.
func (e *Engine) Idle() bool { return len(e.waiting) == 0 && len(e.running) == 0 }

// Stats returns the current state.
func (e *Engine) Stats() Stats {
	s := e.stats
	s.Running, s.Waiting = len(e.running), len(e.waiting)
	s.KVUsage = float64(e.usedBlocks) / float64(e.totalBlock)
	return s
}

func (e *Engine) blocksFor(tokens int) int { return (tokens + e.p.BlockSize - 1) / e.p.BlockSize }

// freeBlocks is what running sequences may still claim; cached prefix blocks give way.
func (e *Engine) freeBlocks() int { return e.totalBlock - e.usedBlocks }

func (e *Engine) claim(n int) bool {
	if n > e.freeBlocks() {
		return false
	}
	e.usedBlocks += n
	// Prefix blocks live in memory not held by running sequences.
	for e.prefix.Len() > e.totalBlock-e.usedBlocks {
		e.prefix.RemoveOldest()
	}
	return true
}

func (e *Engine) release(s *seq) {
	e.usedBlocks -= s.blocks
	s.blocks = 0
}

// Step runs one forward pass: admits waiting requests while the batch, the KV cache and the
// token budget allow, computes one chunk of prefill per admitted sequence and one decode
// token per running one, and returns its duration and the tokens it produced.
// On an idle engine it returns a zero result.
func (e *Engine) Step() StepResult {
	e.emits = e.emits[:0]
	res := StepResult{}
	budget := e.p.MaxBatchedTokens

	// Decode first (vLLM's scheduler serves running requests before new ones); each decoding
	// sequence needs a slot for its next token, and preempts the newest if memory is short.
	var decodeB, decodeCtx int
	for i := 0; i < len(e.running); i++ {
		s := e.running[i]
		if s.generated == 0 || s.total()-s.computed != 1 {
			continue // prefilling (or recomputing after preemption)
		}
		for e.blocksFor(s.total()) > s.blocks {
			if e.claim(1) {
				s.blocks++
				continue
			}
			victim := e.running[len(e.running)-1]
			e.preempt(victim)
			res.Preempted++
			if victim == s {
				break
			}
		}
		if s.blocks == 0 {
			break // s itself was preempted: it was last, so the loop ends here
		}
		decodeB++
		decodeCtx += s.total()
		s.computed++
		budget--
	}

	// Admit from the queue in FIFO order while the batch, KV cache and token budget allow.
	pending := 0
	for _, s := range e.running {
		pending += s.total() - s.computed
	}
	admit := budget - pending
	for len(e.waiting) > 0 && len(e.running) < e.p.MaxBatch && admit > 0 {
		s := e.waiting[0]
		need := e.blocksFor(s.total())
		if !e.claim(need) {
			break
		}
		s.blocks = need
		e.waiting = e.waiting[1:]
		e.lookupPrefix(s)
		e.running = append(e.running, s)
		admit -= s.total() - s.computed
	}

	// One prefill chunk per sequence not yet fully computed, within the token budget.
	var prefT, prefQuad, prefCached, prefRead float64
	for _, s := range e.running {
		if s.computed >= s.total() || budget <= 0 {
			continue
		}
		n := min(s.total()-s.computed, budget)
		budget -= n
		N := float64(n)
		prefT += N
		prefQuad += N * N
		prefCached += N * float64(s.computed)
		prefRead += float64(s.computed)
		s.computed += n
	}

	ms := 0.0
	if prefT > 0 {
		ms += e.p.PrefillBaseMs + e.p.PrefillPerTokenMs*prefT + e.p.PrefillQuadMs*prefQuad + e.p.PrefillCachedMs*prefCached + e.p.PrefillReadMs*prefRead
	}
	if decodeB > 0 {
		d := e.p.DecodeMs(decodeB, decodeCtx)
		if prefT > 0 {
			// One forward pass reads the weights once: the mixed step pays one base cost.
			d -= min(e.p.DecodeBaseMs, e.p.PrefillBaseMs)
		}
		ms += d
	}
	res.Duration = time.Duration(ms * float64(time.Millisecond))

	// Every sequence whose cache is now complete samples a token.
	kept := e.running[:0]
	for _, s := range e.running {
		if s.computed < s.total() {
			kept = append(kept, s)
			continue
		}
		s.generated++ // the sampled token's KV is computed by the next step
		if s.generated > s.emitted {
			s.emitted = s.generated
			em := Emit{ID: s.req.ID, Index: s.generated - 1, Done: s.generated >= s.req.MaxTokens}
			if em.Index == 0 {
				em.CachedTokens = s.cached
			}
			e.emits = append(e.emits, em)
		}
		if s.generated >= s.req.MaxTokens {
			e.release(s)
			continue
		}
		kept = append(kept, s)
	}
	clear(e.running[len(kept):])
	e.running = kept
	res.Emits = e.emits
	return res
}

// lookupPrefix marks the longest cached run of the prompt's leading blocks as computed and
// records the prompt's blocks as cached from now on (vLLM caches a block once computed).
func (e *Engine) lookupPrefix(s *seq) {
	if s.computed > 0 || s.generated > 0 {
		return // a preempted sequence recomputes; its prefix was counted the first time
	}
	hits := 0
	for _, h := range s.req.BlockHashes {
		if _, ok := e.prefix.Get(h); !ok {
			break
		}
		hits++
	}
	cached := min(hits*e.p.BlockSize, s.req.PromptTokens-1)
	s.computed, s.cached = cached, cached
	e.stats.PrefixQueries += int64(s.req.PromptTokens)
	e.stats.PrefixHits += int64(cached)
	for _, h := range s.req.BlockHashes {
		if e.prefix.Len() >= e.totalBlock-e.usedBlocks {
			break
		}
		e.prefix.Add(h, struct{}{})
	}
}

func (e *Engine) preempt(s *seq) {
	e.release(s)
	s.computed = 0
	e.running = e.running[:len(e.running)-1]
	e.waiting = append([]*seq{s}, e.waiting...)
	e.stats.Preemptions++
}
