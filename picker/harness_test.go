package picker_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/picker"
	"github.com/arbiter-serve/arbiter/replicasim"
	"github.com/arbiter-serve/arbiter/router"
)

const testModel = "test-model"

// sim is a real replicasim on a loopback port; stop ends it.
type sim struct {
	addr string
	stop context.CancelFunc
}

func startSim(t testing.TB, echo bool) *sim {
	t.Helper()
	cfg := replicasim.Config{Model: testModel, Echo: echo, StopAfter: 8, Logger: slog.New(slog.DiscardHandler), Exit: func(int) {}}
	if !echo {
		p, err := engine.LoadProfile("h100-llama-3.1-8b")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Profile = p
	}
	srv, err := replicasim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go srv.Run(ctx)
	go func() { _ = srv.Serve(ctx, ln) }()
	t.Cleanup(cancel)
	return &sim{addr: ln.Addr().String(), stop: cancel}
}

func replica(id string, s *sim, price float64) fleet.Replica {
	return fleet.Replica{ID: id, Address: s.addr, Model: testModel, Provider: "local", Region: "lo", Capacity: fleet.OnDemand, PricePerHour: price}
}

// rig is the router's proxy over a pool of sims, with the picker serving it over real
// gRPC on loopback.
type rig struct {
	px     *router.Proxy
	pool   *router.Pool
	reg    *prometheus.Registry
	pk     *picker.Picker
	addr   string
	srv    *grpc.Server
	client extprocv3.ExternalProcessorClient
	conn   *grpc.ClientConn
}

func startRig(t testing.TB, mod func(*router.Config), replicas ...fleet.Replica) *rig {
	t.Helper()
	cfg := router.Defaults()
	cfg.Probe.Interval = 50 * time.Millisecond
	cfg.ScrapeInterval = 50 * time.Millisecond
	if mod != nil {
		mod(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	reg := prometheus.NewRegistry()
	met := router.NewMetrics(reg)
	aff, err := router.NewAffinity(1000, 64)
	if err != nil {
		t.Fatal(err)
	}
	pool := router.NewPool(&cfg, log, met, aff)
	pool.SetReplicas(replicas)
	px, err := router.NewProxy(&cfg, pool, met, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go pool.Run(ctx)
	r := &rig{px: px, pool: pool, reg: reg, pk: &picker.Picker{Router: px, Endpoints: cfg.MaxAttempts, MaxBody: cfg.MaxRequestBodyBytes}}
	r.serve(t, "127.0.0.1:0")
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r.conn, r.client = conn, extprocv3.NewExternalProcessorClient(conn)
	t.Cleanup(func() {
		conn.Close()
		r.srv.Stop()
		cancel()
	})
	return r
}

// serve starts the picker's gRPC server on addr (a restart reuses the address).
func (r *rig) serve(t testing.TB, addr string) {
	t.Helper()
	var ln net.Listener
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ln, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	r.srv = grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(r.srv, r.pk)
	go func() { _ = r.srv.Serve(ln) }()
}

// waitReady waits until every replica in the pool has passed its first probe.
func (r *rig) waitReady(t testing.TB, ids ...string) {
	t.Helper()
	waitFor(t, "replicas ready", func() bool {
		for _, id := range ids {
			if rep := r.pool.Get(id); rep == nil || !rep.Available(time.Now()) {
				return false
			}
		}
		return true
	})
}

func (r *rig) inFlight(id string) int64 { return r.pool.Get(id).InFlight() }

// counter sums a metric's samples whose labels include the pairs given.
func (r *rig) counter(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// call is one HTTP request as the gateway replays it to the picker.
type call struct {
	method, path string
	header       map[string]string
	body         []byte
	chunk        int // request body bytes per ext_proc message (default 1 KiB)
	// subset, when hinted, is the gateway's subset hint.
	subset []string
	hinted bool
	// serveAt picks which offered endpoint the gateway sends to (default 0: the first);
	// the ones before it are taken as failed, as Envoy's retries would.
	serveAt int
	// trailers ends the request and the response with trailers rather than an end of
	// stream on their last body message.
	trailers bool
	// afterFirstChunk runs once the first response body piece went through the picker.
	afterFirstChunk func()
}

// outcome is what the gateway saw.
type outcome struct {
	immediate            *extprocv3.ImmediateResponse
	headerDest, metaDest string
	contentLength        string
	clearRouteCache      bool
	sent                 []byte // the request body the picker had the gateway send
	served               string
	status               int
	body                 []byte // the response body as the client got it
	pickerLost           bool   // the picker's stream broke mid-answer
}

// do sends c through the picker as Envoy's ext_proc filter in FULL_DUPLEX_STREAMED mode
// does, forwards the request to the endpoint picked over real HTTP, and streams the answer
// back through the picker.
func (r *rig) do(t testing.TB, c call) outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := r.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c.method == "" {
		c.method = http.MethodPost
	}
	if c.chunk == 0 {
		c.chunk = 1 << 10
	}
	hm := &corev3.HeaderMap{}
	add := func(k, v string) { hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)}) }
	add(":method", c.method)
	add(":path", c.path)
	add(":authority", "gateway.example")
	add("content-type", "application/json")
	for k, v := range c.header {
		add(strings.ToLower(k), v)
	}
	first := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: len(c.body) == 0}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
	}
	if c.hinted {
		vals := make([]any, len(c.subset))
		for i, s := range c.subset {
			vals[i] = s
		}
		st, err := structpb.NewStruct(map[string]any{picker.SubsetKey: vals})
		if err != nil {
			t.Fatal(err)
		}
		first.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{picker.SubsetNamespace: st}}
	}
	ended := false // the picker ended the stream (an immediate answer): Recv says how
	send := func(m *extprocv3.ProcessingRequest) {
		t.Helper()
		if ended {
			return
		}
		if err := stream.Send(m); errors.Is(err, io.EOF) {
			ended = true
		} else if err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	send(first)
	for i := 0; i < len(c.body); i += c.chunk {
		end := min(i+c.chunk, len(c.body))
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
			Body: c.body[i:end], EndOfStream: end == len(c.body) && !c.trailers}}})
	}
	if c.trailers && len(c.body) > 0 {
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
	}
	var out outcome
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("recv request headers answer: %v", err)
	}
	if im := resp.GetImmediateResponse(); im != nil {
		out.immediate = im
		return out
	}
	hr := resp.GetRequestHeaders()
	if hr == nil {
		t.Fatalf("first answer is %T, want request headers", resp.Response)
	}
	out.clearRouteCache = hr.GetResponse().GetClearRouteCache()
	for _, h := range hr.GetResponse().GetHeaderMutation().GetSetHeaders() {
		switch h.GetHeader().GetKey() {
		case picker.DestinationHeader:
			out.headerDest = string(h.GetHeader().GetRawValue())
		case "content-length":
			out.contentLength = string(h.GetHeader().GetRawValue())
		}
	}
	out.metaDest = resp.GetDynamicMetadata().GetFields()[picker.LBNamespace].GetStructValue().GetFields()[picker.DestinationHeader].GetStringValue()
	if len(c.body) > 0 {
		for {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("recv request body answer: %v", err)
			}
			sr := resp.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				if resp.GetRequestTrailers() != nil {
					continue
				}
				t.Fatalf("request body answer is %v, want a streamed body", resp)
			}
			out.sent = append(out.sent, sr.GetBody()...)
			if sr.GetEndOfStream() {
				break
			}
		}
		if c.trailers {
			if resp, err := stream.Recv(); err != nil || resp.GetRequestTrailers() == nil {
				t.Fatalf("request trailers answer: %v %v", resp, err)
			}
		}
	}
	endpoints := strings.Split(out.headerDest, ",")
	if c.serveAt >= len(endpoints) {
		t.Fatalf("serveAt %d of %d endpoints %q", c.serveAt, len(endpoints), out.headerDest)
	}
	out.served = endpoints[c.serveAt]
	req, err := http.NewRequestWithContext(ctx, c.method, "http://"+out.served+c.path, bytes.NewReader(out.sent))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	hresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("forwarding to %s: %v", out.served, err)
	}
	defer hresp.Body.Close()
	out.status = hresp.StatusCode
	rh := &corev3.HeaderMap{}
	rh.Headers = append(rh.Headers, &corev3.HeaderValue{Key: ":status", RawValue: []byte(strconv.Itoa(hresp.StatusCode))},
		&corev3.HeaderValue{Key: "content-type", RawValue: []byte(hresp.Header.Get("Content-Type"))})
	servedMeta, _ := structpb.NewStruct(map[string]any{picker.ServedKey: out.served})
	lost := func(err error) bool {
		if err == nil {
			return false
		}
		out.pickerLost = true
		return true
	}
	// With the picker gone (FailOpen), the gateway streams the rest to the client as is.
	if lost(stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: rh}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{picker.LBNamespace: servedMeta}}})) {
	} else if _, err := stream.Recv(); lost(err) {
	}
	buf := make([]byte, 4<<10)
	pieces := 0
	for {
		n, rerr := hresp.Body.Read(buf)
		if n > 0 {
			pieces++
			if out.pickerLost {
				out.body = append(out.body, buf[:n]...)
			} else if lost(stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: bytes.Clone(buf[:n])}}})) {
				out.body = append(out.body, buf[:n]...)
			} else if resp, err := stream.Recv(); lost(err) {
				out.body = append(out.body, buf[:n]...)
			} else {
				out.body = append(out.body, resp.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
			}
			if pieces == 1 && c.afterFirstChunk != nil {
				c.afterFirstChunk()
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			t.Fatalf("reading the answer: %v", rerr)
		}
	}
	if !out.pickerLost {
		var last *extprocv3.ProcessingRequest
		if c.trailers {
			last = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}}
		} else {
			last = &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{EndOfStream: true}}}
		}
		if !lost(stream.Send(last)) {
			if resp, err := stream.Recv(); !lost(err) {
				out.body = append(out.body, resp.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
			}
		}
		_ = stream.CloseSend()
	}
	return out
}

func chat(stream bool, extra string) []byte {
	b := `{"model":"` + testModel + `","messages":[{"role":"user","content":"hello"}],"max_tokens":5`
	if stream {
		b += `,"stream":true`
	}
	return []byte(b + extra + "}")
}
