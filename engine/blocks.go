package engine

// blockPool is the KV cache as vLLM v1 keeps it (vllm/v1/core/block_pool.py, BlockPool, and
// vllm/v1/core/kv_cache_utils.py, FreeKVCacheBlockQueue): fixed-size blocks with reference
// counts; a full prompt block is published under its chained hash once computed, so any
// request whose prompt starts with the same blocks shares it (running or not); a block whose
// count drops to zero goes to the tail of a free queue but keeps its hash, and allocation
// takes from the head, evicting that hash. A block in use is never evicted.
type blockPool struct {
	blocks []kvBlock
	// free is an intrusive doubly linked list over blocks; the sentinel is index len(blocks).
	nfree  int
	cached blockIndex
}

type kvBlock struct {
	ref        int32
	prev, next int32
	// hashed: the block answers lookups of hash (it is cached[hash]). A block whose content
	// another block published again later keeps its hash but answers nothing.
	hashed bool
	hash   uint64
}

func newBlockPool(n int) *blockPool {
	p := &blockPool{blocks: make([]kvBlock, n+1), cached: newBlockIndex(n)}
	s := int32(n)
	p.blocks[s].prev, p.blocks[s].next = s, s
	for i := range n {
		p.pushTail(int32(i))
	}
	return p
}

func (p *blockPool) total() int      { return len(p.blocks) - 1 }
func (p *blockPool) sentinel() int32 { return int32(len(p.blocks) - 1) }

// used is the number of blocks held by some request; a cached block nobody holds is free.
// vLLM reports usage the same way: 1 - free/total (BlockPool.get_usage).
func (p *blockPool) used() int { return p.total() - p.nfree }

func (p *blockPool) pushTail(id int32) {
	s := p.sentinel()
	last := p.blocks[s].prev
	p.blocks[id].prev, p.blocks[id].next = last, s
	p.blocks[last].next = id
	p.blocks[s].prev = id
	p.nfree++
}

func (p *blockPool) unlink(id int32) {
	b := &p.blocks[id]
	p.blocks[b.prev].next = b.next
	p.blocks[b.next].prev = b.prev
	b.prev, b.next = -1, -1
	p.nfree--
}

// hits appends to dst the ids of the leading blocks of a prompt found in the cache, at most
// limit of them.
func (p *blockPool) hits(dst []int32, hashes []uint64, limit int) []int32 {
	for _, h := range hashes[:min(len(hashes), limit)] {
		id, ok := p.cached.get(h)
		if !ok {
			break
		}
		dst = append(dst, id)
	}
	return dst
}

// evictable is how many of the blocks nobody holds: touching them takes them off the free
// queue, so they cannot also serve as new blocks.
func (p *blockPool) evictable(ids []int32) int {
	k := 0
	for _, id := range ids {
		if p.blocks[id].ref == 0 {
			k++
		}
	}
	return k
}

// touch takes a reference on cached blocks and appends their ids to dst.
func (p *blockPool) touch(dst []int32, ids []int32) []int32 {
	for _, id := range ids {
		if p.blocks[id].ref == 0 {
			p.unlink(id)
		}
		p.blocks[id].ref++
		dst = append(dst, id)
	}
	return dst
}

// allocate appends n fresh blocks from the head of the free queue (least recently freed),
// evicting whatever prefix they cached; it reports false, changing nothing, if too few are free.
func (p *blockPool) allocate(dst []int32, n int) ([]int32, bool) {
	if n > p.nfree {
		return dst, false
	}
	s := p.sentinel()
	for range n {
		id := p.blocks[s].next
		p.unlink(id)
		b := &p.blocks[id]
		if b.hashed {
			p.cached.del(b.hash)
			b.hashed = false
		}
		b.ref = 1
		dst = append(dst, id)
	}
	return dst, true
}

// release drops a request's references. Blocks go to the free queue last block first, so the
// tail of a prompt is evicted before its head, which more requests share (vLLM frees in
// reverse order for the same reason).
func (p *blockPool) release(ids []int32) {
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		b := &p.blocks[id]
		b.ref--
		if b.ref == 0 {
			p.pushTail(id)
		}
	}
}

// publish makes a computed full block findable by its hash. When another block already holds
// the same content (two requests computed the same prefix, or a fully cached prompt
// recomputed its last block), the newer one answers lookups: it is the one freed last, so the
// content survives as long as either copy would (vLLM keeps both under the hash).
func (p *blockPool) publish(id int32, hash uint64) {
	b := &p.blocks[id]
	b.hashed, b.hash = true, hash
	if old, had := p.cached.set(hash, id); had && old != id {
		p.blocks[old].hashed = false
	}
}
