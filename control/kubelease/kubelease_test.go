package kubelease

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/arbiter-serve/arbiter/replicas/kubernetes/kubetest"
	"github.com/arbiter-serve/arbiter/state"
	"github.com/arbiter-serve/arbiter/state/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Shutdown()
	os.Exit(code)
}

// cutOff is a control plane's way to the apiserver, which the test can cut: calls made
// while it is cut hang until it is restored (a paused process, or a partition that drops
// packets), then fail.
type cutOff struct {
	coordinationv1.LeasesGetter
	cut  atomic.Bool
	back chan struct{}
	mu   sync.Mutex
}

func newCutOff(g coordinationv1.LeasesGetter) *cutOff {
	return &cutOff{LeasesGetter: g, back: make(chan struct{})}
}

func (c *cutOff) Leases(ns string) coordinationv1.LeaseInterface {
	return cutLeases{LeaseInterface: c.LeasesGetter.Leases(ns), c: c}
}

func (c *cutOff) wait() error {
	if !c.cut.Load() {
		return nil
	}
	c.mu.Lock()
	back := c.back
	c.mu.Unlock()
	<-back
	return errors.New("the apiserver was out of reach")
}

func (c *cutOff) restore() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut.Store(false)
	close(c.back)
	c.back = make(chan struct{})
}

type cutLeases struct {
	coordinationv1.LeaseInterface
	c *cutOff
}

func (l cutLeases) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordv1.Lease, error) {
	if err := l.c.wait(); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Get(ctx, name, o)
}

func (l cutLeases) Create(ctx context.Context, lease *coordv1.Lease, o metav1.CreateOptions) (*coordv1.Lease, error) {
	if err := l.c.wait(); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Create(ctx, lease, o)
}

func (l cutLeases) Update(ctx context.Context, lease *coordv1.Lease, o metav1.UpdateOptions) (*coordv1.Lease, error) {
	if err := l.c.wait(); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Update(ctx, lease, o)
}

// frozen is a clock that reads the real time until frozen.
type frozen struct {
	mu sync.Mutex
	at time.Time
}

func (f *frozen) now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.at.IsZero() {
		return f.at
	}
	return time.Now()
}

func (f *frozen) freeze() { f.mu.Lock(); f.at = time.Now(); f.mu.Unlock() }

func waitFor(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
	}
}

// Two control planes on one PostgreSQL store stand for a Kubernetes Lease on a real
// apiserver, each as the service account deploy/kubernetes gives it (RBAC: get, create and
// update Leases in its namespace): one is elected and takes the store's term; the other
// stands by. The leader is cut off from the apiserver, its clock and its renewals stopped
// (a paused process): the other is elected once the Lease expires and takes the next term;
// the old leader, still believing it leads, has its write refused by the store as fenced.
// When it can reach the apiserver again it stands by. The leader that stops gives the Lease
// up and the other is elected at once.
func TestKubernetesLeaseElectsAndTheStoreTermFences(t *testing.T) {
	k := kubetest.Start(t, kubetest.Options{Name: "lease", PodCIDR: "127.0.60.1/24"})
	const ns = "arbiter"
	k.Namespace(ns)
	for _, args := range [][]string{
		{"-n", ns, "create", "serviceaccount", "arbiter-control"},
		{"-n", ns, "create", "role", "arbiter-lease", "--verb=get,create,update", "--resource=leases.coordination.k8s.io"},
		{"-n", ns, "create", "rolebinding", "arbiter-lease", "--role=arbiter-lease", "--serviceaccount=" + ns + ":arbiter-control"},
	} {
		if out, err := k.Kubectl(args...); err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	kubeconfig := k.ServiceAccountKubeconfig(ns, "arbiter-control")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dsn := pgtest.DSN(t)
	open := func() *state.Store {
		st, err := state.OpenPostgres(ctx, dsn, state.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	stA, stB := open(), open()
	const ttl = 3 * time.Second
	client := func() coordinationv1.LeasesGetter {
		c, err := Client(kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	netA := newCutOff(client())
	clockA := &frozen{}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	la, err := Start(ctx, Config{Client: netA, Namespace: ns, Holder: "cp-a", Duration: ttl, Store: stA, Log: log, Now: clockA.now})
	if err != nil {
		t.Fatal(err)
	}
	// Each renews as control's loop does, every third of the lease; a's can be paused.
	var pausedA atomic.Bool
	var loops sync.WaitGroup
	defer loops.Wait()
	defer cancel()
	renewLoop := func(l *Lease, paused *atomic.Bool) {
		loops.Go(func() {
			for ctx.Err() == nil {
				if paused == nil || !paused.Load() {
					_, _ = l.Renew(ctx)
				}
				select {
				case <-ctx.Done():
				case <-time.After(ttl / 3):
				}
			}
		})
	}
	renewLoop(la, &pausedA)
	waitFor(t, "cp-a elected and leading term 1", 30*time.Second, func() bool { return la.Leading() == 1 })

	lb, err := Start(ctx, Config{Client: client(), Namespace: ns, Holder: "cp-b", Duration: ttl, Store: stB, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	renewLoop(lb, nil)
	holder := func() string {
		lease, err := client().Leases(ns).Get(ctx, DefaultName, metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil {
			return ""
		}
		return *lease.Spec.HolderIdentity
	}
	if h := holder(); h != "cp-a" {
		t.Fatalf("the Lease's holder is %q; want cp-a", h)
	}
	for range 3 * int(ttl/(100*time.Millisecond)) { // three lease periods: b stands by
		time.Sleep(100 * time.Millisecond)
		if lb.Leading() != 0 {
			t.Fatal("cp-b leads while cp-a holds the Lease")
		}
	}
	if _, err := stA.PutService(ctx, "svc", "spec", "", time.Now()); err != nil {
		t.Fatalf("the leader's write: %v", err)
	}
	if _, err := stB.PutService(ctx, "svc", "spec-b", "", time.Now()); !errors.Is(err, state.ErrNotLeader) {
		t.Fatalf("the standby's write: %v; want ErrNotLeader", err)
	}

	// cp-a pauses: cut off, its clock and its renewals stopped.
	clockA.freeze()
	pausedA.Store(true)
	netA.cut.Store(true)
	pausedAt := time.Now()
	waitFor(t, "cp-b elected and leading term 2", 4*ttl+10*time.Second, func() bool { return lb.Leading() == 2 })
	took := time.Since(pausedAt)
	t.Logf("cp-b leads %v after cp-a stopped renewing (Lease %v)", took.Round(time.Millisecond), ttl)
	if took > ttl+ttl/3+2*time.Second {
		t.Errorf("the takeover took %v; want within the Lease (%v), a retry and a renewal period", took, ttl)
	}
	if h := holder(); h != "cp-b" {
		t.Fatalf("the Lease's holder is %q; want cp-b", h)
	}
	// cp-a, paused mid-term, still believes it leads; its write is refused by the store.
	if la.Leading() != 1 {
		t.Fatalf("the paused cp-a leads term %d by its own view; want 1 (its clock and elector stood still)", la.Leading())
	}
	_, err = stA.PutService(ctx, "svc", "spec-a2", "", clockA.now())
	if !errors.Is(err, state.ErrFenced) {
		t.Fatalf("the deposed leader's write: %v; want ErrFenced", err)
	}
	t.Logf("the deposed leader's write: %v", err)
	if _, err := stB.PutService(ctx, "svc", "spec-b2", "", time.Now()); err != nil {
		t.Fatalf("the new leader's write: %v", err)
	}

	// cp-a wakes: it finds the Lease another's and stands by.
	netA.restore()
	pausedA.Store(false)
	waitFor(t, "cp-a stands by", 4*ttl, func() bool { return la.Leading() == 0 })
	for range 3 * int(ttl/(100*time.Millisecond)) {
		time.Sleep(100 * time.Millisecond)
		if la.Leading() != 0 || lb.Leading() != 2 {
			t.Fatalf("after cp-a woke: cp-a leads %d, cp-b %d; want 0 and 2", la.Leading(), lb.Leading())
		}
	}
	if _, term, _, err := stA.Current(ctx); err != nil || term != 2 {
		t.Fatalf("the store's term %d (%v) after cp-a woke; want 2", term, err)
	}

	// cp-b stops: it gives the Lease up, and cp-a is elected without waiting it out.
	stopped := time.Now()
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "cp-a elected again, term 3", 2*ttl, func() bool { return la.Leading() == 3 })
	t.Logf("cp-a leads %v after cp-b released the Lease", time.Since(stopped).Round(time.Millisecond))
	if _, err := stB.PutService(ctx, "svc", "spec-b3", "", time.Now()); !errors.Is(err, state.ErrNotLeader) {
		t.Fatalf("the stopped leader's write: %v; want ErrNotLeader", err)
	}
}

func TestStartRefusesBadConfig(t *testing.T) {
	ctx := context.Background()
	st, err := state.Open(t.TempDir() + "/state.db")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Store: st, Namespace: "n", Holder: "h", Duration: 15 * time.Second}, "client"},
		{Config{Client: newCutOff(nil), Store: st, Holder: "h", Duration: 15 * time.Second}, "namespace"},
		{Config{Client: newCutOff(nil), Store: st, Namespace: "n", Holder: "h", Duration: time.Second}, "too short"},
		{Config{Client: newCutOff(nil), Store: st, Namespace: "n", Duration: 15 * time.Second}, "holder"},
	} {
		if _, err := Start(ctx, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Start(%+v): %v; want an error about the %s", c.cfg, err, c.want)
		}
	}
}
