package control

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
)

// boundedMem is memProvider with a capacity, as the local provider has one.
type boundedMem struct {
	*memProvider
	max int
}

func (b boundedMem) MaxReplicas() int { return b.max }

func newLimitedController(t *testing.T, p replicas.Provider, cfg Config) (*Controller, *state.Store) {
	t.Helper()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cfg.Store, cfg.Providers, cfg.Log = st, map[string]replicas.Provider{"local": p}, slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, st
}

// httpStatus is the status the API answers err with.
func httpStatus(err error) int {
	rec := httptest.NewRecorder()
	writeErr(rec, err)
	return rec.Code
}

func sized(n string) string { return strings.Replace(fixedSpec, "replicas: 3", "replicas: "+n, 1) }

// A service larger than the control plane's ceiling or its providers' capacity is refused
// as a bad request, before anything is stored (a spec once asked for a billion replicas and
// the local provider launched until the machine ran out of memory).
func TestServiceLargerThanItsBoundsIsRefused(t *testing.T) {
	ctx := context.Background()
	mem := &memProvider{running: map[string]replicas.Instance{}}
	c, st := newLimitedController(t, boundedMem{mem, 8}, Config{MaxReplicas: 20})
	for _, tc := range []struct{ size, want string }{
		{"21", "this control plane runs at most 20"},
		{"9", "hold at most 8 nodes at once"},
		{"1000", "runs at most 20"},
	} {
		_, _, err := c.Create(ctx, "big", sized(tc.size), nil)
		if err == nil || httpStatus(err) != 400 || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s replicas: %v (HTTP %d); want a 400 saying %q", tc.size, err, httpStatus(err), tc.want)
		}
	}
	if _, err := st.GetVersion(ctx, "big", 1); err == nil {
		t.Fatal("a refused service was stored")
	}
	if _, _, err := c.Create(ctx, "fits", sized("8"), nil); err != nil {
		t.Fatalf("a service that fits: %v", err)
	}
	if _, _, err := c.Update(ctx, "fits", sized("9"), nil); err == nil || httpStatus(err) != 400 {
		t.Fatalf("an update past the providers' capacity: %v", err)
	}
}

// The ceiling holds at run time over all services together, and launches are rate-limited;
// each hold is said once in the service's events. A service as large as the ceiling is
// still updated (one replica over it at a time).
func TestLaunchesStopAtTheCeilingAndAreRateLimited(t *testing.T) {
	ctx := context.Background()
	mem := &memProvider{running: map[string]replicas.Instance{}}
	c, st := newLimitedController(t, mem, Config{MaxReplicas: 5, LaunchesPerSecond: 1000, LaunchBurst: 1000})
	if _, _, err := c.Create(ctx, "a", sized("3"), nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Create(ctx, "b", strings.Replace(sized("3"), "model: m}", "model: m-b}", 1), nil); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		c.tick(ctx)
		c.wg.Wait()
	}
	mem.mu.Lock()
	n := len(mem.running)
	mem.mu.Unlock()
	if n != 5 {
		t.Fatalf("%d replicas running; want the ceiling, 5", n)
	}
	held := 0
	for _, svc := range []string{"a", "b"} {
		evs, err := st.Events(ctx, svc, "", 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if strings.Contains(e.Message, "its ceiling") {
				held++
			}
		}
	}
	if held != 1 {
		t.Fatalf("the ceiling was reported %d times; want once", held)
	}

	// A ceiling-sized service updates, one replica over the ceiling at a time.
	if err := c.Delete(ctx, "b", false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Update(ctx, "a", strings.Replace(sized("5"), "run: x", "run: y", 1), nil); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		c.tick(ctx)
		c.wg.Wait()
		c.mu.Lock()
		for _, r := range c.services["a"].replicas {
			if replicas.State(r.row.State) == replicas.Starting {
				c.transition(ctx, c.services["a"], r, replicas.Ready, "test: ready")
			}
		}
		live := c.liveReplicas()
		c.mu.Unlock()
		if live > 6 {
			t.Fatalf("tick %d: %d live replicas; the ceiling is 5 (6 during an update)", i, live)
		}
	}
	sts, err := c.Status(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if sts[0].Version != 2 || sts[0].Ready != 5 {
		t.Fatalf("after the update: version %d with %d ready; want version 2 with 5", sts[0].Version, sts[0].Ready)
	}
	for _, r := range sts[0].Replicas {
		if r.Version != 2 && live(replicas.State(r.State)) {
			t.Fatalf("an old replica is still live: %+v", r)
		}
	}

	// The launch rate: a burst of 2, then nothing more within the same instant.
	mem2 := &memProvider{running: map[string]replicas.Instance{}}
	now := time.Unix(2_000_000_000, 0)
	c2, _ := newLimitedController(t, mem2, Config{LaunchesPerSecond: 0.001, LaunchBurst: 2, Now: func() time.Time { return now }})
	if _, _, err := c2.Create(ctx, "r", sized("6"), nil); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		c2.tick(ctx)
		c2.wg.Wait()
	}
	mem2.mu.Lock()
	n = len(mem2.running)
	mem2.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d launched; want the burst of 2", n)
	}
}
