package replicasim

import (
	"bufio"
	"net"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-serve/arbiter/oai"
)

// generation is one completion request from admission to its last byte. It outlives the
// fasthttp handler when streaming, so it holds copies, never the RequestCtx.
type generation struct {
	srv      *Server
	kind     oai.Kind
	model    string
	id       uint64
	created  int64
	prompt   int
	max      int
	finish   string
	usage    bool // stream_options.include_usage
	fault    Fault
	start    time.Time
	conn     net.Conn
	engineID uint64
	p        *pending // nil in echo mode
}

// words are the simulated output, one token each.
var words = [...]string{" The", " replica", " is", " simulated", ",", " and", " every", " token", " costs", " time", "."}

// wait blocks until n tokens exist (or the request is done) and returns how many there are;
// ok is false when the client went away, in which case the engine request is cancelled.
func (g *generation) waitFor(n int) (have int, ok bool) {
	if g.p == nil { // echo mode
		if g.srv.cfg.EchoTokenInterval <= 0 {
			return g.max, true
		}
		if n > 1 {
			time.Sleep(g.srv.cfg.EchoTokenInterval)
		}
		return n, true
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		produced, done := g.srv.drv.progress(g.p)
		if produced >= n || done {
			return produced, true
		}
		select {
		case <-g.p.notify:
		case <-tick.C:
			if clientGone(g.conn) {
				g.srv.drv.cancel(g.engineID)
				return produced, false
			}
		}
	}
}

func (g *generation) wait(n int) bool {
	_, ok := g.waitFor(n)
	return ok
}

// stream writes the SSE response as tokens are produced, flushing each event.
func (g *generation) stream(w *bufio.Writer) {
	buf := make([]byte, 0, 512)
	sent := 0
	for sent < g.max {
		have, ok := g.waitFor(sent + 1)
		if !ok {
			return
		}
		buf = buf[:0]
		if sent == 0 && g.kind == oai.Chat {
			// vLLM sends the role chunk with the first token, not before it.
			buf = g.appendChunk(buf, -1)
		}
		for ; sent < have; sent++ {
			if (g.fault.Kind == FaultDieMidStream || g.fault.Kind == FaultCrash) && sent >= g.fault.AfterTokens {
				_ = w.Flush()
				g.srv.die(g.conn, g.fault)
				g.abandon()
				return
			}
			buf = g.appendChunk(buf, sent)
		}
		if _, err := w.Write(buf); err != nil || w.Flush() != nil {
			g.abandon()
			return
		}
	}
	buf = buf[:0]
	if g.usage {
		buf = append(buf, "data: "...)
		buf = g.appendHead(buf, true)
		buf = append(buf, `"choices":[],`...)
		buf = g.appendUsage(buf)
		buf = append(buf, "}\n\n"...)
	}
	buf = append(buf, "data: [DONE]\n\n"...)
	if _, err := w.Write(buf); err == nil {
		_ = w.Flush()
	}
	g.account()
}

// abandon cancels the engine request of a stream that cannot continue.
func (g *generation) abandon() {
	if g.p != nil {
		g.srv.drv.cancel(g.engineID)
	}
}

func (g *generation) appendHead(b []byte, chunk bool) []byte {
	b = append(b, `{"id":"`...)
	if g.kind == oai.Chat {
		b = append(b, "chatcmpl-"...)
	} else {
		b = append(b, "cmpl-"...)
	}
	b = strconv.AppendUint(b, g.id, 10)
	b = append(b, `","object":"`...)
	switch {
	case g.kind == oai.Chat && chunk:
		b = append(b, "chat.completion.chunk"...)
	case g.kind == oai.Chat:
		b = append(b, "chat.completion"...)
	default:
		b = append(b, "text_completion"...)
	}
	b = append(b, `","created":`...)
	b = strconv.AppendInt(b, g.created, 10)
	b = append(b, `,"model":`...)
	b = strconv.AppendQuote(b, g.model)
	return append(b, ',')
}

func (g *generation) appendUsage(b []byte) []byte {
	b = append(b, `"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(g.prompt), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(g.prompt+g.max), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(g.max), 10)
	return append(b, '}')
}

// appendChunk appends one SSE event for token i (i = -1: the chat role preamble).
func (g *generation) appendChunk(b []byte, i int) []byte {
	b = append(b, "data: "...)
	b = g.appendHead(b, true)
	b = append(b, `"choices":[{"index":0,`...)
	if g.kind == oai.Chat {
		b = append(b, `"delta":{`...)
		if i < 0 {
			b = append(b, `"role":"assistant","content":""`...)
		} else {
			b = append(b, `"content":`...)
			b = strconv.AppendQuote(b, words[i%len(words)])
		}
		b = append(b, '}')
	} else {
		b = append(b, `"text":`...)
		b = strconv.AppendQuote(b, words[i%len(words)])
	}
	b = append(b, `,"logprobs":null,"finish_reason":`...)
	if g.srv.cfg.Echo && g.srv.cfg.EchoTokenInterval > 0 {
		// Paced echo streams carry their send time so a benchmark can measure the latency
		// a proxy adds to each chunk (same host, same clock). Clients ignore unknown fields.
		b = append(b[:len(b)-len(`,"finish_reason":`)], `,"sent_unix_nano":`...)
		b = strconv.AppendInt(b, time.Now().UnixNano(), 10)
		b = append(b, `,"finish_reason":`...)
	}
	if i == g.max-1 {
		b = strconv.AppendQuote(b, g.finish)
	} else {
		b = append(b, "null"...)
	}
	return append(b, "}]}\n\n"...)
}

// appendResponse appends the non-streaming response body.
func (g *generation) appendResponse(b []byte) []byte {
	b = g.appendHead(b, false)
	b = append(b, `"choices":[{"index":0,`...)
	var text []byte
	for i := range g.max {
		text = append(text, words[i%len(words)]...)
	}
	if g.kind == oai.Chat {
		b = append(b, `"message":{"role":"assistant","content":`...)
		b = strconv.AppendQuote(b, string(text))
		b = append(b, '}')
	} else {
		b = append(b, `"text":`...)
		b = strconv.AppendQuote(b, string(text))
	}
	b = append(b, `,"logprobs":null,"finish_reason":`...)
	b = strconv.AppendQuote(b, g.finish)
	b = append(b, "}],"...)
	b = g.appendUsage(b)
	return append(b, '}')
}

// account records a finished request in vLLM's metrics.
func (g *generation) account() {
	s := g.srv
	lbl := prometheus.Labels{"model_name": s.cfg.Model, "engine": "0"}
	s.met.promptTokens.With(lbl).Add(float64(g.prompt))
	s.met.genTokens.With(lbl).Add(float64(g.max))
	now := time.Now()
	s.met.e2e.With(lbl).Observe(now.Sub(g.start).Seconds())
	first := now
	if g.p != nil {
		s.drv.mu.Lock()
		first = g.p.firstAt
		s.drv.mu.Unlock()
	}
	s.met.ttft.With(lbl).Observe(first.Sub(g.start).Seconds())
	s.met.requestSuccess.With(prometheus.Labels{"model_name": s.cfg.Model, "engine": "0", "finished_reason": g.finish}).Inc()
}
