package state

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/state/pgtest"
)

// A PostgreSQL server that goes away fails writes within the write timeout with an error
// that says the database is out of reach, the writes after it at once, while what was
// committed stays; once the server is back, writes go on where they were.
func TestPostgresOutOfReachFailsCleanly(t *testing.T) {
	ctx := context.Background()
	pg := pgtest.Start(t)
	url := pg.NewDatabase(t)
	s := openSetting(t, url, Options{WriteTimeout: 2 * time.Second})
	defer s.Close()
	now := time.UnixMilli(1_700_000_000_000)
	if err := writeEverything(ctx, s, now, 0); err != nil {
		t.Fatal(err)
	}
	before := snap(t, s)
	pg.Stop()
	start := time.Now()
	_, err := s.NewReplica(ctx, Replica{Service: "svc", Version: 1, Provider: "local", State: "pending"}, now)
	if err == nil {
		t.Fatal("NewReplica succeeded with the server stopped")
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("the write failed after %v; want within its 2 s write timeout", took)
	}
	if why := Unavailable(err); !strings.Contains(why, "out of reach") {
		t.Fatalf("Unavailable(%v) = %q; want it to say the database is out of reach", err, why)
	}
	t.Logf("the write failed with: %v (%s)", err, Unavailable(err))
	start = time.Now()
	if err := s.AddEvent(ctx, now, "svc", "", "note", "x"); err == nil || !strings.Contains(Unavailable(err), "out of reach") {
		t.Fatalf("a write right after: %v (%q); want a fast error saying it is out of reach", err, Unavailable(err))
	}
	if took := time.Since(start); took > 50*time.Millisecond {
		t.Errorf("the second write waited %v; want it to fail at once", took)
	}
	if err := pg.Restart(); err != nil {
		t.Fatal(err)
	}
	if after := snap(t, s); after != before {
		t.Fatalf("the store changed while its server was down: before %+v, after %+v", before, after)
	}
	var r Replica
	for deadline := time.Now().Add(busyBackoff + 10*time.Second); ; time.Sleep(100 * time.Millisecond) {
		if r, err = s.NewReplica(ctx, Replica{Service: "svc", Version: 1, Provider: "local", State: "pending"}, now); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("write after the server came back: %v", err)
		}
	}
	if r.ID != "svc-2" {
		t.Fatalf("replica ID %s; want svc-2", r.ID)
	}
}

// Control planes that start together against one new database migrate it once: goose's
// advisory lock makes the others wait, and all of them then use the same schema.
func TestPostgresConcurrentOpensMigrateOnce(t *testing.T) {
	url := pgtest.DSN(t)
	var wg sync.WaitGroup
	stores := make([]*Store, 8)
	errs := make([]error, len(stores))
	for i := range stores {
		wg.Go(func() { stores[i], errs[i] = OpenPostgres(context.Background(), url, Options{}) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	var applied []int64
	rows, err := stores[0].db.Query(`SELECT version_id FROM goose_db_version WHERE is_applied ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		applied = append(applied, v)
	}
	if !slices.Equal(applied, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}) {
		t.Fatalf("versions recorded: %v; want [0 1 2 3 4 5 6 7 8 9 10 11], each once", applied)
	}
	now := time.UnixMilli(1_700_000_000_000)
	if err := writeEverything(context.Background(), stores[7], now, 0); err != nil {
		t.Fatal(err)
	}
}

// A SQLite home copied into PostgreSQL reads back the same, and the copy goes on where the
// file stopped: the next replica ID and the next event ID follow the copied ones. A second
// copy into the same database is refused.
func TestCopySQLiteIntoPostgres(t *testing.T) {
	ctx := context.Background()
	src := openSetting(t, backends[0].setting(t), Options{})
	defer src.Close()
	now := time.UnixMilli(1_700_000_000_000)
	for i := range 3 {
		if err := writeEverything(ctx, src, now.Add(time.Duration(i)*time.Second), i); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.MarkSetupDone(ctx, "svc", 2); err != nil {
		t.Fatal(err)
	}
	owner, err := src.DeploymentValue(ctx, LocalOwnerKey, func() (string, error) { return "arbiter-sqlite", nil })
	if err != nil {
		t.Fatal(err)
	}
	dst := openSetting(t, pgtest.DSN(t), Options{})
	defer dst.Close()
	// A control plane opened the database before the copy and stored an owner of its own;
	// it tags nothing yet, and the file's replaces it.
	if _, err := dst.DeploymentValue(ctx, LocalOwnerKey, func() (string, error) { return "arbiter-postgres", nil }); err != nil {
		t.Fatal(err)
	}
	n, err := Copy(ctx, dst, src)
	if err != nil {
		t.Fatal(err)
	}
	if n.Services != 1 || n.Versions != 3 || n.Replicas != 3 || n.Events != 3*3+3 || n.AdapterUses != 2 || n.TenantSpends != 1 {
		t.Fatalf("copied %+v; want 1 service, 3 versions, 3 replicas, 12 events, 2 adapters' use, 1 tenant-day", n)
	}
	same := func(what string, a, b any, errA, errB error) {
		t.Helper()
		if errA != nil || errB != nil {
			t.Fatalf("%s: %v, %v", what, errA, errB)
		}
		if ja, jb := strings.TrimSpace(fmtJSON(t, a)), strings.TrimSpace(fmtJSON(t, b)); ja != jb {
			t.Fatalf("%s differ:\nsqlite   %s\npostgres %s", what, ja, jb)
		}
	}
	sa, ea := src.Services(ctx)
	sb, eb := dst.Services(ctx)
	same("services", sa, sb, ea, eb)
	ra, ea := src.Replicas(ctx, "", true)
	rb, eb := dst.Replicas(ctx, "", true)
	same("replicas", ra, rb, ea, eb)
	va, ea := src.GetVersion(ctx, "svc", 2)
	vb, eb := dst.GetVersion(ctx, "svc", 2)
	same("version 2", va, vb, ea, eb)
	eva, ea := src.Events(ctx, "", "", 0, 1000)
	evb, eb := dst.Events(ctx, "", "", 0, 1000)
	same("events", eva, evb, ea, eb)
	ua, ea := src.AdapterUses(ctx)
	ub, eb := dst.AdapterUses(ctx)
	same("adapter use", ua, ub, ea, eb)
	tsa, ea := src.TenantSpends(ctx, now)
	tsb, eb := dst.TenantSpends(ctx, now)
	same("tenant spend", tsa, tsb, ea, eb)
	if acme := tsb["acme"]; acme.DayDollars != 0.75 || acme.MonthDollars != 0.75 || acme.DayTokens != 300 {
		t.Fatalf("acme's spend after three writes: %+v; want $0.75 and 300 tokens, the day's and the month's", acme)
	}
	if fin := ub["svc"]["fin"]; fin.Requests != 3 || fin.Tokens != 30 || !fin.Since.Equal(now) {
		t.Fatalf("fin's use after three writes: %+v; want 3 requests, 30 tokens, since the first", fin)
	}
	if got, err := dst.DeploymentValue(ctx, LocalOwnerKey, nil); err != nil || got != owner {
		t.Fatalf("the copy's owner: %q, %v; want the file's %q, or its replicas are not found", got, err, owner)
	}

	r, err := dst.NewReplica(ctx, Replica{Service: "svc", Version: 3, Provider: "local", State: "pending"}, now)
	if err != nil || r.ID != "svc-4" {
		t.Fatalf("the next replica after the copy: %q, %v; want svc-4", r.ID, err)
	}
	ev, err := dst.Events(ctx, "svc", r.ID, 0, 10)
	if err != nil || len(ev) != 1 || ev[0].ID != eva[len(eva)-1].ID+1 {
		t.Fatalf("the next event after the copy: %+v, %v; want ID %d", ev, err, eva[len(eva)-1].ID+1)
	}
	if _, err := Copy(ctx, dst, src); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("a second copy into the same database: %v; want it refused", err)
	}
}
