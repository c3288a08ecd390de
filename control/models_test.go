package control

import (
	"context"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
)

// modelsSpec runs a real replicasim (built by the test) that lists model on /v1/models;
// declare, when set, is the model the spec declares.
func modelsSpec(bin, model, declare string) string {
	s := `service:
  readiness_probe: {path: /health, initial_delay_seconds: 30, timeout_seconds: 2}
  replicas: 1
run: exec ` + bin + ` -listen 127.0.0.1:$PORT -model ` + model + ` -echo -log-level warn
arbiter:
  readiness: {probe_interval_seconds: 0.2}
`
	if declare != "" {
		s += "  model: " + declare + "\n"
	}
	return s
}

// Declared models are owned (issue 35 item 2): a second service that declares no model,
// whose replica lists the first service's model, once received the first service's
// requests. Its replica must not be routed to for that model, and status and an event must
// say so; two services that learn one name from their replicas are the same conflict, the
// first keeping it.
func TestAReplicaCannotTakeAnotherServicesModel(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs replicasim processes")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "replicasim")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/replicasim").CombinedOutput(); err != nil {
		t.Fatalf("build replicasim: %v\n%s", err, out)
	}
	st, err := state.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	local, err := replicas.NewLocal(replicas.LocalConfig{Owner: "models-test-" + filepath.Base(dir), LogDir: filepath.Join(dir, "logs")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c, err := New(ctx, Config{Store: st, Providers: map[string]replicas.Provider{"local": local}, Token: "secret", Tick: 100 * time.Millisecond,
		DrainTimeout: time.Second, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() {
		for _, name := range []string{"owner", "rival", "learner-a", "learner-b"} {
			_ = c.Delete(context.Background(), name, false)
		}
		waitUntil(t, "every replica ended", 30*time.Second, func() bool {
			sts, err := c.Status(context.Background(), "")
			return err == nil && len(sts) == 0
		})
		cancel()
		<-done
	}()

	create := func(name, spec string) {
		t.Helper()
		if _, _, err := c.Create(ctx, name, spec, nil); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	ready := func(name string) ServiceStatus {
		t.Helper()
		var st ServiceStatus
		waitUntil(t, name+" ready", 30*time.Second, func() bool {
			sts, err := c.Status(ctx, name)
			if err != nil || len(sts) != 1 {
				return false
			}
			st = sts[0]
			return st.Ready == 1
		})
		return st
	}
	create("owner", modelsSpec(bin, "m", "m"))
	ready("owner")
	create("rival", modelsSpec(bin, "m", ""))
	rival := ready("rival")
	learnerA := func() ServiceStatus { create("learner-a", modelsSpec(bin, "shared", "")); return ready("learner-a") }()
	create("learner-b", modelsSpec(bin, "shared", ""))
	learnerB := ready("learner-b")

	set, _ := c.ReadySet()
	for _, r := range set.Replicas {
		switch {
		case r.Model == "m" && r.Service != "owner":
			t.Errorf("replica %s of service %s is routed for model m, which service owner declares", r.ID, r.Service)
		case r.Model == "shared" && r.Service != "learner-a":
			t.Errorf("replica %s of service %s is routed for model shared, which learner-a learned first", r.ID, r.Service)
		}
	}
	if n := len(set.Replicas); n != 2 {
		t.Errorf("ready set has %d replicas; want owner's and learner-a's: %+v", n, set.Replicas)
	}
	for _, tc := range []struct {
		st           ServiceStatus
		owner, model string
	}{{rival, "owner", "m"}, {learnerB, "learner-a", "shared"}} {
		if len(tc.st.ModelConflicts) != 1 || !strings.Contains(tc.st.ModelConflicts[0], `model "`+tc.model+`" of service "`+tc.owner+`"`) ||
			!strings.Contains(tc.st.ModelConflicts[0], "not routed") {
			t.Errorf("%s's status says %q; want the conflict over %s with %s", tc.st.Name, tc.st.ModelConflicts, tc.model, tc.owner)
		}
		if slices.Contains(tc.st.Models, tc.model) {
			t.Errorf("%s's models %v include %s, which %s owns", tc.st.Name, tc.st.Models, tc.model, tc.owner)
		}
		for _, svc := range []string{tc.st.Name, tc.owner} {
			evs, err := st.Events(ctx, svc, "", 0, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(evs, func(e state.Event) bool { return e.Kind == "model_conflict" && strings.Contains(e.Message, tc.model) }) {
				t.Errorf("no model_conflict event on %s about %s: %+v", svc, tc.model, evs)
			}
		}
	}
	if len(learnerA.ModelConflicts) != 0 || !slices.Contains(learnerA.Models, "shared") {
		t.Errorf("learner-a, first to learn shared: %+v", learnerA)
	}
	c.mu.Lock()
	holder := ""
	if svc := c.serviceFor("m"); svc != nil {
		holder = svc.name
	}
	c.mu.Unlock()
	if holder != "owner" {
		t.Errorf("tokens and wakes for m go to service %q; want owner", holder)
	}
}

func waitUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}
