package control

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
)

// Two routers report one tenant's spend: every answer carries the tenant's total across
// both, the part not saved yet included; a tick saves it in the state file, and a control
// plane started afresh on that file answers the same totals. A spend that is not an
// amount, or a tenant named twice, is refused whole (400) and counts for nothing.
func TestTenantSpendSharedAndKept(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "state.db")
	start := func() (*Controller, *httptest.Server, *state.Store) {
		st, err := state.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		c, err := New(context.Background(), Config{Store: st, Providers: map[string]replicas.Provider{"local": &memProvider{running: map[string]replicas.Instance{}}}, Token: "secret", Now: clock.Now,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(c.Handler())
		return c, srv, st
	}
	c, srv, st := start()
	report := func(srv *httptest.Server, router, tenants string) fleet.LoadAnswer {
		t.Helper()
		code, body := call(t, srv, "POST", "/v1/load", "secret", `{"router":"`+router+`","models":[],"replicas":[],"tenants":[`+tenants+`]}`)
		if code != 200 {
			t.Fatalf("report from %s: %d %s", router, code, body)
		}
		var ans fleet.LoadAnswer
		if err := json.Unmarshal([]byte(body), &ans); err != nil {
			t.Fatal(err)
		}
		return ans
	}
	spend := func(ans fleet.LoadAnswer, tenant string) fleet.TenantSpend {
		for _, s := range ans.Tenants {
			if s.Tenant == tenant {
				return s
			}
		}
		return fleet.TenantSpend{}
	}
	report(srv, "r1", `{"tenant":"acme","dollars":1.5,"tokens":1000,"requests":2}`)
	ans := report(srv, "r2", `{"tenant":"acme","dollars":0.25,"tokens":100,"requests":1},{"tenant":"beta","dollars":0.5}`)
	if a := spend(ans, "acme"); ans.Day != "2026-11-30" || a.DayDollars != 1.75 || a.MonthDollars != 1.75 || a.DayTokens != 1100 {
		t.Fatalf("answer to the second router before a tick: %+v; want acme's $1.75 across both routers", ans)
	}
	for _, bad := range []string{
		`{"tenant":"acme","dollars":-1}`,
		`{"tenant":"acme","dollars":1e300}`,
		`{"tenant":"","dollars":1}`,
		`{"tenant":"acme","dollars":1},{"tenant":"acme","dollars":1}`,
		`{"tenant":"a\u0007b","dollars":1}`,
	} {
		if code, body := call(t, srv, "POST", "/v1/load", "secret", `{"router":"r1","models":[],"tenants":[`+bad+`]}`); code != 400 || !strings.Contains(body, "tenants[") {
			t.Fatalf("a report with tenants %s: %d %s; want 400 naming the entry", bad, code, body)
		}
	}
	c.tick(context.Background())
	got, err := st.TenantSpends(context.Background(), clock.Now())
	if err != nil || got["acme"].DayDollars != 1.75 || got["beta"].DayDollars != 0.5 {
		t.Fatalf("saved after a tick: %+v %v; want acme $1.75, beta $0.5", got, err)
	}
	if a := spend(report(srv, "r1", ``), "acme"); a.DayDollars != 1.75 {
		t.Fatalf("after the tick: acme %+v; want the saved $1.75, counted once", a)
	}
	// A tick that saves more keeps the totals up with it.
	report(srv, "r1", `{"tenant":"acme","dollars":0.25}`)
	c.tick(context.Background())
	if a := spend(report(srv, "r2", ``), "acme"); a.DayDollars != 2 || a.MonthDollars != 2 {
		t.Fatalf("after a second tick: acme %+v; want $2, counted once", a)
	}
	if got, err := st.TenantSpends(context.Background(), clock.Now()); err != nil || got["acme"].DayDollars != 2 {
		t.Fatalf("saved after a second tick: %+v %v; want acme $2", got, err)
	}
	// A restart: the spend is read back from the file.
	srv.Close()
	st.Close()
	c, srv, st = start()
	defer st.Close()
	defer srv.Close()
	c.tick(context.Background())
	if a := spend(report(srv, "r2", ``), "acme"); a.DayDollars != 2 || a.MonthDollars != 2 {
		t.Fatalf("after a restart: acme %+v; want the $2 read back", a)
	}
	// serve status reads the same through GET /v1/tenants.
	code, body := call(t, srv, "GET", "/v1/tenants", "secret", "")
	var listed fleet.LoadAnswer
	if err := json.Unmarshal([]byte(body), &listed); code != 200 || err != nil || spend(listed, "acme").MonthDollars != 2 || spend(listed, "beta").DayDollars != 0.5 {
		t.Fatalf("GET /v1/tenants: %d %s", code, body)
	}
	// The next day, in the next month: both start again.
	clock.Add(24 * time.Hour)
	c.tick(context.Background())
	ans = report(srv, "r1", `{"tenant":"acme","dollars":1}`)
	if a := spend(ans, "acme"); ans.Day != "2026-12-01" || a.DayDollars != 1 || a.MonthDollars != 1 {
		t.Fatalf("on 2026-12-01: %+v; want a new month: $1 today and this month", ans)
	}
}
