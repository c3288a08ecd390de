package picker_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/arbiter-serve/arbiter/picker"
	"github.com/arbiter-serve/arbiter/router"
)

// gatewayIn replays one request as Envoy's ext_proc filter does in a request body mode
// other than FULL_DUPLEX_STREAMED (the harness's do covers that one): the gateway waits
// for the headers' answer before it sends any body; in BUFFERED it then sends the body
// whole and routes on the body's answer (whose header mutation may carry the pick), in
// STREAMED it routes on the headers' answer and streams the body piece by piece, each
// piece answered, and in NONE it sends no body at all
// (https://www.envoyproxy.io/docs/envoy/latest/api-v3/extensions/filters/http/ext_proc/v3/processing_mode.proto).
// say puts the mode in the first message's protocol_config, as Envoy does; without it the
// picker must be told or find out. A gateway message unanswered within 2 s is a hang
// (Envoy's own message_timeout is 200 ms). It returns the endpoint the gateway sends to
// and the body it sends, or the immediate answer.
func gatewayIn(t *testing.T, r *rig, mode filterv3.ProcessingMode_BodySendMode, say bool, header map[string]string, body []byte) (dest string, sent []byte, immediate *extprocv3.ImmediateResponse) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := r.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.CloseSend()
	recv := func(what string) *extprocv3.ProcessingResponse {
		t.Helper()
		type got struct {
			resp *extprocv3.ProcessingResponse
			err  error
		}
		ch := make(chan got, 1)
		go func() { resp, err := stream.Recv(); ch <- got{resp, err} }()
		select {
		case g := <-ch:
			if g.err != nil {
				t.Fatalf("%s: %v", what, g.err)
			}
			return g.resp
		case <-time.After(2 * time.Second):
			t.Fatalf("%s mode (said: %v): no answer to the %s within 2 s: the gateway would hang until its message timeout", mode, say, what)
			return nil
		}
	}
	destOf := func(c *extprocv3.CommonResponse) string {
		for _, h := range c.GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == picker.DestinationHeader {
				return string(h.GetHeader().GetRawValue())
			}
		}
		return ""
	}
	hm := &corev3.HeaderMap{}
	for k, v := range map[string]string{":method": "POST", ":path": "/v1/chat/completions", ":authority": "gateway.example", "content-type": "application/json"} {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	for k, v := range header {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
	}
	first := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}}
	if say {
		first.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: filterv3.ProcessingMode_NONE}
	}
	if err := stream.Send(first); err != nil {
		t.Fatal(err)
	}
	resp := recv("request headers")
	if im := resp.GetImmediateResponse(); im != nil {
		return "", nil, im
	}
	dest = destOf(resp.GetRequestHeaders().GetResponse())
	sent = body
	switch mode {
	case filterv3.ProcessingMode_BUFFERED:
		if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
			t.Fatal(err)
		}
		resp := recv("request body")
		if im := resp.GetImmediateResponse(); im != nil {
			return "", nil, im
		}
		c := resp.GetRequestBody().GetResponse()
		if d := destOf(c); d != "" {
			dest = d
		}
		if m := c.GetBodyMutation(); m.GetStreamedResponse() != nil {
			t.Fatal("a streamed body answer in BUFFERED mode: Envoy refuses it")
		} else if b := m.GetBody(); b != nil {
			sent = b
		}
	case filterv3.ProcessingMode_STREAMED:
		for i := 0; i < len(body); i += 64 {
			end := min(i+64, len(body))
			if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body[i:end], EndOfStream: end == len(body)}}}); err != nil {
				t.Fatal(err)
			}
			c := recv("request body piece").GetRequestBody().GetResponse()
			if c.GetBodyMutation() != nil || destOf(c) != "" {
				t.Fatalf("STREAMED piece answered with a change the gateway can no longer apply: %v", c)
			}
		}
	}
	return dest, sent, nil
}

// forward sends the body to the endpoint as the gateway would and returns the status.
func forward(t *testing.T, dest string, body []byte) int {
	t.Helper()
	resp, err := http.Post("http://"+dest+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("forwarding to %q: %v", dest, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// The picker answers in every request body mode a gateway may be configured with, said in
// protocol_config or not: FULL_DUPLEX_STREAMED (the harness's tests), BUFFERED (picked by the
// body, the pick on the body's answer), STREAMED and NONE (picked from the headers alone,
// with the model from the gateway's X-Gateway-Model-Name). Before, BUFFERED unsaid hung
// until the gateway's timeout, and STREAMED and NONE got no destination.
func TestEveryBodyMode(t *testing.T) {
	a, b := startSim(t, true), startSim(t, true)
	r := startRig(t, nil, replica("a", a, 1), replica("b", b, 2))
	r.waitReady(t, "a", "b")
	body := chat(false, "")
	model := map[string]string{router.ModelHeader: testModel}
	for _, c := range []struct {
		mode     filterv3.ProcessingMode_BodySendMode
		say      bool
		picker   string // the picker's configured mode
		header   map[string]string
		wantLone bool // picked from the headers alone
	}{
		{mode: filterv3.ProcessingMode_BUFFERED, say: true},
		{mode: filterv3.ProcessingMode_BUFFERED, say: false, picker: "BUFFERED"},
		// Not said, not configured: found out after the header wait, picked from the headers.
		{mode: filterv3.ProcessingMode_BUFFERED, say: false, wantLone: true},
		{mode: filterv3.ProcessingMode_STREAMED, say: true, header: model, wantLone: true},
		{mode: filterv3.ProcessingMode_STREAMED, say: false, picker: "STREAMED", header: model, wantLone: true},
		{mode: filterv3.ProcessingMode_NONE, say: true, header: model, wantLone: true},
		{mode: filterv3.ProcessingMode_NONE, say: false, header: model, wantLone: true},
		// Without the model header, the pool's only model.
		{mode: filterv3.ProcessingMode_NONE, say: true, wantLone: true},
	} {
		r.pk.BodyMode = c.picker
		dest, sent, im := gatewayIn(t, r, c.mode, c.say, c.header, body)
		name := c.mode.String() + map[bool]string{true: " said", false: " unsaid"}[c.say] + " (picker: " + c.picker + ")"
		if im != nil {
			t.Fatalf("%s: immediate answer %v", name, im)
		}
		if dest == "" {
			t.Fatalf("%s: no destination", name)
		}
		if first := strings.Split(dest, ",")[0]; first != a.addr && first != b.addr {
			t.Fatalf("%s: destination %q is neither replica", name, dest)
		}
		if !bytes.Equal(sent, body) {
			t.Fatalf("%s: the gateway would send %q, not the client's body", name, sent)
		}
		if st := forward(t, strings.Split(dest, ",")[0], sent); st != 200 {
			t.Fatalf("%s: %d from the replica", name, st)
		}
		waitFor(t, name+": in-flight released", func() bool { return r.inFlight("a") == 0 && r.inFlight("b") == 0 })
	}
	r.pk.BodyMode = ""
	// A model the pool does not serve, named by the gateway's header: 404, as the router.
	_, _, im := gatewayIn(t, r, filterv3.ProcessingMode_NONE, true, map[string]string{router.ModelHeader: "other"}, body)
	if im == nil || im.GetStatus().GetCode() != 404 || !bytes.Contains(im.GetBody(), []byte(router.ModelHeader)) {
		t.Fatalf("unknown model in the header: want 404 naming %s, got %v", router.ModelHeader, im)
	}
}

func TestParseBodyMode(t *testing.T) {
	for in, want := range map[string]filterv3.ProcessingMode_BodySendMode{
		"": filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, "buffered": filterv3.ProcessingMode_BUFFERED,
		"STREAMED": filterv3.ProcessingMode_STREAMED, "NONE": filterv3.ProcessingMode_NONE,
	} {
		if got, err := picker.ParseBodyMode(in); err != nil || got != want {
			t.Errorf("ParseBodyMode(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := picker.ParseBodyMode("DUPLEX"); err == nil || !strings.Contains(err.Error(), "FULL_DUPLEX_STREAMED") {
		t.Errorf("a wrong mode: %v", err)
	}
}
