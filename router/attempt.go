package router

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/oai"
)

var errDeadline = errors.New("request deadline exceeded")

// attempt tries the request on one replica. It returns true when the client has its answer
// (or is gone) and false when the caller should try another replica: every failure here
// happens before any byte reached the client. mayRetry false means this is the last try,
// so an upstream 502/503 is passed through instead of being hidden.
func (px *Proxy) attempt(ctx *fasthttp.RequestCtx, c *call, r *Replica, mayRetry bool) bool {
	// What this replica is expected to do with the request, whichever policy chose it: the
	// predictor learns from, and the error metric compares against, this prediction, made
	// at the pick's time (c.route.Now).
	pred := r.Begin(&c.route, 3*px.cfg.ScrapeInterval)
	if f := c.onBegin; f != nil {
		c.onBegin = nil
		f()
	}
	handedOff := false // the stream writer releases the in-flight count when it ends
	defer func() {
		if !handedOff {
			r.End(pred, px.Now())
			c.kickAfterEnd()
		}
	}()

	if c.adapter != nil {
		if err := px.ensureAdapter(r, *c.adapter, c.deadline); err != nil {
			var refused *errAdapterLoad
			if errors.As(err, &refused) {
				// The replica refused the adapter's files: the other replicas read the same.
				px.met.fail("adapter_load", c.service)
				ctx.Response.Reset()
				ctx.SetStatusCode(fasthttp.StatusBadGateway)
				ctx.SetContentType("application/json")
				ctx.SetBody(oai.ErrorBody(oai.ServerError, err.Error(), "adapter_load_failed"))
				return true
			}
			if errors.Is(err, errAdapterWait) {
				// The deadline ends the attempts: the caller answers 504.
				return false
			}
			px.upstreamFailed(r, "adapter_load", err)
			return false
		}
	}
	c.firstByte = px.firstByteTimeout(c, pred)
	uc, sentAt, err := px.send(ctx, c, r)
	if err != nil {
		if errors.Is(err, errClientGone) {
			px.clientGone(c, r)
			return true
		}
		reason := "send"
		if timedOut(err) {
			reason = "first_byte_timeout"
		}
		px.upstreamFailed(r, reason, err)
		return false
	}
	hdr := &ctx.Response.Header
	// Interim responses (100 Continue, 103 Early Hints) precede the replica's answer: skip
	// them, as net/http's client does. Taken for the answer, one would reach the client and
	// the real answer be left on the pooled connection for the next request to read.
	for i := 0; isInterim(hdr.StatusCode()) && i < maxInterim; i++ {
		hdr.Reset()
		if err := hdr.Read(uc.br); err != nil {
			_ = uc.Close()
			px.upstreamFailed(r, "read_header", err)
			ctx.Response.Reset()
			return false
		}
	}
	if s := hdr.StatusCode(); s < 200 || s > 599 {
		// 101 (the router asked for no upgrade), interim responses without end, or a status
		// HTTP does not define (999): no answer to pass on, and nothing to trust after it on
		// the connection.
		_ = uc.Close()
		px.upstreamFailed(r, "bad_status", fmt.Errorf("response status %d", s))
		ctx.Response.Reset()
		return false
	}
	if c.capped {
		hdr.Set(PriorityHeader, c.band.String()) // the band it ran in, below the one asked for
	}
	if px.cfg.RoutingHeaders {
		hdr.Set("X-Arbiter-Replica", r.Info().ID)
		hdr.Set("X-Arbiter-Predicted-Ttft-Ms", strconv.FormatFloat(pred.TTFT*1000, 'f', 3, 64))
		hdr.Set("X-Arbiter-Predicted-Tpot-Ms", strconv.FormatFloat(pred.TPOT*1000, 'f', 3, 64))
		hdr.Set("X-Arbiter-Predicted-Uncached", strconv.Itoa(pred.Uncached))
		// When the prediction's clock starts: a client on the same host can then tell the
		// replica's TTFT from the time its request spent before the router sent it.
		hdr.Set("X-Arbiter-Sent-Unix-Nano", strconv.FormatInt(sentAt.UnixNano(), 10))
	}
	upstreamClose := hdr.ConnectionClose()
	hdr.ResetConnectionClose() // the client's connection is ours to manage, not the replica's
	px.scrubUpstreamHeader(r, hdr)
	status := hdr.StatusCode()

	if (status == fasthttp.StatusBadGateway || status == fasthttp.StatusServiceUnavailable) && mayRetry {
		_ = uc.Close() // not worth reading an error body we will not use
		px.upstreamFailed(r, "status_5xx", nil)
		ctx.Response.Reset()
		return false
	}
	if bytes.HasPrefix(hdr.ContentType(), []byte("text/event-stream")) {
		s := px.newStreamer(c, r, uc, upstreamClose, sentAt, pred, ctx.Conn())
		if err := s.open(hdr); err != nil { // the stream's first bytes were malformed
			_ = uc.Close()
			px.upstreamFailed(r, "stream_open", err)
			ctx.Response.Reset()
			return false
		}
		handedOff, c.streaming = true, true // the body stream now owns the in-flight counts (see CloseWithError)
		ctx.Response.SetBodyStream(s, -1)
		return true
	}

	// A whole response: read it into the client's response (no intermediate copy), under
	// roundTrip's deadline.
	// A 204 or 304 ends at its header (RFC 9112 §6.3), whatever it says of a body: read as
	// one, a 204 without Content-Length would be read until the replica closed.
	if !bodiless(status) {
		err = ctx.Response.ReadBody(uc.br, px.cfg.MaxResponseBodyBytes)
		if err == nil && hdr.ContentLength() == -1 {
			err = hdr.ReadTrailer(uc.br)
		}
	}
	if err != nil {
		_ = uc.Close()
		ctx.Response.Reset()
		if errors.Is(err, fasthttp.ErrBodyTooLarge) {
			px.met.fail("response_too_large", c.service)
			oai.WriteError(ctx, fasthttp.StatusBadGateway, oai.ServerError, "replica response exceeds the router's size limit")
			return true
		}
		px.upstreamFailed(r, "read_body", err)
		return false // nothing reached the client: another replica may answer
	}
	now := px.Now()
	if upstreamClose || bodiless(status) {
		// A 204 or 304 has no body, so whatever a replica sent after its header (a body
		// anyway, or a whole forged response) would be read as the next request's answer.
		_ = uc.Close()
	} else {
		r.conns.put(uc, now)
	}
	if status >= 500 && status != fasthttp.StatusBadGateway && status != fasthttp.StatusServiceUnavailable {
		px.upstreamFailed(r, "status_5xx", nil)
	}
	if status == fasthttp.StatusBadGateway || status == fasthttp.StatusServiceUnavailable {
		c.lastUpstream = status
		px.upstreamFailed(r, "status_5xx", nil)
		return false
	}
	if px.refusesAPI(c, r, status, ctx.Response.Body()) {
		ctx.Response.Reset() // another replica may serve it (endpoints.go)
		return false
	}
	var usage oai.Usage
	if status == fasthttp.StatusOK {
		p := px.parsers.Get()
		usage, _ = oai.ResponseUsage(p, ctx.Response.Body())
		if c.kind == oai.Responses {
			px.responses.remember(responseID(p, ctx.Response.Body()), r.Info().ID)
		}
		px.parsers.Put(p)
	}
	px.account(c, r, result{code: status, usage: usage, sentAt: sentAt, firstAt: now, endAt: now, pred: pred})
	return true
}

var errClientGone = errors.New("client went away")

// maxInterim bounds the interim (1xx) responses skipped before a replica's answer.
const maxInterim = 5

// isInterim reports whether status is an interim response that a final one follows
// (RFC 9110 §15.2); 101 Switching Protocols is final.
func isInterim(status int) bool {
	return status >= 100 && status < 200 && status != fasthttp.StatusSwitchingProtocols
}

// bodiless reports whether a response with status has no body, whatever its header says
// (RFC 9112 §6.3).
func bodiless(status int) bool {
	return status == fasthttp.StatusNoContent || status == fasthttp.StatusNotModified
}

// send writes the request to the replica and reads the response header into ctx.Response.
// A pooled connection that turns out dead before any response byte (the replica closed it
// while idle) is replaced by a fresh dial once, invisibly to the client.
func (px *Proxy) send(ctx *fasthttp.RequestCtx, c *call, r *Replica) (*upConn, time.Time, error) {
	out := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(out)
	ctx.Request.Header.CopyTo(&out.Header)
	out.Header.SetHost(r.Info().Address)
	out.Header.ResetConnectionClose()
	// The router answered the client's Expect: 100-continue itself and has the whole body:
	// asked again, a replica would send a 100 Continue before its answer.
	out.Header.Del(fasthttp.HeaderExpect)
	out.Header.Del("X-Arbiter-Policy")
	out.Header.Del("X-Arbiter-Deadline-Ms")
	out.Header.Del("X-Slo-Ttft-Ms")
	out.Header.Del("X-Slo-Tpot-Ms")
	out.Header.Del(PriorityHeader)
	for _, h := range px.stripHeaders {
		out.Header.Del(h)
	}
	out.SetBodyRaw(c.body)

	sentAt := c.route.Now // microseconds before the write: the pick's time
	uc, reused, err := r.conns.get(sentAt, c.deadline)
	for {
		if err != nil {
			return nil, time.Time{}, err
		}
		err = px.roundTrip(ctx, c, out, uc, r, sentAt)
		if err == nil {
			return uc, sentAt, nil
		}
		_ = uc.Close()
		if errors.Is(err, errClientGone) || !reused || !staleConnError(err) {
			return nil, time.Time{}, err
		}
		ctx.Response.Reset()
		uc, reused, err = r.conns.dial(c.deadline)
		sentAt = px.Now()
	}
}

// roundTrip writes the request and waits for the response header, watching the client:
// if it hangs up meanwhile, the upstream socket is closed, which cancels the generation.
// vLLM sends a non-streamed response's header only when the generation is done, so the
// wait is for the whole generation: it is cut after the first-byte timeout only when the
// replica's engine made no progress meanwhile (its scraped token counters did not move); a
// generation that progresses is waited for, however long, in slices of that timeout, up to
// the client's own deadline. The header's arrival arms a fresh stream_idle_timeout for the
// body that follows.
func (px *Proxy) roundTrip(ctx *fasthttp.RequestCtx, c *call, out *fasthttp.Request, uc *upConn, r *Replica, now time.Time) error {
	waitUntil := func(from time.Time, d time.Duration) time.Time {
		t := from.Add(d)
		if !c.clientDeadline.IsZero() {
			t = minTime(t, c.clientDeadline)
		}
		return t
	}
	// The write is bounded by the pick's deadline too: a replica that takes no bytes has
	// not taken the request.
	_ = uc.SetDeadline(minTime(waitUntil(now, c.firstByte), maxTime(c.deadline, now.Add(px.cfg.ConnectTimeout))))
	if err := out.Write(uc.bw); err != nil {
		return err
	}
	if err := uc.bw.Flush(); err != nil {
		return err
	}
	_ = uc.SetReadDeadline(waitUntil(now, c.firstByte))
	px.watcher.add(&c.watch, ctx.Conn(), uc, now)
	slice := now
	var err error
	for {
		err = ctx.Response.Header.Read(uc.br)
		if err == nil || !timedOut(err) || uc.br.Buffered() > 0 {
			break
		}
		at := px.Now()
		if !c.clientDeadline.IsZero() && !at.Before(c.clientDeadline) || !r.progressedSince(slice) {
			break
		}
		// The engine moved during this slice: the generation is alive, wait another.
		px.met.firstByteExtended.Inc()
		slice = at
		_ = uc.SetReadDeadline(waitUntil(at, c.firstByte))
	}
	if px.watcher.remove(&c.watch) {
		return errClientGone
	}
	if err == nil {
		_ = uc.SetReadDeadline(waitUntil(px.Now(), px.cfg.StreamIdleTimeout))
	}
	return err
}

// firstByteTimeout is how long this attempt waits for the replica's response header: a
// multiple of what the request is expected to take there (its SLO target or the prediction,
// whichever is larger), within [first_byte_timeout_min, first_byte_timeout]. A whole
// response's header comes after its generation, so without max_tokens its length is
// unknown and the full first_byte_timeout applies.
func (px *Proxy) firstByteTimeout(c *call, pred Prediction) time.Duration {
	limit, k := px.cfg.FirstByteTimeout, px.cfg.FirstByteSLOMultiple
	var expect float64
	switch {
	case k <= 0:
		return limit
	case c.adapter != nil:
		// A LoRA adapter's request waits in vLLM's queue until its adapter gets a GPU slot,
		// which the requests of the adapters holding them decide: a replica that keeps it
		// waiting is serving, not failing.
		return limit
	case c.stream:
		expect = max(c.slo.TTFT, pred.TTFT)
	case c.outBounded:
		expect = max(c.slo.E2E, pred.E2E)
	}
	if !(expect > 0) || math.IsInf(expect, 0) {
		return limit
	}
	return min(max(time.Duration(k*expect*float64(time.Second)), px.cfg.FirstByteTimeoutMin), limit)
}

// timedOut reports whether err is a deadline passing: fasthttp's header reader answers
// its own ErrTimeout, a socket write the os one.
func timedOut(err error) bool {
	return errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, os.ErrDeadlineExceeded)
}

// staleConnError reports whether err is what a request on a socket the peer had already
// closed looks like, before any response byte.
func staleConnError(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
