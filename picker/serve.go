package picker

import (
	"context"
	"net"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The gRPC health services the protocol names: liveness (the process answers), readiness
// (it can pick: its endpoints are known) and the ext_proc service itself (as readiness).
const (
	LivenessService  = "liveness"
	ReadinessService = "readiness"
	ExtProcService   = "envoy.service.ext_proc.v3.ExternalProcessor"
)

// readyPoll is how often readiness is looked at again.
const readyPoll = 500 * time.Millisecond

// drainTimeout bounds how long a stopping picker waits for the answers streaming through it.
const drainTimeout = 30 * time.Second

// Serve serves the picker and gRPC health on ln until ctx ends, then lets the streams in
// progress finish (up to 30 s). ready says whether the picker can pick (nil: always).
func Serve(ctx context.Context, ln net.Listener, p *Picker, ready func() bool) error {
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, p)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	hs.SetServingStatus(LivenessService, healthpb.HealthCheckResponse_SERVING)
	setReady := func(ok bool) {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if ok {
			st = healthpb.HealthCheckResponse_SERVING
		}
		for _, s := range []string{ReadinessService, ExtProcService, ""} {
			hs.SetServingStatus(s, st)
		}
	}
	isReady := func() bool { return ready == nil || ready() }
	setReady(isReady())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(readyPoll)
		defer t.Stop()
		was := isReady()
		for {
			select {
			case <-ctx.Done():
				hs.Shutdown() // every service NOT_SERVING: the gateway stops sending
				done := make(chan struct{})
				go func() { srv.GracefulStop(); close(done) }()
				select {
				case <-done:
				case <-time.After(drainTimeout):
					srv.Stop()
				}
				return
			case <-t.C:
				if now := isReady(); now != was {
					setReady(now)
					was = now
				}
			}
		}
	}()
	err := srv.Serve(ln)
	if ctx.Err() != nil {
		<-stopped
		return nil
	}
	srv.Stop()
	return err
}
