package router

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// A router takes its replicas from exactly one place; a Source is given the pool, and the
// picker's front door hears from its synced whether the set has come.
func TestRunTakesOneReplicaSource(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := Defaults()
	log := slog.New(slog.DiscardHandler)
	src := func(context.Context, *Pool) (func() bool, error) { return func() bool { return true }, nil }
	for _, o := range []Options{
		{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", Config: cfg, Log: log},
		{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", Config: cfg, Log: log, ReplicaFile: "r.yaml", Source: src},
		{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", Config: cfg, Log: log, ControlURL: "http://127.0.0.1:1", Source: src},
	} {
		if err := Run(ctx, o); err == nil || !strings.Contains(err.Error(), "exactly one of a replica file, a control plane URL and a replica source") {
			t.Errorf("Run with file %q, control %q, source %v: got %v, want the one-source error", o.ReplicaFile, o.ControlURL, o.Source != nil, err)
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
				p.SetReplicas([]fleet.Replica{{ID: "a", Address: "127.0.0.1:9", Model: "m", Capacity: fleet.Spot, PricePerHour: 0.4}})
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
