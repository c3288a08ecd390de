package router

import (
	"bytes"
	"fmt"
	"math"
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
	// LoRA is the newest vllm:lora_requests_info (nil: none, a server without adapters).
	// A series that cannot be believed is skipped, with why in LoRAInvalid and LoRADetail:
	// vLLM keeps every series it ever set, so one bad one must not cost the replica its
	// other gauges for good.
	LoRA                    *LoRAInfo
	LoRAInvalid, LoRADetail string
	// Invalid, when not empty, is why the scrape cannot be trusted (the reason label of
	// arbiter_router_replica_reports_rejected_total), and Detail which sample said what:
	// the gauges are then zero and not Found.
	Invalid, Detail string
}

// maxEngineRequests bounds the requests one replica may say it runs or queues (each
// series, and their sum over engines): 2^20. vLLM runs at most max_num_seqs at once (256
// or 1024 by default, per engine) and its waiting queue holds what its clients sent; a
// million requests queued on one replica is more than any set of routers holds for it, so
// a figure past that is a corrupt or hostile report, and one that would make the replica
// look busy enough to starve it of traffic.
const maxEngineRequests = 1 << 20

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
// never fail a replica over an unrelated metric. A sample of the gauges it reads must be
// a number a vLLM can report: request counts whole, from 0 to maxEngineRequests (their
// sum too), and KV use a fraction from 0 to 1 (vLLM's kv_cache_usage_perc is a fraction
// despite its name: "1 means 100 percent usage"); one that is not makes the whole scrape
// Invalid, since a replica that lies about one gauge cannot be trusted with the others.
func ParseEngineGauges(text []byte) EngineGauges {
	var g EngineGauges
	invalid := func(reason string, name []byte, v string) EngineGauges {
		return EngineGauges{Invalid: reason, Detail: fmt.Sprintf("%s %s", name, v)}
	}
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
		name, raw, ok := splitSample(line)
		if !ok {
			continue
		}
		if bytes.Equal(name, mLoRAInfo) {
			if reason, detail := parseLoRAInfo(line, raw, &g); reason != "" && g.LoRAInvalid == "" {
				g.LoRAInvalid, g.LoRADetail = reason, detail
			}
			continue
		}
		isCount := bytes.Equal(name, mRunning) || bytes.Equal(name, mWaiting)
		isKV := bytes.Equal(name, mKV) || bytes.Equal(name, mKVv0)
		isTokens := bytes.Equal(name, mPromptTokens) || bytes.Equal(name, mGenTokens)
		if !isCount && !isKV && !isTokens {
			continue
		}
		v, err := strconv.ParseFloat(string(raw), 64)
		switch {
		case err != nil || math.IsNaN(v) || math.IsInf(v, 0):
			return invalid("not_a_number", name, string(raw)+" is not a finite number")
		case v < 0:
			return invalid("negative", name, string(raw)+" is negative")
		case isKV && v > 1:
			return invalid("too_large", name, string(raw)+" is over 1 (the whole cache)")
		case isCount && v != math.Trunc(v):
			return invalid("fractional", name, string(raw)+" is not a whole number of requests")
		case isCount && v > maxEngineRequests:
			return invalid("too_large", name, fmt.Sprintf("%s is over %d requests", raw, maxEngineRequests))
		}
		if isTokens {
			// A counter is no load reading (Found stays as the gauges say); only whether it
			// moves is used, so its size needs no bound beyond being finite.
			g.Tokens += v
			g.TokensFound = true
			continue
		}
		switch {
		case bytes.Equal(name, mRunning):
			g.Running += v
		case bytes.Equal(name, mWaiting):
			g.Waiting += v
		default:
			g.KVUsage = max(g.KVUsage, v)
		}
		if g.Running > maxEngineRequests || g.Waiting > maxEngineRequests {
			return invalid("too_large", name, fmt.Sprintf("summed over its series, over %d requests", maxEngineRequests))
		}
		g.Found = true
	}
	return g
}

// splitSample parses `name{labels} value [timestamp]`, leaving the value unparsed.
func splitSample(line []byte) (name, value []byte, ok bool) {
	line = bytes.TrimRight(line, " \t\r")
	end := bytes.IndexAny(line, "{ \t")
	if end <= 0 {
		return nil, nil, false
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
			return nil, nil, false
		}
		rest = rest[closeAt+1:]
	}
	fields := bytes.Fields(rest)
	if len(fields) == 0 || len(fields) > 2 {
		return nil, nil, false
	}
	return name, fields[0], true
}
