package replicasim

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arbiter-serve/arbiter/engine"
)

// driver runs an engine in real time: one goroutine steps it and sleeps for each step's
// modelled duration, then hands the produced tokens to the waiting requests.
type driver struct {
	// dead is set once the engine loop has stopped: vLLM's /health then answers 503
	// (vllm/entrypoints/openai/api_server.py, health → engine_client.check_health raises
	// EngineDeadError) and new requests are refused rather than queued for ever.
	dead    atomic.Bool
	mu      sync.Mutex // guards eng, pending, nextID
	eng     *engine.Engine
	pending map[uint64]*pending
	nextID  uint64
	wake    chan struct{} // one slot: coalesces "work arrived" signals
	// slowdown multiplies step times (the "slow tokens" fault); read under mu.
	slowdown float64
	met      *metrics
	// busyUntil is when the engine is done loading adapters it was asked to preload (a
	// load runs between steps); guarded by mu.
	busyUntil time.Time
	// adapters, if set, is told each step's running and waiting adapters (vLLM's
	// vllm:lora_requests_info is set every step).
	adapters func(running, waiting []uint32)
}

// errEngineDead refuses a request once the engine loop has stopped.
var errEngineDead = errors.New("the engine is dead (its loop stopped); the server cannot serve requests")

// pending is one request's progress, written by the driver and read by its handler.
type pending struct {
	notify   chan struct{} // one slot
	produced int           // tokens generated so far; guarded by driver.mu
	cached   int
	prompt   int
	done     bool
	times    requestTimes // arrival, first scheduled, first and latest token
}

func newDriver(eng *engine.Engine, met *metrics) *driver {
	return &driver{eng: eng, met: met, pending: map[uint64]*pending{}, wake: make(chan struct{}, 1), slowdown: 1}
}

// submit queues a request and returns its id and progress record.
func (d *driver) submit(req engine.Request) (uint64, *pending, error) {
	if d.dead.Load() {
		return 0, nil, errEngineDead
	}
	d.mu.Lock()
	d.nextID++
	req.ID = d.nextID
	if err := d.eng.Add(req); err != nil {
		d.mu.Unlock()
		return 0, nil, err
	}
	p := &pending{notify: make(chan struct{}, 1), prompt: req.PromptTokens, times: requestTimes{arrival: time.Now()}}
	d.pending[req.ID] = p
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
	return req.ID, p, nil
}

// cancel drops a request (client gone); safe to call after it finished.
func (d *driver) cancel(id uint64) {
	d.mu.Lock()
	d.eng.Cancel(id)
	delete(d.pending, id)
	d.mu.Unlock()
}

// progress reads a request's state.
func (d *driver) progress(p *pending) (produced int, done bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return p.produced, p.done
}

// cachedTokens is the prompt tokens the prefix cache served p (known once scheduled).
func (d *driver) cachedTokens(p *pending) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return p.cached
}

func (d *driver) stats() engine.Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.eng.Stats()
}

// preload puts an adapter in the engine's CPU memory; the engine is busy loading it for
// load, from now or from the end of the loads before it. It returns when the load ends.
func (d *driver) preload(adapter uint32, load time.Duration) time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	if read, err := d.eng.Preload(adapter, 0); err != nil || !read {
		return time.Now()
	}
	d.busyUntil = later(time.Now(), d.busyUntil).Add(load)
	return d.busyUntil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (d *driver) setSlowdown(f float64) {
	d.mu.Lock()
	d.slowdown = max(f, 1)
	d.mu.Unlock()
}

// run steps the engine until ctx ends. Sleeping to an absolute deadline keeps the modelled
// time from drifting by the loop's own overhead. Token and step metrics are recorded as
// vLLM records them: TTFT and the prompt's tokens at the first token, each generated token
// and inter-token latency as it comes, and the step's tokens once per step.
func (d *driver) run(ctx context.Context) {
	defer d.dead.Store(true)
	next := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		d.mu.Lock()
		if d.eng.Idle() {
			d.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-d.wake:
			}
			next = time.Now()
			continue
		}
		if wait := time.Until(d.busyUntil); wait > 0 {
			// Loading adapters: the step starts when the loads end.
			d.mu.Unlock()
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			next = time.Now()
			continue
		}
		stepStart := time.Now()
		st := d.eng.Step()
		var running, waiting []uint32
		if d.adapters != nil {
			running, waiting = d.eng.Adapters(nil, nil)
		}
		dur := time.Duration(float64(st.Duration) * d.slowdown)
		emits := append([]engine.Emit(nil), st.Emits...)
		for _, id := range st.Scheduled {
			if p := d.pending[id]; p != nil {
				p.times.scheduled = stepStart
			}
		}
		d.mu.Unlock()
		if d.adapters != nil {
			d.adapters(running, waiting)
		}

		next = next.Add(dur)
		if wait := time.Until(next); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		} else {
			next = time.Now() // fell behind (e.g. a loaded machine): do not try to catch up
		}
		now := time.Now()
		stepTokens := 0
		d.mu.Lock()
		for _, em := range emits {
			p := d.pending[em.ID]
			if p == nil {
				continue // cancelled during the step
			}
			p.produced = em.Index + 1
			if em.Index == 0 {
				p.times.first, p.cached = now, em.CachedTokens
				d.met.ttft.Observe(now.Sub(p.times.arrival).Seconds())
				d.met.promptTokens.Add(float64(p.prompt))
				stepTokens += p.prompt
			} else {
				d.met.itl.Observe(now.Sub(p.times.last).Seconds())
			}
			p.times.last = now
			d.met.genTokens.Inc()
			stepTokens++
			if em.Done {
				p.done = true
				delete(d.pending, em.ID)
			}
			select {
			case p.notify <- struct{}{}:
			default:
			}
		}
		d.mu.Unlock()
		if stepTokens > 0 {
			d.met.iterTok.Observe(float64(stepTokens))
		}
	}
}
