package state

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Several control planes may share one database; one leads at a time. The lease is the
// leader table's one row: who holds it, its term (how many leaders there have been) and
// when it expires. A control plane takes it when it is free or expired, with the next
// term, and renews it well before it expires; one that cannot renew in time steps down.
//
// Clocks decide only who may try to lead; terms decide what is written (fencing). Each
// write of a store with a lease runs, in its own transaction, a read of the current term
// and is refused unless it is the one its control plane holds. On PostgreSQL the read is
// FOR SHARE, so a takeover (an UPDATE of that row) waits for writes in flight under the old
// term to commit, and no write of the old term commits after it. SQLite's one writer at a
// time gives the same order. A leader paused past its lease (a stopped process, a long GC,
// a cut network) that comes back finds its writes refused, and since a replica's row is
// written before its launch, it cannot launch either; it learns it lost the lease from the
// refusal (ErrFenced) or its next renewal, and steps down.

// ErrNotLeader is returned, without touching the database, by a write to a store with a
// lease while its control plane does not hold the lease.
var ErrNotLeader = errors.New("this control plane does not hold the lease; only the leader writes")

// ErrFenced is returned by a write whose term is no longer the store's: another control
// plane took the lease. Nothing was written. The store drops the term it held.
var ErrFenced = errors.New("fenced: the lease moved to a later term; nothing was written")

// fencedError is ErrFenced with the terms.
type fencedError struct {
	held, now int64
	holder    string
}

func (e fencedError) Error() string {
	return fmt.Sprintf("fenced: this control plane led term %d, but %s leads term %d now; nothing was written", e.held, e.holder, e.now)
}
func (e fencedError) Is(target error) bool { return target == ErrFenced }

// begin starts a write's transaction. For a store with a lease it first checks that the
// term this process holds is the current one (see above).
func (s *Store) begin(ctx context.Context) (*sql.Tx, error) {
	if !s.leased.Load() {
		return s.db.BeginTx(ctx, nil)
	}
	held := s.term.Load()
	if held == 0 {
		return nil, ErrNotLeader
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	q := `SELECT term, holder FROM leader WHERE id = 1`
	if s.d.postgres {
		q += ` FOR SHARE`
	}
	var cur int64
	var holder string
	if err := tx.QueryRowContext(ctx, q).Scan(&cur, &holder); err != nil {
		tx.Rollback()
		return nil, fmt.Errorf("read the lease's term: %w", err)
	}
	if cur != held {
		tx.Rollback()
		s.term.CompareAndSwap(held, 0)
		return nil, fencedError{held: held, now: cur, holder: holder}
	}
	return tx, nil
}

// commit commits a write's transaction; what names the write in its error.
func commit(tx *sql.Tx, what string) error {
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%s: commit: %w", what, err)
	}
	return nil
}

// Lease is one control plane's hold on a store's lease. Its methods are safe for
// concurrent use.
type Lease struct {
	s      *Store
	holder string
	ttl    time.Duration
	now    func() time.Time

	// renewing serialises renewals; mu guards term and expires, and is never held across a
	// database call, so Leading answers at once while a renewal waits on the database.
	renewing sync.Mutex
	mu       sync.Mutex
	term     int64     // the term held; 0: none
	expires  time.Time // when the held term expires, by this process's clock
	// elected: a lock outside the store (a Kubernetes Lease) says who leads; the store's
	// term only fences. Renew never takes the lease then, Take does.
	elected bool
}

// NewLease makes the store one of several control planes' on one database: from now on it
// writes only while this lease is held. holder names this control plane (a host name and
// process ID, a pod name) to the others and in messages; ttl is how long a renewal holds
// the lease; now is the clock (nil: time.Now). The lease is not held until Renew takes it.
func (s *Store) NewLease(holder string, ttl time.Duration, now func() time.Time) (*Lease, error) {
	if holder == "" {
		return nil, errors.New("lease: a holder name is required")
	}
	if ttl < time.Second {
		return nil, fmt.Errorf("lease: duration %v is too short; use 1s or more (15s is a good start)", ttl)
	}
	if now == nil {
		now = time.Now
	}
	s.leased.Store(true)
	return &Lease{s: s, holder: holder, ttl: ttl, now: now}, nil
}

// NewElectedLease is NewLease for control planes that a lock outside the store elects (a
// Kubernetes Lease, package kubelease): the store's term still fences every write, but who
// leads is the lock's to say. Take makes this control plane the store's leader, with the
// next term, when the lock elects it, whether or not the last term has expired by the
// store's clock: the lock has found the last leader gone. Renew only extends a term held.
func (s *Store) NewElectedLease(holder string, ttl time.Duration, now func() time.Time) (*Lease, error) {
	l, err := s.NewLease(holder, ttl, now)
	if err != nil {
		return nil, err
	}
	l.elected = true
	return l, nil
}

// Holder is the name this lease's control plane goes by.
func (l *Lease) Holder() string { return l.holder }

// TTL is how long a renewal holds the lease.
func (l *Lease) TTL() time.Duration { return l.ttl }

// Leading returns the term this control plane leads, or 0 when it does not: it never
// took the lease, lost it, a write found it fenced, or its last renewal is older than the
// lease by its clock.
func (l *Lease) Leading() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expire()
	return l.term
}

// expire steps down once the held term has expired by this process's clock, or once a
// write found it fenced. Caller holds l.mu.
func (l *Lease) expire() {
	if l.term == 0 {
		return
	}
	if l.s.term.Load() != l.term || !l.now().Before(l.expires) {
		l.s.term.CompareAndSwap(l.term, 0)
		l.term = 0
	}
}

// Renew takes the lease if it is free or expired (with the next term), or extends it if
// this control plane holds it, and returns the term it leads (0: another one leads). A
// renewal that fails leaves the lease held until it expires by this process's clock.
func (l *Lease) Renew(ctx context.Context) (int64, error) {
	return l.renewOrTake(ctx, false)
}

// Take, for a lease made by NewElectedLease, makes this control plane the store's leader
// with the next term (the outside lock elected it), and returns that term; every write of
// an earlier term is refused from then on.
func (l *Lease) Take(ctx context.Context) (int64, error) {
	if !l.elected {
		return 0, errors.New("lease: Take is for a lease an outside lock elects (NewElectedLease); the store's own lease is taken by Renew")
	}
	return l.renewOrTake(ctx, true)
}

func (l *Lease) renewOrTake(ctx context.Context, take bool) (int64, error) {
	l.renewing.Lock()
	defer l.renewing.Unlock()
	term, err := l.renew(ctx, take)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.expire()
		return l.term, fmt.Errorf("lease: %w", err)
	}
	return term, nil
}

func (l *Lease) renew(ctx context.Context, take bool) (int64, error) {
	ctx, cancel := l.s.bound(ctx)
	defer cancel()
	now := l.now()
	l.mu.Lock()
	held := l.term
	l.mu.Unlock()
	tx, err := l.s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	q := `SELECT holder, term, expires_at FROM leader WHERE id = 1`
	if l.s.d.postgres {
		q += ` FOR UPDATE`
	}
	var holder string
	var term, expires int64
	if err := tx.QueryRowContext(ctx, q).Scan(&holder, &term, &expires); err != nil {
		return 0, err
	}
	until := now.Add(l.ttl)
	switch {
	case held != 0 && term == held && holder == l.holder:
		// Ours: extend it.
	case l.elected && take:
		term++ // elected by the outside lock: ours, as the next leader
	case !l.elected && expires <= ms(now):
		term++ // free or expired: ours, as the next leader
	default:
		// Another control plane leads (or took over from us).
		l.mu.Lock()
		l.s.term.CompareAndSwap(l.term, 0)
		l.term = 0
		l.mu.Unlock()
		return 0, nil
	}
	addr, _ := l.s.address.Load().(string)
	if _, err := tx.ExecContext(ctx, l.s.q(`UPDATE leader SET holder = ?, term = ?, expires_at = ?, address = ? WHERE id = 1`), l.holder, term, ms(until), addr); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	l.mu.Lock()
	l.term, l.expires = term, until
	l.s.term.Store(term)
	l.mu.Unlock()
	return term, nil
}

// Release gives the lease up (a control plane that stops), so another takes it at its next
// renewal instead of after the lease expires.
func (l *Lease) Release(ctx context.Context) error {
	l.renewing.Lock()
	defer l.renewing.Unlock()
	l.mu.Lock()
	held := l.term
	l.s.term.CompareAndSwap(held, 0)
	l.term = 0
	l.mu.Unlock()
	if held == 0 {
		return nil
	}
	ctx, cancel := l.s.bound(ctx)
	defer cancel()
	if _, err := l.s.db.ExecContext(ctx, l.s.q(`UPDATE leader SET expires_at = 0 WHERE id = 1 AND term = ? AND holder = ?`), held, l.holder); err != nil {
		return fmt.Errorf("lease: release term %d: %w", held, err)
	}
	return nil
}

// Advertise sets where this store's control plane's API answers (a URL), written with
// its lease: standbys forward the writes they are sent to the leader's.
func (s *Store) Advertise(url string) { s.address.Store(url) }

// Advertised is the URL Advertise set ("": none).
func (s *Store) Advertised() string { u, _ := s.address.Load().(string); return u }

// LeaderInfo is the lease as the database says: who holds it, its term, when it expires by
// the holder's clock, and where the holder's API answers ("" if it did not say).
type LeaderInfo struct {
	Holder  string
	Term    int64
	Expires time.Time
	Address string
}

// Leader reads the lease's row.
func (s *Store) Leader(ctx context.Context) (LeaderInfo, error) {
	var li LeaderInfo
	var e int64
	err := s.db.QueryRowContext(ctx, `SELECT holder, term, expires_at, address FROM leader WHERE id = 1`).Scan(&li.Holder, &li.Term, &e, &li.Address)
	li.Expires = fromMS(e)
	return li, err
}

// Current is who holds the lease, its term and when it expires, as the database says.
func (s *Store) Current(ctx context.Context) (holder string, term int64, expires time.Time, err error) {
	var e int64
	err = s.db.QueryRowContext(ctx, `SELECT holder, term, expires_at FROM leader WHERE id = 1`).Scan(&holder, &term, &e)
	return holder, term, fromMS(e), err
}

// Confirm checks, as every write does, that this store's control plane still leads the
// current term (always nil for a store without a lease); for an action that writes nothing
// before it asks a provider (a termination). It narrows the window in which a deposed
// leader acts, but cannot close it: the provider is not fenced by the store's term.
func (s *Store) Confirm(ctx context.Context) error {
	if !s.leased.Load() {
		return nil
	}
	tx, err := s.begin(ctx)
	if err != nil {
		return err
	}
	return tx.Rollback()
}
