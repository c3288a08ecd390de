// Package state is the control plane's durable memory: services and their versions,
// replicas with their provider handles, and an event log, in one SQLite file (WAL) by
// default, or in a PostgreSQL database that several control planes can share.
//
// The one rule it exists for: a replica row is written before the provider is asked to
// launch it, so a crash at any point leaves a row that names what might be running, and a
// restarted control plane can find it and either adopt or terminate it.
package state

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite" // registers the pure-Go "sqlite" driver
)

// ErrNotFound is returned when a service or replica does not exist.
var ErrNotFound = errors.New("not found")

// Store is an open state file or database. It is safe for concurrent use.
type Store struct {
	db *sql.DB
	d  dialect
	// writeTimeout bounds each write to a PostgreSQL store (0: unbounded, SQLite's case,
	// where the busy timeout does it), so a server that stopped answering fails a write as
	// a locked file does instead of stalling it.
	writeTimeout time.Duration
	// busyUntil (Unix ms): after a write found the store locked by another process or out of
	// reach, further writes fail at once until then instead of each waiting out the busy
	// timeout, so a control loop that writes under its lock is stalled for one timeout, not
	// one per write. busyWhy says why, for those fast failures.
	busyUntil atomic.Int64
	busyWhy   atomic.Pointer[string]
	// leased: a Lease was made on this store, so it is one of several control planes on
	// one database and writes only under the term it holds (term; 0: none), checked in
	// each write's transaction (lease.go).
	leased atomic.Bool
	term   atomic.Int64
	// address is where this control plane's API answers (Advertise), a string.
	address atomic.Value
}

// dialect is what differs between the two databases.
type dialect struct {
	name     string // the migrations folder: "sqlite" or "postgres"
	postgres bool
}

// q rewrites a query's ? placeholders as PostgreSQL's $1, $2… (no query of this package
// has a ? inside a string literal).
func (s *Store) q(query string) string {
	if !s.d.postgres || !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// busyBackoff is how long writes fail fast after one found the store locked or unreachable.
const busyBackoff = 2 * time.Second

// ErrBusy is returned, without touching the store, by writes made shortly after one found
// it locked by another process or out of reach; Unavailable says which.
var ErrBusy = errors.New("the state store refused a write moments ago; not trying again yet")

// fastFail is ErrBusy with the reason of the write that started the spell.
type fastFail struct{ why string }

func (f fastFail) Error() string {
	return f.why + " (found so by a write moments ago; not trying again yet)"
}
func (f fastFail) Is(target error) bool { return target == ErrBusy }

// writable fails fast while a recent write found the store locked or unreachable.
func (s *Store) writable() error {
	if time.Now().UnixMilli() < s.busyUntil.Load() {
		if why := s.busyWhy.Load(); why != nil {
			return fastFail{why: *why}
		}
		return ErrBusy
	}
	return nil
}

// errWriteTimeout is the cause of a write's context ending at Store.writeTimeout.
var errWriteTimeout = errors.New("the state database did not answer in time")

// bound gives a write its deadline (PostgreSQL's writeTimeout; none for SQLite).
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.writeTimeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, s.writeTimeout, errWriteTimeout)
}

// wrote notes a write's outcome: a locked or unreachable store starts the fail-fast period.
// ctx is the write's own (from bound): a write that ran out of its time is one the server
// did not answer.
func (s *Store) wrote(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) && context.Cause(ctx) == errWriteTimeout {
		err = fmt.Errorf("%w (%w)", errWriteTimeout, err)
	}
	if busy(err) {
		why := Unavailable(err)
		s.busyWhy.Store(&why)
		s.busyUntil.Store(time.Now().Add(busyBackoff).UnixMilli())
	}
	return err
}

// busy reports whether a write failed because another process holds a lock the store
// needs, or the store is out of reach for now: failures that will likely pass, that the
// next writes would only wait on again.
func busy(err error) bool {
	return errors.Is(err, ErrBusy) || sqliteBusy(err) || pgBusy(err)
}

// Options tune how a store is opened.
type Options struct {
	// BusyTimeout is how long a write waits for another process's lock on what it writes
	// (SQLite: the file's write lock, held by a backup or someone's sqlite3 shell;
	// PostgreSQL: a row or table lock, as lock_timeout) before failing with a busy error;
	// default 1 s. The control plane is the store's only writer, so anything longer only
	// stalls it.
	BusyTimeout time.Duration
	// WriteTimeout bounds a write to a PostgreSQL store, connecting included (default 5 s):
	// past it the server counts as unreachable. SQLite ignores it.
	WriteTimeout time.Duration
}

func (o *Options) defaults() {
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = time.Second
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 5 * time.Second
	}
}

// IsPostgres says whether a state setting names a PostgreSQL database (a postgres:// or
// postgresql:// URL) rather than a SQLite file's path.
func IsPostgres(setting string) bool {
	return strings.HasPrefix(setting, "postgres://") || strings.HasPrefix(setting, "postgresql://")
}

// Describe names the store a setting opens for logs and messages: a file's path, or a
// database's host, port and name without its password.
func Describe(setting string) string {
	if !IsPostgres(setting) {
		return "SQLite " + setting
	}
	cfg, err := pgx.ParseConfig(setting)
	if err != nil {
		return "PostgreSQL (an invalid URL)"
	}
	return "PostgreSQL " + pgName(cfg)
}

// OpenSetting opens the store a setting names: a PostgreSQL URL, or else a SQLite file's
// path.
func OpenSetting(ctx context.Context, setting string, o Options) (*Store, error) {
	if IsPostgres(setting) {
		return OpenPostgres(ctx, setting, o)
	}
	return OpenWith(setting, o)
}

// Open opens (creating if needed) the state file at path with default options.
func Open(path string) (*Store, error) { return OpenWith(path, Options{}) }

// OpenWith opens (creating if needed) the state file at path. A file that fails SQLite's
// quick check is refused: acting on a corrupt record of what runs is how replicas leak.
func OpenWith(path string, o Options) (*Store, error) {
	o.defaults()
	// busy_timeout: the CLI may read while the daemon writes; synchronous=FULL: a row the
	// control plane acted on must survive a power cut, not just a process crash.
	// The state names every replica, its address and its service's spec (envs included):
	// only its owner reads it. SQLite gives its -wal and -shm files the database file's
	// mode, so creating the file 0600 first covers all three.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	err = f.Chmod(0o600) // one an older version created 0644
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	dsn := fmt.Sprintf("file:%s?_pragma=journal_mode(WAL)&_pragma=busy_timeout(%d)&_pragma=synchronous(FULL)&_pragma=foreign_keys(ON)",
		path, o.BusyTimeout.Milliseconds())
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open state %s: %w", path, err)
	}
	// One writer at a time is SQLite's model; one connection avoids SQLITE_BUSY between our
	// own goroutines and keeps transactions serial.
	db.SetMaxOpenConns(1)
	s := &Store{db: db, d: dialect{name: "sqlite"}}
	if err := s.check(context.Background(), "quick_check"); err != nil {
		db.Close()
		return nil, fmt.Errorf("state %s: %w", path, err)
	}
	if err := s.migrate(context.Background()); err != nil {
		db.Close()
		return nil, fmt.Errorf("state %s: %w", path, err)
	}
	return s, nil
}

// Check runs the database's own integrity check: SQLite's over the whole file; on
// PostgreSQL, whose server checks its pages itself, a read of every table.
func (s *Store) Check(ctx context.Context) error {
	if s.d.postgres {
		for _, t := range []string{"services", "versions", "replicas", "events", "leader"} {
			var n int
			if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM `+t).Scan(&n); err != nil {
				return fmt.Errorf("read %s: %w", t, err)
			}
		}
		return nil
	}
	return s.check(ctx, "integrity_check")
}

func (s *Store) check(ctx context.Context, pragma string) error {
	rows, err := s.db.QueryContext(ctx, "PRAGMA "+pragma)
	if err != nil {
		return fmt.Errorf("%s: %w", pragma, err)
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return fmt.Errorf("%s: %w", pragma, err)
		}
		if line != "ok" {
			problems = append(problems, line)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%s: %w", pragma, err)
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrCorrupt, strings.Join(problems, "; "))
	}
	return nil
}

// ErrCorrupt is returned when SQLite's integrity check finds damage.
var ErrCorrupt = errors.New("the state file is damaged (SQLite integrity check)")

// Unavailable says, for an error from a Store, whether the store could not be used for a
// reason outside Arbiter that will likely pass (another process holds its write lock, the
// disk is full, the database server is out of reach), in words for an operator; ""
// otherwise.
func Unavailable(err error) string {
	var ff fastFail
	if errors.As(err, &ff) {
		return ff.why
	}
	if errors.Is(err, ErrBusy) {
		return "the state store was locked or out of reach moments ago; nothing was written"
	}
	if why := sqliteUnavailable(err); why != "" {
		return why
	}
	return pgUnavailable(err)
}

// Close closes the store.
func (s *Store) Close() error { return s.db.Close() }

// Service is one service's row.
type Service struct {
	Name    string `json:"name"`
	Version int    `json:"version"`
	Status  string `json:"status"`
	// Tokens is every prompt and completion token served so far, from router reports.
	Tokens    float64   `json:"tokens"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Version is one submitted spec of a service.
type Version struct {
	Service string
	Version int
	Spec    string // the service.yaml text as submitted
	// Envs are the command line's --env values (JSON object): they fill the spec's null envs
	// and must come back with it after a restart.
	Envs      string
	SetupDone bool
	CreatedAt time.Time
}

// Replica is one replica's row. Handle is the provider's own name for it (a process
// group, a pod, an instance ID); empty until the provider has answered the launch.
type Replica struct {
	ID           string  `json:"id"`
	Service      string  `json:"service"`
	Version      int     `json:"version"`
	Provider     string  `json:"provider"`
	Handle       string  `json:"handle"`
	Address      string  `json:"address"`
	Model        string  `json:"model"`
	State        string  `json:"state"`
	Reason       string  `json:"reason"`
	Capacity     string  `json:"capacity"`
	Region       string  `json:"region"`
	Zone         string  `json:"zone"`
	PricePerHour float64 `json:"price_per_hour"`
	// PriceSource says where PricePerHour came from (a catalog file, a provider's price
	// API); "" where the provider does not say.
	PriceSource string `json:"price_source,omitempty"`
	// Accelerator is the GPU placement launched the replica on, as the catalogs name it
	// (L4, H100); "" where the provider quotes no market (the local machine).
	Accelerator string `json:"accelerator,omitempty"`
	// Launcher is where the control plane that launched the replica answers (its
	// advertised API URL, Store.Advertise; "" without a lease): a provider that keeps a
	// replica's output on that control plane's host (the local one) is read through it.
	Launcher string `json:"launcher,omitempty"`
	// Adapter is the LoRA adapter the replica serves merged into its weights, as one of
	// that adapter's own replicas (issue 51); "" for the service's shared replicas, which
	// serve the base model and load adapters.
	Adapter    string    `json:"adapter,omitempty"`
	LaunchedAt time.Time `json:"launched_at"`
	ReadyAt    time.Time `json:"ready_at,omitzero"`
	UpdatedAt  time.Time `json:"updated_at"`
	EndedAt    time.Time `json:"ended_at,omitzero"`
}

// Event is one entry of the event log.
type Event struct {
	ID      int64     `json:"id"`
	At      time.Time `json:"at"`
	Service string    `json:"service"`
	Replica string    `json:"replica,omitempty"`
	Kind    string    `json:"kind"`
	Message string    `json:"message"`
}

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v)
}

// PutService creates a service (version 1) or adds a new version to an existing one, and
// returns the version number.
func (s *Store) PutService(ctx context.Context, name, spec, envs string, now time.Time) (int, error) {
	return s.PutServiceOnce(ctx, "", name, spec, envs, now)
}

// requestsKept is how long a request's key is remembered: far longer than any client
// retries one write.
const requestsKept = 24 * time.Hour

// PutServiceOnce is PutService that records key (a client's Idempotency-Key; "": none) with
// the version, in the same transaction: Request finds it after, whichever control plane
// asks.
func (s *Store) PutServiceOnce(ctx context.Context, key, name, spec, envs string, now time.Time) (int, error) {
	if err := s.writable(); err != nil {
		return 0, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	v, err := s.putService(ctx, key, name, spec, envs, now)
	return v, s.wrote(ctx, err)
}

// Request is the service and version a write with this Idempotency-Key made, or
// ErrNotFound.
func (s *Store) Request(ctx context.Context, key string) (service string, version int, err error) {
	err = s.db.QueryRowContext(ctx, s.q(`SELECT service, version FROM requests WHERE id = ?`), key).Scan(&service, &version)
	if errors.Is(err, sql.ErrNoRows) {
		return "", 0, ErrNotFound
	}
	if err != nil {
		return "", 0, fmt.Errorf("read request %q: %w", key, err)
	}
	return service, version, nil
}

func (s *Store) putService(ctx context.Context, key, name, spec, envs string, now time.Time) (int, error) {
	if envs == "" {
		envs = "{}"
	}
	tx, err := s.begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("put service %s: %w", name, err)
	}
	defer tx.Rollback()
	var v int
	err = tx.QueryRowContext(ctx, s.q(`SELECT version FROM services WHERE name = ?`), name).Scan(&v)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		v = 1
		_, err = tx.ExecContext(ctx, s.q(`INSERT INTO services (name, version, status, created_at, updated_at) VALUES (?, 1, 'active', ?, ?)`), name, ms(now), ms(now))
	case err == nil:
		v++
		_, err = tx.ExecContext(ctx, s.q(`UPDATE services SET version = ?, status = 'active', updated_at = ? WHERE name = ?`), v, ms(now), name)
	}
	if err != nil {
		return 0, fmt.Errorf("put service %s: %w", name, err)
	}
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO versions (service, version, spec, envs, created_at) VALUES (?, ?, ?, ?, ?)`), name, v, spec, envs, ms(now)); err != nil {
		return 0, fmt.Errorf("put service %s version %d: %w", name, v, err)
	}
	if err := s.insertEvent(ctx, tx, now, name, "", eventService, fmt.Sprintf("version %d submitted", v)); err != nil {
		return 0, err
	}
	if key != "" {
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM requests WHERE created_at < ?`), ms(now.Add(-requestsKept))); err != nil {
			return 0, fmt.Errorf("put service %s: drop old requests: %w", name, err)
		}
		// A key taken already (a retry that raced its first try past the caller's
		// check) fails the insert: nothing is written twice.
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO requests (id, service, version, created_at) VALUES (?, ?, ?, ?)`), key, name, v, ms(now)); err != nil {
			return 0, fmt.Errorf("put service %s: record request %q: %w", name, key, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("put service %s: commit: %w", name, err)
	}
	return v, nil
}

// SetServiceStatus records a service's status (active, deleting).
func (s *Store) SetServiceStatus(ctx context.Context, name, status string, now time.Time) error {
	if err := s.writable(); err != nil {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.wrote(ctx, s.setServiceStatus(ctx, name, status, now))
}

func (s *Store) setServiceStatus(ctx context.Context, name, status string, now time.Time) error {
	tx, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("service %s status: %w", name, err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, s.q(`UPDATE services SET status = ?, updated_at = ? WHERE name = ?`), status, ms(now), name)
	if err != nil {
		return fmt.Errorf("service %s status: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("service %s: %w", name, ErrNotFound)
	}
	return commit(tx, "service "+name+" status")
}

// AddTokens adds served tokens to a service's total (cost per million tokens survives
// control-plane restarts).
func (s *Store) AddTokens(ctx context.Context, name string, n float64) error {
	if math.IsNaN(n) || math.IsInf(n, 0) || n < 0 {
		return fmt.Errorf("service %s tokens: %v is not a count", name, n)
	}
	if err := s.writable(); err != nil {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.wrote(ctx, s.addTokens(ctx, name, n))
}

func (s *Store) addTokens(ctx context.Context, name string, n float64) error {
	tx, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("service %s tokens: %w", name, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, s.q(`UPDATE services SET tokens = tokens + ? WHERE name = ?`), n, name); err != nil {
		return fmt.Errorf("service %s tokens: %w", name, err)
	}
	return commit(tx, "service "+name+" tokens")
}

// The event a service's deletion writes (Events reads it to start a new log for the name).
const eventService, eventDeleted = "service", "deleted"

// DeleteService removes a service, its versions and its replica rows. The caller must have
// terminated every replica first; events stay, as history.
func (s *Store) DeleteService(ctx context.Context, name string, now time.Time) error {
	if err := s.writable(); err != nil {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.wrote(ctx, s.deleteService(ctx, name, now))
}

func (s *Store) deleteService(ctx context.Context, name string, now time.Time) error {
	tx, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("delete service %s: %w", name, err)
	}
	defer tx.Rollback()
	var live int
	if err := tx.QueryRowContext(ctx, s.q(`SELECT count(*) FROM replicas WHERE service = ? AND ended_at = 0`), name).Scan(&live); err != nil {
		return fmt.Errorf("delete service %s: %w", name, err)
	}
	if live > 0 {
		return fmt.Errorf("delete service %s: %d replicas not terminated yet", name, live)
	}
	for _, q := range []string{`DELETE FROM replicas WHERE service = ?`, `DELETE FROM versions WHERE service = ?`, `DELETE FROM adapter_use WHERE service = ?`, `DELETE FROM services WHERE name = ?`} {
		if _, err := tx.ExecContext(ctx, s.q(q), name); err != nil {
			return fmt.Errorf("delete service %s: %w", name, err)
		}
	}
	if err := s.insertEvent(ctx, tx, now, name, "", eventService, eventDeleted); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("delete service %s: commit: %w", name, err)
	}
	return nil
}

// Services lists every service, by name.
func (s *Store) Services(ctx context.Context) ([]Service, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT name, version, status, tokens, created_at, updated_at FROM services ORDER BY name`))
	if err != nil {
		return nil, fmt.Errorf("list services: %w", err)
	}
	defer rows.Close()
	var out []Service
	for rows.Next() {
		var sv Service
		var c, u int64
		if err := rows.Scan(&sv.Name, &sv.Version, &sv.Status, &sv.Tokens, &c, &u); err != nil {
			return nil, err
		}
		sv.CreatedAt, sv.UpdatedAt = fromMS(c), fromMS(u)
		out = append(out, sv)
	}
	return out, rows.Err()
}

// GetService returns one service or ErrNotFound.
func (s *Store) GetService(ctx context.Context, name string) (Service, error) {
	var sv Service
	var c, u int64
	err := s.db.QueryRowContext(ctx, s.q(`SELECT name, version, status, tokens, created_at, updated_at FROM services WHERE name = ?`), name).
		Scan(&sv.Name, &sv.Version, &sv.Status, &sv.Tokens, &c, &u)
	if errors.Is(err, sql.ErrNoRows) {
		return sv, fmt.Errorf("service %q: %w", name, ErrNotFound)
	}
	sv.CreatedAt, sv.UpdatedAt = fromMS(c), fromMS(u)
	return sv, err
}

// GetVersion returns one version's spec.
func (s *Store) GetVersion(ctx context.Context, service string, version int) (Version, error) {
	v := Version{Service: service, Version: version}
	var c int64
	var done int
	err := s.db.QueryRowContext(ctx, s.q(`SELECT spec, envs, setup_done, created_at FROM versions WHERE service = ? AND version = ?`), service, version).Scan(&v.Spec, &v.Envs, &done, &c)
	if errors.Is(err, sql.ErrNoRows) {
		return v, fmt.Errorf("service %q version %d: %w", service, version, ErrNotFound)
	}
	v.SetupDone, v.CreatedAt = done != 0, fromMS(c)
	return v, err
}

// MarkSetupDone records that a version's setup command has run.
func (s *Store) MarkSetupDone(ctx context.Context, service string, version int) error {
	if err := s.writable(); err != nil {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.wrote(ctx, s.markSetupDone(ctx, service, version))
}

func (s *Store) markSetupDone(ctx context.Context, service string, version int) error {
	what := fmt.Sprintf("service %s version %d setup done", service, version)
	tx, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, s.q(`UPDATE versions SET setup_done = 1 WHERE service = ? AND version = ?`), service, version); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return commit(tx, what)
}

// NewReplica records the intent to launch a replica (state pending, no handle yet) and
// returns it with a fresh ID of the form <service>-<n>. It must be called, and must have
// returned, before the provider's launch: the row is what makes a crash recoverable.
func (s *Store) NewReplica(ctx context.Context, r Replica, now time.Time) (Replica, error) {
	if err := s.writable(); err != nil {
		return r, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	out, err := s.newReplica(ctx, r, now)
	return out, s.wrote(ctx, err)
}

func (s *Store) newReplica(ctx context.Context, r Replica, now time.Time) (Replica, error) {
	tx, err := s.begin(ctx)
	if err != nil {
		return r, fmt.Errorf("new replica for %s: %w", r.Service, err)
	}
	defer tx.Rollback()
	var seq int
	if err := tx.QueryRowContext(ctx, s.q(`UPDATE services SET next_seq = next_seq + 1 WHERE name = ? RETURNING next_seq - 1`), r.Service).Scan(&seq); err != nil {
		return r, fmt.Errorf("new replica for %s: %w", r.Service, err)
	}
	r.ID = fmt.Sprintf("%s-%d", r.Service, seq)
	r.LaunchedAt, r.UpdatedAt = now, now
	if r.Launcher == "" {
		// The row is written by the control plane that launches it.
		r.Launcher = s.Advertised()
	}
	_, err = tx.ExecContext(ctx, s.q(`INSERT INTO replicas (id, service, version, provider, handle, address, model, state, reason, capacity, region, zone, price_per_hour, price_source, accelerator, launcher, adapter, launched_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		r.ID, r.Service, r.Version, r.Provider, r.Handle, r.Address, r.Model, r.State, r.Reason, r.Capacity, r.Region, r.Zone, r.PricePerHour, r.PriceSource, r.Accelerator, r.Launcher, r.Adapter, ms(now), ms(now))
	if err != nil {
		return r, fmt.Errorf("new replica %s: %w", r.ID, err)
	}
	if err := s.insertEvent(ctx, tx, now, r.Service, r.ID, "state", moved("→ "+r.State, r.Reason)); err != nil {
		return r, err
	}
	if err := tx.Commit(); err != nil {
		return r, fmt.Errorf("new replica %s: commit: %w", r.ID, err)
	}
	return r, nil
}

// SaveReplica writes a replica's mutable fields; when its state changed from prev, the
// transition and its reason go to the event log in the same transaction.
func (s *Store) SaveReplica(ctx context.Context, r Replica, prevState string, now time.Time) error {
	if err := s.writable(); err != nil {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.wrote(ctx, s.saveReplica(ctx, r, prevState, now))
}

func (s *Store) saveReplica(ctx context.Context, r Replica, prevState string, now time.Time) error {
	tx, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("save replica %s: %w", r.ID, err)
	}
	defer tx.Rollback()
	r.UpdatedAt = now
	res, err := tx.ExecContext(ctx, s.q(`UPDATE replicas SET handle = ?, address = ?, model = ?, state = ?, reason = ?, capacity = ?, region = ?, zone = ?,
		price_per_hour = ?, price_source = ?, ready_at = ?, updated_at = ?, ended_at = ?, version = ? WHERE id = ?`),
		r.Handle, r.Address, r.Model, r.State, r.Reason, r.Capacity, r.Region, r.Zone, r.PricePerHour, r.PriceSource, ms(r.ReadyAt), ms(now), ms(r.EndedAt), r.Version, r.ID)
	if err != nil {
		return fmt.Errorf("save replica %s: %w", r.ID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("save replica %s: %w", r.ID, ErrNotFound)
	}
	if prevState != r.State {
		if err := s.insertEvent(ctx, tx, now, r.Service, r.ID, "state", moved(prevState+" → "+r.State, r.Reason)); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("save replica %s: commit: %w", r.ID, err)
	}
	return nil
}

// moved is a state event's message: the move, and its reason where one was given.
func moved(move, reason string) string {
	if reason == "" {
		return move
	}
	return move + ": " + reason
}

const replicaCols = `id, service, version, provider, handle, address, model, state, reason, capacity, region, zone, price_per_hour, price_source, accelerator, launcher, adapter, launched_at, ready_at, updated_at, ended_at`

// Replicas lists a service's replicas ("" = all services); ended ones only when withEnded.
func (s *Store) Replicas(ctx context.Context, service string, withEnded bool) ([]Replica, error) {
	q := `SELECT ` + replicaCols + ` FROM replicas WHERE (? = '' OR service = ?)`
	if !withEnded {
		q += ` AND ended_at = 0`
	}
	rows, err := s.db.QueryContext(ctx, s.q(q+` ORDER BY service, launched_at, id`), service, service)
	if err != nil {
		return nil, fmt.Errorf("list replicas: %w", err)
	}
	defer rows.Close()
	var out []Replica
	for rows.Next() {
		var r Replica
		var l, rd, u, e int64
		if err := rows.Scan(&r.ID, &r.Service, &r.Version, &r.Provider, &r.Handle, &r.Address, &r.Model, &r.State, &r.Reason,
			&r.Capacity, &r.Region, &r.Zone, &r.PricePerHour, &r.PriceSource, &r.Accelerator, &r.Launcher, &r.Adapter, &l, &rd, &u, &e); err != nil {
			return nil, err
		}
		r.LaunchedAt, r.ReadyAt, r.UpdatedAt, r.EndedAt = fromMS(l), fromMS(rd), fromMS(u), fromMS(e)
		out = append(out, r)
	}
	return out, rows.Err()
}

// AddEvent appends to the event log.
func (s *Store) AddEvent(ctx context.Context, now time.Time, service, replica, kind, msg string) error {
	if err := s.writable(); err != nil {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.wrote(ctx, s.addEvent(ctx, now, service, replica, kind, msg))
}

func (s *Store) addEvent(ctx context.Context, now time.Time, service, replica, kind, msg string) error {
	tx, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("event log: %w", err)
	}
	defer tx.Rollback()
	if err := s.insertEvent(ctx, tx, now, service, replica, kind, msg); err != nil {
		return err
	}
	return commit(tx, "event log")
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// eventLock is the key of the PostgreSQL advisory lock that event inserts take until their
// transaction commits, so that event IDs are given in commit order as in SQLite: a reader
// following the log by ID (serve logs) never passes an event that commits later with a
// smaller one.
const eventLock = 0x61726269746572 // "arbiter"

func (s *Store) insertEvent(ctx context.Context, db execer, now time.Time, service, replica, kind, msg string) error {
	q := `INSERT INTO events (at, service, replica, kind, message) VALUES (?, ?, ?, ?, ?)`
	if s.d.postgres {
		// One statement, so that the lock is held to the end of an autocommitted insert too.
		q = `WITH l AS (SELECT pg_advisory_xact_lock(` + fmt.Sprint(eventLock) + `))
			INSERT INTO events (at, service, replica, kind, message) SELECT ?, ?, ?, ?, ? FROM l`
	}
	if _, err := db.ExecContext(ctx, s.q(q), ms(now), service, replica, kind, msg); err != nil {
		return fmt.Errorf("event log: %w", err)
	}
	return nil
}

// Events returns a service's events with ID > after ("" = every service; replica filters
// when not empty), oldest first, at most limit. A service's events are those of the
// service that has its name now: a name deleted and created again starts a new log (its
// replica IDs start again at 1 too), and the deleted service's events, which stay as
// history, are listed only with every service's, or while no service has the name.
func (s *Store) Events(ctx context.Context, service, replica string, after int64, limit int) ([]Event, error) {
	if service != "" {
		// Deletion writes its event in the same transaction that removes the service, so
		// the current service's log begins after the name's last deletion.
		var deleted sql.NullInt64
		err := s.db.QueryRowContext(ctx, s.q(`SELECT (SELECT max(id) FROM events WHERE service = ? AND kind = ? AND message = ?) FROM services WHERE name = ?`),
			service, eventService, eventDeleted, service).Scan(&deleted)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return nil, fmt.Errorf("events: %w", err)
		case deleted.Valid:
			after = max(after, deleted.Int64)
		}
	}
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT id, at, service, replica, kind, message FROM events
		WHERE id > ? AND (? = '' OR service = ?) AND (? = '' OR replica = ?) ORDER BY id LIMIT ?`),
		after, service, service, replica, replica, limit)
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		var at int64
		if err := rows.Scan(&e.ID, &at, &e.Service, &e.Replica, &e.Kind, &e.Message); err != nil {
			return nil, err
		}
		e.At = fromMS(at)
		out = append(out, e)
	}
	return out, rows.Err()
}

// AdapterUse is what one LoRA adapter of a service served since Since: requests and tokens
// as the routers reported them.
type AdapterUse struct {
	Adapter          string
	Requests, Tokens float64
	Since            time.Time
}

// AddAdapterUse adds requests and tokens to adapters' totals, in one transaction; an adapter
// without a row gets one, counted from now.
func (s *Store) AddAdapterUse(ctx context.Context, service string, add []AdapterUse, now time.Time) error {
	for _, a := range add {
		for _, v := range []float64{a.Requests, a.Tokens} {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return fmt.Errorf("service %s adapter %s use: %v is not a count", service, a.Adapter, v)
			}
		}
	}
	if err := s.writable(); err != nil {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.wrote(ctx, s.addAdapterUse(ctx, service, add, now))
}

func (s *Store) addAdapterUse(ctx context.Context, service string, add []AdapterUse, now time.Time) error {
	tx, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("service %s adapter use: %w", service, err)
	}
	defer tx.Rollback()
	for _, a := range add {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO adapter_use (service, adapter, requests, tokens, since) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (service, adapter) DO UPDATE SET requests = adapter_use.requests + excluded.requests, tokens = adapter_use.tokens + excluded.tokens`),
			service, a.Adapter, a.Requests, a.Tokens, ms(now)); err != nil {
			return fmt.Errorf("service %s adapter %s use: %w", service, a.Adapter, err)
		}
	}
	return commit(tx, "service "+service+" adapter use")
}

// AdapterUses returns every service's adapters' totals, by service and adapter name.
func (s *Store) AdapterUses(ctx context.Context) (map[string]map[string]AdapterUse, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, `SELECT service, adapter, requests, tokens, since FROM adapter_use`)
	if err != nil {
		return nil, fmt.Errorf("adapter use: %w", err)
	}
	defer rows.Close()
	out := map[string]map[string]AdapterUse{}
	for rows.Next() {
		var a AdapterUse
		var service string
		var since int64
		if err := rows.Scan(&service, &a.Adapter, &a.Requests, &a.Tokens, &since); err != nil {
			return nil, fmt.Errorf("adapter use: %w", err)
		}
		a.Since = fromMS(since)
		if out[service] == nil {
			out[service] = map[string]AdapterUse{}
		}
		out[service][a.Adapter] = a
	}
	return out, rows.Err()
}

// TenantUse is spend to add to a tenant's day.
type TenantUse struct {
	Tenant                    string
	Dollars, Tokens, Requests float64
}

// TenantSpend is a tenant's spend in one UTC day and in the calendar month that holds it.
type TenantSpend struct {
	DayDollars, MonthDollars float64
	DayTokens, MonthTokens   float64
}

// dayOf is the UTC day a time falls in, as tenant_spend keys it.
func dayOf(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// AddTenantSpend adds spend to tenants' totals for the UTC day of now, in one transaction.
func (s *Store) AddTenantSpend(ctx context.Context, add []TenantUse, now time.Time) error {
	for _, a := range add {
		for _, v := range []float64{a.Dollars, a.Tokens, a.Requests} {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return fmt.Errorf("tenant %s spend: %v is not an amount", a.Tenant, v)
			}
		}
	}
	if err := s.writable(); err != nil {
		return err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.wrote(ctx, s.addTenantSpend(ctx, add, dayOf(now)))
}

func (s *Store) addTenantSpend(ctx context.Context, add []TenantUse, day string) error {
	tx, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("tenant spend: %w", err)
	}
	defer tx.Rollback()
	for _, a := range add {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO tenant_spend (tenant, day, dollars, tokens, requests) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (tenant, day) DO UPDATE SET dollars = tenant_spend.dollars + excluded.dollars, tokens = tenant_spend.tokens + excluded.tokens,
			requests = tenant_spend.requests + excluded.requests`),
			a.Tenant, day, a.Dollars, a.Tokens, a.Requests); err != nil {
			return fmt.Errorf("tenant %s spend: %w", a.Tenant, err)
		}
	}
	return commit(tx, "tenant spend")
}

// TenantSpends returns every tenant's spend in the UTC day of now and in its month.
func (s *Store) TenantSpends(ctx context.Context, now time.Time) (map[string]TenantSpend, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	day := dayOf(now)
	month := day[:len("2006-01-")] + "01"
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT tenant, day, dollars, tokens FROM tenant_spend WHERE day >= ? AND day <= ?`), month, day)
	if err != nil {
		return nil, fmt.Errorf("tenant spend: %w", err)
	}
	defer rows.Close()
	out := map[string]TenantSpend{}
	for rows.Next() {
		var tenant, d string
		var dollars, tokens float64
		if err := rows.Scan(&tenant, &d, &dollars, &tokens); err != nil {
			return nil, fmt.Errorf("tenant spend: %w", err)
		}
		t := out[tenant]
		t.MonthDollars += dollars
		t.MonthTokens += tokens
		if d == day {
			t.DayDollars += dollars
			t.DayTokens += tokens
		}
		out[tenant] = t
	}
	return out, rows.Err()
}
