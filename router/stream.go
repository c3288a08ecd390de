package router

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/arbiter-serve/arbiter/internal/conn/connwatch"
	"github.com/arbiter-serve/arbiter/oai"
)

// streamer passes one SSE response through, event by event. It is the client response's
// body stream: fasthttp's server calls Read and writes (and flushes) each result as one
// HTTP chunk, so every read from the replica reaches the client at once, with no pipe and
// no goroutine of its own. It outlives the handler, so it holds only its own state.
type streamer struct {
	px            *Proxy
	c             *call
	r             *Replica
	uc            *upConn
	upstreamClose bool
	up            *fasthttp.Response
	body          io.Reader
	p             *fastjson.Parser
	buf           *[]byte // read buffer, pooled
	pending       []byte  // bytes of an event not yet complete
	out           []byte  // events ready for the client
	outPos        int
	res           result
	finished      bool // the replica's stream ended (cleanly or not)
	cleanEOF      bool
	sawDone       bool // the replica sent data: [DONE], the end of every OpenAI stream
	closed        bool
	// client is the client's connection, looked at (never read) while the replica sends
	// bytes that complete no event: nothing is then written to the client, so its leaving
	// would go unseen. Valid until CloseWithError: fasthttp writes the body on it.
	client net.Conn
	// progress is when the last complete event came (or the stream opened): the stream's
	// idle deadline runs from it, so bytes that complete no event are no progress.
	progress time.Time
}

// streamDeadline is the failure of a stream the client's own deadline ended.
const streamDeadline = "stream_deadline"

// maxEventBytes bounds what the router holds of one SSE event: a replica whose event
// grows past it (a 100 MB data line, an event that never ends) has its stream ended with
// an error event and its connection closed, rather than the router's memory taken. vLLM's
// largest events, a chunk with top-20 logprobs for a few tokens or a tool call's
// arguments in one delta, are some tens of KiB.
const maxEventBytes = 1 << 20

// streamClientCheck is how long a stream goes without a complete event before each read
// that brings none also looks at whether the client is still there.
const streamClientCheck = 250 * time.Millisecond

// streamBufs recycles read buffers across streams; an SSE event is rarely over 1 KB.
var streamBufs = sync.Pool{New: func() any { b := make([]byte, 4<<10); return &b }}

func (px *Proxy) newStreamer(c *call, r *Replica, uc *upConn, upstreamClose bool, sentAt time.Time, pred Prediction, client net.Conn) *streamer {
	return &streamer{px: px, c: c, r: r, uc: uc, upstreamClose: upstreamClose, client: client, progress: px.Now(),
		res: result{code: fasthttp.StatusOK, sentAt: sentAt, pred: pred, streamed: true}}
}

// open attaches a body reader (chunked or identity) to the upstream connection.
func (s *streamer) open(hdr *fasthttp.ResponseHeader) error {
	s.up = fasthttp.AcquireResponse()
	hdr.CopyTo(&s.up.Header)
	s.up.StreamBody = true
	if err := s.up.ReadBody(s.uc.br, 0); err != nil {
		fasthttp.ReleaseResponse(s.up)
		return err
	}
	s.body = s.up.BodyStream()
	s.p = s.px.parsers.Get()
	s.buf = streamBufs.Get().(*[]byte)
	return nil
}

// Read implements io.Reader for fasthttp's body writer.
func (s *streamer) Read(dst []byte) (int, error) {
	for {
		if s.outPos < len(s.out) {
			n := copy(dst, s.out[s.outPos:])
			s.outPos += n
			return n, nil
		}
		s.out, s.outPos = s.out[:0], 0
		if s.finished {
			return 0, io.EOF
		}
		s.fill()
	}
}

// fill reads once from the replica and queues the complete events the client should get.
// A replica failure after bytes were sent cannot be retried: the stream ends with an SSE
// error event the client's SDK will raise.
func (s *streamer) fill() {
	px, c := s.px, s.c
	// A stream runs as long as it progresses (a long answer streams for many minutes):
	// only a gap between events, or the client's own deadline, ends it. Before the first
	// token the gap is the prompt's prefill, which vLLM spends after it has sent the
	// stream's header: a 120k-token prompt takes far longer than a gap between tokens, so
	// the wait for the first token is first_byte_slo_multiple × the TTFT expected (the SLO
	// or the replica's predicted TTFT, whichever is longer) when that is longer, up to
	// request_timeout.
	gap := px.cfg.StreamIdleTimeout
	if s.res.firstAt.IsZero() {
		if expect := max(c.slo.TTFT, s.res.pred.TTFT); expect > 0 && !math.IsInf(expect, 0) {
			gap = max(gap, min(time.Duration(px.cfg.FirstByteSLOMultiple*expect*float64(time.Second)), px.cfg.RequestTimeout))
		}
	}
	idle := s.progress.Add(gap)
	if !c.clientDeadline.IsZero() {
		idle = minTime(idle, c.clientDeadline)
	}
	_ = s.uc.SetReadDeadline(idle)
	n, err := s.body.Read(*s.buf)
	if n > 0 {
		s.consume((*s.buf)[:n])
	}
	switch {
	case err == nil && s.overlong():
	case err == nil && len(s.out) == 0 && px.Now().Sub(s.progress) >= streamClientCheck && s.client != nil && connwatch.PeerClosed(s.client):
		// Bytes that complete no event, and nobody to send them to.
		s.finished, s.res.clientGone = true, true
	case err == nil:
	case errors.Is(err, io.EOF):
		s.eof()
	default:
		s.finished = true
		s.res.failed = "stream_broken"
		msg := "replica failed mid-stream"
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded) && !c.clientDeadline.IsZero() && !px.Now().Before(c.clientDeadline):
			msg, s.res.failed = "the request's deadline (X-Arbiter-Deadline-Ms) passed mid-stream", streamDeadline
		case errors.Is(err, os.ErrDeadlineExceeded):
			msg, s.res.failed = "replica stalled mid-stream", "stream_stalled"
		}
		s.out = append(s.out, s.errorEvent(msg)...)
	}
}

// consume takes bytes of the replica's stream: each event they complete is accounted and,
// if the client should get it, queued in s.out.
func (s *streamer) consume(b []byte) {
	from := max(len(s.pending)-2, 0) // what was pending held no terminator
	s.pending = append(s.pending, b...)
	rest := s.pending
	for {
		ev, r, ok := oai.NextEventFrom(rest, from)
		if !ok {
			break
		}
		from = 0
		if s.keep(ev) {
			s.out = append(s.out, ev...)
		}
		rest = r
		s.progress = s.px.Now()
	}
	s.pending = append(s.pending[:0], rest...)
}

// overlong ends a stream whose unfinished event has grown past maxEventBytes, with an
// error event, and reports whether it did.
func (s *streamer) overlong() bool {
	if len(s.pending) <= maxEventBytes {
		return false
	}
	s.finished, s.res.failed = true, "stream_event_too_large"
	s.pending = s.pending[:0]
	s.out = append(s.out, oai.ErrorEvent(oai.ServerError, fmt.Sprintf("replica sent an SSE event too large (over %d bytes)", maxEventBytes))...)
	return true
}

// eof ends the stream at the end of the replica's body.
func (s *streamer) eof() {
	s.out = append(s.out, s.pending...) // an unterminated last event passes as it is
	s.pending = s.pending[:0]
	if s.sawDone {
		s.finished, s.cleanEOF = true, true
		return
	}
	// The body ended without [DONE]: a replica that died mid-stream on a response
	// delimited by closing the connection looks like a clean end. It is not one.
	s.finished, s.res.failed = true, "stream_truncated"
	s.out = append(s.out, s.errorEvent("replica closed the stream before its end")...)
}

// errorEvent is the event that ends a stream that failed after bytes reached the client,
// in its API's shape.
func (s *streamer) errorEvent(msg string) []byte {
	if s.c.kind == oai.Responses {
		return oai.ResponsesErrorEvent(oai.ServerError, msg)
	}
	return oai.ErrorEvent(oai.ServerError, msg)
}

// keep inspects one event for accounting and reports whether the client should get it.
func (s *streamer) keep(ev []byte) bool {
	data := oai.EventData(ev)
	if data == nil {
		return true
	}
	if u, usageOnly, ok := oai.ChunkUsage(s.p, data); ok {
		s.res.usage = u
		if usageOnly {
			return !s.c.stripUsage
		}
	}
	if s.c.kind == oai.Responses {
		// Typed events: the first output delta is the first token, and the stream ends
		// with response.completed (or .incomplete, .failed), not [DONE].
		switch classifyResponsesEvent(ev, data) {
		case responsesCreated:
			s.px.responses.remember(eventResponseID(s.p, data), s.r.Info().ID)
			return true
		case responsesEnd:
			s.sawDone = true
			return true
		case responsesOther:
			return true
		}
	} else if string(data) == "[DONE]" {
		s.sawDone = true
		return true
	}
	if s.res.firstAt.IsZero() {
		s.res.firstAt = s.px.Now()
		s.r.FirstToken(s.res.pred, s.res.firstAt)
		s.c.prefilled()
	}
	s.res.events++
	return true
}

// CloseWithError is called by fasthttp once the response is written or abandoned; wErr is
// the client write error, if any. It settles the replica connection, releases the
// in-flight count and accounts the request, exactly once.
func (s *streamer) CloseWithError(wErr error) error {
	if s.closed {
		return nil
	}
	s.closed = true
	px, r := s.px, s.r
	defer func() {
		r.End(s.res.pred, px.Now())
		s.c.kickAfterEnd()
	}()
	switch {
	case !s.finished || s.res.clientGone:
		// The client hung up (or fasthttp gave up on it): closing the replica socket
		// cancels the generation.
		_ = s.uc.Close()
		s.res.clientGone = true
	case s.cleanEOF && !s.upstreamClose:
		_ = s.up.CloseBodyStream()
		r.conns.put(s.uc, px.Now())
	default:
		_ = s.uc.Close()
	}
	if wErr != nil && s.finished && s.outPos < len(s.out) {
		s.res.clientGone = true // the end of the stream never reached the client
	}
	fasthttp.ReleaseResponse(s.up)
	px.parsers.Put(s.p)
	streamBufs.Put(s.buf)
	s.res.endAt = px.Now()
	px.account(s.c, r, s.res)
	code := fasthttp.StatusOK
	if s.res.clientGone {
		code = 499
	}
	px.keyDone(s.c.key, s.c.service, code)
	return nil
}
