package router

import (
	"bytes"
	"strconv"
)

// EngineGauges are the figures the router reads from a replica's vLLM /metrics.
type EngineGauges struct {
	Running, Waiting, KVUsage float64
	// Tokens is the engine's prompt and generation tokens processed so far (the sum of
	// vllm:prompt_tokens_total and vllm:generation_tokens_total): it grows while the engine
	// works, token by token in decode and chunk by chunk in a long prefill, so a wait on the
	// replica can tell a generation that progresses from one that stalled. TokensFound is
	// false when neither counter was present.
	Tokens      float64
	TokensFound bool
	// Found is false when none of the gauges was present (not a vLLM, or still loading).
	Found bool
}

var (
	mRunning = []byte("vllm:num_requests_running")
	mWaiting = []byte("vllm:num_requests_waiting")
	mKV      = []byte("vllm:kv_cache_usage_perc")
	// vLLM's v0 engine named KV usage differently; accept it too.
	mKVv0 = []byte("vllm:gpu_cache_usage_perc")
	// Counters, with the _total suffix of the text exposition.
	mPromptTokens = []byte("vllm:prompt_tokens_total")
	mGenTokens    = []byte("vllm:generation_tokens_total")
)

// ParseEngineGauges reads vLLM's queue and KV-cache gauges from Prometheus text exposition,
// summing series across label sets (one per engine or model) and taking the highest KV use.
// It reads only what it needs and skips anything it does not understand: a scrape must
// never fail a replica over an unrelated metric.
func ParseEngineGauges(text []byte) EngineGauges {
	var g EngineGauges
	for len(text) > 0 {
		line := text
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			text = nil
		}
		if len(line) == 0 || line[0] != 'v' {
			continue // comments, blank lines, other namespaces
		}
		name, value, ok := splitSample(line)
		if !ok {
			continue
		}
		switch {
		case bytes.Equal(name, mRunning):
			g.Running += value
		case bytes.Equal(name, mWaiting):
			g.Waiting += value
		case bytes.Equal(name, mKV), bytes.Equal(name, mKVv0):
			g.KVUsage = max(g.KVUsage, value)
		case bytes.Equal(name, mPromptTokens), bytes.Equal(name, mGenTokens):
			g.Tokens += value
			g.TokensFound = true
			continue // a counter alone is no load reading
		default:
			continue
		}
		g.Found = true
	}
	return g
}

// splitSample parses `name{labels} value [timestamp]`.
func splitSample(line []byte) (name []byte, value float64, ok bool) {
	line = bytes.TrimRight(line, " \t\r")
	end := bytes.IndexAny(line, "{ \t")
	if end <= 0 {
		return nil, 0, false
	}
	name, rest := line[:end], line[end:]
	if rest[0] == '{' {
		// Label values may contain '}' inside quotes; find the closing brace outside quotes.
		inQuote, esc := false, false
		closeAt := -1
		for i := 1; i < len(rest); i++ {
			c := rest[i]
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inQuote = !inQuote
			case c == '}' && !inQuote:
				closeAt = i
			}
			if closeAt >= 0 {
				break
			}
		}
		if closeAt < 0 {
			return nil, 0, false
		}
		rest = rest[closeAt+1:]
	}
	fields := bytes.Fields(rest)
	if len(fields) == 0 || len(fields) > 2 {
		return nil, 0, false
	}
	v, err := strconv.ParseFloat(string(fields[0]), 64)
	if err != nil || v != v || v < 0 { // NaN or negative gauges are not loads
		return nil, 0, false
	}
	return name, v, true
}
