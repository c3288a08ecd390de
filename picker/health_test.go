package picker_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/arbiter-serve/arbiter/picker"
)

// MUST: gRPC health for liveness (always, while the process answers), readiness and the
// ext_proc service (only once the picker knows its endpoints); all NOT_SERVING as it stops.
func TestHealth(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var ready atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- picker.Serve(ctx, ln, &picker.Picker{}, ready.Load) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	status := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return resp.GetStatus()
	}
	serving := healthpb.HealthCheckResponse_SERVING
	waitFor(t, "liveness", func() bool { return status(picker.LivenessService) == serving })
	if s := status(picker.ReadinessService); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("readiness before the endpoints are known: %v", s)
	}
	if s := status(picker.ExtProcService); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("ext_proc before the endpoints are known: %v", s)
	}
	ready.Store(true)
	waitFor(t, "readiness", func() bool {
		return status(picker.ReadinessService) == serving && status(picker.ExtProcService) == serving
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}
