package router

import (
	"bufio"
	"errors"
	"io"
	"os"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/arbiter-serve/arbiter/oai"
)

// streamer passes one SSE response through, event by event. It runs in fasthttp's body
// writer goroutine after the handler returned, so it holds only its own state.
type streamer struct {
	px            *Proxy
	c             *call
	r             *Replica
	uc            *upConn
	upstreamClose bool
	sentAt        time.Time
	loadAtStart   float64
	up            *fasthttp.Response
}

func (px *Proxy) newStreamer(c *call, r *Replica, uc *upConn, upstreamClose bool, sentAt time.Time, load float64) *streamer {
	return &streamer{px: px, c: c, r: r, uc: uc, upstreamClose: upstreamClose, sentAt: sentAt, loadAtStart: load}
}

// open attaches a body reader (chunked or identity) to the upstream connection.
func (s *streamer) open(hdr *fasthttp.ResponseHeader) error {
	s.up = fasthttp.AcquireResponse()
	hdr.CopyTo(&s.up.Header)
	s.up.StreamBody = true
	return s.up.ReadBody(s.uc.br, 0)
}

// run copies events to the client, flushing after each read from the replica (a replica
// flushes per event, so each read is an event or a few). It strips the usage chunk the
// router added, and turns a replica failure after bytes were sent into an SSE error event.
func (s *streamer) run(w *bufio.Writer) {
	px, c, r := s.px, s.c, s.r
	defer r.inflight.Add(-1)
	defer fasthttp.ReleaseResponse(s.up)
	res := result{code: fasthttp.StatusOK, sentAt: s.sentAt, loadAtStart: s.loadAtStart, streamed: true}
	defer func() {
		if v := recover(); v != nil {
			px.log.Error("panic in stream writer", "panic", v)
			_ = s.uc.Close()
			res.failed = "panic"
		}
		res.endAt = px.Now()
		px.account(c, r, res)
	}()

	body := s.up.BodyStream()
	buf := make([]byte, 32<<10)
	var pending []byte
	p := px.parsers.Get()
	defer px.parsers.Put(p)
	for {
		_ = s.uc.SetReadDeadline(minTime(c.deadline, px.Now().Add(px.cfg.StreamIdleTimeout)))
		n, err := body.Read(buf)
		if n > 0 {
			pending = append(pending, buf[:n]...)
			for {
				ev, rest, ok := oai.NextEvent(pending)
				if !ok {
					break
				}
				if s.keep(ev, &res, p) {
					if _, werr := w.Write(ev); werr != nil {
						break
					}
				}
				pending = rest
			}
			pending = append(pending[:0], pending...)
			if ferr := w.Flush(); ferr != nil {
				// The client hung up: closing the replica socket cancels the generation.
				_ = s.uc.Close()
				res.clientGone = true
				return
			}
		}
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) {
			if len(pending) > 0 { // an unterminated last event: pass it on as it is
				_, _ = w.Write(pending)
				_ = w.Flush()
			}
			_ = s.up.CloseBodyStream()
			if s.upstreamClose {
				_ = s.uc.Close()
			} else {
				r.conns.put(s.uc, px.Now())
			}
			return
		}
		// The replica died or stalled mid-stream. Bytes are out: no retry, end the stream
		// with an error event the client's SDK will raise.
		_ = s.uc.Close()
		res.failed = "stream_broken"
		msg := "replica failed mid-stream"
		if errors.Is(err, os.ErrDeadlineExceeded) {
			msg, res.failed = "replica stalled mid-stream", "stream_stalled"
		}
		_, _ = w.Write(oai.ErrorEvent(oai.ServerError, msg))
		_ = w.Flush()
		return
	}
}

// keep inspects one event for accounting and reports whether the client should get it.
func (s *streamer) keep(ev []byte, res *result, p *fastjson.Parser) bool {
	data := oai.EventData(ev)
	if data == nil {
		return true
	}
	now := s.px.Now()
	if u, usageOnly, ok := oai.ChunkUsage(p, data); ok {
		res.usage = u
		if usageOnly && s.c.stripUsage {
			return false
		}
		if usageOnly {
			return true
		}
	}
	if string(data) == "[DONE]" {
		return true
	}
	if res.firstAt.IsZero() {
		res.firstAt = now
	}
	res.events++
	return true
}
