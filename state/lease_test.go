package state

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/state/pgtest"
)

// clock is a test's clock for one control plane: a paused process is one whose clock
// (and renewals) stop while the others' go on.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newLease(t *testing.T, s *Store, holder string, ttl time.Duration, c *clock) *Lease {
	t.Helper()
	l, err := s.NewLease(holder, ttl, c.now)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func renew(t *testing.T, l *Lease) int64 {
	t.Helper()
	term, err := l.Renew(context.Background())
	if err != nil {
		t.Fatalf("%s: renew: %v", l.Holder(), err)
	}
	return term
}

// Two control planes on one database: exactly one leads; the other's writes are refused.
// The leader pauses past its lease: the other takes over with the next term, and the old
// leader's writes (a launch's row among them) are refused as fenced, writing nothing, and
// it steps down. A leader that stops gives the lease up for the other to take at once.
func TestLeaseOneLeaderAndFencing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, setting string) {
		ctx := context.Background()
		a, b := openSetting(t, setting, Options{}), openSetting(t, setting, Options{})
		defer a.Close()
		defer b.Close()
		start := time.UnixMilli(1_700_000_000_000)
		ca, cb := &clock{t: start}, &clock{t: start}
		const ttl = 15 * time.Second
		la, lb := newLease(t, a, "cp-a", ttl, ca), newLease(t, b, "cp-b", ttl, cb)

		if got := renew(t, la); got != 1 {
			t.Fatalf("cp-a took term %d; want 1", got)
		}
		if got := renew(t, lb); got != 0 {
			t.Fatalf("cp-b leads term %d while cp-a holds the lease", got)
		}
		if _, err := a.PutService(ctx, "svc", "spec", "", start); err != nil {
			t.Fatalf("the leader's write: %v", err)
		}
		if _, err := b.NewReplica(ctx, Replica{Service: "svc", Version: 1, Provider: "local", State: "pending"}, start); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("the standby's write: %v; want ErrNotLeader", err)
		}
		// The leader renews on time for a while: the lease stays its.
		for range 3 {
			ca.add(ttl / 3)
			cb.add(ttl / 3)
			if renew(t, la) != 1 || renew(t, lb) != 0 {
				t.Fatal("the lease changed hands while its holder renewed it")
			}
		}

		// cp-a pauses: its clock and renewals stop. Just short of its lease, cp-b waits;
		// at its end, cp-b takes over.
		cb.add(ttl - time.Millisecond)
		if got := renew(t, lb); got != 0 {
			t.Fatalf("cp-b took term %d before cp-a's lease expired", got)
		}
		cb.add(time.Millisecond)
		if got := renew(t, lb); got != 2 {
			t.Fatalf("cp-b leads term %d once cp-a's lease expired; want 2", got)
		}
		if holder, term, _, err := b.Current(ctx); err != nil || holder != "cp-b" || term != 2 {
			t.Fatalf("the store says %s leads term %d (%v); want cp-b, term 2", holder, term, err)
		}

		// cp-a comes back believing it leads (its clock did not move) and tries to launch.
		if la.Leading() != 1 {
			t.Fatal("the paused leader's own clock should still say it leads")
		}
		before := snap(t, a)
		_, err := a.NewReplica(ctx, Replica{Service: "svc", Version: 1, Provider: "local", State: "pending"}, ca.now())
		if !errors.Is(err, ErrFenced) {
			t.Fatalf("the deposed leader's launch row: %v; want ErrFenced", err)
		}
		if msg := err.Error(); !strings.Contains(msg, "term 1") || !strings.Contains(msg, "cp-b leads term 2") {
			t.Errorf("fenced error %q; want it to name the terms and the new leader", msg)
		}
		t.Logf("the deposed leader's write failed with: %v", err)
		if err := a.AddEvent(ctx, ca.now(), "svc", "", "note", "x"); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("the deposed leader's next write: %v; want ErrNotLeader (it stepped down)", err)
		}
		if la.Leading() != 0 {
			t.Fatal("the deposed leader still says it leads after a fenced write")
		}
		if after := snap(t, a); after != before {
			t.Fatalf("the deposed leader's writes changed the store: %+v → %+v", before, after)
		}
		if got := renew(t, la); got != 0 {
			t.Fatalf("the deposed leader renewed into term %d while cp-b leads", got)
		}
		if _, err := b.NewReplica(ctx, Replica{Service: "svc", Version: 1, Provider: "local", State: "pending"}, cb.now()); err != nil {
			t.Fatalf("the new leader's write: %v", err)
		}

		// cp-b stops and releases: cp-a takes term 3 at once, without waiting out the lease.
		if err := lb.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if got := renew(t, la); got != 3 {
			t.Fatalf("after cp-b released, cp-a leads term %d; want 3", got)
		}
		if _, err := b.PutService(ctx, "svc", "spec", "", cb.now()); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("the released leader's write: %v; want ErrNotLeader", err)
		}
	})
}

// A leader whose renewals fail (the database out of its reach) steps down by its own
// clock when its lease ends, before another can have taken over.
func TestLeaseStepsDownWhenItCannotRenew(t *testing.T) {
	s := openSetting(t, t.TempDir()+"/state.db", Options{})
	c := &clock{t: time.UnixMilli(1_700_000_000_000)}
	l := newLease(t, s, "cp-a", 10*time.Second, c)
	if renew(t, l) != 1 {
		t.Fatal("no lease")
	}
	s.Close() // every renewal fails from now on
	c.add(9 * time.Second)
	if term, err := l.Renew(context.Background()); err == nil || term != 1 {
		t.Fatalf("a failed renewal inside the lease: term %d, %v; want term 1 and an error", term, err)
	}
	c.add(time.Second)
	if term, err := l.Renew(context.Background()); err == nil || term != 0 {
		t.Fatalf("a failed renewal at the lease's end: term %d, %v; want 0 (stepped down) and an error", term, err)
	}
	if l.Leading() != 0 {
		t.Fatal("still leading after the lease ended unrenewed")
	}
}

// Control planes that all try at once: exactly one leads.
func TestLeaseContendedElectsOne(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, setting string) {
		const n = 5
		c := &clock{t: time.UnixMilli(1_700_000_000_000)}
		leases := make([]*Lease, n)
		for i := range leases {
			s := openSetting(t, setting, Options{})
			defer s.Close()
			leases[i] = newLease(t, s, "cp-"+string(rune('a'+i)), 15*time.Second, c)
		}
		var wg sync.WaitGroup
		for _, l := range leases {
			wg.Go(func() {
				for range 20 {
					if _, err := l.Renew(context.Background()); err != nil {
						t.Logf("%s: %v", l.Holder(), err) // SQLite: busy while another renews
					}
				}
			})
		}
		wg.Wait()
		leaders := 0
		for _, l := range leases {
			if term := l.Leading(); term != 0 {
				leaders++
				if term != 1 {
					t.Errorf("%s leads term %d; want 1 (no term passed)", l.Holder(), term)
				}
			}
		}
		if leaders != 1 {
			t.Fatalf("%d control planes lead; want exactly 1", leaders)
		}
	})
}

// On PostgreSQL a takeover waits for the writes in flight under the old term: a write that
// read its term before the takeover commits before the new term exists, never after.
func TestLeaseTakeoverWaitsForWritesInFlight(t *testing.T) {
	ctx := context.Background()
	setting := backends[1].setting(t)
	a := openSetting(t, setting, Options{})
	b := openSetting(t, setting, Options{BusyTimeout: time.Minute})
	defer a.Close()
	defer b.Close()
	start := time.UnixMilli(1_700_000_000_000)
	ca, cb := &clock{t: start}, &clock{t: start}
	la, lb := newLease(t, a, "cp-a", 15*time.Second, ca), newLease(t, b, "cp-b", 15*time.Second, cb)
	if renew(t, la) != 1 {
		t.Fatal("cp-a did not take the lease")
	}
	tx, err := a.begin(ctx) // a write of term 1, its term checked, not committed yet
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := a.insertEvent(ctx, tx, start, "svc", "", "note", "in flight under term 1"); err != nil {
		t.Fatal(err)
	}
	cb.add(time.Minute)
	took := make(chan int64, 1)
	go func() {
		term, err := lb.Renew(ctx)
		if err != nil {
			t.Error(err)
		}
		took <- term
	}()
	// Wait until the takeover is blocked on the write's lock.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var waiting int
		if err := b.db.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case term := <-took:
			t.Fatalf("cp-b took term %d while a write of term 1 was in flight", term)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the takeover neither waited nor finished")
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("the write of term 1 that began before the takeover: %v", err)
	}
	if term := <-took; term != 2 {
		t.Fatalf("cp-b leads term %d after the write committed; want 2", term)
	}
	if _, err := a.NewReplica(ctx, Replica{Service: "svc", Version: 1, Provider: "local", State: "pending"}, start); !errors.Is(err, ErrFenced) {
		t.Fatalf("cp-a's next write: %v; want ErrFenced", err)
	}
}

// A renewal that waits on the database (another session holds the lease's row) does not
// hold up Leading, which the control loop asks on every tick.
func TestLeaseLeadingAnswersWhileARenewalWaits(t *testing.T) {
	ctx := context.Background()
	setting := backends[1].setting(t)
	s := openSetting(t, setting, Options{BusyTimeout: time.Minute, WriteTimeout: time.Minute})
	defer s.Close()
	l := newLease(t, s, "cp-a", 15*time.Second, &clock{t: time.UnixMilli(1_700_000_000_000)})
	if renew(t, l) != 1 {
		t.Fatal("no lease")
	}
	unlock := holdTx(t, "pgx", setting, `BEGIN`, `SELECT * FROM leader FOR UPDATE`)
	done := make(chan error, 1)
	go func() {
		_, err := l.Renew(ctx)
		done <- err
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var waiting int
		if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the renewal never waited on the held row")
		}
	}
	start := time.Now()
	if term := l.Leading(); term != 1 {
		t.Fatalf("Leading() = %d while a renewal waits; want 1", term)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Leading() took %v while a renewal waited on the database; want at once", took)
	}
	unlock()
	if err := <-done; err != nil {
		t.Fatalf("the renewal after the row was released: %v", err)
	}
}

// A lease an outside lock elects (a Kubernetes Lease): Renew never takes the store's lease,
// even an expired one; Take does, with the next term, even while the last leader's term has
// not expired by the store's clock (the lock found that leader gone), and that leader's
// writes are refused as fenced from then on.
func TestElectedLeaseTakenOnlyWhenElected(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, setting string) {
		ctx := context.Background()
		a, b := openSetting(t, setting, Options{}), openSetting(t, setting, Options{})
		defer a.Close()
		defer b.Close()
		start := time.UnixMilli(1_700_000_000_000)
		ca, cb := &clock{t: start}, &clock{t: start}
		const ttl = 15 * time.Second
		la, err := a.NewElectedLease("cp-a", ttl, ca.now)
		if err != nil {
			t.Fatal(err)
		}
		lb, err := b.NewElectedLease("cp-b", ttl, cb.now)
		if err != nil {
			t.Fatal(err)
		}
		if got := renew(t, la); got != 0 {
			t.Fatalf("cp-a renewed into term %d without being elected", got)
		}
		if got, err := la.Take(ctx); err != nil || got != 1 {
			t.Fatalf("cp-a, elected, took term %d (%v); want 1", got, err)
		}
		if got := renew(t, la); got != 1 {
			t.Fatalf("cp-a's renewal: term %d; want 1", got)
		}
		if _, err := a.PutService(ctx, "svc", "spec", "", start); err != nil {
			t.Fatalf("the leader's write: %v", err)
		}
		// cp-a's term runs out by the store's clock: cp-b, not elected, still takes nothing.
		cb.add(2 * ttl)
		if got := renew(t, lb); got != 0 {
			t.Fatalf("cp-b renewed into term %d without being elected", got)
		}
		// Elected while cp-a's term is fresh by every clock: cp-b takes term 2.
		cb.add(-2 * ttl)
		if got, err := lb.Take(ctx); err != nil || got != 2 {
			t.Fatalf("cp-b, elected, took term %d (%v); want 2", got, err)
		}
		if _, err := a.PutService(ctx, "svc", "spec2", "", start); !errors.Is(err, ErrFenced) {
			t.Fatalf("the deposed leader's write: %v; want ErrFenced", err)
		}
		if got := renew(t, la); got != 0 {
			t.Fatalf("the deposed leader renewed into term %d", got)
		}
		if _, err := b.PutService(ctx, "svc", "spec2", "", start); err != nil {
			t.Fatalf("the new leader's write: %v", err)
		}
		own, err := a.NewLease("cp-c", ttl, ca.now)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := own.Take(ctx); err == nil {
			t.Fatal("Take on the store's own lease: no error")
		}
	})
}

// A leader frozen inside a renewal (kill -STOP between its SELECT … FOR UPDATE of the lease
// row and its commit) holds the row's lock; the server ends its session once it has sat
// idle in the transaction for the write timeout, so a standby takes the expired lease
// instead of failing on the lock for as long as the leader stays frozen.
func TestPostgresLeaseTakenFromALeaderFrozenInATransaction(t *testing.T) {
	url := pgtest.DSN(t)
	o := Options{WriteTimeout: 2 * time.Second, BusyTimeout: 500 * time.Millisecond}
	a := openSetting(t, url, o)
	b := openSetting(t, url, o)
	c := &clock{t: time.UnixMilli(1_700_000_000_000)}
	la, lb := newLease(t, a, "cp-a", 3*time.Second, c), newLease(t, b, "cp-b", 3*time.Second, c)
	if renew(t, la) != 1 {
		t.Fatal("cp-a: no lease")
	}
	// cp-a freezes mid-renewal: the row locked, the transaction never ended.
	tx, err := a.db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var holder string
	if err := tx.QueryRow(`SELECT holder FROM leader WHERE id = 1 FOR UPDATE`).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	c.add(4 * time.Second) // the lease has expired
	deadline := time.Now().Add(30 * time.Second)
	var lastErr error
	for time.Now().Before(deadline) {
		term, err := lb.Renew(context.Background())
		if err == nil && term == 2 {
			return
		}
		lastErr = err
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("cp-b never took the lease from cp-a frozen in a transaction: %v", lastErr)
}
