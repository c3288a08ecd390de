package state

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/arbiter-serve/arbiter/state/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Shutdown()
	os.Exit(code)
}

// backend is one database the store runs on, for tests that must hold on both.
type backend struct {
	name string
	// setting makes a new, empty store's setting (a file path or a PostgreSQL URL).
	setting func(t *testing.T) string
	// lock takes, from another connection, the locks a write needs (as an operator's
	// sqlite3 shell or psql session, or a backup, would) while reads go on; unlock
	// releases them.
	lock func(t *testing.T, setting string) (unlock func())
}

var backends = []backend{
	{name: "sqlite", setting: func(t *testing.T) string { return filepath.Join(t.TempDir(), "state.db") }, lock: lockSQLite},
	{name: "postgres", setting: func(t *testing.T) string { return pgtest.DSN(t) }, lock: lockPostgres},
}

// forEachBackend runs f once per backend, each as a subtest with a new store's setting.
func forEachBackend(t *testing.T, f func(t *testing.T, b backend, setting string)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { f(t, b, b.setting(t)) })
	}
}

func openSetting(t *testing.T, setting string, o Options) *Store {
	t.Helper()
	s, err := OpenSetting(context.Background(), setting, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// holdTx opens a connection of another process's kind to the store and runs stmts in a
// transaction it keeps open until unlock.
func holdTx(t *testing.T, driver, dsn string, stmts ...string) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	other, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	for _, q := range stmts {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return func() {
		if _, err := conn.ExecContext(ctx, `ROLLBACK`); err != nil {
			t.Fatal(err)
		}
	}
}

func lockSQLite(t *testing.T, path string) func() {
	return holdTx(t, "sqlite", "file:"+path+"?_pragma=busy_timeout(100)", `BEGIN IMMEDIATE`)
}

// lockPostgres takes EXCLUSIVE locks on every table: they conflict with every write and let
// plain reads through, as SQLite's BEGIN IMMEDIATE does.
func lockPostgres(t *testing.T, url string) func() {
	return holdTx(t, "pgx", url, `BEGIN`, `LOCK TABLE services, versions, replicas, events IN EXCLUSIVE MODE`)
}

func fmtJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
