package router

import (
	"bytes"
	"strings"

	"github.com/valyala/fasthttp"
)

// upstreamHopHeaders are the hop-by-hop fields of RFC 9110 §7.6.1 (and the older ones Go's
// httputil.ReverseProxy also drops) that a replica's response may carry but which describe
// its connection to the router, not the router's to the client: passed on, a replica's
// "Connection: close, X-Arbiter-Replica" or "Upgrade" would act on the client's connection.
// Framing (Content-Length, Transfer-Encoding) fasthttp reads and writes itself.
var upstreamHopHeaders = []string{"Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "TE", "Upgrade"}

// upstreamOriginHeaders are fields by which a replica would speak for the router's own
// origin, which every service's clients share: Set-Cookie (a cookie one service's replica
// sets, the client sends to every service), Alt-Svc (sends the client's next requests to a
// host the replica names) and Strict-Transport-Security (pins the endpoint's scheme). No
// OpenAI-compatible server needs them.
var upstreamOriginHeaders = []string{"Set-Cookie", "Alt-Svc", "Strict-Transport-Security"}

// scrubUpstreamHeader removes from a replica's response header what is not the client's
// (upstreamHopHeaders, the fields its Connection header names, upstreamOriginHeaders),
// and counts each kind found against the replica (source headers). The caller has already
// taken the Connection header's close token.
func (px *Proxy) scrubUpstreamHeader(r *Replica, hdr *fasthttp.ResponseHeader) {
	var found []string
	// The names a Connection header lists are hop-by-hop too (RFC 9110 §7.6.1).
	for _, v := range hdr.PeekAll(fasthttp.HeaderConnection) {
		for _, name := range bytes.Split(v, []byte(",")) {
			name = bytes.TrimSpace(name)
			if len(name) == 0 || bytes.EqualFold(name, []byte("close")) || bytes.EqualFold(name, []byte("keep-alive")) {
				continue
			}
			if n := string(name); hdr.Peek(n) != nil && !isFramingHeader(n) {
				hdr.Del(n)
				found = append(found, n)
			}
		}
	}
	hdr.Del(fasthttp.HeaderConnection)
	for _, h := range upstreamHopHeaders {
		if hdr.Peek(h) != nil {
			hdr.Del(h)
			found = append(found, h)
		}
	}
	if len(found) > 0 {
		rejectReport(px.met, px.log, r, sourceHeaders, "hop_by_hop", "response header fields dropped: "+strings.Join(found, ", "), px.Now())
	}
	found = found[:0]
	for _, h := range upstreamOriginHeaders {
		if hdr.Peek(h) != nil {
			hdr.Del(h)
			found = append(found, h)
		}
	}
	if len(found) > 0 {
		rejectReport(px.met, px.log, r, sourceHeaders, "origin", "response header fields dropped: "+strings.Join(found, ", "), px.Now())
	}
}

// isFramingHeader reports whether a Connection header names a field fasthttp itself frames
// the response by (deleting it would only unframe the body the router still has to read).
func isFramingHeader(name string) bool {
	return strings.EqualFold(name, fasthttp.HeaderContentLength) || strings.EqualFold(name, fasthttp.HeaderTransferEncoding) ||
		strings.EqualFold(name, fasthttp.HeaderContentType)
}
