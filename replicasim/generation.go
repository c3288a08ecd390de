package replicasim

import (
	"bufio"
	"net"
	"strconv"
	"time"

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
	sp       sampling
	maxSet   bool              // the client set max_tokens
	echoText string            // the prompt, for a completion with echo
	resp     *responsesRequest // a Responses API request's own fields; nil for the others
	// seqs are the engine requests, one per choice (vLLM runs n > 1 as n child requests
	// that share the prompt's cached blocks); empty in echo mode.
	seqs []seqRef
}

type seqRef struct {
	id uint64
	p  *pending
}

// words are the simulated output, one token each.
var words = [...]string{" The", " replica", " is", " simulated", ",", " and", " every", " token", " costs", " time", "."}

// wait blocks until n tokens exist (or the request is done) and returns how many there are;
// ok is false when the client went away, in which case the engine request is cancelled.
func (g *generation) waitFor(n int) (have int, ok bool) {
	if len(g.seqs) == 0 { // echo mode
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
		// Choices are streamed in step: token i of every choice, then token i+1.
		produced, done := g.max, true
		for _, sq := range g.seqs {
			pr, d := g.srv.drv.progress(sq.p)
			produced, done = min(produced, pr), done && d
		}
		if produced >= n || done {
			return produced, true
		}
		select {
		case <-g.seqs[0].p.notify:
		case <-tick.C:
			if clientGone(g.conn) {
				g.abandon()
				g.record("abort")
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
	if g.kind == oai.Responses {
		g.streamResponses(w)
		return
	}
	buf := make([]byte, 0, 512)
	sent := 0
	for sent < g.max {
		have, ok := g.waitFor(sent + 1)
		if !ok {
			return
		}
		buf = buf[:0]
		if sent == 0 && g.kind == oai.Chat {
			// vLLM sends the role chunk with the first token, not before it, and the echoed
			// last message in a chunk of its own after it.
			for c := range g.sp.n {
				buf = g.appendChunk(buf, c, -1)
			}
			if g.echoText != "" {
				for c := range g.sp.n {
					buf = g.appendChunk(buf, c, -2)
				}
			}
		}
		for ; sent < have; sent++ {
			if (g.fault.Kind == FaultDieMidStream || g.fault.Kind == FaultCrash) && sent >= g.fault.AfterTokens {
				_ = w.Flush()
				g.srv.die(g.conn, g.fault)
				g.abandon()
				return
			}
			for c := range g.sp.n {
				buf = g.appendChunk(buf, c, sent)
			}
		}
		if _, err := w.Write(buf); err != nil || w.Flush() != nil {
			g.abandon()
			g.record("abort")
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
	for _, sq := range g.seqs {
		g.srv.drv.cancel(sq.id)
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
	b = strconv.AppendInt(b, int64(g.prompt+g.completion()), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(g.completion()), 10)
	if g.srv.cfg.PromptTokensDetails && len(g.seqs) > 0 {
		b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
		b = strconv.AppendInt(b, int64(g.srv.drv.cachedTokens(g.seqs[0].p)), 10)
		b = append(b, '}')
	}
	return append(b, '}')
}

// completion is the tokens generated over all choices.
func (g *generation) completion() int { return g.sp.n * g.max }

// appendChunk appends one SSE event for token i of a choice (i = -1: the chat role preamble;
// -2: a chat's echoed last message).
func (g *generation) appendChunk(b []byte, choice, i int) []byte {
	b = append(b, "data: "...)
	b = g.appendHead(b, true)
	b = append(b, `"choices":[{"index":`...)
	b = strconv.AppendInt(b, int64(choice), 10)
	b = append(b, ',')
	text := ""
	switch {
	case i >= 0:
		text = words[i%len(words)]
	case i == -2:
		text = g.echoText
	}
	if i == 0 && g.kind != oai.Chat {
		text = g.echoText + text // vLLM sends a completion's echoed prompt with the first token
	}
	if g.kind == oai.Chat {
		b = append(b, `"delta":{`...)
		if i == -1 {
			b = append(b, `"role":"assistant","content":""`...)
		} else {
			b = append(b, `"content":`...)
			b = strconv.AppendQuote(b, text)
		}
		b = append(b, '}')
	} else {
		b = append(b, `"text":`...)
		b = strconv.AppendQuote(b, text)
	}
	b = append(b, `,"logprobs":`...)
	if i >= 0 {
		b = g.appendLogprobs(b, i, i+1, g.textOffset(i))
	} else {
		b = append(b, "null"...)
	}
	if g.srv.cfg.Echo && g.srv.cfg.EchoTokenInterval > 0 {
		// Paced echo streams carry their send time so a benchmark can measure the latency
		// a proxy adds to each chunk (same host, same clock). Clients ignore unknown fields.
		b = append(b, `,"sent_unix_nano":`...)
		b = strconv.AppendInt(b, time.Now().UnixNano(), 10)
	}
	b = append(b, `,"finish_reason":`...)
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
	b = append(b, `"choices":[`...)
	text := []byte(g.echoText)
	for i := range g.max {
		text = append(text, words[i%len(words)]...)
	}
	for c := range g.sp.n {
		if c > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(c), 10)
		if g.kind == oai.Chat {
			b = append(b, `,"message":{"role":"assistant","content":`...)
			b = strconv.AppendQuote(b, string(text))
			b = append(b, '}')
		} else {
			b = append(b, `,"text":`...)
			b = strconv.AppendQuote(b, string(text))
		}
		b = append(b, `,"logprobs":`...)
		b = g.appendLogprobs(b, 0, g.max, len(g.echoText))
		b = append(b, `,"finish_reason":`...)
		b = strconv.AppendQuote(b, g.finish)
		b = append(b, '}')
	}
	b = append(b, "],"...)
	b = g.appendUsage(b)
	return append(b, '}')
}

// textOffset is where token i's text starts in the whole text of its choice, the echoed
// prompt included: a streamed chunk's text_offset counts from there, not from the chunk
// (vllm/entrypoints/openai/serving_completion.py, initial_text_offset = previous_text_lens).
func (g *generation) textOffset(i int) int {
	off := 0
	if g.kind != oai.Chat {
		off = len(g.echoText)
	}
	return off + i/len(words)*wordsBefore[len(words)] + wordsBefore[i%len(words)]
}

// wordsBefore[i] is the length of the text of words[:i].
var wordsBefore = func() (n [len(words) + 1]int) {
	for i, w := range words {
		n[i+1] = n[i] + len(w)
	}
	return n
}()

// appendLogprobs appends the log-probabilities of tokens [from, to), or null when the request
// asked for none. The values are made up (there is no model) but shaped as vLLM's:
// completions' CompletionLogProbs and chat's ChatCompletionLogProbs
// (vllm/entrypoints/openai/protocol.py). offset is where the tokens' text starts.
func (g *generation) appendLogprobs(b []byte, from, to, offset int) []byte {
	k := g.sp.logprobs
	if k < 0 {
		return append(b, "null"...)
	}
	if g.kind == oai.Chat {
		b = append(b, `{"content":[`...)
		for i := from; i < to; i++ {
			if i > from {
				b = append(b, ',')
			}
			b = appendChatLogprob(b, i, 0)
			b = append(b, `,"top_logprobs":[`...)
			for r := range k {
				if r > 0 {
					b = append(b, ',')
				}
				b = appendChatLogprob(b, i, r)
				b = append(b, '}')
			}
			b = append(b, "]}"...)
		}
		return append(b, "]}"...)
	}
	b = append(b, `{"text_offset":[`...)
	for i := from; i < to; i++ {
		if i > from {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(offset), 10)
		offset += len(words[i%len(words)])
	}
	b = append(b, `],"token_logprobs":[`...)
	for i := from; i < to; i++ {
		if i > from {
			b = append(b, ',')
		}
		b = appendLogprob(b, 0)
	}
	b = append(b, `],"tokens":[`...)
	for i := from; i < to; i++ {
		if i > from {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, words[i%len(words)])
	}
	b = append(b, `],"top_logprobs":[`...)
	for i := from; i < to; i++ {
		if i > from {
			b = append(b, ',')
		}
		b = append(b, '{')
		for r := range max(k, 1) {
			if r > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendQuote(b, altToken(i, r))
			b = append(b, ':')
			b = appendLogprob(b, r)
		}
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// altToken is the rank-th most likely token at position i (rank 0: the one generated).
func altToken(i, rank int) string { return words[(i+rank)%len(words)] }

// appendLogprob appends the made-up log-probability of the rank-th most likely token.
func appendLogprob(b []byte, rank int) []byte {
	return strconv.AppendFloat(b, -0.05-0.7*float64(rank), 'f', 4, 64)
}

// appendChatLogprob appends one {"token","logprob","bytes" of a chat logprob entry, left
// open for the caller to add fields and close.
func appendChatLogprob(b []byte, i, rank int) []byte {
	tok := altToken(i, rank)
	b = append(b, `{"token":`...)
	b = strconv.AppendQuote(b, tok)
	b = append(b, `,"logprob":`...)
	b = appendLogprob(b, rank)
	b = append(b, `,"bytes":[`...)
	for j := range len(tok) {
		if j > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(tok[j]), 10)
	}
	return append(b, ']')
}

// account records a request that ran to its end in vLLM's metrics.
func (g *generation) account() { g.record(g.finish) }

// record puts each of the request's engine requests in vLLM's per-request metrics, with
// the reason it finished ("abort" for a client that went away). In echo mode there is no
// engine to count tokens as they come, so the counters and TTFT are recorded here.
func (g *generation) record(reason string) {
	m, now := g.srv.met, time.Now()
	if len(g.seqs) == 0 {
		m.promptTokens.Add(float64(g.prompt))
		m.genTokens.Add(float64(g.completion()))
		m.ttft.Observe(now.Sub(g.start).Seconds())
		m.finished(requestTimes{arrival: g.start}, g.prompt, g.completion(), g.max, g.maxSet, reason, now)
		m.reqMaxGen.Observe(float64(g.max))
		return
	}
	d := g.srv.drv
	most := 0
	for _, sq := range g.seqs {
		d.mu.Lock()
		t, produced := sq.p.times, sq.p.produced
		d.mu.Unlock()
		m.finished(t, g.prompt, produced, g.max, g.maxSet, reason, now)
		most = max(most, produced)
	}
	// Once per client request, the most any of its n sequences generated: vLLM 0.11 keeps
	// it on the parent request (vllm/v1/engine/parallel_sampling.py, ParentRequest,
	// max_num_generation_tokens) and records it when the last child finishes.
	m.reqMaxGen.Observe(float64(most))
}
