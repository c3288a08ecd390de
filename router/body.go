package router

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/oai"
)

// The client server streams request bodies (fasthttp's StreamRequestBody), so that a body
// is read only once the request has been authenticated and admitted, and large ones only
// within a budget of bytes held at once (max_body_buffer_bytes). Without it fasthttp reads
// every body whole before the handler runs, and concurrent connections × max_request_body_bytes
// is the only bound on the router's memory: 256 clients sending 8 MiB each would be 2 GiB.

// prefetchedBody is what fasthttp reads of a streamed body with its headers
// (readBodyWithStreaming's 8 KiB): such a body is whole before the handler runs.
const prefetchedBody = 8 << 10

// smallBody is the largest body read without taking from the budget: chat requests of a
// few thousand tokens, the bulk of the traffic, whose total the connection cap bounds.
const smallBody = 64 << 10

// bodyWait bounds how long a large body waits for room in the budget before its request
// is answered 503 (its bytes still unread).
const bodyWait = 2 * time.Second

// reqBody is a request body as read, and what it holds until releaseBody.
type reqBody struct {
	b      []byte
	held   int64   // bytes taken from the body budget
	pooled *[]byte // b's buffer, from the proxy's pool
}

// readBody reads the request's body, taking what it holds from the body budget. On
// failure the client has its answer and nothing is held.
func (px *Proxy) readBody(ctx *fasthttp.RequestCtx) (reqBody, bool) {
	limit := px.cfg.MaxRequestBodyBytes
	n := ctx.Request.Header.ContentLength()
	if n > limit {
		px.refuseBody(ctx, fasthttp.StatusRequestEntityTooLarge, "body_too_large",
			fmt.Sprintf("request body too large: %d bytes, max_request_body_bytes is %d", n, limit))
		return reqBody{}, false
	}
	if n >= 0 && n <= prefetchedBody {
		// Already in memory: copied once into a pooled buffer (Request.Body would copy it
		// within its own and log a warning about streams on every call).
		buf := px.bodyBufs.Get().(*[]byte)
		b := (*buf)[:n]
		if _, err := io.ReadFull(ctx.RequestBodyStream(), b); err != nil {
			px.bodyBufs.Put(buf)
			px.refuseUnread(ctx, err)
			return reqBody{}, false
		}
		return reqBody{b: b, pooled: buf}, true
	}
	var head []byte
	want := int64(n)
	if n < 0 {
		// A chunked body's size is known only once read: the first 64 KiB are read as a
		// small body's are; past them it holds room for the largest.
		b, err := io.ReadAll(io.LimitReader(ctx.RequestBodyStream(), smallBody+1))
		if err == nil && len(b) <= smallBody {
			return reqBody{b: b}, true
		}
		if err != nil {
			px.refuseUnread(ctx, err)
			return reqBody{}, false
		}
		head, want = b, int64(limit)
	}
	var rb reqBody
	if want > smallBody {
		if !px.takeBody(want) {
			px.refuseBody(ctx, fasthttp.StatusServiceUnavailable, "body_buffer_busy",
				fmt.Sprintf("too many large request bodies are held at once (max_body_buffer_bytes %d MiB); retry shortly", px.cfg.MaxBodyBufferBytes>>20))
			ctx.Response.Header.Set("Retry-After", "1")
			return reqBody{}, false
		}
		rb.held = want
	}
	var err error
	if rb.b, err = readStream(ctx.RequestBodyStream(), head, n, limit); err != nil {
		px.releaseBody(rb)
		if errors.Is(err, fasthttp.ErrBodyTooLarge) {
			px.refuseBody(ctx, fasthttp.StatusRequestEntityTooLarge, "body_too_large",
				fmt.Sprintf("request body too large: more than max_request_body_bytes (%d)", limit))
		} else {
			px.refuseUnread(ctx, err)
		}
		return reqBody{}, false
	}
	return rb, true
}

// readStream reads a body of n bytes into a buffer of its own, sized once; or, n < 0, the
// rest of a chunked body after its head, at most limit bytes in all.
func readStream(r io.Reader, head []byte, n, limit int) ([]byte, error) {
	if n >= 0 {
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	buf := bytes.NewBuffer(head) // the rest goes after the head, not into a copy of its own
	_, err := buf.ReadFrom(io.LimitReader(r, int64(limit-len(head))+1))
	if err == nil && buf.Len() > limit {
		err = fasthttp.ErrBodyTooLarge
	}
	return buf.Bytes(), err
}

// takeBody takes n bytes from the body budget, waiting at most bodyWait (and never past
// request_timeout) for others to give theirs back.
func (px *Proxy) takeBody(n int64) bool {
	if px.bodies.TryAcquire(n) {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(bodyWait, px.cfg.RequestTimeout))
	defer cancel()
	return px.bodies.Acquire(ctx, n) == nil
}

// releaseBody gives a body's bytes back to the budget and its buffer to the pool: the
// caller holds no reference to it any more.
func (px *Proxy) releaseBody(rb reqBody) {
	if rb.held > 0 {
		px.bodies.Release(rb.held)
	}
	if rb.pooled != nil {
		px.bodyBufs.Put(rb.pooled)
	}
}

// refuseUnread answers a request whose body did not arrive whole: a client that stopped
// sending (read_timeout) or hung up mid-body.
func (px *Proxy) refuseUnread(ctx *fasthttp.RequestCtx, err error) {
	px.refuseBody(ctx, fasthttp.StatusBadRequest, "body_read", "request body not received whole: "+err.Error())
}

// refuseBody answers a request whose body the router will not read (whole): the rest of it
// is not read, so the connection closes after the answer (lingering, so the answer is read).
func (px *Proxy) refuseBody(ctx *fasthttp.RequestCtx, code int, reason, msg string) {
	px.met.fail(reason, "") // the body is not read yet: nor is its model
	typ := oai.InvalidRequest
	if code == fasthttp.StatusServiceUnavailable {
		typ = oai.Unavailable
	}
	oai.WriteError(ctx, code, typ, msg)
	ctx.SetConnectionClose()
}
