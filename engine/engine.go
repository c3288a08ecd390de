// Package engine is the performance model of a GPU serving engine (vLLM-like): continuous
// batching under a max batch size and a KV-cache token budget, a FIFO waiting queue (or one
// ordered by priority, as vLLM's --scheduling-policy priority orders it), chunked
// prefill whose cost grows with uncached prompt tokens, decode steps whose cost grows with
// the batch and its context, and prefix caching by prompt block as vLLM v1 does it (see
// blockPool).
//
// It is pure and clock-free: Step says how long the next forward pass takes and what it
// produced; the caller decides how time passes (replicasim sleeps, the simulator advances
// virtual time). An Engine is not safe for concurrent use.
package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Request is one generation request as the engine sees it.
type Request struct {
	ID           uint64
	PromptTokens int
	// MaxTokens is the number of tokens to generate (the simulator has no EOS).
	MaxTokens int
	// BlockHashes are chained hashes of the sequence's full BlockSize-token blocks, in
	// order: the prompt's, then those its generated tokens will fill, as far as the caller
	// knows them (a block is published once all its tokens' KV is computed, so a later
	// prompt that repeats an answer finds it cached, as vLLM v1 caches generated blocks:
	// vllm/v1/core/single_type_kv_cache_manager.py cache_blocks, called by
	// KVCacheManager.allocate_slots for every full block). nil disables prefix caching.
	BlockHashes []uint64
	// Adapter is the LoRA adapter the request runs with (vLLM's lora_int_id; 0: the base
	// model). Needs SetLoRA.
	Adapter uint32
	// AdapterLoad is how long reading Adapter from disk takes, paid by the step that needs it
	// when it is not in CPU memory.
	AdapterLoad time.Duration
	// Priority orders the queue under priority scheduling (SetPriorityScheduling): lower
	// first, then earlier arrival, as vLLM's --scheduling-policy priority does with its
	// requests' priority field (default 0). Ignored first come first served.
	Priority int
}

// Emit is one token produced by a step.
type Emit struct {
	ID    uint64
	Index int  // 0-based index of the generated token
	Done  bool // the request has generated all its tokens
	// CachedTokens is the prompt tokens served from the prefix cache (set on Index 0).
	CachedTokens int
}

// StepResult is what one forward pass did. Emits and Scheduled are reused by the next Step.
type StepResult struct {
	Duration time.Duration
	Emits    []Emit
	// Preempted counts sequences evicted back to the queue for lack of KV cache.
	Preempted int
	// Scheduled lists the requests that left the queue for the first time in this step.
	Scheduled []uint64
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
	cached    int     // prompt tokens that came from the prefix cache on admission
	blocks    []int32 // KV blocks held, in token order
	published int     // leading blocks published to the prefix cache
	emitted   int     // tokens already handed to the caller (survives preemption)
	admitted  bool    // left the queue once (a preempted sequence returns to it)
	arrival   uint64  // the order of its Add: priority scheduling's tie-break
	decodedIn uint64  // the step that last scheduled its decode
}

// total is the number of tokens the sequence must have in cache to generate the next token.
func (s *seq) total() int { return s.req.PromptTokens + s.generated }

// Engine is one replica's serving engine.
type Engine struct {
	p          Profile
	totalBlock int
	kv         *blockPool
	waiting    []*seq
	running    []*seq
	stats      Stats
	emits      []Emit
	scheduled  []uint64
	hitIDs     []int32    // admit's scratch: the cached blocks of the prompt it admits
	lora       *loraState // nil: no adapters (SetLoRA)
	// priority: the queue is ordered by (Priority, arrival) and a preemption evicts the
	// running sequence last in that order (SetPriorityScheduling); else first come first
	// served, and a preemption evicts the newest.
	priority bool
	arrivals uint64
	steps    uint64
}

// New returns an engine for the profile.
func New(p Profile) (*Engine, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	total := p.KVTokens / p.BlockSize
	return &Engine{p: p, totalBlock: total, kv: newBlockPool(total)}, nil
}

// Profile returns the engine's profile.
func (e *Engine) Profile() Profile { return e.p }

// Add queues a request. MaxTokens < 1 is treated as 1. A request whose prompt and output
// could never fit in the KV cache is refused, as vLLM refuses one longer than max_model_len.
func (e *Engine) Add(r Request) error {
	r.MaxTokens = max(r.MaxTokens, 1)
	r.PromptTokens = max(r.PromptTokens, 1)
	if r.Adapter != 0 && e.lora == nil {
		return errNoLoRA
	}
	if r.MaxTokens > e.MaxContext()-r.PromptTokens {
		return fmt.Errorf("prompt (%d tokens) plus max_tokens (%d) exceeds the context (%d tokens)",
			r.PromptTokens, r.MaxTokens, e.MaxContext())
	}
	e.arrivals++
	e.enqueue(&seq{req: r, arrival: e.arrivals})
	return nil
}

// SetPriorityScheduling orders the queue by each request's Priority, then its arrival, and
// preempts the running sequence last in that order when the KV cache is short, as vLLM's
// --scheduling-policy priority does (vllm/v1/core/sched/scheduler.py: a PriorityRequestQueue
// of (priority, arrival_time), and max(self.running, key=(priority, arrival_time)) as the
// victim). Running sequences are still scheduled before waiting ones: a more urgent arrival
// goes ahead of the queue, not of prefills already under way. Call it before adding any
// request.
func (e *Engine) SetPriorityScheduling() error {
	if !e.Idle() {
		return errors.New("SetPriorityScheduling on an engine with requests")
	}
	e.priority = true
	return nil
}

// before reports whether a goes ahead of b in the queue under priority scheduling.
func before(a, b *seq) bool {
	if a.req.Priority != b.req.Priority {
		return a.req.Priority < b.req.Priority
	}
	return a.arrival < b.arrival
}

// enqueue puts s in the queue: last first come first served, in its place by (Priority,
// arrival) under priority scheduling.
func (e *Engine) enqueue(s *seq) {
	if !e.priority {
		e.waiting = append(e.waiting, s)
		return
	}
	i, _ := slices.BinarySearchFunc(e.waiting, s, func(x, t *seq) int {
		if before(x, t) {
			return -1
		}
		return 1
	})
	e.waiting = slices.Insert(e.waiting, i, s)
}

// victim is the running sequence a preemption evicts: the newest first come first served,
// the last by (Priority, arrival) under priority scheduling.
func (e *Engine) victim() int {
	v := len(e.running) - 1
	if e.priority {
		for i, s := range e.running {
			if before(e.running[v], s) {
				v = i
			}
		}
	}
	return v
}

// MaxContext is the largest prompt plus output the engine accepts: the model's context,
// bounded by what the KV cache can hold.
func (e *Engine) MaxContext() int {
	kv := e.totalBlock * e.p.BlockSize
	if e.p.MaxModelLen > 0 {
		return min(e.p.MaxModelLen, kv)
	}
	return kv
}

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
	s.KVUsage = float64(e.kv.used()) / float64(e.totalBlock)
	return s
}

func (e *Engine) blocksFor(tokens int) int { return (tokens + e.p.BlockSize - 1) / e.p.BlockSize }

func (e *Engine) release(s *seq) {
	e.kv.release(s.blocks)
	s.blocks = s.blocks[:0]
	s.published = 0
}

// Step runs one forward pass: admits waiting requests while the batch, the KV cache and the
// token budget allow, computes one chunk of prefill per admitted sequence and one decode
// token per running one, and returns its duration and the tokens it produced.
// On an idle engine it returns a zero result.
func (e *Engine) Step() StepResult {
	e.emits, e.scheduled = e.emits[:0], e.scheduled[:0]
	res := StepResult{}
	budget := e.p.MaxBatchedTokens

	// Decode first (vLLM's scheduler serves running requests before new ones); each decoding
	// sequence needs a slot for its next token, and preempts a running one (victim: the
	// newest, or the least urgent under priority scheduling) if memory is short.
	var decodeB, decodeCtx, decodeAdapters int
	preempted := false
	e.steps++
	for i := 0; i < len(e.running); i++ {
		s := e.running[i]
		if s.generated == 0 || s.total()-s.computed != 1 {
			continue // prefilling (or recomputing after preemption)
		}
		for e.blocksFor(s.total()) > len(s.blocks) {
			var ok bool
			if s.blocks, ok = e.kv.allocate(s.blocks, 1); ok {
				continue
			}
			v := e.victim()
			victim := e.running[v]
			if victim.decodedIn == e.steps {
				// Scheduled earlier in this step: its decode is given back, as vLLM
				// returns a preempted request's scheduled tokens to the budget.
				victim.decodedIn = 0
				decodeB--
				decodeCtx -= victim.total()
				if victim.req.Adapter != 0 {
					decodeAdapters--
				}
				budget++
			}
			e.preemptAt(v)
			res.Preempted++
			preempted = true
			if v <= i {
				i-- // the loop's place moves with the sequences after the victim
			}
			if victim == s {
				break
			}
		}
		if len(s.blocks) == 0 {
			continue // s itself was preempted (first come first served: it was last)
		}
		decodeB++
		decodeCtx += s.total()
		if s.req.Adapter != 0 {
			decodeAdapters++
		}
		s.computed++
		budget--
		e.publish(s)
		s.decodedIn = e.steps
	}

	// Admit from the queue in FIFO order while the batch, KV cache and token budget allow,
	// and only in a step that preempted nothing, as vLLM's scheduler does ("if not
	// preempted_reqs", vllm/v1/core/sched/scheduler.py): the cache is oversubscribed, and
	// a preempted sequence taken back at once would be preempted again, recomputing its
	// prompt at every step.
	pending := 0
	for _, s := range e.running {
		pending += s.total() - s.computed
	}
	admit := budget - pending
	if e.lora != nil {
		e.lora.batchAdapters(e.running)
	}
	for i := 0; !preempted && i < len(e.waiting) && len(e.running) < e.p.MaxBatch && admit > 0; {
		s := e.waiting[i]
		if e.lora != nil && e.lora.skip(s) {
			i++ // no GPU slot for its adapter: later requests may go past it, as in vLLM
			continue
		}
		if !e.admit(s, admit) {
			break
		}
		if i == 0 {
			e.waiting = e.waiting[1:]
		} else {
			e.waiting = slices.Delete(e.waiting, i, i+1)
		}
		e.running = append(e.running, s)
		admit -= s.total() - s.computed
		if e.lora != nil {
			e.lora.join(s)
		}
	}

	// One prefill chunk per sequence not yet fully computed, within the token budget.
	var prefT, prefQuad, prefCached, prefRead, adapterTokens float64
	cachedSeqs := 0
	for _, s := range e.running {
		if s.computed >= s.total() || budget <= 0 {
			continue
		}
		n := e.growForChunk(s, min(s.total()-s.computed, budget))
		if n <= 0 {
			continue // no KV block free for its next chunk: it waits for decodes to end
		}
		budget -= n
		N := float64(n)
		if s.req.Adapter != 0 {
			adapterTokens += N
		}
		prefT += N
		prefQuad += N * N
		prefCached += N * float64(s.computed)
		prefRead += float64(s.computed)
		if s.computed > 0 {
			cachedSeqs++
		}
		s.computed += n
		e.publish(s)
	}

	if prefT == 0 && decodeB == 0 && len(e.running) > 0 {
		// Every running sequence is mid-prompt and none can get a block for its next
		// chunk: give the victim's blocks (the newest's, or the least urgent's) to the
		// others, as vLLM preempts when an allocation fails, or nothing would ever move.
		e.preemptAt(e.victim())
		res.Preempted++
	}

	pf, df := e.p.StepMs(StepShape{Tokens: prefT, SumN2: prefQuad, SumNP: prefCached, SumP: prefRead, CachedSeqs: cachedSeqs,
		DecodeBatch: decodeB, DecodeCtx: float64(decodeCtx)})
	ms := pf + df
	res.Duration = time.Duration(ms * float64(time.Millisecond))
	if e.lora != nil {
		res.Duration += e.lora.stepCost(e.running, ms, adapterTokens+float64(decodeAdapters), prefT+float64(decodeB))
	}

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
	res.Emits, res.Scheduled = e.emits, e.scheduled
	return res
}

// admit gives a waiting sequence the KV blocks of its first chunk (at most budget tokens):
// the longest run of its prompt's leading blocks already cached is shared and counts as
// computed, the rest of the chunk's blocks are allocated; later chunks get theirs as they
// are computed (growForChunk). vLLM's scheduler allocates the same way, for the tokens
// scheduled in a step (vllm/v1/core/sched/scheduler.py, kv_cache_manager.allocate_slots),
// so a long prompt does not wait for room for all of itself. As in vLLM
// (KVCacheManager.get_computed_blocks), a prompt that is entirely cached still computes its
// last token, so at most (tokens-1)/BlockSize blocks hit. It reports false, changing
// nothing, when the free blocks do not suffice.
func (e *Engine) admit(s *seq, budget int) bool {
	e.hitIDs = e.kv.hits(e.hitIDs[:0], s.req.BlockHashes, (s.total()-1)/e.p.BlockSize)
	hit := len(e.hitIDs)
	computed := hit * e.p.BlockSize
	chunk := min(s.total()-computed, budget)
	need := e.blocksFor(computed+chunk) - hit
	if need > e.kv.nfree-e.kv.evictable(e.hitIDs) {
		return false
	}
	s.blocks = e.kv.touch(s.blocks[:0], e.hitIDs)
	s.blocks, _ = e.kv.allocate(s.blocks, need)
	s.computed, s.published = computed, hit
	// vLLM 0.11 counts every lookup, a preempted request's again, over all its tokens
	// (KVCacheManager.get_computed_blocks).
	e.stats.PrefixQueries += int64(s.total())
	e.stats.PrefixHits += int64(s.computed)
	if !s.admitted {
		s.admitted = true
		s.cached = s.computed
		e.scheduled = append(e.scheduled, s.req.ID)
	}
	return true
}

// growForChunk gives a prefilling sequence the blocks for its next n tokens, or for as many
// of them as the free blocks allow, and returns how many tokens it may compute.
func (e *Engine) growForChunk(s *seq, n int) int {
	want := e.blocksFor(s.computed+n) - len(s.blocks)
	if want > 0 {
		s.blocks, _ = e.kv.allocate(s.blocks, min(want, e.kv.nfree))
	}
	return min(n, len(s.blocks)*e.p.BlockSize-s.computed)
}

// publish makes the sequence's computed full blocks, its prompt's and then its answer's,
// findable by later prompts.
func (e *Engine) publish(s *seq) {
	full := s.computed / e.p.BlockSize
	for ; s.published < min(full, len(s.req.BlockHashes)); s.published++ {
		e.kv.publish(s.blocks[s.published], s.req.BlockHashes[s.published])
	}
}

// preemptAt evicts running[i] back to the queue: to its head first come first served, to
// its place by (Priority, arrival) under priority scheduling.
func (e *Engine) preemptAt(i int) {
	s := e.running[i]
	e.release(s)
	s.computed = 0
	e.running = slices.Delete(e.running, i, i+1)
	if e.priority {
		e.enqueue(s)
	} else {
		e.waiting = append([]*seq{s}, e.waiting...)
	}
	e.stats.Preemptions++
}
