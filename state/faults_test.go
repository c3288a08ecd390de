package state

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// snapshot is everything a reader can see in a state file, to compare before and after a
// failed write.
type snapshot struct {
	services, versions, replicas, events int
	nextSeq                              int
}

func snap(t *testing.T, s *Store) snapshot {
	t.Helper()
	var sn snapshot
	for q, dst := range map[string]*int{
		`SELECT count(*) FROM services`: &sn.services, `SELECT count(*) FROM versions`: &sn.versions,
		`SELECT count(*) FROM replicas`: &sn.replicas, `SELECT count(*) FROM events`: &sn.events,
		`SELECT coalesce(sum(next_seq), 0) FROM services`: &sn.nextSeq,
	} {
		if err := s.db.QueryRow(q).Scan(dst); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return sn
}

// writeEverything runs one of each write a control plane makes and returns the first error.
func writeEverything(ctx context.Context, s *Store, now time.Time, i int) error {
	if _, err := s.PutService(ctx, "svc", strings.Repeat("run: x\n", 50), "", now); err != nil {
		return err
	}
	r, err := s.NewReplica(ctx, Replica{Service: "svc", Version: 1, Provider: "local", State: "pending", Reason: fmt.Sprintf("write %d", i)}, now)
	if err != nil {
		return err
	}
	r.State, r.Handle, r.Reason = "starting", "h", strings.Repeat("why ", 40)
	if err := s.SaveReplica(ctx, r, "pending", now); err != nil {
		return err
	}
	if err := s.AddTokens(ctx, "svc", 1); err != nil {
		return err
	}
	if err := s.AddAdapterUse(ctx, "svc", []AdapterUse{{Adapter: "fin", Requests: 1, Tokens: 10}, {Adapter: "sql", Tokens: 0.5}}, now); err != nil {
		return err
	}
	if err := s.AddTenantSpend(ctx, []TenantUse{{Tenant: "acme", Dollars: 0.25, Tokens: 100, Requests: 1}}, now); err != nil {
		return err
	}
	return s.AddEvent(ctx, now, "svc", r.ID, "note", strings.Repeat("e", 300))
}

// A full disk fails the write with an error that says so, changes nothing that was not
// committed, and leaves a file that passes SQLite's integrity check and takes writes again
// once space is back. max_page_count makes SQLite answer exactly as on a full disk
// (SQLITE_FULL); TestDiskFullOnARealFilesystem does it with a real one.
func TestFullDatabaseFailsCleanly(t *testing.T) {
	ctx := context.Background()
	s, err := Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.UnixMilli(1_700_000_000_000)
	if err := writeEverything(ctx, s, now, 0); err != nil {
		t.Fatal(err)
	}
	var pages int
	if err := s.db.QueryRow(`PRAGMA page_count`).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Exec(fmt.Sprintf(`PRAGMA max_page_count = %d`, pages+3)); err != nil {
		t.Fatal(err)
	}
	var full error
	var before snapshot
	for i := 1; i < 1000 && full == nil; i++ {
		before = snap(t, s)
		full = writeEverything(ctx, s, now, i)
	}
	if full == nil {
		t.Fatal("1000 rounds of writes fit in 3 pages: max_page_count had no effect")
	}
	if why := Unavailable(full); !strings.Contains(why, "full") {
		t.Fatalf("Unavailable(%v) = %q; want it to say the disk is full", full, why)
	}
	t.Logf("the write failed with: %v", full)
	// The failed round may have committed its first writes (each is its own transaction),
	// but none half: every replica row has its creation event.
	after := snap(t, s)
	if after.replicas < before.replicas || after.events < before.events {
		t.Fatalf("rows lost: before %+v, after %+v", before, after)
	}
	var orphans int
	if err := s.db.QueryRow(`SELECT count(*) FROM replicas r WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.replica = r.id)`).Scan(&orphans); err != nil {
		t.Fatal(err)
	}
	if orphans != 0 {
		t.Fatalf("%d replica rows without their event: a transaction was cut in half", orphans)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("integrity check after the full disk: %v", err)
	}
	if _, err := s.db.Exec(`PRAGMA max_page_count = 1000000`); err != nil {
		t.Fatal(err)
	}
	if err := writeEverything(ctx, s, now, 9999); err != nil {
		t.Fatalf("write after space came back: %v", err)
	}
}

// Another process holding the store's write locks (a backup, an operator's sqlite3 shell
// or psql session) fails writes after the busy timeout with an error that says so; nothing
// is half-written, reads go on, and writes work again when the lock is released.
func TestLockedStoreFailsCleanly(t *testing.T) {
	forEachBackend(t, lockedStoreFailsCleanly)
}

func lockedStoreFailsCleanly(t *testing.T, b backend, setting string) {
	ctx := context.Background()
	s := openSetting(t, setting, Options{BusyTimeout: 150 * time.Millisecond})
	defer s.Close()
	now := time.UnixMilli(1_700_000_000_000)
	if err := writeEverything(ctx, s, now, 0); err != nil {
		t.Fatal(err)
	}
	unlock := b.lock(t, setting)
	before := snap(t, s)
	start := time.Now()
	_, err := s.NewReplica(ctx, Replica{Service: "svc", Version: 1, Provider: "local", State: "pending"}, now)
	if err == nil {
		t.Fatal("NewReplica succeeded while another process held the write lock")
	}
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Errorf("failed after %v, before its busy timeout", waited)
	}
	if why := Unavailable(err); !strings.Contains(why, "locked") {
		t.Fatalf("Unavailable(%v) = %q; want it to say the store is locked", err, why)
	}
	t.Logf("the write failed with: %v (%s)", err, Unavailable(err))
	// The next write does not wait out the timeout again: one stalled write per busy
	// spell, not one per write.
	start = time.Now()
	if err := s.AddEvent(ctx, now, "svc", "", "note", "x"); err == nil || !strings.Contains(Unavailable(err), "locked") {
		t.Fatalf("a write right after a busy one: %v (%q); want a fast busy error saying it is locked", err, Unavailable(err))
	}
	if waited := time.Since(start); waited > 50*time.Millisecond {
		t.Errorf("the second write waited %v; want it to fail at once", waited)
	}
	if after := snap(t, s); after != before {
		t.Fatalf("a failed write changed the store: before %+v, after %+v", before, after)
	}
	if _, err := s.Replicas(ctx, "svc", true); err != nil {
		t.Fatalf("reads must go on while another process writes: %v", err)
	}
	unlock()
	var r Replica
	deadline := time.Now().Add(busyBackoff + time.Second)
	for {
		if r, err = s.NewReplica(ctx, Replica{Service: "svc", Version: 1, Provider: "local", State: "pending"}, now); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("write after the lock was released: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r.ID != "svc-2" {
		t.Fatalf("replica ID %s; want svc-2 (the failed write must not use up a sequence number)", r.ID)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
}

// A damaged file is refused at open, naming the damage, rather than acted on.
func TestOpenRefusesACorruptFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_700_000_000_000)
	for i := range 50 {
		if err := writeEverything(context.Background(), s, now, i); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Overwrite the second page onward (keeping the header page) with garbage.
	for i := 4096; i < len(b) && i < 4096*6; i++ {
		b[i] = byte(i * 7)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path)
	if err == nil {
		s.Close()
		t.Fatal("Open accepted a file with garbage pages")
	}
	if !errors.Is(err, ErrCorrupt) && !strings.Contains(err.Error(), "malformed") {
		t.Fatalf("Open refused the file with %v; want the integrity check's verdict", err)
	}
	t.Logf("refused: %v", err)
}

// The same as TestFullDatabaseFailsCleanly on a real filesystem that fills up: a 640 KiB
// tmpfs mounted in a private mount namespace (unshare -rm, no privileges needed where user
// namespaces are allowed). The test re-runs itself inside it.
func TestDiskFullOnARealFilesystem(t *testing.T) {
	if dir := os.Getenv("ARBITER_STATE_TMPFS"); dir != "" {
		diskFullInside(t, dir)
		return
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("unshare (util-linux) not installed; TestFullDatabaseFailsCleanly covers SQLite's side")
	}
	dir := t.TempDir()
	cmd := exec.Command(unshare, "-rm", "sh", "-c", `mount -t tmpfs -o size=640k arbiter-test "$1" && exec "$2" -test.run '^TestDiskFullOnARealFilesystem$' -test.v -test.count=1`,
		"sh", dir, os.Args[0])
	cmd.Env = append(os.Environ(), "ARBITER_STATE_TMPFS="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil && (strings.Contains(string(out), "unshare failed") || strings.Contains(string(out), "mount:")) {
		t.Skipf("cannot mount a private tmpfs here (%s); TestFullDatabaseFailsCleanly covers SQLite's side", strings.TrimSpace(string(out)))
	}
	if err != nil || !strings.Contains(string(out), "--- PASS: TestDiskFullOnARealFilesystem") {
		t.Fatalf("inside the tmpfs: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "faults_test.go") {
			t.Log(strings.TrimSpace(line))
		}
	}
}

func diskFullInside(t *testing.T, dir string) {
	ctx := context.Background()
	// Ballast, freed later to give the disk space back.
	ballast := filepath.Join(dir, "ballast")
	if err := os.WriteFile(ballast, make([]byte, 160<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_700_000_000_000)
	var full error
	rounds := 0
	for ; rounds < 100000 && full == nil; rounds++ {
		full = writeEverything(ctx, s, now, rounds)
	}
	if full == nil {
		t.Fatal("the tmpfs never filled")
	}
	if why := Unavailable(full); why == "" {
		t.Fatalf("Unavailable(%v) = \"\"; want a reason", full)
	}
	t.Logf("after %d rounds the write failed with: %v (%s)", rounds, full, Unavailable(full))
	committed := snap(t, s)
	if err := s.Check(ctx); err != nil {
		t.Fatalf("integrity check on the full disk: %v", err)
	}
	s.Close() // may fail to checkpoint: the WAL stays and is replayed at the next open
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path)
	if err != nil {
		t.Fatalf("reopen after space came back: %v", err)
	}
	defer s.Close()
	if got := snap(t, s); got != committed {
		t.Fatalf("after reopen: %+v; want what was committed before the disk filled: %+v", got, committed)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("integrity check after reopen: %v", err)
	}
	if err := writeEverything(ctx, s, now, rounds+1); err != nil && !errors.Is(err, ErrNotFound) {
		t.Fatalf("write after space came back: %v", err)
	}
}
