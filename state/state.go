// Package state is the control plane's durable memory: services and their versions,
// replicas with their provider handles, and an event log, in one SQLite file (WAL).
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
	"strings"
	"sync/atomic"
	"time"

	"modernc.org/sqlite" // also registers the pure-Go "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"
)

// ErrNotFound is returned when a service or replica does not exist.
var ErrNotFound = errors.New("not found")

// Store is an open state file. It is safe for concurrent use.
type Store struct {
	db *sql.DB
	// busyUntil (Unix ms): after a write found the file locked by another process, further
	// writes fail at once until then instead of each waiting out the busy timeout, so a
	// control loop that writes under its lock is stalled for one timeout, not one per write.
	busyUntil atomic.Int64
}

// busyBackoff is how long writes fail fast after one found the file locked.
const busyBackoff = 2 * time.Second

// ErrBusy is returned, without touching the file, by writes made shortly after one found
// it locked by another process.
var ErrBusy = errors.New("the state file was locked by another process moments ago; not waiting again yet")

// writable fails fast while a recent write found the file locked.
func (s *Store) writable() error {
	if time.Now().UnixMilli() < s.busyUntil.Load() {
		return ErrBusy
	}
	return nil
}

// wrote notes a write's outcome: a busy file starts the fail-fast period.
func (s *Store) wrote(err error) error {
	if busy(err) {
		s.busyUntil.Store(time.Now().Add(busyBackoff).UnixMilli())
	}
	return err
}

// sqliteCode is an error's primary SQLite result code, or -1 when SQLite did not give it.
func sqliteCode(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code() & 0xff
	}
	return -1
}

// busy reports whether another process's lock on the file made a write fail.
func busy(err error) bool {
	c := sqliteCode(err)
	return errors.Is(err, ErrBusy) || c == sqlite3.SQLITE_BUSY || c == sqlite3.SQLITE_LOCKED
}

const schema = `
CREATE TABLE IF NOT EXISTS services (
	name        TEXT PRIMARY KEY,
	version     INTEGER NOT NULL,
	status      TEXT NOT NULL,
	next_seq    INTEGER NOT NULL DEFAULT 1,
	tokens      REAL NOT NULL DEFAULT 0,
	created_at  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS versions (
	service     TEXT NOT NULL,
	version     INTEGER NOT NULL,
	spec        TEXT NOT NULL,
	envs        TEXT NOT NULL DEFAULT '{}',
	setup_done  INTEGER NOT NULL DEFAULT 0,
	created_at  INTEGER NOT NULL,
	PRIMARY KEY (service, version)
);
CREATE TABLE IF NOT EXISTS replicas (
	id             TEXT PRIMARY KEY,
	service        TEXT NOT NULL,
	version        INTEGER NOT NULL,
	provider       TEXT NOT NULL,
	handle         TEXT NOT NULL DEFAULT '',
	address        TEXT NOT NULL DEFAULT '',
	model          TEXT NOT NULL DEFAULT '',
	state          TEXT NOT NULL,
	reason         TEXT NOT NULL DEFAULT '',
	capacity       TEXT NOT NULL DEFAULT '',
	region         TEXT NOT NULL DEFAULT '',
	zone           TEXT NOT NULL DEFAULT '',
	price_per_hour REAL NOT NULL DEFAULT 0,
	price_source   TEXT NOT NULL DEFAULT '',
	accelerator    TEXT NOT NULL DEFAULT '',
	launched_at    INTEGER NOT NULL,
	ready_at       INTEGER NOT NULL DEFAULT 0,
	updated_at     INTEGER NOT NULL,
	ended_at       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS replicas_by_service ON replicas (service, state);
CREATE TABLE IF NOT EXISTS events (
	id       INTEGER PRIMARY KEY AUTOINCREMENT,
	at       INTEGER NOT NULL,
	service  TEXT NOT NULL,
	replica  TEXT NOT NULL DEFAULT '',
	kind     TEXT NOT NULL,
	message  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_service ON events (service, id);
`

// Options tune how a state file is opened.
type Options struct {
	// BusyTimeout is how long a write waits for another process's write lock on the file
	// (a backup, someone's sqlite3 shell) before failing with a busy error; default 1 s.
	// The control plane is the file's only writer, so anything longer only stalls it.
	BusyTimeout time.Duration
}

// Open opens (creating if needed) the state file at path with default options.
func Open(path string) (*Store, error) { return OpenWith(path, Options{}) }

// OpenWith opens (creating if needed) the state file at path. A file that fails SQLite's
// quick check is refused: acting on a corrupt record of what runs is how replicas leak.
func OpenWith(path string, o Options) (*Store, error) {
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = time.Second
	}
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
	s := &Store{db: db}
	if err := s.check(context.Background(), "quick_check"); err != nil {
		db.Close()
		return nil, fmt.Errorf("state %s: %w", path, err)
	}
	if _, err := db.Exec(schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("state %s: create schema: %w", path, err)
	}
	for _, col := range []string{"price_source", "accelerator"} {
		if err := s.addColumn(context.Background(), "replicas", col, "TEXT NOT NULL DEFAULT ''"); err != nil {
			db.Close()
			return nil, fmt.Errorf("state %s: %w", path, err)
		}
	}
	return s, nil
}

// addColumn adds a column a state file written by an older version lacks (CREATE TABLE IF
// NOT EXISTS leaves an existing table as it was).
func (s *Store) addColumn(ctx context.Context, table, column, decl string) error {
	rows, err := s.db.QueryContext(ctx, "SELECT name FROM pragma_table_info(?)", table)
	if err != nil {
		return fmt.Errorf("read %s's columns: %w", table, err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return err
		}
		if name == column {
			return nil
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rows.Close()
	if _, err := s.db.ExecContext(ctx, "ALTER TABLE "+table+" ADD COLUMN "+column+" "+decl); err != nil {
		return fmt.Errorf("add %s.%s: %w", table, column, err)
	}
	return nil
}

// Check runs SQLite's full integrity check over the file.
func (s *Store) Check(ctx context.Context) error { return s.check(ctx, "integrity_check") }

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

// Unavailable says, for an error from a Store, whether the state file could not be used for
// a reason outside Arbiter that will likely pass (another process holds its write lock, the
// disk is full), in words for an operator; "" otherwise. The write that failed changed
// nothing: every write is one transaction.
func Unavailable(err error) string {
	if busy(err) {
		return "the state file is locked by another process (SQLite busy); nothing was written"
	}
	switch sqliteCode(err) {
	case sqlite3.SQLITE_FULL:
		return "the disk holding the state file is full; nothing was written"
	case sqlite3.SQLITE_IOERR:
		return "the state file could not be written (I/O error); nothing was written"
	}
	return ""
}

// Close closes the file.
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
	Accelerator string    `json:"accelerator,omitempty"`
	LaunchedAt  time.Time `json:"launched_at"`
	ReadyAt     time.Time `json:"ready_at,omitzero"`
	UpdatedAt   time.Time `json:"updated_at"`
	EndedAt     time.Time `json:"ended_at,omitzero"`
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
	if err := s.writable(); err != nil {
		return 0, err
	}
	v, err := s.putService(ctx, name, spec, envs, now)
	return v, s.wrote(err)
}

func (s *Store) putService(ctx context.Context, name, spec, envs string, now time.Time) (int, error) {
	if envs == "" {
		envs = "{}"
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("put service %s: %w", name, err)
	}
	defer tx.Rollback()
	var v int
	err = tx.QueryRowContext(ctx, `SELECT version FROM services WHERE name = ?`, name).Scan(&v)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		v = 1
		_, err = tx.ExecContext(ctx, `INSERT INTO services (name, version, status, created_at, updated_at) VALUES (?, 1, 'active', ?, ?)`, name, ms(now), ms(now))
	case err == nil:
		v++
		_, err = tx.ExecContext(ctx, `UPDATE services SET version = ?, status = 'active', updated_at = ? WHERE name = ?`, v, ms(now), name)
	}
	if err != nil {
		return 0, fmt.Errorf("put service %s: %w", name, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO versions (service, version, spec, envs, created_at) VALUES (?, ?, ?, ?, ?)`, name, v, spec, envs, ms(now)); err != nil {
		return 0, fmt.Errorf("put service %s version %d: %w", name, v, err)
	}
	if err := addEvent(ctx, tx, now, name, "", eventService, fmt.Sprintf("version %d submitted", v)); err != nil {
		return 0, err
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
	return s.wrote(s.setServiceStatus(ctx, name, status, now))
}

func (s *Store) setServiceStatus(ctx context.Context, name, status string, now time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE services SET status = ?, updated_at = ? WHERE name = ?`, status, ms(now), name)
	if err != nil {
		return fmt.Errorf("service %s status: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("service %s: %w", name, ErrNotFound)
	}
	return nil
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
	return s.wrote(s.addTokens(ctx, name, n))
}

func (s *Store) addTokens(ctx context.Context, name string, n float64) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE services SET tokens = tokens + ? WHERE name = ?`, n, name); err != nil {
		return fmt.Errorf("service %s tokens: %w", name, err)
	}
	return nil
}

// The event a service's deletion writes (Events reads it to start a new log for the name).
const eventService, eventDeleted = "service", "deleted"

// DeleteService removes a service, its versions and its replica rows. The caller must have
// terminated every replica first; events stay, as history.
func (s *Store) DeleteService(ctx context.Context, name string, now time.Time) error {
	if err := s.writable(); err != nil {
		return err
	}
	return s.wrote(s.deleteService(ctx, name, now))
}

func (s *Store) deleteService(ctx context.Context, name string, now time.Time) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("delete service %s: %w", name, err)
	}
	defer tx.Rollback()
	var live int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM replicas WHERE service = ? AND ended_at = 0`, name).Scan(&live); err != nil {
		return fmt.Errorf("delete service %s: %w", name, err)
	}
	if live > 0 {
		return fmt.Errorf("delete service %s: %d replicas not terminated yet", name, live)
	}
	for _, q := range []string{`DELETE FROM replicas WHERE service = ?`, `DELETE FROM versions WHERE service = ?`, `DELETE FROM services WHERE name = ?`} {
		if _, err := tx.ExecContext(ctx, q, name); err != nil {
			return fmt.Errorf("delete service %s: %w", name, err)
		}
	}
	if err := addEvent(ctx, tx, now, name, "", eventService, eventDeleted); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("delete service %s: commit: %w", name, err)
	}
	return nil
}

// Services lists every service, by name.
func (s *Store) Services(ctx context.Context) ([]Service, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, version, status, tokens, created_at, updated_at FROM services ORDER BY name`)
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
	err := s.db.QueryRowContext(ctx, `SELECT name, version, status, tokens, created_at, updated_at FROM services WHERE name = ?`, name).
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
	err := s.db.QueryRowContext(ctx, `SELECT spec, envs, setup_done, created_at FROM versions WHERE service = ? AND version = ?`, service, version).Scan(&v.Spec, &v.Envs, &done, &c)
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
	return s.wrote(s.markSetupDone(ctx, service, version))
}

func (s *Store) markSetupDone(ctx context.Context, service string, version int) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE versions SET setup_done = 1 WHERE service = ? AND version = ?`, service, version); err != nil {
		return fmt.Errorf("service %s version %d setup done: %w", service, version, err)
	}
	return nil
}

// NewReplica records the intent to launch a replica (state pending, no handle yet) and
// returns it with a fresh ID of the form <service>-<n>. It must be called, and must have
// returned, before the provider's launch: the row is what makes a crash recoverable.
func (s *Store) NewReplica(ctx context.Context, r Replica, now time.Time) (Replica, error) {
	if err := s.writable(); err != nil {
		return r, err
	}
	out, err := s.newReplica(ctx, r, now)
	return out, s.wrote(err)
}

func (s *Store) newReplica(ctx context.Context, r Replica, now time.Time) (Replica, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return r, fmt.Errorf("new replica for %s: %w", r.Service, err)
	}
	defer tx.Rollback()
	var seq int
	if err := tx.QueryRowContext(ctx, `UPDATE services SET next_seq = next_seq + 1 WHERE name = ? RETURNING next_seq - 1`, r.Service).Scan(&seq); err != nil {
		return r, fmt.Errorf("new replica for %s: %w", r.Service, err)
	}
	r.ID = fmt.Sprintf("%s-%d", r.Service, seq)
	r.LaunchedAt, r.UpdatedAt = now, now
	_, err = tx.ExecContext(ctx, `INSERT INTO replicas (id, service, version, provider, handle, address, model, state, reason, capacity, region, zone, price_per_hour, price_source, accelerator, launched_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		r.ID, r.Service, r.Version, r.Provider, r.Handle, r.Address, r.Model, r.State, r.Reason, r.Capacity, r.Region, r.Zone, r.PricePerHour, r.PriceSource, r.Accelerator, ms(now), ms(now))
	if err != nil {
		return r, fmt.Errorf("new replica %s: %w", r.ID, err)
	}
	if err := addEvent(ctx, tx, now, r.Service, r.ID, "state", moved("→ "+r.State, r.Reason)); err != nil {
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
	return s.wrote(s.saveReplica(ctx, r, prevState, now))
}

func (s *Store) saveReplica(ctx context.Context, r Replica, prevState string, now time.Time) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("save replica %s: %w", r.ID, err)
	}
	defer tx.Rollback()
	r.UpdatedAt = now
	res, err := tx.ExecContext(ctx, `UPDATE replicas SET handle = ?, address = ?, model = ?, state = ?, reason = ?, capacity = ?, region = ?, zone = ?,
		price_per_hour = ?, price_source = ?, ready_at = ?, updated_at = ?, ended_at = ? WHERE id = ?`,
		r.Handle, r.Address, r.Model, r.State, r.Reason, r.Capacity, r.Region, r.Zone, r.PricePerHour, r.PriceSource, ms(r.ReadyAt), ms(now), ms(r.EndedAt), r.ID)
	if err != nil {
		return fmt.Errorf("save replica %s: %w", r.ID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("save replica %s: %w", r.ID, ErrNotFound)
	}
	if prevState != r.State {
		if err := addEvent(ctx, tx, now, r.Service, r.ID, "state", moved(prevState+" → "+r.State, r.Reason)); err != nil {
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

const replicaCols = `id, service, version, provider, handle, address, model, state, reason, capacity, region, zone, price_per_hour, price_source, accelerator, launched_at, ready_at, updated_at, ended_at`

// Replicas lists a service's replicas ("" = all services); ended ones only when withEnded.
func (s *Store) Replicas(ctx context.Context, service string, withEnded bool) ([]Replica, error) {
	q := `SELECT ` + replicaCols + ` FROM replicas WHERE (? = '' OR service = ?)`
	if !withEnded {
		q += ` AND ended_at = 0`
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY service, launched_at, id`, service, service)
	if err != nil {
		return nil, fmt.Errorf("list replicas: %w", err)
	}
	defer rows.Close()
	var out []Replica
	for rows.Next() {
		var r Replica
		var l, rd, u, e int64
		if err := rows.Scan(&r.ID, &r.Service, &r.Version, &r.Provider, &r.Handle, &r.Address, &r.Model, &r.State, &r.Reason,
			&r.Capacity, &r.Region, &r.Zone, &r.PricePerHour, &r.PriceSource, &r.Accelerator, &l, &rd, &u, &e); err != nil {
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
	return s.wrote(s.addEvent(ctx, now, service, replica, kind, msg))
}

func (s *Store) addEvent(ctx context.Context, now time.Time, service, replica, kind, msg string) error {
	return addEvent(ctx, s.db, now, service, replica, kind, msg)
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func addEvent(ctx context.Context, db execer, now time.Time, service, replica, kind, msg string) error {
	if _, err := db.ExecContext(ctx, `INSERT INTO events (at, service, replica, kind, message) VALUES (?, ?, ?, ?, ?)`, ms(now), service, replica, kind, msg); err != nil {
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
		err := s.db.QueryRowContext(ctx, `SELECT (SELECT max(id) FROM events WHERE service = ? AND kind = ? AND message = ?) FROM services WHERE name = ?`,
			service, eventService, eventDeleted, service).Scan(&deleted)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return nil, fmt.Errorf("events: %w", err)
		case deleted.Valid:
			after = max(after, deleted.Int64)
		}
	}
	rows, err := s.db.QueryContext(ctx, `SELECT id, at, service, replica, kind, message FROM events
		WHERE id > ? AND (? = '' OR service = ?) AND (? = '' OR replica = ?) ORDER BY id LIMIT ?`,
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
