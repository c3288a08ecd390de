package replicasim

import (
	"fmt"
	"time"
)

// ColdStart models how long a vLLM replica takes from its process start to serving: the
// weights read from disk or the network at a stated bandwidth, the engine's start, and
// CUDA-graph capture unless it runs eager. A real replica takes 30 s to several minutes;
// the phases and their default lengths come from vLLM's own start-up logs:
//
//   - weights: vLLM's "Loading weights took 24.84 seconds" for a 12.66 GiB model from a
//     local disk (vllm-project/vllm#38820), 0.51 GiB/s; a download from the Hub or a
//     network volume is slower, a hot page cache far faster (70B FP8 in about 10 s,
//     vllm-project/vllm#19824).
//   - engine start: everything but the weights and the graphs, from the process's start
//     to its first answer: Python imports, the API server, Dynamo and torch.compile (from
//     its cache), the memory profile that sizes the KV cache. vllm-project/vllm#20264: a
//     first answer 59 s after start, of which 0.9 s weights and 17 s graph capture, so 41 s.
//   - CUDA-graph capture: "Graph capturing finished in 17 secs" (vllm-project/vllm#20264);
//     vLLM skips it with --enforce-eager.
//
// Like vLLM, whose OpenAI server binds its port before it builds the engine
// (vllm/entrypoints/openai/api_server.py: the socket is created first, "to make sure that
// we bind the port before the engine is set up"), a replica under a cold start has its
// port bound throughout: connections are taken by the kernel and wait, unanswered, until
// it serves. A probe sees a timeout, not a refusal.
type ColdStart struct {
	// WeightGiB is what is read (the profile's weights).
	WeightGiB float64
	// LoadGiBPerSecond is the read bandwidth; 0 with WeightGiB > 0 is invalid.
	LoadGiBPerSecond float64
	// EngineStart is the rest of the start-up but the graphs.
	EngineStart time.Duration
	// GraphCapture is CUDA-graph capture (0: eager).
	GraphCapture time.Duration
}

// Defaults of the model (see ColdStart).
const (
	DefaultLoadGiBPerSecond = 0.51
	DefaultEngineStart      = 41 * time.Second
	DefaultGraphCapture     = 17 * time.Second
)

// Validate rejects a model that cannot run.
func (c ColdStart) Validate() error {
	switch {
	case c.WeightGiB < 0:
		return fmt.Errorf("cold start: weights %v GiB: want ≥ 0", c.WeightGiB)
	case c.WeightGiB > 0 && !(c.LoadGiBPerSecond > 0):
		return fmt.Errorf("cold start: load bandwidth %v GiB/s: want > 0", c.LoadGiBPerSecond)
	case c.EngineStart < 0 || c.GraphCapture < 0:
		return fmt.Errorf("cold start: engine start %v, graph capture %v: want ≥ 0", c.EngineStart, c.GraphCapture)
	}
	return nil
}

// Weights is how long reading the weights takes.
func (c ColdStart) Weights() time.Duration {
	if c.WeightGiB == 0 {
		return 0
	}
	return time.Duration(c.WeightGiB / c.LoadGiBPerSecond * float64(time.Second))
}

// Total is the time from process start to serving.
func (c ColdStart) Total() time.Duration {
	return c.Weights() + c.EngineStart + c.GraphCapture
}

// Phases are the start-up's steps in order, each with its length and the line vLLM logs at
// its end, so a replica's log reads like a real one's.
func (c ColdStart) Phases() []ColdStartPhase {
	ps := []ColdStartPhase{{c.Weights(), fmt.Sprintf("Loading weights took %.2f seconds (%.2f GiB at %.2f GiB/s)", c.Weights().Seconds(), c.WeightGiB, c.LoadGiBPerSecond)}}
	ps = append(ps, ColdStartPhase{c.EngineStart, fmt.Sprintf("init engine (profile, create kv cache, warmup model) took %.2f seconds", c.EngineStart.Seconds())})
	if c.GraphCapture > 0 {
		ps = append(ps, ColdStartPhase{c.GraphCapture, fmt.Sprintf("Graph capturing finished in %.0f secs", c.GraphCapture.Seconds())})
	}
	return ps
}

// ColdStartPhase is one step of a cold start.
type ColdStartPhase struct {
	Took time.Duration
	Log  string
}
