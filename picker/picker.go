// Package picker is Arbiter's endpoint picker for Kubernetes gateways: a gRPC server of
// Envoy's external processing protocol (envoy.service.ext_proc.v3) speaking the Gateway API
// Inference Extension's Endpoint Picker Protocol (GIE docs/proposals/004-endpoint-picker-protocol,
// v1.0.0). The gateway streams each request's headers and body in; the picker answers with
// the replicas to send it to, picked by the router's own policy code (router.Proxy.Handoff):
// one policy behind two front doors. The answer streams back through the picker, which reads
// its usage so tokens, $/M tokens and the predictor's lessons are accounted as the router
// accounts them.
package picker

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/arbiter-serve/arbiter/router"
)

// The protocol's names (004-endpoint-picker-protocol, v1.0.0).
const (
	// DestinationHeader carries the picked endpoints, "ip:port" comma-separated, the first
	// the pick and the rest the gateway's retries in order.
	DestinationHeader = "x-gateway-destination-endpoint"
	// LBNamespace is the dynamic metadata namespace of the picked endpoints (the same key
	// as the header), and the filter metadata namespace of the endpoint that served.
	LBNamespace = "envoy.lb"
	// ServedKey names, in LBNamespace of a response's metadata, the endpoint that served.
	ServedKey = "x-gateway-destination-endpoint-served"
	// SubsetNamespace and SubsetKey carry the gateway's subset hint: the only endpoints the
	// picker may pick.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
)

// streamedChunk bounds the body bytes of one streamed body message sent back to the
// gateway: GIE's own picker sends a request body in pieces of 62,000 bytes.
const streamedChunk = 62000

// Router is what the picker needs of the router: a pick for a request (router.Proxy).
type Router interface {
	Handoff(in router.HandoffRequest) (*router.Handoff, *router.Refusal)
	// BodyTooLarge is the answer to a body past limit bytes, counted as the router's.
	BodyTooLarge(limit int) *router.Refusal
}

// Picker serves the ext_proc protocol. Its zero fields take the documented defaults.
type Picker struct {
	extprocv3.UnimplementedExternalProcessorServer

	Router Router
	// Endpoints is how many endpoints each pick offers, the pick and then the gateway's
	// retries (default 3: the router's max_attempts).
	Endpoints int
	// MaxBody bounds a request body the picker holds to pick by (default 8 MiB, the
	// router's max_request_body_bytes): a larger one is answered 413.
	MaxBody int
	// BodyMode is the gateway's request body mode (its ext_proc processing_mode's
	// request_body_mode: FULL_DUPLEX_STREAMED, BUFFERED, BUFFERED_PARTIAL, STREAMED or NONE)
	// for gateways whose messages do not say it (Envoy says it in the first message's
	// protocol_config; older Envoys and other gateways do not). Default
	// FULL_DUPLEX_STREAMED, the mode the protocol requires a picker to support.
	BodyMode string
	// HeaderWait: where the body mode is FULL_DUPLEX_STREAMED only by default (not said,
	// not configured) and no body follows the headers within this long, the gateway is
	// taken to wait for the headers' answer (BUFFERED, STREAMED, NONE) and the request is
	// picked from its headers alone, with a warning, rather than left to hang until the
	// gateway's message timeout (Envoy's default: 200 ms). Default 100 ms.
	HeaderWait time.Duration
	Log        *slog.Logger

	warned atomic.Bool // the headers-alone fallback was logged at warn level
}

// ParseBodyMode reads a body mode by its ext_proc name ("" is FULL_DUPLEX_STREAMED).
func ParseBodyMode(s string) (filterv3.ProcessingMode_BodySendMode, error) {
	if s == "" {
		return filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, nil
	}
	v, ok := filterv3.ProcessingMode_BodySendMode_value[strings.ToUpper(s)]
	if !ok {
		return 0, fmt.Errorf("request body mode %q: want FULL_DUPLEX_STREAMED, BUFFERED, BUFFERED_PARTIAL, STREAMED or NONE", s)
	}
	return filterv3.ProcessingMode_BodySendMode(v), nil
}

func (p *Picker) headerWait() time.Duration {
	if p.HeaderWait > 0 {
		return p.HeaderWait
	}
	return 100 * time.Millisecond
}

func (p *Picker) endpoints() int {
	if p.Endpoints <= 0 {
		return 3
	}
	return p.Endpoints
}

func (p *Picker) maxBody() int {
	if p.MaxBody <= 0 {
		return 8 << 20
	}
	return p.MaxBody
}

func (p *Picker) log() *slog.Logger {
	if p.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Log
}

// exchange is one HTTP request's ext_proc stream: the gateway opens one per request.
type exchange struct {
	p      *Picker
	stream extprocv3.ExternalProcessor_ProcessServer
	// mode is the gateway's request body mode, said is whether its protocol_config said
	// it (else the picker's BodyMode). FULL_DUPLEX_STREAMED: the gateway streams the body
	// and waits for the headers' answer until the body is whole; BUFFERED: it wants the
	// headers answered, then sends the body whole and routes on the body's answer;
	// STREAMED and NONE: it routes on the headers' answer, so the pick is made from the
	// headers alone.
	mode       filterv3.ProcessingMode_BodySendMode
	said       bool
	respDuplex bool
	// alone: the request was picked from its headers alone; its body passes unchanged.
	alone  bool
	header map[string]string
	hinted bool
	subset []string
	body   []byte
	h      *router.Handoff
}

// Process implements the ext_proc service: one stream per HTTP request.
func (p *Picker) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	mode, err := ParseBodyMode(p.BodyMode)
	if err != nil {
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	x := &exchange{p: p, stream: stream, mode: mode, respDuplex: true}
	defer func() {
		if x.h != nil {
			x.h.Close()
		}
	}()
	for {
		req, err := x.recv()
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil
		}
		if err != nil {
			return err
		}
		if pc := req.GetProtocolConfig(); pc != nil {
			x.mode, x.said = pc.GetRequestBodyMode(), true
			x.respDuplex = pc.GetResponseBodyMode() == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
		}
		done, err := x.handle(req)
		if err != nil || done {
			return err
		}
	}
}

// recv is the gateway's next message. Where the headers came, the body mode is
// FULL_DUPLEX_STREAMED by default only, and nothing is picked yet, a gateway that waits for
// the headers' answer would wait forever: after HeaderWait without a message the request
// is picked from its headers alone, and the message still awaited.
func (x *exchange) recv() (*extprocv3.ProcessingRequest, error) {
	if x.header == nil || x.h != nil || x.said || x.alone || x.mode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED || x.p.BodyMode != "" {
		return x.stream.Recv()
	}
	type got struct {
		req *extprocv3.ProcessingRequest
		err error
	}
	ch := make(chan got, 1)
	go func() {
		req, err := x.stream.Recv()
		ch <- got{req, err}
	}()
	t := time.NewTimer(x.p.headerWait())
	defer t.Stop()
	select {
	case g := <-ch:
		return g.req, g.err
	case <-t.C:
	}
	msg := "the gateway sent no request body within the picker's header wait: it seems to wait for the headers' answer (request body mode BUFFERED, STREAMED or NONE, not said in protocol_config); picking from the headers alone (least loaded replica, no prefix, SLO or token accounting). Set the picker's request body mode to the gateway's (BUFFERED picks by the body)"
	if x.p.warned.CompareAndSwap(false, true) {
		x.p.log().Warn(msg, "wait", x.p.headerWait())
	} else {
		x.p.log().Debug(msg)
	}
	x.alone = true
	if done, err := x.pick(true); done || err != nil {
		if err == nil {
			err = io.EOF // answered at once (a refusal): the exchange is over
		}
		return nil, err // the Recv under way ends with the stream
	}
	g := <-ch
	return g.req, g.err
}

// handle answers one message; done says the exchange is over (an immediate response).
func (x *exchange) handle(req *extprocv3.ProcessingRequest) (done bool, err error) {
	switch v := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		x.header = headerMap(v.RequestHeaders.GetHeaders())
		x.hinted, x.subset = subsetHint(req.GetMetadataContext())
		if v.RequestHeaders.GetEndOfStream() {
			return x.pick(true)
		}
		switch x.mode {
		case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
			return false, nil // the pick waits for the body
		case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
			// The headers' answer lets the body come; the pick rides on the body's answer.
			return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
				RequestHeaders: &extprocv3.HeadersResponse{}}})
		default:
			// STREAMED, NONE: the gateway routes on the headers' answer.
			x.alone = true
			x.p.log().Debug("picking from the headers alone: the gateway's request body mode routes before the body", "mode", x.mode.String())
			return x.pick(true)
		}
	case *extprocv3.ProcessingRequest_RequestBody:
		b := v.RequestBody
		if x.alone {
			// Picked from the headers: the body passes as it is.
			return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
				RequestBody: &extprocv3.BodyResponse{}}})
		}
		if len(x.body)+len(b.GetBody()) > x.p.maxBody() {
			return true, x.immediate(x.p.Router.BodyTooLarge(x.p.maxBody()))
		}
		x.body = append(x.body, b.GetBody()...)
		if b.GetEndOfStream() {
			return x.pick(false)
		}
		if x.mode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			// BUFFERED_PARTIAL's pieces before the last: each passes as it is.
			return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
				RequestBody: &extprocv3.BodyResponse{}}})
		}
		return false, nil
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if x.h == nil && !x.alone && len(x.body) > 0 {
			// A body whose end came with its trailers.
			if done, err := x.pick(false); done || err != nil {
				return done, err
			}
		}
		return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		hm := headerMap(v.ResponseHeaders.GetHeaders())
		if x.h != nil {
			if served := servedEndpoint(req.GetMetadataContext()); served != "" && !x.h.Served(served) {
				x.p.log().Warn("the gateway sent the request to an endpoint the picker did not offer", "served", served, "offered", x.h.Endpoints())
			}
			code, _ := strconv.Atoi(hm[":status"])
			x.h.ResponseHeaders(code, hm["content-type"], v.ResponseHeaders.GetEndOfStream())
		}
		return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
			ResponseHeaders: &extprocv3.HeadersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseBody:
		b := v.ResponseBody
		out := b.GetBody()
		if x.h != nil {
			out = x.h.ResponseBody(b.GetBody(), b.GetEndOfStream())
		}
		return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
			ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: bodyMutation(x.respDuplex, out, b.GetEndOfStream())}}}})
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		if x.h != nil {
			// A body that ended with trailers rather than an end of stream of its own.
			x.h.ResponseBody(nil, true)
		}
		return false, x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return false, nil
}

// pick asks the router for the endpoints and tells the gateway: the destination header
// and the envoy.lb metadata, the same list in both (the protocol forbids them to differ),
// or an immediate response when nothing can serve.
func (x *exchange) pick(headersOnly bool) (bool, error) {
	h, f := x.p.Router.Handoff(router.HandoffRequest{
		HeadersOnly: x.alone,
		Method:      x.header[":method"], Path: pathOf(x.header[":path"]), ContentType: x.header["content-type"],
		Header: func(name string) []byte {
			if v, ok := x.header[strings.ToLower(name)]; ok {
				return []byte(v)
			}
			return nil
		},
		Body: x.body, Subset: x.subset, Hinted: x.hinted, Endpoints: x.p.endpoints(),
	})
	if f != nil {
		return true, x.immediate(f)
	}
	x.h = h
	dest := strings.Join(h.Endpoints(), ",")
	set := []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: DestinationHeader, RawValue: []byte(dest)}}}
	body := h.Body()
	if !headersOnly {
		// The body may have changed (stream_options.include_usage added): its length with it.
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))}})
	}
	common := &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set}}
	meta := &structpb.Struct{Fields: map[string]*structpb.Value{
		LBNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{DestinationHeader: structpb.NewStringValue(dest)}}),
	}}
	if headersOnly || x.mode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		if err := x.send(&extprocv3.ProcessingResponse{DynamicMetadata: meta, Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{Response: common}}}); err != nil || headersOnly {
			return false, err
		}
		for len(body) > streamedChunk {
			if err := x.send(bodyResponse(body[:streamedChunk], false)); err != nil {
				return false, err
			}
			body = body[streamedChunk:]
		}
		return false, x.send(bodyResponse(body, true))
	}
	// BUFFERED: the headers were answered; the pick rides on the body's answer, which
	// carries the whole body (BUFFERED_PARTIAL: the pieces before passed as they were, so
	// the body is left as it comes).
	if x.mode == filterv3.ProcessingMode_BUFFERED {
		common.BodyMutation = bodyMutation(false, body, true)
	}
	return false, x.send(&extprocv3.ProcessingResponse{DynamicMetadata: meta, Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: common}}})
}

// immediate answers the client without an upstream: a 503 when nothing can serve, a 429
// when the request is shed, a 4xx for a bad request, in OpenAI's error shape.
func (x *exchange) immediate(f *router.Refusal) error {
	set := []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")}}}
	for k, v := range f.Headers {
		set = append(set, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)}})
	}
	return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(f.Status)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: set},
		Body:    f.Body,
		Details: "arbiter_picker_" + f.Reason,
	}}})
}

func (x *exchange) send(resp *extprocv3.ProcessingResponse) error {
	if err := x.stream.Send(resp); err != nil {
		return status.Errorf(codes.Unknown, "sending to the gateway: %v", err)
	}
	return nil
}

// bodyResponse answers a request body message with a streamed piece of the body to send.
func bodyResponse(body []byte, end bool) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: bodyMutation(true, body, end)}}}}
}

// bodyMutation replaces a body message's bytes: in full-duplex mode as a streamed piece,
// otherwise as the message's body.
func bodyMutation(duplex bool, body []byte, end bool) *extprocv3.BodyMutation {
	if duplex {
		return &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: end}}}
	}
	return &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}
}

// headerMap reads Envoy's headers, lower-cased as HTTP/2 has them; Envoy sends a value in
// raw_value or value, as configured.
func headerMap(hm *corev3.HeaderMap) map[string]string {
	out := make(map[string]string, len(hm.GetHeaders()))
	for _, h := range hm.GetHeaders() {
		v := h.GetValue()
		if raw := h.GetRawValue(); len(raw) > 0 {
			v = string(raw)
		}
		out[strings.ToLower(h.GetKey())] = v
	}
	return out
}

// subsetHint reads the gateway's subset hint: hinted says the key is present (an empty
// list is a hint nothing satisfies). A list of strings is the protocol's form; a single
// comma-separated string is taken too.
func subsetHint(md *corev3.Metadata) (hinted bool, subset []string) {
	ns, ok := md.GetFilterMetadata()[SubsetNamespace]
	if !ok {
		return false, nil
	}
	v, ok := ns.GetFields()[SubsetKey]
	if !ok {
		return false, nil
	}
	subset = []string{}
	if l := v.GetListValue(); l != nil {
		for _, e := range l.GetValues() {
			if s := strings.TrimSpace(e.GetStringValue()); s != "" {
				subset = append(subset, s)
			}
		}
		return true, subset
	}
	for _, s := range strings.Split(v.GetStringValue(), ",") {
		if s = strings.TrimSpace(s); s != "" {
			subset = append(subset, s)
		}
	}
	return true, subset
}

// servedEndpoint reads the endpoint that served, from a response's metadata ("": not said).
func servedEndpoint(md *corev3.Metadata) string {
	return md.GetFilterMetadata()[LBNamespace].GetFields()[ServedKey].GetStringValue()
}

// pathOf is a :path without its query.
func pathOf(p string) string {
	if i := strings.IndexByte(p, '?'); i >= 0 {
		return p[:i]
	}
	return p
}
