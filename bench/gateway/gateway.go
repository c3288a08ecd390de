// Package gateway is a benchmark's stand-in for a Kubernetes gateway in front of Arbiter's
// endpoint picker: an HTTP server that, for each request, does what Envoy's ext_proc filter
// does in FULL_DUPLEX_STREAMED mode with GIE's Endpoint Picker Protocol (headers and body to
// the picker, the request to the first endpoint of x-gateway-destination-endpoint, the
// next on a connection failure, the answer streamed back through the picker piece by
// piece). No Envoy can be had here; this drives the picker over real gRPC and the replicas
// over real HTTP, so a benchmark can send the same traffic through the router and through
// the picker and compare.
package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/arbiter-serve/arbiter/picker"
)

// Gateway is the HTTP front of one or more pickers.
type Gateway struct {
	// clients are the pickers, taken in turn per request, as a gateway balances its
	// streams over the picker Service's pods.
	clients []extprocv3.ExternalProcessorClient
	conns   []*grpc.ClientConn
	next    atomic.Uint64
	// IDs names each endpoint address, set as X-Arbiter-Replica on the answer (as the
	// router's routing_headers do) so a benchmark can say which replica served.
	IDs  map[string]string
	http *http.Client
}

// New connects to the pickers at addrs (host:port of their ext_proc gRPC).
func New(addrs []string, ids map[string]string) (*Gateway, error) {
	g := &Gateway{IDs: ids, http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}}
	for _, addr := range addrs {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			g.Close()
			return nil, err
		}
		g.conns, g.clients = append(g.conns, conn), append(g.clients, extprocv3.NewExternalProcessorClient(conn))
	}
	if len(g.clients) == 0 {
		return nil, errors.New("gateway: no picker")
	}
	return g, nil
}

// Close ends the gRPC connections.
func (g *Gateway) Close() error {
	var errs []error
	for _, c := range g.conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// ServeHTTP takes one client request through the picker to a replica and back.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := g.serve(w, r); err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
	}
}

// chunk is how many request body bytes go in one ext_proc message (Envoy streams what
// arrives; 16 KiB is an HTTP/2 frame's default maximum).
const chunk = 16 << 10

func (g *Gateway) serve(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	stream, err := g.clients[(g.next.Add(1)-1)%uint64(len(g.clients))].Process(ctx)
	if err != nil {
		return fmt.Errorf("picker: %w", err)
	}
	hm := &corev3.HeaderMap{}
	add := func(k, v string) { hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)}) }
	add(":method", r.Method)
	add(":path", r.URL.RequestURI())
	add(":authority", r.Host)
	for k, vs := range r.Header {
		add(strings.ToLower(k), strings.Join(vs, ","))
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: len(body) == 0}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}}); err != nil {
		return fmt.Errorf("picker: %w", err)
	}
	for i := 0; i < len(body); i += chunk {
		end := min(i+chunk, len(body))
		if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
			Body: body[i:end], EndOfStream: end == len(body)}}}); err != nil {
			return fmt.Errorf("picker: %w", err)
		}
	}
	resp, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("picker: %w", err)
	}
	if im := resp.GetImmediateResponse(); im != nil {
		for _, h := range im.GetHeaders().GetSetHeaders() {
			w.Header().Set(h.GetHeader().GetKey(), string(h.GetHeader().GetRawValue()))
		}
		w.WriteHeader(int(im.GetStatus().GetCode()))
		_, _ = w.Write(im.GetBody())
		return nil
	}
	var dest []string
	header := http.Header{}
	for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if k := h.GetHeader().GetKey(); k == picker.DestinationHeader {
			dest = strings.Split(string(h.GetHeader().GetRawValue()), ",")
		} else if k != "content-length" {
			header.Set(k, string(h.GetHeader().GetRawValue()))
		}
	}
	if len(dest) == 0 {
		return errors.New("the picker named no endpoint")
	}
	var sent []byte
	if len(body) > 0 {
		for {
			resp, err := stream.Recv()
			if err != nil {
				return fmt.Errorf("picker: %w", err)
			}
			sr := resp.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return fmt.Errorf("picker: the body's answer is %v, want a streamed body", resp)
			}
			sent = append(sent, sr.GetBody()...)
			if sr.GetEndOfStream() {
				break
			}
		}
	}
	// To the first endpoint that takes the connection, as Envoy's retries on connect
	// failure go down the list.
	var up *http.Response
	var served string
	for _, d := range dest {
		req, err := http.NewRequestWithContext(ctx, r.Method, "http://"+d+r.URL.RequestURI(), bytes.NewReader(sent))
		if err != nil {
			return err
		}
		req.Header = r.Header.Clone()
		for k, vs := range header {
			req.Header[k] = vs
		}
		req.ContentLength = int64(len(sent))
		if up, err = g.http.Do(req); err == nil {
			served = d
			break
		}
		var op *net.OpError
		if !errors.As(err, &op) || op.Op != "dial" {
			return err
		}
	}
	if up == nil {
		return fmt.Errorf("no endpoint of %v took the connection", dest)
	}
	defer up.Body.Close()
	meta, _ := structpb.NewStruct(map[string]any{picker.ServedKey: served})
	rh := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(strconv.Itoa(up.StatusCode))},
		{Key: "content-type", RawValue: []byte(up.Header.Get("Content-Type"))}}}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: rh}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{picker.LBNamespace: meta}}}); err != nil {
		return fmt.Errorf("picker: %w", err)
	}
	if _, err := stream.Recv(); err != nil {
		return fmt.Errorf("picker: %w", err)
	}
	for k, vs := range up.Header {
		if k != "Content-Length" {
			w.Header()[k] = vs
		}
	}
	if id := g.IDs[served]; id != "" {
		w.Header().Set("X-Arbiter-Replica", id)
	}
	w.WriteHeader(up.StatusCode)
	flusher, _ := w.(http.Flusher)
	buf := make([]byte, 32<<10)
	for {
		n, rerr := up.Body.Read(buf)
		end := errors.Is(rerr, io.EOF)
		if n > 0 || end {
			if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
				Body: bytes.Clone(buf[:n]), EndOfStream: end}}}); err != nil {
				return fmt.Errorf("picker: %w", err)
			}
			resp, err := stream.Recv()
			if err != nil {
				return fmt.Errorf("picker: %w", err)
			}
			if _, err := w.Write(resp.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()); err != nil {
				return nil // the client went away
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if end {
			break
		}
		if rerr != nil {
			return nil // headers are sent: the client sees a cut answer
		}
	}
	_ = stream.CloseSend()
	return nil
}
