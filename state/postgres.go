package state

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// OpenPostgres opens the PostgreSQL database a URL names (postgres://user:pass@host:port/db?…,
// libpq's keywords as query parameters) and brings its schema to the newest version. Unless
// the URL sets them, a connection gives up after o.WriteTimeout, a write waits
// o.BusyTimeout for another session's lock (lock_timeout), and a session idle inside a
// transaction for o.WriteTimeout is ended by the server (idle_in_transaction_session_timeout).
//
// Every write is one transaction that returns only once the server has committed it (the
// server's synchronous_commit decides how durable that is; its default waits for the WAL
// flush, as SQLite's synchronous=FULL does).
func OpenPostgres(ctx context.Context, url string, o Options) (*Store, error) {
	o.defaults()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		// pgx's message names the URL with its password redacted.
		return nil, fmt.Errorf("state database: %w", err)
	}
	name := pgName(cfg)
	if !strings.Contains(url, "connect_timeout") {
		cfg.ConnectTimeout = o.WriteTimeout
	}
	// Session settings the URL does not set.
	unlessSet := func(key, value string) {
		if _, ok := cfg.RuntimeParams[key]; !ok {
			cfg.RuntimeParams[key] = value
		}
	}
	unlessSet("lock_timeout", strconv.FormatInt(o.BusyTimeout.Milliseconds(), 10))
	// A transaction left open longer than a write may take belongs to a client that has
	// gone or been frozen (kill -STOP, a paused VM) while holding its row locks: the leader
	// row's among them, which would keep every standby from taking an expired lease. The
	// server ends such a session, and its locks with it.
	unlessSet("idle_in_transaction_session_timeout", strconv.FormatInt(o.WriteTimeout.Milliseconds(), 10))
	unlessSet("application_name", "arbiter")
	db := stdlib.OpenDB(*cfg)
	// A handful of connections: the control plane's writes are few and short; reads (the
	// API, routers' polls) go on beside a write that waits on a lock.
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(4)
	s := &Store{db: db, d: dialect{name: "postgres", postgres: true}, writeTimeout: o.WriteTimeout}
	pctx, cancel := context.WithTimeout(ctx, o.WriteTimeout)
	err = db.PingContext(pctx)
	cancel()
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("state database %s: %w", name, err)
	}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("state database %s: %w", name, err)
	}
	return s, nil
}

// pgName names a database for messages: host, port and database, never the password.
func pgName(cfg *pgx.ConnConfig) string {
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
}

// pgState is an error's SQLSTATE from the server, or "".
func pgState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// pgUnreachable reports whether a write failed because the server could not be reached or
// stopped answering: a refused or timed-out connection, one cut mid-write, a server shutting
// down or starting up (SQLSTATE classes 08 and 57P).
func pgUnreachable(err error) bool {
	var ce *pgconn.ConnectError
	var ne net.Error
	switch code := pgState(err); {
	case strings.HasPrefix(code, "08"), code == "57P01", code == "57P02", code == "57P03", code == "53300":
		return true
	case code != "":
		return false
	}
	return errors.As(err, &ce) || errors.Is(err, errWriteTimeout) || pgconn.Timeout(err) || errors.As(err, &ne) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, driver.ErrBadConn)
}

// pgBusy: another session holds a lock this write needs (lock_timeout), the server is out
// of reach, or it is a read-only standby (during a failover of PostgreSQL itself).
func pgBusy(err error) bool {
	switch pgState(err) {
	case "55P03", "25006":
		return true
	}
	return pgUnreachable(err)
}

// pgUnavailable is Unavailable for PostgreSQL's errors.
func pgUnavailable(err error) string {
	switch code := pgState(err); {
	case code == "55P03":
		return "the state database is locked by another session (PostgreSQL lock timeout); nothing was written"
	case code == "25006":
		return "the state database is read-only (a standby server); nothing was written"
	case code == "53100":
		return "the disk holding the state database is full; nothing was written"
	case code == "58030":
		return "the state database could not write (I/O error); nothing was written"
	case strings.HasPrefix(code, "53") && code != "53300":
		return "the state database server is out of resources (SQLSTATE " + code + "); nothing was written"
	}
	if pgUnreachable(err) {
		// A connection cut while a commit was on its way leaves the outcome unknown to us:
		// the caller acts on neither (a launch whose row is not confirmed is not made; a row
		// that did commit is found and reconciled like one a crash left).
		return "the state database is out of reach; the write was not confirmed"
	}
	return ""
}
