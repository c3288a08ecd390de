package picker_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/arbiter-serve/arbiter/fleet"
)

// BenchmarkPickerAddedTime is the time a request spends in the picker before the gateway can
// send it: from the gateway's first message (its headers) to the last piece of the body the
// picker streams back, over real gRPC on loopback, for a chat request's body of each size
// sent as Envoy streams it (16 KiB messages). The policy is slo_cheapest over four replicas
// of two prices (replicasim, ready). The answer then goes through the picker too (a small
// whole one), untimed, so each request's count is released as in service.
//
//	go test -run '^$' -bench BenchmarkPickerAddedTime -benchtime 2000x ./picker/
func BenchmarkPickerAddedTime(b *testing.B) {
	var reps []fleet.Replica
	for i := range 4 {
		reps = append(reps, replica(fmt.Sprintf("r%d", i), startSim(b, true), float64(1+i%2)))
	}
	r := startRig(b, nil, reps...)
	r.waitReady(b, "r0", "r1", "r2", "r3")
	for _, size := range []int{4 << 10, 64 << 10, 256 << 10} {
		b.Run(fmt.Sprintf("body=%dKiB", size>>10), func(b *testing.B) {
			body := chatOfSize(size)
			took := make([]time.Duration, 0, b.N)
			b.SetBytes(int64(len(body)))
			b.ResetTimer()
			for range b.N {
				took = append(took, r.pickOnly(b, body))
			}
			b.StopTimer()
			slices.Sort(took)
			q := func(p float64) float64 { return float64(took[int(p*float64(len(took)-1))].Microseconds()) }
			b.ReportMetric(q(0.5), "p50_µs")
			b.ReportMetric(q(0.99), "p99_µs")
		})
	}
}

// chatOfSize is a chat request of about n bytes, its prompt text of words.
func chatOfSize(n int) []byte {
	head := `{"model":"` + testModel + `","max_tokens":16,"messages":[{"role":"user","content":"`
	tail := `"}]}`
	words := strings.Repeat("the quick brown fox jumps over the lazy dog ", n/44+1)
	return []byte(head + words[:n-len(head)-len(tail)] + tail)
}

// pickOnly runs one request through the picker as the gateway does and returns the time
// from its headers to the last piece of its body back; the answer (a small JSON body) then
// passes through, untimed.
func (r *rig) pickOnly(b *testing.B, body []byte) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := r.client.Process(ctx)
	if err != nil {
		b.Fatal(err)
	}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")},
		{Key: ":path", RawValue: []byte("/v1/chat/completions")}, {Key: "content-type", RawValue: []byte("application/json")}}}
	start := time.Now()
	msgs := []*extprocv3.ProcessingRequest{{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}}}
	const piece = 16 << 10
	for i := 0; i < len(body); i += piece {
		end := min(i+piece, len(body))
		msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body[i:end], EndOfStream: end == len(body)}}})
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			b.Fatal(err)
		}
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			b.Fatal(err)
		}
		if im := resp.GetImmediateResponse(); im != nil {
			b.Fatalf("immediate %d: %s", im.GetStatus().GetCode(), im.GetBody())
		}
		if sr := resp.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); sr.GetEndOfStream() {
			break
		}
	}
	took := time.Since(start)
	answer := []byte(`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}`)
	rh := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}, {Key: "content-type", RawValue: []byte("application/json")}}}
	for _, m := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: rh}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: answer, EndOfStream: true}}},
	} {
		if err := stream.Send(m); err != nil {
			b.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			b.Fatal(err)
		}
	}
	_ = stream.CloseSend()
	return took
}
