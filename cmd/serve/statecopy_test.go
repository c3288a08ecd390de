package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/state"
	"github.com/arbiter-serve/arbiter/state/pgtest"
)

// serve state copy moves a home's SQLite state into PostgreSQL, says what it copied, and
// refuses a second copy into the same database.
func TestStateCopyIntoPostgres(t *testing.T) {
	ctx := context.Background()
	home := t.TempDir()
	st, err := state.Open(control.StatePath(home))
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_700_000_000_000)
	if _, err := st.PutService(ctx, "llm", "run: x", "", now); err != nil {
		t.Fatal(err)
	}
	if _, err := st.NewReplica(ctx, state.Replica{Service: "llm", Version: 1, Provider: "local", State: "pending"}, now); err != nil {
		t.Fatal(err)
	}
	st.Close()
	url := pgtest.Start(t).NewDatabase(t)
	run := func() (string, error) {
		cmd := root()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs([]string{"--home", home, "state", "copy", "--to", url})
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}
	out, err := run()
	if err != nil {
		t.Fatal(err)
	}
	if want := "1 services, 1 versions, 1 replicas, 2 events"; !strings.Contains(out, want) || strings.Contains(out, "postgres@") {
		t.Fatalf("output %q; want it to say %q and name the database without its user", out, want)
	}
	pg, err := state.OpenPostgres(ctx, url, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	rows, err := pg.Replicas(ctx, "llm", false)
	if err != nil || len(rows) != 1 || rows[0].ID != "llm-1" {
		t.Fatalf("replicas in PostgreSQL: %+v, %v", rows, err)
	}
	if _, err := run(); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("a second copy: %v; want it refused", err)
	}
	if _, err := state.Open(filepath.Join(home, "state.db")); err != nil {
		t.Fatalf("the SQLite file after the copy: %v", err)
	}
}
