package control

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
)

// testClock is a clock the test moves; probes read it from their own goroutines.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// coldProvider launches replicas that are real HTTP servers on loopback, ready coldStart
// after launch on the test's clock (a vLLM replica loading its weights), reclaims a noticed
// one at its deadline, and refuses launches for want of capacity while full.
type coldProvider struct {
	memProvider
	clock     *testClock
	coldStart time.Duration

	cmu     sync.Mutex
	full    bool
	reclaim map[string]time.Time // handle → reclaimed at
	servers []*httptest.Server
}

func (p *coldProvider) Launch(_ context.Context, ls replicas.LaunchSpec) (replicas.Instance, error) {
	p.cmu.Lock()
	defer p.cmu.Unlock()
	if p.full {
		return replicas.Instance{}, fmt.Errorf("launch %s: no node has a free nvidia.com/gpu: %w", ls.ReplicaID, replicas.ErrNoCapacity)
	}
	readyAt := p.clock.Now().Add(p.coldStart)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" || p.clock.Now().Before(readyAt) {
			http.Error(w, "loading weights", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	p.servers = append(p.servers, srv)
	in := replicas.Instance{ReplicaID: ls.ReplicaID, Handle: "h-" + ls.ReplicaID, Address: srv.Listener.Addr().String(), Capacity: fleet.Spot}
	p.mu.Lock()
	p.running[ls.ReplicaID] = in
	p.mu.Unlock()
	return in, nil
}

func (p *coldProvider) Status(ctx context.Context, handle string) (replicas.Status, string, error) {
	p.cmu.Lock()
	at, ok := p.reclaim[handle]
	p.cmu.Unlock()
	if ok && !p.clock.Now().Before(at) {
		_ = p.Terminate(ctx, handle)
	}
	return p.memProvider.Status(ctx, handle)
}

func (p *coldProvider) setFull(full bool) {
	p.cmu.Lock()
	p.full = full
	p.cmu.Unlock()
}

const loneSpec = `service:
  readiness_probe: /health
  replicas: 1
run: x
arbiter: {model: m}
`

// counterValue is a counter's value in reg by name and labels (-1: no such series).
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// A preemption notice on a lone ready replica, with the notice lengths real providers give
// (AWS spot 2 minutes; GCP spot, Karpenter's disruption and AKS spot 30 s) and a replacement
// whose cold start is 45 s: the replica serves on while its replacement starts, and drains
// when the replacement is ready (AWS) or 10 s before the reclaim (the 30 s notices, whose
// replacements cannot be ready in time); with no capacity for a replacement it serves to
// the same margin. Each event says what happened, and the metrics count what it cost.
func TestNoticeServesUntilReplacedOrDeadline(t *testing.T) {
	const coldStart = 45 * time.Second
	for _, tc := range []struct {
		name, reason string
		notice       time.Duration
		full         bool // no capacity for a replacement during the notice
		outcome      string
		want         []string // the victim's preemption events, in order
	}{
		{name: "AWS spot, 2 min", notice: 2 * time.Minute, reason: "EC2 spot instance interruption warning (terminate)", outcome: "replaced",
			want: []string{"serves until a replacement is ready, or until 10s before the reclaim", "replacement svc-2 launching"}},
		{name: "GCP spot, 30 s", notice: 30 * time.Second, reason: "ACPI G2 soft off: preempted", outcome: "deadline",
			want: []string{"serves until a replacement is ready", "replacement svc-2 launching", "ready: the service had no replica ready for"}},
		{name: "Karpenter, 30 s", notice: 30 * time.Second, reason: "its node n1 is tainted karpenter.sh/disrupted:NoSchedule", outcome: "deadline",
			want: []string{"serves until a replacement is ready", "replacement svc-2 launching", "ready: the service had no replica ready for"}},
		{name: "Karpenter, 30 s, no capacity", notice: 30 * time.Second, full: true, reason: "its node n1 is tainted karpenter.sh/disrupted:NoSchedule", outcome: "deadline",
			want: []string{"serves until a replacement is ready", "replacement svc-2 launching", "no capacity for a replacement", "ready: the service had no replica ready for"}},
		{name: "AKS spot, 30 s", notice: 30 * time.Second, reason: "Azure scheduled event Preempt", outcome: "deadline",
			want: []string{"serves until a replacement is ready", "replacement svc-2 launching", "ready: the service had no replica ready for"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clock := &testClock{t: time.UnixMilli(1_800_000_000_000)}
			p := &coldProvider{memProvider: memProvider{running: map[string]replicas.Instance{}}, clock: clock, coldStart: coldStart, reclaim: map[string]time.Time{}}
			t.Cleanup(func() {
				for _, s := range p.servers {
					s.Close()
				}
			})
			st, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			reg := prometheus.NewRegistry()
			c, err := New(ctx, Config{Store: st, Providers: map[string]replicas.Provider{"local": p}, Now: clock.Now, Metrics: reg,
				Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := c.Create(ctx, "svc", loneSpec, nil); err != nil {
				t.Fatal(err)
			}
			step := func() {
				c.tick(ctx)
				c.wg.Wait()
				clock.Add(time.Second)
			}
			// serving lists the replicas routers send new requests to.
			serving := func() []string {
				set, _ := c.ReadySet()
				var out []string
				for _, r := range set.Replicas {
					if !r.Draining {
						out = append(out, r.ID)
					}
				}
				return out
			}
			for i := 0; len(serving()) == 0; i++ {
				if i > 120 {
					t.Fatal("the first replica is not ready after 120 s")
				}
				step()
			}
			victim := serving()[0]
			p.setFull(tc.full)
			at := clock.Now()
			deadline := at.Add(tc.notice)
			p.cmu.Lock()
			p.reclaim["h-"+victim] = deadline
			p.cmu.Unlock()
			c.preemptionNotice(ctx, "local", replicas.Notice{ReplicaID: victim, Handle: "h-" + victim, Deadline: deadline, Reason: tc.reason})

			var servedUntil, replacedAt time.Time // the victim's last second serving; the first with another ready
			unready := 0                          // seconds with nothing serving
			for clock.Now().Before(at.Add(3 * time.Minute)) {
				now := clock.Now()
				ids := serving()
				for _, id := range ids {
					if id == victim {
						servedUntil = now
					} else if replacedAt.IsZero() {
						replacedAt = now
					}
				}
				if len(ids) == 0 {
					unready++
				}
				if tc.full && !now.Before(deadline) {
					p.setFull(false) // the reclaimed node's GPU is free again
				}
				step()
			}
			if replacedAt.IsZero() {
				t.Fatal("no replacement ready 3 minutes after the notice")
			}
			if servedUntil.IsZero() {
				servedUntil = at // drained at the notice itself
			}
			served := servedUntil.Sub(at)
			switch tc.outcome {
			case "replaced":
				// Serving through the notice until the replacement is ready, then drained.
				if servedUntil.Before(replacedAt) || unready != 0 {
					t.Errorf("the victim served %s into the %s notice; the replacement was ready at %s; %d s with nothing ready: want it serving until the replacement was ready, and never nothing ready",
						served, tc.notice, replacedAt.Sub(at), unready)
				}
				if !servedUntil.Before(deadline.Add(-10 * time.Second)) {
					t.Errorf("the victim served until %s of a %s notice, though its replacement was ready at %s", served, tc.notice, replacedAt.Sub(at))
				}
			case "deadline":
				// Serving until 10 s before the reclaim, not a second of the notice lost earlier.
				if served < tc.notice-11*time.Second || served >= tc.notice-10*time.Second+time.Second {
					t.Errorf("the victim served %s into a %s notice; want until 10 s before the reclaim (%s)", served, tc.notice, tc.notice-10*time.Second)
				}
				if gap := replacedAt.Sub(at) - served; unready == 0 || gap > time.Duration(unready+1)*time.Second {
					t.Errorf("%d s with nothing ready between the drain and the replacement (%s later)", unready, gap)
				}
			}
			// What the notice cost, counted.
			if got := counterValue(t, reg, "arbiter_control_preemption_outcomes_total", map[string]string{"service": "svc", "outcome": tc.outcome}); got != 1 {
				t.Errorf("arbiter_control_preemption_outcomes_total{outcome=%q} = %v; want 1", tc.outcome, got)
			}
			unreadySeconds := counterValue(t, reg, "arbiter_control_preemption_unready_seconds_total", map[string]string{"service": "svc"})
			if d := unreadySeconds - float64(unready); d < -1 || d > 1 {
				t.Errorf("arbiter_control_preemption_unready_seconds_total = %v; want the %d s nothing was ready", unreadySeconds, unready)
			}
			// The events say what happened, in order, and nothing that did not.
			evs, err := st.Events(ctx, "svc", victim, 0, 1000)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range evs {
				got = append(got, e.Kind+": "+e.Message)
			}
			all, _ := st.Events(ctx, "svc", "", 0, 1000)
			for _, e := range all {
				if e.Kind == "preemption" && e.Replica != victim {
					got = append(got, e.Kind+": "+e.Message)
				}
			}
			text := strings.Join(got, "\n")
			t.Logf("events:\n%s", text)
			i := 0
			for _, w := range tc.want {
				j := strings.Index(text[i:], w)
				if j < 0 {
					t.Errorf("events lack %q (in this order):\n%s", w, text)
					break
				}
				i += j + len(w)
			}
			drained := map[string]string{"replaced": "preemption notice: replacement svc-2 ready; draining", "deadline": "preemption notice: drained at the deadline, 0 of 1 replicas ready besides it"}[tc.outcome]
			if !strings.Contains(text, drained) {
				t.Errorf("no drain event %q:\n%s", drained, text)
			}
			if !tc.full && strings.Contains(text, "no capacity") || tc.full && strings.Count(text, "preemption: no capacity for a replacement") != 1 {
				t.Errorf("events say 'no capacity' where they should not, or more than once:\n%s", text)
			}
		})
	}
}

// TestHelperReplica is the replica the local-provider test runs: this test binary, run
// again with ARBITER_TEST_REPLICA=1, answers the readiness probe and /v1/models on
// 127.0.0.1:$PORT until it is terminated.
func TestHelperReplica(t *testing.T) {
	if os.Getenv("ARBITER_TEST_REPLICA") != "1" {
		t.Skip("the local-provider test's replica process")
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, `{"data":[{"id":"m"}]}`) })
	err := http.ListenAndServe("127.0.0.1:"+os.Getenv("PORT"), mux)
	t.Fatal(err)
}

// With the local provider (real processes, real timers): a lone replica's 4 s notice on a
// machine with room for one replica. The replacement is refused for want of capacity, so
// the replica serves on until 1 s (the margin here) before the reclaim instead of draining
// at the notice; the replacement starts once the reclaim frees the room.
func TestLocalNoticeWithNoCapacityServesToTheMargin(t *testing.T) {
	if testing.Short() {
		t.Skip("runs replica processes for a few seconds")
	}
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	local, err := replicas.NewLocal(replicas.LocalConfig{Owner: "notice-test-" + filepath.Base(dir), LogDir: filepath.Join(dir, "logs"),
		MaxReplicas: 1, Capacity: fleet.Spot, Grace: time.Second, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	st, err := state.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	c, err := New(ctx, Config{Store: st, Providers: map[string]replicas.Provider{"local": local}, Tick: 100 * time.Millisecond,
		NoticeMargin: time.Second, Metrics: reg, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		insts, _ := local.List(context.Background())
		for _, in := range insts {
			_ = local.Terminate(context.Background(), in.Handle)
		}
		st.Close()
	})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	spec := fmt.Sprintf("service:\n  readiness_probe: /health\n  replicas: 1\nrun: exec \"$ARBITER_TEST_BINARY\" -test.run='^TestHelperReplica$'\n"+
		"envs: {ARBITER_TEST_REPLICA: \"1\", ARBITER_TEST_BINARY: %q}\narbiter: {model: m}\n", self)
	if _, _, err := c.Create(ctx, "svc", spec, nil); err != nil {
		t.Fatal(err)
	}
	serving := func() []string {
		set, _ := c.ReadySet()
		var out []string
		for _, r := range set.Replicas {
			if !r.Draining {
				out = append(out, r.ID)
			}
		}
		return out
	}
	waitFor := func(what string, d time.Duration, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(d); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %s", what, d)
			}
		}
	}
	waitFor("the first replica ready", 30*time.Second, func() bool { return len(serving()) == 1 })
	victim := serving()[0]
	const notice = 4 * time.Second
	at := time.Now()
	if err := c.Preempt(victim, notice); err != nil {
		t.Fatal(err)
	}
	var servedUntil time.Time
	waitFor("the victim drained", 30*time.Second, func() bool {
		for _, id := range serving() {
			if id == victim {
				servedUntil = time.Now()
				return false
			}
		}
		return true
	})
	// It served until about 1 s before the reclaim (the tick is 100 ms): not at the notice.
	if served := servedUntil.Sub(at); served < notice-time.Second-500*time.Millisecond || served > notice {
		t.Errorf("the victim served %s into a %s notice; want until 1 s before the reclaim", served.Round(time.Millisecond), notice)
	}
	waitFor("a replacement ready after the reclaim", 60*time.Second, func() bool {
		ids := serving()
		return len(ids) == 1 && ids[0] != victim
	})
	evs, err := st.Events(ctx, "svc", victim, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var text []string
	for _, e := range evs {
		text = append(text, e.Message)
	}
	joined := strings.Join(text, "\n")
	for _, want := range []string{"it serves until a replacement is ready, or until 1s before the reclaim", "no capacity for a replacement (launch",
		"preemption notice: drained at the deadline, 0 of 1 replicas ready besides it (no capacity for a replacement)"} {
		if !strings.Contains(joined, want) {
			t.Errorf("the victim's events lack %q:\n%s", want, joined)
		}
	}
	if got := counterValue(t, reg, "arbiter_control_preemption_outcomes_total", map[string]string{"service": "svc", "outcome": "deadline"}); got != 1 {
		t.Errorf("arbiter_control_preemption_outcomes_total{outcome=deadline} = %v; want 1", got)
	}
	if got := counterValue(t, reg, "arbiter_control_preemption_unready_seconds_total", map[string]string{"service": "svc"}); got <= 0 {
		t.Errorf("arbiter_control_preemption_unready_seconds_total = %v; want the time from the drain to the replacement's readiness", got)
	}
}
