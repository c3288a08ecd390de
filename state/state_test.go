package state

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReplicaLifecycleSurvivesReopen(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, setting string) { replicaLifecycleSurvivesReopen(t, setting) })
}

func replicaLifecycleSurvivesReopen(t *testing.T, setting string) {
	ctx := context.Background()
	s := openSetting(t, setting, Options{})
	now := time.UnixMilli(1_700_000_000_000)
	v, err := s.PutService(ctx, "llm", "run: x", "", now)
	if err != nil || v != 1 {
		t.Fatalf("PutService = %d, %v; want 1", v, err)
	}
	if v, err = s.PutService(ctx, "llm", "run: y", `{"A":"b"}`, now); err != nil || v != 2 {
		t.Fatalf("second PutService = %d, %v; want 2", v, err)
	}
	r, err := s.NewReplica(ctx, Replica{Service: "llm", Version: 2, Provider: "local", State: "pending", Reason: "target 1"}, now)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := s.NewReplica(ctx, Replica{Service: "llm", Version: 2, Provider: "local", State: "pending"}, now)
	if err != nil || r.ID != "llm-1" || r2.ID != "llm-2" {
		t.Fatalf("IDs %q %q (%v); want llm-1 llm-2", r.ID, r2.ID, err)
	}
	r.State, r.Handle, r.Address = "starting", "123:456", "127.0.0.1:9"
	if err := s.SaveReplica(ctx, r, "pending", now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteService(ctx, "llm", now); err == nil {
		t.Fatal("DeleteService with live replicas succeeded")
	}
	s.Close()

	// A crash is a reopen: everything written must be there.
	s = openSetting(t, setting, Options{})
	defer s.Close()
	rows, err := s.Replicas(ctx, "llm", false)
	if err != nil || len(rows) != 2 {
		t.Fatalf("Replicas = %v, %v; want 2 rows", rows, err)
	}
	if rows[0].Handle != "123:456" || rows[0].State != "starting" || rows[0].Address != "127.0.0.1:9" {
		t.Fatalf("row after reopen = %+v", rows[0])
	}
	ev, err := s.Events(ctx, "llm", "llm-1", 0, 100)
	if err != nil || len(ev) != 2 || !strings.HasPrefix(ev[1].Message, "pending → starting") {
		t.Fatalf("events = %+v, %v", ev, err)
	}
	for _, row := range rows {
		prev := row.State
		row.State, row.EndedAt = "terminated", now
		if err := s.SaveReplica(ctx, row, prev, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteService(ctx, "llm", now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetService(ctx, "llm"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetService after delete: %v; want ErrNotFound", err)
	}
	if err := s.SaveReplica(ctx, Replica{ID: "nope"}, "x", now); !errors.Is(err, ErrNotFound) {
		t.Fatalf("SaveReplica unknown: %v", err)
	}
}

// The state file (and SQLite's -wal and -shm beside it) is readable by its owner only, also
// when an older version created it 0644.
func TestStateFilesAreOwnerOnly(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	old := filepath.Join(dir, "old.db")
	if err := os.WriteFile(old, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "state.db"), old} {
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutService(ctx, "svc", "run: x", "", time.Now()); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{path, path + "-wal", path + "-shm"} {
			fi, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: mode %v; want 0600", filepath.Base(f), fi.Mode().Perm())
			}
		}
		s.Close()
	}
}

// A state file written before replicas had a price source opens with the column added,
// its rows intact, and the source is kept from then on.
func TestOlderFileGainsThePriceSourceColumn(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_700_000_000_000)
	if _, err := s.PutService(ctx, "llm", "run: x", "", now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.NewReplica(ctx, Replica{Service: "llm", Version: 1, Provider: "aws", State: "pending", PricePerHour: 0.38}, now); err != nil {
		t.Fatal(err)
	}
	// What the previous version's file looks like: no price source, and no record of
	// migrations (its schema was made by hand).
	for _, q := range []string{"ALTER TABLE replicas DROP COLUMN price_source", "DROP TABLE goose_db_version"} {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	s, err = Open(path)
	if err != nil {
		t.Fatalf("reopening an older file: %v", err)
	}
	defer s.Close()
	rows, err := s.Replicas(ctx, "llm", true)
	if err != nil || len(rows) != 1 || rows[0].PricePerHour != 0.38 || rows[0].PriceSource != "" {
		t.Fatalf("rows %+v %v", rows, err)
	}
	r := rows[0]
	r.PriceSource = "ec2:DescribeSpotPriceHistory"
	if err := s.SaveReplica(ctx, r, r.State, now); err != nil {
		t.Fatal(err)
	}
	if rows, _ := s.Replicas(ctx, "llm", true); rows[0].PriceSource != "ec2:DescribeSpotPriceHistory" {
		t.Fatalf("price source not kept: %+v", rows[0])
	}
}

// A replica's accelerator is written with its intent and read back, and a file from before
// the column opens with it added (empty: not known).
func TestReplicaKeepsItsAccelerator(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_700_000_000_000)
	if _, err := s.PutService(ctx, "llm", "run: x", "", now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.NewReplica(ctx, Replica{Service: "llm", Version: 1, Provider: "aws", State: "pending", Accelerator: "L4"}, now); err != nil {
		t.Fatal(err)
	}
	if rows, err := s.Replicas(ctx, "llm", true); err != nil || len(rows) != 1 || rows[0].Accelerator != "L4" {
		t.Fatalf("rows %+v %v: want the accelerator L4", rows, err)
	}
	// A file from before the column: without it, and without the migrations that added it.
	if _, err := s.db.ExecContext(ctx, "ALTER TABLE replicas DROP COLUMN accelerator"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.ExecContext(ctx, "DELETE FROM goose_db_version WHERE version_id >= 3"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = Open(path); err != nil {
		t.Fatalf("reopening an older file: %v", err)
	}
	defer s.Close()
	if rows, err := s.Replicas(ctx, "llm", true); err != nil || len(rows) != 1 || rows[0].Accelerator != "" {
		t.Fatalf("rows %+v %v", rows, err)
	}
}

// A name deleted and created again is a new service: its events start at its creation, and
// the deleted one's (its problems, its replicas of the same IDs) are not replayed as its
// own. They stay, as history, in the log of every service.
func TestRecreatedServiceStartsANewEventLog(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, setting string) { recreatedServiceStartsANewEventLog(t, setting) })
}

func recreatedServiceStartsANewEventLog(t *testing.T, setting string) {
	ctx := context.Background()
	s := openSetting(t, setting, Options{})
	defer s.Close()
	now := time.UnixMilli(1_700_000_000_000)
	if _, err := s.PutService(ctx, "llm", "run: x", "", now); err != nil {
		t.Fatal(err)
	}
	r, err := s.NewReplica(ctx, Replica{Service: "llm", Version: 1, Provider: "local", State: "pending"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddEvent(ctx, now, "llm", "", "error", "placement waits: catalog unreachable"); err != nil {
		t.Fatal(err)
	}
	r.State, r.EndedAt = "terminated", now
	if err := s.SaveReplica(ctx, r, "pending", now); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteService(ctx, "llm", now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutService(ctx, "llm", "run: y", "", now); err != nil { // the same millisecond
		t.Fatal(err)
	}
	messages := func(service, replica string) []string {
		t.Helper()
		ev, err := s.Events(ctx, service, replica, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ev {
			out = append(out, e.Message)
		}
		return out
	}
	if got := messages("llm", ""); strings.Join(got, "|") != "version 1 submitted" {
		t.Errorf("the new service's events: %q; want only its own submission", got)
	}
	if got := messages("llm", "llm-1"); len(got) != 0 {
		t.Errorf("the new service's llm-1 has the deleted one's events: %q", got)
	}
	if got := messages("", ""); len(got) != 6 || got[2] != "placement waits: catalog unreachable" || got[4] != "deleted" {
		t.Errorf("every service's events: %q; want the whole history, the deleted service's included", got)
	}
}

// A write's Idempotency-Key is recorded with the version it made, in the same transaction
// (issue 46 §2): found after, on either database; a second write with the same key is
// refused and writes nothing; a day later the key is forgotten.
func TestPutServiceOnceRecordsItsKey(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, setting string) {
		ctx := context.Background()
		s := openSetting(t, setting, Options{})
		defer s.Close()
		t0 := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
		if _, _, err := s.Request(ctx, "k1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("an unknown key: %v; want ErrNotFound", err)
		}
		if v, err := s.PutServiceOnce(ctx, "k1", "svc", "spec: 1", "", t0); err != nil || v != 1 {
			t.Fatalf("first write: version %d, %v", v, err)
		}
		if v, err := s.PutServiceOnce(ctx, "k2", "svc", "spec: 2", "", t0); err != nil || v != 2 {
			t.Fatalf("second write: version %d, %v", v, err)
		}
		if svc, v, err := s.Request(ctx, "k1"); err != nil || svc != "svc" || v != 1 {
			t.Fatalf("k1: %s %d %v; want svc version 1", svc, v, err)
		}
		if _, err := s.PutServiceOnce(ctx, "k2", "svc", "spec: 3", "", t0); err == nil {
			t.Fatal("a key used twice was taken twice")
		}
		if sv, err := s.GetService(ctx, "svc"); err != nil || sv.Version != 2 {
			t.Fatalf("after the refused write: version %d, %v; want 2", sv.Version, err)
		}
		if _, err := s.PutServiceOnce(ctx, "k3", "svc", "spec: 3", "", t0.Add(requestsKept+time.Minute)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Request(ctx, "k1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("k1 a day later: %v; want forgotten", err)
		}
	})
}

// A tenant's spend adds up per UTC day; the month's sum holds every day of its calendar
// month and none of the month before; a spend that is not an amount is refused whole.
func TestTenantSpendByDayAndMonth(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			s := openSetting(t, b.setting(t), Options{})
			defer s.Close()
			at := func(v string) time.Time {
				tm, err := time.Parse(time.RFC3339, v)
				if err != nil {
					t.Fatal(err)
				}
				return tm
			}
			for _, w := range []struct {
				when    string
				dollars float64
			}{{"2026-10-31T23:59:59Z", 100}, {"2026-11-01T00:00:00Z", 1}, {"2026-11-29T12:00:00Z", 2}, {"2026-11-30T00:30:00+02:00", 4}, {"2026-11-30T10:00:00Z", 8}} {
				if err := s.AddTenantSpend(ctx, []TenantUse{{Tenant: "acme", Dollars: w.dollars, Tokens: 10 * w.dollars, Requests: 1}, {Tenant: "beta", Dollars: 0.5}}, at(w.when)); err != nil {
					t.Fatal(err)
				}
			}
			got, err := s.TenantSpends(ctx, at("2026-11-30T18:00:00Z"))
			if err != nil {
				t.Fatal(err)
			}
			// 00:30 at +02:00 is the 29th in UTC.
			if a := got["acme"]; a.DayDollars != 8 || a.MonthDollars != 15 || a.DayTokens != 80 || a.MonthTokens != 150 {
				t.Errorf("acme on 2026-11-30: %+v; want day $8, month $15 (not October's $100)", a)
			}
			if b := got["beta"]; b.DayDollars != 0.5 || b.MonthDollars != 2 {
				t.Errorf("beta: %+v", b)
			}
			if err := s.AddTenantSpend(ctx, []TenantUse{{Tenant: "acme", Dollars: 1}, {Tenant: "beta", Dollars: math.NaN()}}, at("2026-11-30T19:00:00Z")); err == nil {
				t.Error("a NaN spend was taken")
			}
			if got, _ := s.TenantSpends(ctx, at("2026-11-30T19:00:00Z")); got["acme"].DayDollars != 8 {
				t.Errorf("after a refused write acme's day is $%v; want $8 (nothing of it written)", got["acme"].DayDollars)
			}
		})
	}
}

// A replica of a LoRA adapter's own (issue 51) keeps its adapter, in either backend.
func TestReplicaKeepsItsAdapter(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, setting string) {
		ctx := context.Background()
		s := openSetting(t, setting, Options{})
		defer s.Close()
		now := time.UnixMilli(1_700_000_000_000)
		if _, err := s.PutService(ctx, "llm", "run: x", "", now); err != nil {
			t.Fatal(err)
		}
		for _, a := range []string{"fin", ""} {
			if _, err := s.NewReplica(ctx, Replica{Service: "llm", Version: 1, Provider: "local", State: "pending", Adapter: a}, now); err != nil {
				t.Fatal(err)
			}
		}
		rows, err := s.Replicas(ctx, "llm", true)
		if err != nil || len(rows) != 2 || rows[0].Adapter != "fin" || rows[1].Adapter != "" {
			t.Fatalf("rows %+v %v: want the adapter fin, then none", rows, err)
		}
	})
}
