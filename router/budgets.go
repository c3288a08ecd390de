package router

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/oai"
)

// Budgets in dollars (issue 52). A tenant's spend is what its requests' tokens cost at the
// price per token of the replica that answered them (its hourly price over its throughput,
// fleet.Replica.TokensPerSecond: what the control plane publishes for the service's request
// mix). Each router reports what it counted to the control plane with its load reports; the
// control plane adds every router's reports up per tenant and UTC day in the state store and
// answers each report with the day's and the month's totals. A router checks a request
// against its tenant's budget from those totals plus what it has counted since: so two
// routers share one budget, and no restart forgets what was spent.
//
// The keys file gives a tenant a soft and a hard limit per UTC day or calendar month:
//
//	tenants:
//	  - {name: acme, budget: {period: month, soft_dollars: 800, hard_dollars: 1000}}
//
// The soft limit is seen (arbiter_router_tenant_spend_dollars beside
// arbiter_router_tenant_budget_dollars, and the ArbiterTenantBudgetSoftLimit alert); the hard
// one refuses the tenant's new requests with 429 until the period ends. An answer already
// started is never cut: a request is checked once, when it arrives, so a tenant may end a
// little over its hard limit by what its open requests and the other routers' last second
// spend.

// TenantSpec is one tenant's entry in the keys file.
type TenantSpec struct {
	Name   string      `yaml:"name"`
	Budget *BudgetSpec `yaml:"budget"`
}

// BudgetSpec is a tenant's budget: per UTC day or calendar month, in US dollars.
type BudgetSpec struct {
	Period      string  `yaml:"period"`
	SoftDollars float64 `yaml:"soft_dollars"`
	HardDollars float64 `yaml:"hard_dollars"`
}

// budget is a loaded BudgetSpec.
type budget struct {
	monthly    bool
	soft, hard float64 // 0: none
}

func (b budget) period() string {
	if b.monthly {
		return "month"
	}
	return "day"
}

// adjective is "daily" or "monthly".
func (b budget) adjective() string {
	if b.monthly {
		return "monthly"
	}
	return "daily"
}

func (s BudgetSpec) load() (budget, error) {
	var b budget
	switch s.Period {
	case "day":
	case "month":
		b.monthly = true
	default:
		return b, fmt.Errorf("period %q: want day (UTC) or month (calendar, UTC)", s.Period)
	}
	for _, v := range []struct {
		name string
		v    float64
	}{{"soft_dollars", s.SoftDollars}, {"hard_dollars", s.HardDollars}} {
		if math.IsNaN(v.v) || math.IsInf(v.v, 0) || v.v < 0 || v.v > 1e9 {
			return b, fmt.Errorf("%s %v: want US dollars from 0 (none) to 1e9", v.name, v.v)
		}
	}
	if s.SoftDollars == 0 && s.HardDollars == 0 {
		return b, errors.New("give soft_dollars (an alert), hard_dollars (a refusal) or both")
	}
	if s.HardDollars > 0 && s.SoftDollars > s.HardDollars {
		return b, fmt.Errorf("soft_dollars %v is above hard_dollars %v: the alert would come after the refusal", s.SoftDollars, s.HardDollars)
	}
	b.soft, b.hard = s.SoftDollars, s.HardDollars
	return b, nil
}

// loadTenants reads the keys file's tenants: each must be a tenant of some key.
func (ks *Keys) loadTenants(specs []TenantSpec) error {
	known := map[string]bool{}
	for _, k := range ks.byDigest {
		known[k.tenant] = true
	}
	for i, s := range specs {
		switch {
		case s.Name == "":
			return fmt.Errorf("tenants[%d]: name: required", i)
		case !known[s.Name]:
			return fmt.Errorf("tenants[%d] (%s): no key names this tenant (give a key tenant: %s, or its name)", i, s.Name, s.Name)
		case ks.budgets[s.Name] != (budget{}):
			return fmt.Errorf("tenants[%d]: %q is listed twice", i, s.Name)
		case s.Budget == nil:
			return fmt.Errorf("tenants[%d] (%s): budget: required", i, s.Name)
		}
		b, err := s.Budget.load()
		if err != nil {
			return fmt.Errorf("tenants[%d] (%s).budget: %w", i, s.Name, err)
		}
		if ks.budgets == nil {
			ks.budgets = map[string]budget{}
		}
		ks.budgets[s.Name] = b
	}
	return nil
}

// HasBudgets reports whether a tenant has a budget.
func (ks *Keys) HasBudgets() bool { return ks != nil && len(ks.budgets) > 0 }

// spendBook is what this router knows of tenants' spend: what it counted and has not had
// taken by the control plane (pending, and sending while a report carries it), and the
// fleet-wide totals the control plane last answered (known, of the UTC day knownDay).
type spendBook struct {
	mu       sync.Mutex
	pending  map[string]fleet.TenantUse
	sending  map[string]fleet.TenantUse
	known    map[string]fleet.TenantSpend
	knownDay string
}

// add counts one answered request's spend.
func (b *spendBook) add(tenant string, dollars, tokens float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pending = fleet.AddTenantUse(b.pending, fleet.TenantUse{Tenant: tenant, Dollars: dollars, Tokens: tokens, Requests: 1})
}

// take hands the pending spend to a report; the report's outcome settles it (sent).
func (b *spendBook) take() []fleet.TenantUse {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.pending) == 0 || b.sending != nil {
		return nil // nothing to send, or another report carries spend and is not settled
	}
	out := make([]fleet.TenantUse, 0, len(b.pending))
	b.sending = b.pending
	b.pending = nil
	for _, u := range b.sending {
		out = append(out, u)
	}
	return out
}

// sent settles a report: taken, the control plane's answer (nil: none read) replaces the
// known totals; not taken, the spend it carried (carried: take gave it some) goes back to
// pending for the next report.
func (b *spendBook) sent(carried, taken bool, ans *fleet.LoadAnswer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if carried && !taken {
		for _, u := range b.sending {
			b.pending = fleet.AddTenantUse(b.pending, u)
		}
	}
	if carried {
		b.sending = nil
	}
	if ans == nil || ans.Day == "" {
		return
	}
	known := make(map[string]fleet.TenantSpend, len(ans.Tenants))
	for _, s := range ans.Tenants {
		// Spend never falls within a period: a control plane that has just taken over
		// answers from the store for a tick before its first save (at most a second).
		if old, ok := b.known[s.Tenant]; ok && b.knownDay == ans.Day {
			s.DayDollars, s.MonthDollars = max(s.DayDollars, old.DayDollars), max(s.MonthDollars, old.MonthDollars)
		}
		known[s.Tenant] = s
	}
	b.known, b.knownDay = known, ans.Day
}

// spent is a tenant's spend in its budget's period as of now: the fleet-wide total last
// answered (when it is of now's day, or for a month of now's month) plus what this router
// counted since.
func (b *spendBook) spent(tenant string, monthly bool, now time.Time) float64 {
	day := now.UTC().Format(time.DateOnly)
	b.mu.Lock()
	defer b.mu.Unlock()
	total := b.pending[tenant].Dollars + b.sending[tenant].Dollars
	if k, ok := b.known[tenant]; ok {
		switch {
		case b.knownDay == day && !monthly:
			total += k.DayDollars
		case monthly && len(b.knownDay) == len(day) && b.knownDay[:7] == day[:7]:
			total += k.MonthDollars
		}
	}
	return total
}

// periodEnd is when a budget's period that holds now ends (UTC).
func periodEnd(monthly bool, now time.Time) time.Time {
	y, m, d := now.UTC().Date()
	if monthly {
		return time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC)
	}
	return time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
}

// overBudget answers 429 for a request whose tenant has spent its hard limit, and reports
// whether it did. The OpenAI SDKs retry a 429; x-should-retry: false tells them not to
// (openai-python reads it), since nothing changes before the period ends.
func (px *Proxy) overBudget(ctx *fasthttp.RequestCtx, c *call) bool {
	ks := px.keys.Load()
	if ks == nil || c.key == nil {
		return false
	}
	b, ok := ks.budgets[c.tenant]
	if !ok || b.hard <= 0 {
		return false
	}
	now := px.Now()
	spent := px.Load.spend.spent(c.tenant, b.monthly, now)
	if spent < b.hard {
		return false
	}
	end := periodEnd(b.monthly, now)
	px.met.fail("budget_exceeded", c.service)
	px.met.queueRejected.WithLabelValues(c.service, c.tenant, c.band.String(), "budget").Inc()
	ctx.Response.Reset()
	ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
	ctx.SetContentType("application/json")
	ctx.SetBody(oai.ErrorBody(oai.InsufficientQuota, fmt.Sprintf("Budget has been exceeded: tenant %s spent %s of its %s hard limit of %s. It resets at %s.",
		c.tenant, usd(spent), b.adjective(), usd(b.hard), end.Format(time.RFC3339)), "budget_exceeded"))
	ctx.Response.Header.Set("Retry-After", strconv.FormatInt(int64(math.Ceil(end.Sub(now).Seconds())), 10))
	ctx.Response.Header.Set("X-Should-Retry", "false")
	return true
}

// usd writes an amount in dollars: cents from a dollar up, else enough digits to show it.
func usd(v float64) string {
	if v >= 1 || v == 0 {
		return fmt.Sprintf("$%.2f", v)
	}
	return "$" + strconv.FormatFloat(v, 'g', 3, 64)
}

// DollarsPerToken is what one token costs on the replica: its hourly price over the
// throughput it is described with (reserved capacity too: budgets charge back what the
// capacity costs, used or not).
func (r *Replica) DollarsPerToken() float64 {
	info := r.Info()
	if info.PricePerHour <= 0 {
		return 0
	}
	tps := info.TokensPerSecond
	if tps <= 0 {
		tps = defaultTokensPerSecond
	}
	return info.PricePerHour / 3600 / tps
}

// budgetCollector exports each budgeted tenant's spend and limits at scrape time.
type budgetCollector struct {
	spend, limit *prometheus.Desc
	px           atomic.Pointer[Proxy]
}

func (bc *budgetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- bc.spend
	ch <- bc.limit
}

func (bc *budgetCollector) Collect(ch chan<- prometheus.Metric) {
	px := bc.px.Load()
	if px == nil {
		return
	}
	ks := px.keys.Load()
	if ks == nil {
		return
	}
	now := px.Now()
	for tenant, b := range ks.budgets {
		p := b.period()
		ch <- prometheus.MustNewConstMetric(bc.spend, prometheus.GaugeValue, px.Load.spend.spent(tenant, b.monthly, now), tenant, p)
		if b.soft > 0 {
			ch <- prometheus.MustNewConstMetric(bc.limit, prometheus.GaugeValue, b.soft, tenant, p, "soft")
		}
		if b.hard > 0 {
			ch <- prometheus.MustNewConstMetric(bc.limit, prometheus.GaugeValue, b.hard, tenant, p, "hard")
		}
	}
}
