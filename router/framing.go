package router

import (
	"bytes"

	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/oai"
)

// A request's framing is what a request-smuggling attack plays on: two parsers reading one
// byte stream as different requests. fasthttp already answers 400 and closes for
// duplicate or conflicting Content-Length, a Transfer-Encoding whose last coding is not
// chunked, chunked over HTTP/1.0 and a bare CR; it reads Content-Length with
// Transfer-Encoding by the chunked framing and then closes (RFC 9112 §6.1). What it
// accepts that another parser on the path may read differently, framingError refuses.

// framingError returns why a request's header block is ambiguous (empty: it is not), from
// the block as it came on the wire (RawHeaders: fasthttp keeps it as received, folds and
// line ends included):
//   - a bare LF ending a line: RFC 9112 §2.2 lets a recipient take it for a line end, and
//     one that does not reads the next field as part of this one;
//   - obsolete line folding (a line starting with a space or tab): RFC 9112 §5.2 lets a
//     server refuse it, and a folded Transfer-Encoding or Content-Length is the classic
//     smuggling vector;
//   - a Transfer-Encoding other than exactly chunked ("identity", which fasthttp reads by
//     Content-Length; RFC 9112 §6.3 says 400 and close when chunked is not the last coding).
func framingError(h *fasthttp.RequestHeader) string {
	raw := h.RawHeaders()
	for i, c := range raw {
		if c == '\n' && (i == 0 || raw[i-1] != '\r') {
			return "a header line ends in a bare LF (RFC 9112 §2.2)"
		}
	}
	for line := range bytes.SplitSeq(raw, []byte("\r\n")) {
		if len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
			return "obsolete line folding in the header (RFC 9112 §5.2)"
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(bytes.TrimSpace(name), []byte(fasthttp.HeaderTransferEncoding)) &&
			!bytes.EqualFold(bytes.TrimSpace(value), []byte("chunked")) {
			return "Transfer-Encoding other than chunked (RFC 9112 §6.3)"
		}
	}
	return ""
}

// refuseFraming answers a request with ambiguous framing 400 and closes its connection:
// what follows its header on the connection cannot be trusted to be its body.
func (px *Proxy) refuseFraming(ctx *fasthttp.RequestCtx) bool {
	why := framingError(&ctx.Request.Header)
	if why == "" {
		return false
	}
	px.met.fail("bad_framing", "")
	oai.WriteError(ctx, fasthttp.StatusBadRequest, oai.InvalidRequest, "malformed HTTP request: "+why)
	ctx.SetConnectionClose() // after WriteError, which resets the response
	return true
}
