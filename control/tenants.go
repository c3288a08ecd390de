package control

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/state"
)

// Tenants' spend (issue 52). Each router reports what each tenant spent through it since its
// last report (fleet.LoadReport.Tenants: dollars at the replicas' price per token, tokens,
// requests); the control plane adds it up per tenant and UTC day in the state store at each
// tick, so no restart of a router or of the control plane loses it, and answers every report
// with every tenant's spend in the day and the month, the unsaved part included. Every router
// thus reads the same figures, which its budgets (the keys file's tenants) are checked
// against: two routers share one budget.

// tenantBook is the spend not saved yet and the saved totals as last read. Guarded by c.mu.
type tenantBook struct {
	pending map[string]fleet.TenantUse
	// saved are the store's totals for day and its month: read at the first tick after a
	// recovery or a new day, then kept up with what each tick saves.
	saved map[string]state.TenantSpend
	day   string
	read  bool
}

// reportTenants takes one report's spend. Caller holds c.mu.
func (c *Controller) reportTenants(us []fleet.TenantUse) {
	for _, u := range us {
		c.tenants.pending = fleet.AddTenantUse(c.tenants.pending, u)
	}
}

// flushTenants saves the spend reported since the last tick and reads the totals again;
// what fails to save is kept for the next tick. Caller holds c.mu.
func (c *Controller) flushTenants(ctx context.Context, now time.Time) {
	b := &c.tenants
	day := now.UTC().Format(time.DateOnly)
	if len(b.pending) > 0 {
		add := make([]state.TenantUse, 0, len(b.pending))
		for _, t := range slices.Sorted(maps.Keys(b.pending)) {
			u := b.pending[t]
			add = append(add, state.TenantUse{Tenant: u.Tenant, Dollars: u.Dollars, Tokens: u.Tokens, Requests: u.Requests})
		}
		if err := c.store.AddTenantSpend(ctx, add, now); err != nil {
			c.log.Error("tenant spend not saved; kept for the next tick", "err", err)
			return
		}
		if b.read && b.day == day {
			// Saved to now's day: the totals read are the store's plus what was just
			// added (only the leader writes them), with no query each tick.
			for _, u := range add {
				t := b.saved[u.Tenant]
				t.DayDollars += u.Dollars
				t.MonthDollars += u.Dollars
				t.DayTokens += u.Tokens
				t.MonthTokens += u.Tokens
				b.saved[u.Tenant] = t
			}
		}
		clear(b.pending)
	}
	if b.read && b.day == day {
		return
	}
	saved, err := c.store.TenantSpends(ctx, now)
	if err != nil {
		c.log.Error("tenant spend not read; budgets see the last totals read", "err", err)
		return
	}
	b.saved, b.day, b.read = saved, day, true
}

// answer is every tenant's spend for the routers: the saved totals of now's day and month,
// plus what is not saved yet. Caller holds c.mu for the controller's book.
func (b *tenantBook) answer(now time.Time) fleet.LoadAnswer {
	day := now.UTC().Format(time.DateOnly)
	ans := fleet.LoadAnswer{OK: true, Day: day}
	all := map[string]fleet.TenantSpend{}
	if len(b.day) == len(day) && b.day[:7] == day[:7] { // the same month
		for t, s := range b.saved {
			ts := fleet.TenantSpend{Tenant: t, MonthDollars: s.MonthDollars, MonthTokens: s.MonthTokens}
			if b.day == day {
				ts.DayDollars, ts.DayTokens = s.DayDollars, s.DayTokens
			}
			all[t] = ts
		}
	}
	for t, p := range b.pending {
		ts := all[t]
		ts.Tenant = t
		ts.DayDollars += p.Dollars
		ts.MonthDollars += p.Dollars
		ts.DayTokens += p.Tokens
		ts.MonthTokens += p.Tokens
		all[t] = ts
	}
	for _, t := range slices.Sorted(maps.Keys(all)) {
		ans.Tenants = append(ans.Tenants, all[t])
	}
	return ans
}

// tenantsSpend answers GET /v1/tenants: every tenant's spend in the UTC day and month. The
// leader answers what the routers are answered (the unsaved part included); a standby reads
// the store.
func (c *Controller) tenantsSpend(w http.ResponseWriter, r *http.Request) {
	now := c.cfg.Now()
	if c.leading() {
		c.mu.Lock()
		if !c.tenants.read {
			c.flushTenants(r.Context(), now)
		}
		ans := c.tenants.answer(now)
		c.mu.Unlock()
		writeJSON(w, http.StatusOK, ans)
		return
	}
	saved, err := c.store.TenantSpends(r.Context(), now)
	if err != nil {
		writeErr(w, err)
		return
	}
	book := tenantBook{saved: saved, day: now.UTC().Format(time.DateOnly), read: true}
	writeJSON(w, http.StatusOK, book.answer(now))
}
