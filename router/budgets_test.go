package router

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

const (
	acmeKey = "sk-acme-0123456789abcdef0"
	betaKey = "sk-beta-0123456789abcdef0"
)

// budgetRouter is a router following fake, with the keys file keysYAML, in front of one
// replica that costs $0.01 a token ($36/h at 1 token/s).
func budgetRouter(t *testing.T, fake *fakeControlPlane, s *sim, keysYAML string) (*rig, *ControlPlane) {
	t.Helper()
	fake.publish([]fleet.Service{{Name: "svc", Models: []string{testModel}}},
		[]fleet.Replica{{ID: "a", Address: s.addr, Model: testModel, Provider: "local", Capacity: fleet.OnDemand, PricePerHour: 36, TokensPerSecond: 1}})
	ks, err := ParseKeys([]byte(keysYAML), "")
	if err != nil {
		t.Fatal(err)
	}
	cps := httptest.NewServer(fake)
	t.Cleanup(cps.Close)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var cp *ControlPlane
	r := startRouterWith(t, nil, func(px *Proxy, pool *Pool) {
		px.SetKeys(ks)
		cp = NewControlPlane(cps.URL, "tok", "r1", pool, px.Load, slog.New(slog.DiscardHandler))
		cp.ReportEvery = 50 * time.Millisecond
		px.ControlPlane = cp
	})
	go cp.Run(ctx)
	waitFor(t, "the first ready set", func() bool { return cp.Revision() >= 1 })
	waitFor(t, "the replica available", func() bool { return r.pool.Get("a") != nil && r.pool.Get("a").Available(time.Now()) })
	return r, cp
}

const budgetKeys = `keys:
  - {name: acme-web, key: ` + acmeKey + `, tenant: acme}
  - {name: beta, key: ` + betaKey + `}
tenants:
  - {name: acme, budget: {period: day, soft_dollars: 0.5, hard_dollars: 1}}
`

// A tenant's hard limit counts what every router spent (the control plane's answer, here
// $0.90 another router spent) and what this one counted since: the request that crosses it
// is answered in full, and so is a stream already under way; the next one gets 429
// budget_exceeded, told not to retry before the day ends. Another tenant is not touched.
func TestBudgetHardLimitSharedAndNeverCutsAStream(t *testing.T) {
	s := startSim(t, simOpts{echo: true, interval: 250 * time.Millisecond})
	fake := &fakeControlPlane{changed: make(chan struct{}), spend: map[string]fleet.TenantSpend{"acme": {Tenant: "acme", DayDollars: 0.9, MonthDollars: 0.9}}}
	r, _ := budgetRouter(t, fake, s, budgetKeys)
	now := func() time.Time { return time.Now() }
	waitFor(t, "the other router's $0.90 learned", func() bool { return r.px.Load.spend.spent("acme", false, now()) >= 0.9 })

	// A stream starts under the limit and runs for about two seconds.
	req, _ := http.NewRequest(http.MethodPost, r.url+"/v1/chat/completions", strings.NewReader(chatBody(true, `,"stream_options":{"include_usage":true}`)))
	req.Header.Set("Authorization", "Bearer "+acmeKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the stream: %v %v", resp, err)
	}
	streamed := make(chan []string, 1)
	go func() { ev, _ := readEvents(t, resp.Body); resp.Body.Close(); streamed <- ev }()

	// A request under the limit crosses it: it is answered in full.
	if resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "Authorization", "Bearer "+acmeKey); resp.StatusCode != 200 {
		t.Fatalf("a request under the limit: %d %s", resp.StatusCode, body)
	}
	if got := r.px.Load.spend.spent("acme", false, now()); got < 1 {
		t.Fatalf("acme's spend after it: $%v; want past the $1 hard limit", got)
	}
	resp2, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "Authorization", "Bearer "+acmeKey)
	typ, code := openAIError(t, body)
	retry, _ := strconv.Atoi(resp2.Header.Get("Retry-After"))
	if resp2.StatusCode != 429 || typ != "insufficient_quota" || code != "budget_exceeded" || resp2.Header.Get("X-Should-Retry") != "false" ||
		retry < 1 || retry > 86400 || !strings.Contains(body, "tenant acme spent $") || !strings.Contains(body, "daily hard limit of $1.00") {
		t.Fatalf("over the limit: HTTP %d, Retry-After %q, X-Should-Retry %q, %s; want 429 insufficient_quota budget_exceeded, not to be retried before midnight UTC",
			resp2.StatusCode, resp2.Header.Get("Retry-After"), resp2.Header.Get("X-Should-Retry"), body)
	}
	if resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "Authorization", "Bearer "+betaKey); resp.StatusCode != 200 {
		t.Fatalf("another tenant: %d %s", resp.StatusCode, body)
	}
	ev := <-streamed
	if len(ev) < 3 || !strings.Contains(ev[len(ev)-1], "[DONE]") || !strings.Contains(ev[len(ev)-2], `"usage"`) {
		t.Fatalf("the stream started under the limit was cut: %d events, last %q", len(ev), ev[len(ev)-1])
	}
	// Everything this router counted reaches the control plane, once.
	waitFor(t, "the spend reported", func() bool {
		fake.mu.Lock()
		defer fake.mu.Unlock()
		return fake.spend["acme"].DayDollars >= r.px.Load.spend.spent("acme", false, now())-1e-9 && len(r.px.Load.spend.pending) == 0
	})
	if got := r.counter(t, "arbiter_router_tenant_budget_dollars", "tenant", "acme", "limit", "hard"); got != 1 {
		t.Errorf("hard budget gauge %v; want 1", got)
	}
	if got := r.counter(t, "arbiter_router_tenant_spend_dollars", "tenant", "acme", "period", "day"); got < 1 {
		t.Errorf("spend gauge %v; want past 1", got)
	}
}

// A report whose answer is lost keeps its spend, which the next report sends again (it may
// be counted twice, never lost); the budget counts it meanwhile.
func TestBudgetSpendKeptWhenAReportIsLost(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	fake := &fakeControlPlane{changed: make(chan struct{}), lose: true}
	r, _ := budgetRouter(t, fake, s, budgetKeys)
	if resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "Authorization", "Bearer "+acmeKey); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	spent := r.px.Load.spend.spent("acme", false, time.Now())
	if spent <= 0 {
		t.Fatal("nothing counted")
	}
	waitFor(t, "a report lost", func() bool {
		fake.mu.Lock()
		defer fake.mu.Unlock()
		return fake.spend["acme"].DayDollars > 0
	})
	if got := r.px.Load.spend.spent("acme", false, time.Now()); got < spent {
		t.Fatalf("after a lost report the router counts $%v; want at least the $%v spent", got, spent)
	}
	fake.mu.Lock()
	fake.lose = false
	fake.mu.Unlock()
	waitFor(t, "a report answered", func() bool {
		r.px.Load.spend.mu.Lock()
		defer r.px.Load.spend.mu.Unlock()
		return len(r.px.Load.spend.pending) == 0 && r.px.Load.spend.known["acme"].DayDollars >= spent
	})
}

func TestBudgetFileErrors(t *testing.T) {
	base := "keys: [{name: a, key: " + aliceKey + ", tenant: acme}]\n"
	for _, tc := range []struct{ file, want string }{
		{base + "tenants: [{name: acme, budget: {period: week, hard_dollars: 1}}]", `tenants[0] (acme).budget: period "week": want day (UTC) or month`},
		{base + "tenants: [{name: acme, budget: {period: day}}]", "give soft_dollars (an alert), hard_dollars (a refusal) or both"},
		{base + "tenants: [{name: acme, budget: {period: day, soft_dollars: 5, hard_dollars: 1}}]", "soft_dollars 5 is above hard_dollars 1"},
		{base + "tenants: [{name: acme, budget: {period: day, hard_dollars: -1}}]", "hard_dollars -1: want US dollars"},
		{base + "tenants: [{name: other, budget: {period: day, hard_dollars: 1}}]", "tenants[0] (other): no key names this tenant"},
		{base + "tenants: [{name: acme}]", "budget: required"},
		{base + "tenants: [{name: acme, budget: {period: day, hard_dollars: 1}}, {name: acme, budget: {period: day, hard_dollars: 1}}]", `"acme" is listed twice`},
		{base + "tenants: [{name: acme, budget: {period: day, hard: 1}}]", "field hard not found"},
		{base + "tenants: {acme: 1}", "api keys"},
	} {
		if _, err := ParseKeys([]byte(tc.file), ""); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s\n→ %v; want an error with %q", tc.file, err, tc.want)
		}
	}
	// A router with no control plane refuses budgets: nothing would add its spend to the
	// other routers' or keep it across a restart.
	dir := t.TempDir()
	path := dir + "/keys.yaml"
	if err := os.WriteFile(path, []byte(base+"tenants: [{name: acme, budget: {period: day, hard_dollars: 1}}]"), 0o600); err != nil {
		t.Fatal(err)
	}
	px := &Proxy{}
	err := px.loadKeys(context.Background(), path, "", false, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "budgets need a control plane") {
		t.Fatalf("budgets without a control plane: %v", err)
	}
}
