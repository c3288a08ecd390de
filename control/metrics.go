package control

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
)

// endedRetention is how long a terminated replica's cost series stay exported: long
// enough for any scrape to see their final value, short enough that replica churn does
// not grow the series count without bound. Dropping a finished counter loses nothing:
// increase() over any window that saw it still counts its growth.
const endedRetention = time.Hour

// metrics are the control plane's Prometheus metrics (namespace arbiter, subsystem control).
// Money and replica-seconds are computed at scrape time from the state file, the same rows
// `serve status` bills from, so Prometheus and the CLI cannot disagree and a restarted
// control plane carries on from what it recorded instead of starting again at zero.
type metrics struct {
	preemptions *prometheus.CounterVec   // service, provider, region, zone, capacity
	coldStart   *prometheus.HistogramVec // service, provider, capacity
	decisions   *prometheus.CounterVec   // service, direction, cause
	transitions *prometheus.CounterVec   // service, state
	stateErrors prometheus.Counter
	// pendingWrites are state writes waiting for a locked file.
	pendingWrites prometheus.Gauge
	unknown       *prometheus.GaugeVec // provider
	// What preemption notices cost: how the notices on serving replicas ended, and the
	// time they left a service with no replica ready.
	noticeOutcomes *prometheus.CounterVec // service, outcome
	unready        *prometheus.CounterVec // service
	// leader is 1 while this control plane leads (always, without a lease), 0 on a
	// standby: the spend and replica series of every control plane on one store come from
	// the same rows, so a dashboard sums only the leader's.
	leader prometheus.GaugeFunc
}

var coldStartBuckets = []float64{1, 2, 5, 10, 20, 30, 60, 120, 180, 300, 450, 600, 900, 1800}

func newMetrics(reg prometheus.Registerer, c *Controller) *metrics {
	ns, sub := "arbiter", "control"
	m := &metrics{
		preemptions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "preemptions_total",
			Help: "Preemption notices received for this control plane's replicas."}, []string{"service", "provider", "region", "zone", "capacity"}),
		coldStart: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "cold_start_seconds",
			Help: "Launch to first ready (provisioning, image, weights, warm-up), per replica.", Buckets: coldStartBuckets},
			[]string{"service", "provider", "capacity"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "scale_decisions_total",
			Help: "Replica target changes, by direction and cause (wake: from zero; idle: to zero; panic: burst; load: stable window)."},
			[]string{"service", "direction", "cause"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "replica_transitions_total",
			Help: "Replica life-cycle moves, by the state entered."}, []string{"service", "state"}),
		stateErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "state_write_errors_total",
			Help: "Writes to the state file that failed (disk full, database busy); they are kept and written in order once it frees."}),
		pendingWrites: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "state_pending_writes",
			Help: "State writes waiting for the file (locked, full), to be written in order."}),
		unknown: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "unknown_replicas",
			Help: "Instances a provider runs under this control plane's tag that no replica row names (leaks), at the last audit."},
			[]string{"provider"}),
		noticeOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "preemption_outcomes_total",
			Help: "How preemption notices on serving replicas ended: replaced (drained once the replicas ready besides it covered the target), deadline (served until shortly before the reclaim, then drained with no replacement ready), reclaimed (gone or failing before either)."},
			[]string{"service", "outcome"}),
		unready: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "preemption_unready_seconds_total",
			Help: "Seconds a service had no replica ready because a preemption notice took its last ready one (drained at the deadline or reclaimed), until a replacement was ready; counted as it passes."},
			[]string{"service"}),
		leader: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "leader",
			Help: "1 while this control plane leads (holds the store's lease, or runs without one), 0 while it stands by. Several control planes on one store report the same spend and replicas: sum only the leader's."},
			func() float64 {
				if c.leading() {
					return 1
				}
				return 0
			}),
	}
	if reg == nil {
		return m
	}
	reg.MustRegister(m.leader, m.preemptions, m.coldStart, m.decisions, m.transitions, m.stateErrors, m.pendingWrites, m.unknown, m.noticeOutcomes, m.unready, &billCollector{c: c})
	return m
}

var (
	// accelerator is the replica's GPU type as the catalogs name it (L4, H100), "" where not
	// known (the local machine): one value per replica, so it adds no series; on the
	// per-place spend, one per GPU type offered there (a catalog's few names).
	billLabels       = []string{"service", "replica", "provider", "region", "zone", "capacity", "accelerator"}
	replicaSecondsDs = prometheus.NewDesc("arbiter_control_replica_seconds_total",
		"Seconds each replica has been billed: from launch to termination, in every state (a replica loading weights is billed).", billLabels, nil)
	dollarsDs = prometheus.NewDesc("arbiter_control_dollars_total",
		"Dollars each replica has cost: its price per hour × its billed time. For $ per token, divide the service's spend (arbiter_control_spend_dollars_total) by arbiter_control_tokens_total.", billLabels, nil)
	priceDs = prometheus.NewDesc("arbiter_control_replica_price_dollars_per_hour",
		"Price per hour of each replica that is billed now (not yet terminated).", billLabels, nil)
	spendDs = prometheus.NewDesc("arbiter_control_spend_dollars_total",
		"Dollars spent per service, place and GPU type (accelerator): every replica there, ended ones included. Each series starts at 0 when the place is first quoted, so rate() and increase() count every dollar, short-lived replicas' too (a per-replica series first seen already above 0 loses what it cost before that scrape).",
		[]string{"service", "provider", "region", "zone", "capacity", "accelerator"}, nil)
	replicasDs = prometheus.NewDesc("arbiter_control_replicas",
		"Replicas by life-cycle state, provider and capacity kind.", []string{"service", "state", "provider", "capacity"}, nil)
	tokensDs = prometheus.NewDesc("arbiter_control_tokens_total",
		"Tokens served per service (prompt + completion), as the routers report them; at 0 from the service's creation (or the control plane's start), before any token, so increase() over any range counts every token, a new replica's first answers too. The denominator of $ per million tokens.",
		[]string{"service"}, nil)
	targetDs = prometheus.NewDesc("arbiter_control_target_replicas",
		"The autoscaler's current replica target per service.", []string{"service"}, nil)
	stateUpDs = prometheus.NewDesc("arbiter_control_state_up",
		"1 when this scrape read the state store (the SQLite file or PostgreSQL), 0 when it could not: then the series read from it (dollars, replica seconds, prices, spend) are left out of the scrape, and the rest of it stands.", nil, nil)
	stateReadErrorsDs = prometheus.NewDesc("arbiter_control_state_read_errors_total",
		"Scrapes of these metrics that could not read the state store (arbiter_control_state_up was 0).", nil, nil)
)

// metricsHandler serves g's metrics. A collector that fails leaves its own series out and
// the rest of the scrape stands (logged), rather than the whole scrape failing with HTTP
// 500: the series that say what is wrong (the leader gauge, the state store's reachability,
// the write errors) are the ones an outage needs scraped.
func metricsHandler(g prometheus.Gatherer, log *slog.Logger) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)})
}

// billCollector reads the billing rows at scrape time. readErrors counts the scrapes that
// could not: kept here, not in a registered counter, so that the scrape that fails reports
// itself (registered collectors are gathered concurrently, in no set order).
type billCollector struct {
	c          *Controller
	readErrors atomic.Int64
}

func (b *billCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- replicaSecondsDs
	ch <- dollarsDs
	ch <- priceDs
	ch <- spendDs
	ch <- replicasDs
	ch <- targetDs
	ch <- tokensDs
	ch <- stateUpDs
	ch <- stateReadErrorsDs
}

func (b *billCollector) Collect(ch chan<- prometheus.Metric) {
	c := b.c
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := c.store.Replicas(ctx, "", true)
	up := 1.0
	if err != nil {
		// An invalid metric would fail the whole scrape (HTTP 500), the leader gauge and
		// the write-error counter with it, for exactly as long as the store is out of
		// reach: the series that need the store are left out, and state_up says so.
		up = 0
		b.readErrors.Add(1)
		c.log.Warn("metrics: cannot read the state store; its series are left out of this scrape", "err", err)
	}
	ch <- prometheus.MustNewConstMetric(stateUpDs, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(stateReadErrorsDs, prometheus.CounterValue, float64(b.readErrors.Load()))
	now := c.cfg.Now()
	spend := map[spendKey]float64{}
	for _, r := range rows {
		secs := billedSeconds(r, now)
		spend[spendKey{r.Service, place{r.Provider, r.Region, r.Zone, r.Capacity, r.Accelerator}}] += r.PricePerHour * secs / 3600
		if !r.EndedAt.IsZero() && now.Sub(r.EndedAt) > endedRetention {
			continue
		}
		lv := []string{r.Service, r.ID, r.Provider, r.Region, r.Zone, r.Capacity, r.Accelerator}
		ch <- prometheus.MustNewConstMetric(replicaSecondsDs, prometheus.CounterValue, secs, lv...)
		ch <- prometheus.MustNewConstMetric(dollarsDs, prometheus.CounterValue, r.PricePerHour*secs/3600, lv...)
		if r.EndedAt.IsZero() {
			ch <- prometheus.MustNewConstMetric(priceDs, prometheus.GaugeValue, r.PricePerHour, lv...)
		}
	}
	type key struct{ service, state, provider, capacity string }
	counts := map[key]int{}
	c.mu.Lock()
	for _, s := range c.services {
		for _, pl := range s.places {
			k := spendKey{s.name, pl}
			spend[k] += 0 // known, so present from 0
		}
		ch <- prometheus.MustNewConstMetric(targetDs, prometheus.GaugeValue, float64(s.target), s.name)
		ch <- prometheus.MustNewConstMetric(tokensDs, prometheus.CounterValue, s.served, s.name)
		for _, r := range s.replicas {
			counts[key{s.name, r.row.State, r.row.Provider, r.row.Capacity}]++
		}
	}
	c.mu.Unlock()
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(replicasDs, prometheus.GaugeValue, float64(n), k.service, k.state, k.provider, k.capacity)
	}
	if up == 0 {
		// Spend summed from no rows would go down to the quoted places' 0: a counter reset
		// that rate() reads as the whole spend spent again once the store is back.
		return
	}
	for k, v := range spend {
		ch <- prometheus.MustNewConstMetric(spendDs, prometheus.CounterValue, v, k.service, k.provider, k.region, k.zone, k.capacity, k.accelerator)
	}
}

// place is where a replica runs, as billing groups it: where, how bought, on which GPU type.
type place struct{ provider, region, zone, capacity, accelerator string }

// knowPlace records a place the service may run in, so that its spend series, and its
// preemption count where it is spot, are scraped at 0 before anything happens there: a
// counter first seen above 0 is invisible to rate() and increase(). Caller holds c.mu.
func (c *Controller) knowPlace(s *service, pl place) {
	if slices.Contains(s.places, pl) {
		return
	}
	s.places = append(s.places, pl)
	if pl.capacity == string(fleet.Spot) {
		c.metrics.preemptions.WithLabelValues(s.name, pl.provider, pl.region, pl.zone, pl.capacity)
	}
	// The first replica's cold start counts too: a histogram that first appears with one
	// observation shows none to increase().
	c.metrics.coldStart.WithLabelValues(s.name, pl.provider, pl.capacity)
}

// knowService makes a service's scale-decision and preemption-cost series exist at 0
// (every direction and cause scaleCause gives, every notice outcome), so that the first
// of each counts in increase() and rate().
func (c *Controller) knowService(name string) {
	for _, dc := range [][2]string{{"up", "wake"}, {"up", "load"}, {"up", "panic"}, {"down", "load"}, {"down", "idle"}, {"down", "panic"}} {
		c.metrics.decisions.WithLabelValues(name, dc[0], dc[1])
	}
	for _, o := range []string{noticeReplaced, noticeDeadline, noticeReclaimed} {
		c.metrics.noticeOutcomes.WithLabelValues(name, o)
	}
	c.metrics.unready.WithLabelValues(name)
}

type spendKey struct {
	service string
	place
}

// billedSeconds is how long a replica has been paid for by now: launch to termination.
func billedSeconds(r state.Replica, now time.Time) float64 {
	end := r.EndedAt
	if end.IsZero() {
		end = now
	}
	if !end.After(r.LaunchedAt) {
		return 0
	}
	return end.Sub(r.LaunchedAt).Seconds()
}

// scaleCause names why a target moved, in a few fixed words (the decision's Reason is a
// sentence with numbers in it: fine for logs, unbounded as a label).
func scaleCause(from, to int, panic bool) (direction, cause string) {
	direction = "up"
	if to < from {
		direction = "down"
	}
	switch {
	case from == 0:
		return direction, "wake"
	case to == 0:
		return direction, "idle"
	case panic:
		return direction, "panic"
	}
	return direction, "load"
}

// endUnknown terminates an instance no row wants, in the background; a failure is left to
// the next audit, which finds it again.
func (c *Controller) endUnknown(ctx context.Context, p replicas.Provider, in replicas.Instance) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if err := c.confirmLead(tctx); err != nil {
			c.log.Warn("not terminating: this control plane no longer leads", "replica", in.ReplicaID, "err", err)
			return
		}
		if err := p.Terminate(tctx, in.Handle); err != nil {
			c.log.Error("terminate a replica no live row wants", "replica", in.ReplicaID, "err", err)
		}
	}()
}

// audit counts instances the providers run under this control plane's tag that no replica
// row names, and ends those seen twice. Recovery terminates such leftovers at start;
// between starts this is how a leak (a launch whose answer was lost, a provider that
// ignored a terminate) becomes visible and is ended.
func (c *Controller) audit(ctx context.Context) {
	for name, p := range c.cfg.Providers {
		insts, err := p.List(ctx)
		if err != nil {
			c.log.Warn("audit: provider list failed", "provider", name, "err", err)
			continue
		}
		c.mu.Lock()
		known := map[string]bool{}
		for _, s := range c.services {
			for id, r := range s.replicas {
				if replicas.State(r.row.State) != replicas.Terminated {
					known[id] = true
				}
			}
		}
		sweep := c.unswept[name]
		delete(c.unswept, name)
		c.mu.Unlock()
		n := 0
		seen := map[string]bool{}
		for _, in := range insts {
			if known[in.ReplicaID] {
				continue
			}
			n++
			key := name + "/" + in.Handle
			seen[key] = true
			// A row is written before its launch and dropped only once its instance is
			// confirmed gone, so an instance no live row names in two audits running is a
			// leak (a launch whose answer was lost, a termination the provider took back):
			// end it. After a recovery that could not list this provider, at once.
			if !sweep && !c.suspects[key] {
				c.log.Warn("audit: instance with no replica row; ending it if the next audit finds it still", "provider", name, "replica", in.ReplicaID, "handle", in.Handle)
				continue
			}
			c.log.Warn("terminating a replica no live row wants", "provider", name, "replica", in.ReplicaID, "handle", in.Handle)
			c.event(ctx, "", in.ReplicaID, "recover", "running on "+name+" but wanted by no live row: terminated")
			c.endUnknown(ctx, p, in)
		}
		for key := range c.suspects {
			if strings.HasPrefix(key, name+"/") && !seen[key] {
				delete(c.suspects, key)
			}
		}
		for key := range seen {
			c.suspects[key] = true
		}
		c.metrics.unknown.WithLabelValues(name).Set(float64(n))
	}
}
