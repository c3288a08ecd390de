package router

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-serve/arbiter/fleet"
)

// A router takes its replicas from a file, or from the control plane, a Source or both; a
// Source is given the pool, and the picker's front door hears from its synced whether the
// set has come.
func TestRunTakesItsReplicaSources(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := Defaults()
	log := slog.New(slog.DiscardHandler)
	src := func(context.Context, *Pool) (func() bool, error) { return func() bool { return true }, nil }
	for _, o := range []Options{
		{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", Config: cfg, Log: log},
		{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", Config: cfg, Log: log, ReplicaFile: "r.yaml", Source: src},
		{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", Config: cfg, Log: log, ReplicaFile: "r.yaml", ControlURL: "http://127.0.0.1:1"},
	} {
		if err := Run(ctx, o); err == nil || !strings.Contains(err.Error(), "give a replica file, or a control plane URL, a replica source or both") {
			t.Errorf("Run with file %q, control %q, source %v: got %v, want the sources error", o.ReplicaFile, o.ControlURL, o.Source != nil, err)
		}
	}
	boom := errors.New("no such pool")
	err := Run(ctx, Options{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", Config: cfg, Log: log,
		Source: func(context.Context, *Pool) (func() bool, error) { return nil, boom }})
	if !errors.Is(err, boom) {
		t.Errorf("a source that cannot start: Run returned %v, want its error", err)
	}

	// The source's set is the pool's, and its synced is what the front doors hear.
	got := make(chan []string, 1)
	var synced func() bool
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- Run(rctx, Options{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", Config: cfg, Log: log,
			Source: func(_ context.Context, p *Pool) (func() bool, error) {
				p.SetSource("test", []fleet.Replica{{ID: "a", Address: "127.0.0.1:9", Model: "m", Capacity: fleet.Spot, PricePerHour: 0.4}})
				return func() bool { return len(p.Snapshot()) == 1 }, nil
			},
			FrontDoors: []func(ctx context.Context, px *Proxy, s func() bool) error{func(ctx context.Context, px *Proxy, s func() bool) error {
				synced = s
				var ids []string
				for _, r := range px.pool.Snapshot() {
					ids = append(ids, r.Info().ID)
				}
				got <- ids
				<-ctx.Done()
				return nil
			}}})
	}()
	select {
	case ids := <-got:
		if len(ids) != 1 || ids[0] != "a" || !synced() {
			t.Errorf("the front door saw replicas %v (synced %v), want the source's [a]", ids, synced())
		}
	case err := <-done:
		t.Fatalf("Run ended: %v", err)
	case <-ctx.Done():
		t.Fatal("the front door never started")
	}
	rcancel()
	if err := <-done; err != nil {
		t.Errorf("Run after its context ended: %v", err)
	}
}

// Two sources in one pool: the union, an address both give taken as the first source (by
// name: the control plane's) gives it, and one source's change leaving the other's alone.
func TestPoolSetSourceUnion(t *testing.T) {
	cfg := Defaults()
	pool := NewPool(&cfg, slog.New(slog.DiscardHandler), NewMetrics(prometheus.NewRegistry()), nil)
	ids := func() map[string]fleet.Replica {
		out := map[string]fleet.Replica{}
		for _, r := range pool.Snapshot() {
			out[r.Info().ID] = *r.Info()
		}
		return out
	}
	placed := fleet.Replica{ID: "svc-1", Address: "10.0.0.1:8000", Model: "m", Capacity: fleet.Spot, PricePerHour: 0.9, Service: "svc"}
	pool.SetSource("inferencepool", []fleet.Replica{
		{ID: "arbiter/pod-a:8000", Address: "10.0.0.1:8000", Model: "m", Capacity: fleet.Spot, PricePerHour: 0.4},
		{ID: "arbiter/pod-b:8000", Address: "10.0.0.2:8000", Model: "m", Capacity: fleet.OnDemand, PricePerHour: 11},
	})
	if got := ids(); len(got) != 2 || got["arbiter/pod-a:8000"].PricePerHour != 0.4 {
		t.Fatalf("the pool's pods alone: %v", got)
	}
	pool.SetSource(SourceControl, []fleet.Replica{placed})
	got := ids()
	if len(got) != 2 || got["svc-1"].PricePerHour != 0.9 || got["svc-1"].Service != "svc" || got["arbiter/pod-b:8000"].Address != "10.0.0.2:8000" {
		t.Fatalf("with the control plane's replica of pod-a's address: %v; want svc-1 (the control plane's) and pod-b", got)
	}
	if _, dup := got["arbiter/pod-a:8000"]; dup {
		t.Errorf("pod-a is listed twice: as the control plane's svc-1 and as the pool's pod")
	}
	pool.SetSource("inferencepool", nil)
	if got := ids(); len(got) != 1 || got["svc-1"].ID != "svc-1" {
		t.Errorf("the pool's pods gone: %v, want the control plane's svc-1 alone", got)
	}
	pool.SetSource(SourceControl, nil)
	if got := ids(); len(got) != 0 {
		t.Errorf("both sources empty: %v", got)
	}
}
