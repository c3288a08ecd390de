package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// LoRA configures an engine that serves LoRA adapters on its base model, as vLLM's
// --enable-lora with --max-loras and --max-cpu-loras does (vllm/config/lora.py, 0.10–0.11).
//
// What it models, each from vLLM's code or a cited measurement:
//   - GPU slots: a step's batch holds requests of at most MaxLoRAs distinct adapters. A waiting
//     request whose adapter would exceed them is skipped, and later ones (the base model's,
//     or an active adapter's) are scheduled past it; it stays at the head of the queue (V1
//     scheduler, vllm/v1/core/sched/scheduler.py: "Scheduling would exceed max_loras, skip.").
//   - CPU cache: up to MaxCPULoRAs adapters stay in CPU memory, least recently used evicted
//     first (vllm/lora/worker_manager.py LRUCacheWorkerLoRAManager). A step whose batch needs
//     an adapter not in it loads it from disk first: the step takes the request's AdapterLoad
//     longer, as vLLM's worker loads it inside execute_model before the forward pass.
//   - The cost of the LoRA kernels: a step takes 1 + StepCost × (the share of its tokens that
//     are adapters') times the base model's time.
//
// Not modelled: the copy of an adapter from CPU into a GPU slot (LoRAX measured about 20 ms a
// layer, predibase/lorax#433; vLLM publishes no figure), and any cost of mixing several
// adapters in one batch beyond their tokens (no published measurement found; vLLM's PR #11267
// measured the same throughput at --max-loras 1 and 4 with one adapter).
type LoRA struct {
	// MaxLoRAs is the GPU slots: the most distinct adapters in one batch (vLLM's default 1).
	MaxLoRAs int
	// MaxCPULoRAs is the adapters kept in CPU memory (default MaxLoRAs; at least MaxLoRAs,
	// as vLLM requires).
	MaxCPULoRAs int
	// StepCost is the extra step time of a batch of adapter tokens only, as a share of the
	// base model's (DefaultLoRAStepCost when zero; negative means none).
	StepCost float64
}

// DefaultLoRAStepCost is what one rank-8 adapter cost vLLM on an A100 serving Llama-2-7B,
// ShareGPT's 1,000 prompts: 11.45 requests a second on the base model, 7.60 on the adapter
// (vllm-project/vllm#11267), so a step of adapter tokens takes 11.45/7.60 = 1.51× as long.
// Held out from it: vllm-project/vllm#10062 reports "up to a 50% drop in maximum throughput"
// (a step 2.0×) on an A100-40GB with 160 and 640 MB adapters, 25 % more than this model says
// for those larger adapters; vllm-project/vllm#15655 measured 8–24 % slower steps on TPU v6e,
// where this model says 51 %. The figure is modelled, not measured on this project's GPUs.
const DefaultLoRAStepCost = 11.45/7.60 - 1

// loraState is an engine's adapter bookkeeping.
type loraState struct {
	cfg LoRA
	// cpu lists the adapters in CPU memory, least recently used first.
	cpu []uint32
	// stall is load time owed by adapters loaded outside a step (Preload), added to the next.
	stall time.Duration
	// active is Step's scratch: the distinct adapters of the batch.
	active []uint32
}

// SetLoRA enables adapters on the engine; call it before adding any request.
func (e *Engine) SetLoRA(l LoRA) error {
	if l.MaxLoRAs < 1 {
		return fmt.Errorf("max_loras must be at least 1, got %d", l.MaxLoRAs)
	}
	if l.MaxCPULoRAs == 0 {
		l.MaxCPULoRAs = l.MaxLoRAs
	}
	if l.MaxCPULoRAs < l.MaxLoRAs {
		// vLLM's own words (vllm/config/lora.py LoRAConfig.__post_init__).
		return fmt.Errorf("max_cpu_loras (%d) must be >= max_loras (%d)", l.MaxCPULoRAs, l.MaxLoRAs)
	}
	switch {
	case l.StepCost == 0:
		l.StepCost = DefaultLoRAStepCost
	case l.StepCost < 0:
		l.StepCost = 0
	}
	if !e.Idle() {
		return errors.New("SetLoRA on an engine with requests")
	}
	e.lora = &loraState{cfg: l}
	return nil
}

// LoRAConfig returns the engine's adapter configuration and whether it serves adapters.
func (e *Engine) LoRAConfig() (LoRA, bool) {
	if e.lora == nil {
		return LoRA{}, false
	}
	return e.lora.cfg, true
}

// Preload puts an adapter in CPU memory, as vLLM does for --lora-modules at start and for
// /v1/load_lora_adapter (engine_client.add_lora: "This will also preload it for incoming
// requests"). The engine core runs it between steps, so the next step starts load later. It
// reports whether the adapter had to be read (false: it was cached already).
func (e *Engine) Preload(adapter uint32, load time.Duration) (bool, error) {
	if e.lora == nil {
		return false, errNoLoRA
	}
	if adapter == 0 {
		return false, errors.New("adapter 0 is the base model")
	}
	if e.lora.touch(adapter) {
		return false, nil
	}
	e.lora.stall += load
	return true, nil
}

// Cached reports whether an adapter is in CPU memory.
func (e *Engine) Cached(adapter uint32) bool {
	return e.lora != nil && slices.Contains(e.lora.cpu, adapter)
}

// Adapters appends the adapters of running and of waiting requests, each once, in the
// order their requests are: what vLLM's vllm:lora_requests_info lists as
// running_lora_adapters and waiting_lora_adapters.
func (e *Engine) Adapters(running, waiting []uint32) ([]uint32, []uint32) {
	for _, s := range e.running {
		if a := s.req.Adapter; a != 0 && !slices.Contains(running, a) {
			running = append(running, a)
		}
	}
	for _, s := range e.waiting {
		if a := s.req.Adapter; a != 0 && !slices.Contains(waiting, a) {
			waiting = append(waiting, a)
		}
	}
	return running, waiting
}

var errNoLoRA = errors.New("LoRA is not enabled on this engine (vLLM's --enable-lora)")

// touch marks an adapter most recently used and reports whether it was cached; one that was
// not is added, evicting the least recently used beyond MaxCPULoRAs.
func (l *loraState) touch(a uint32) bool {
	if i := slices.Index(l.cpu, a); i >= 0 {
		l.cpu = append(slices.Delete(l.cpu, i, i+1), a)
		return true
	}
	if len(l.cpu) >= l.cfg.MaxCPULoRAs {
		l.cpu = slices.Delete(l.cpu, 0, 1)
	}
	l.cpu = append(l.cpu, a)
	return false
}

// batchAdapters sets active to the distinct adapters of the running requests.
func (l *loraState) batchAdapters(running []*seq) {
	l.active = l.active[:0]
	for _, s := range running {
		if a := s.req.Adapter; a != 0 && !slices.Contains(l.active, a) {
			l.active = append(l.active, a)
		}
	}
}

// skip reports whether a waiting request cannot join the batch for want of a GPU slot.
func (l *loraState) skip(s *seq) bool {
	a := s.req.Adapter
	return a != 0 && len(l.active) >= l.cfg.MaxLoRAs && !slices.Contains(l.active, a)
}

// join counts an admitted request's adapter in the batch.
func (l *loraState) join(s *seq) {
	if a := s.req.Adapter; a != 0 && !slices.Contains(l.active, a) {
		l.active = append(l.active, a)
	}
}

// stepCost is the time a step adds for its adapters: the loads of those not in CPU memory
// (and any owed by Preload), and the kernels' share. adapterTokens of tokens are adapters'.
func (l *loraState) stepCost(running []*seq, baseMs float64, adapterTokens, tokens float64) time.Duration {
	extra := l.stall
	l.stall = 0
	for _, s := range running {
		if a := s.req.Adapter; a != 0 && !l.touch(a) {
			extra += s.req.AdapterLoad
		}
	}
	if tokens > 0 {
		extra += time.Duration(baseMs * l.cfg.StepCost * adapterTokens / tokens * float64(time.Millisecond))
	}
	return extra
}
