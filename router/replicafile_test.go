package router

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestParseReplicaFileErrorsNameTheField(t *testing.T) {
	for body, want := range map[string]string{
		"replicas:\n  - {id: a, address: 127.0.0.1:1, model: m, capacity: cheap}\n":                             "capacity \"cheap\"",
		"replicas:\n  - {id: a, address: nowhere, model: m}\n":                                                  "want host:port",
		"replicas:\n  - {id: a, address: 127.0.0.1:1}\n":                                                        "model: required",
		"replicas:\n  - {id: a, address: 127.0.0.1:1, model: m, colour: red}\n":                                 "field colour not found",
		"replicas:\n  - {id: a, address: 127.0.0.1:1, model: m}\n  - {id: a, address: 127.0.0.1:2, model: m}\n": "duplicate id",
	} {
		if _, err := ParseReplicaFile([]byte(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseReplicaFile(%q) = %v, want an error containing %q", body, err, want)
		}
	}
}

func TestReplicaFileIsReloadedAndBadEditsAreIgnored(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "replicas.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		// Make sure the modification time moves even on coarse-grained filesystems.
		future := time.Now().Add(time.Duration(len(s)) * time.Second)
		_ = os.Chtimes(path, future, future)
	}
	write("replicas:\n  - {id: a, address: 127.0.0.1:1, model: m}\n")
	cfg := Defaults()
	log := slog.New(slog.DiscardHandler)
	pool := NewPool(&cfg, log, NewMetrics(prometheus.NewRegistry()), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := WatchReplicaFile(ctx, path, pool, log, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if len(pool.Snapshot()) != 1 {
		t.Fatal("initial set not loaded")
	}
	write("replicas:\n  - {id: a, address: 127.0.0.1:1, model: m}\n  - {id: b, address: 127.0.0.1:2, model: m}\n")
	waitFor(t, "reload with two replicas", func() bool { return len(pool.Snapshot()) == 2 })
	write("replicas: [this is not a replica list")
	time.Sleep(100 * time.Millisecond)
	if len(pool.Snapshot()) != 2 {
		t.Fatal("a bad edit replaced the last good set")
	}
}
