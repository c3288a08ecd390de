package router

import (
	"strconv"
	"time"

	"github.com/arbiter-serve/arbiter/oai"
)

// result is how one request ended on one replica.
type result struct {
	code       int
	usage      oai.Usage
	sentAt     time.Time
	firstAt    time.Time // first streamed token (streams) or the whole response
	endAt      time.Time
	events     int        // streamed content events
	pred       Prediction // made when the request was sent
	streamed   bool
	clientGone bool
	failed     string // non-empty: the replica failed mid-stream (reason)
}

// account records a finished request: metrics, token counts, SLO, the predictor's lesson
// and passive health.
func (px *Proxy) account(c *call, r *Replica, res result) {
	defer px.survive(r)
	res.usage = px.checkedUsage(r, res.usage)
	c.settle(res.usage.Prompt, res.usage.Completion)
	info := r.Info()
	code := res.code
	switch {
	case res.clientGone:
		code = 499 // nginx's "client closed request"
		px.met.fail("client_gone", c.service)
	case res.failed == streamDeadline:
		px.met.fail("deadline", c.service) // the client's deadline, not the replica's fault
	case res.failed != "":
		px.upstreamFailed(r, res.failed, nil)
	case code < 500:
		r.requestSucceeded()
	}
	// Replicas' series are by the model they serve (an adapter's base): an adapter's own
	// are per service and adapter only, so hundreds of adapters cost hundreds of series,
	// not hundreds per replica.
	px.met.request(c.pickModel(), r, code)
	if c.adapter != nil {
		px.met.adapterRequests.WithLabelValues(c.service, c.adapter.Name, strconv.Itoa(code)).Inc()
		if res.usage.Prompt > 0 || res.usage.Completion > 0 {
			px.met.adapterTokens.WithLabelValues(c.service, c.adapter.Name, "prompt").Add(float64(res.usage.Prompt))
			px.met.adapterTokens.WithLabelValues(c.service, c.adapter.Name, "completion").Add(float64(res.usage.Completion))
		}
	}
	if res.usage.Prompt > 0 || res.usage.Completion > 0 {
		c.load.tokens.Add(int64(res.usage.Prompt + res.usage.Completion))
		if c.kind.Generates() && code == 200 && res.failed == "" && !res.clientGone {
			// The request mix the control plane sizes GPUs by: what was asked and answered.
			c.load.served(res.usage.Prompt, res.usage.Completion)
		}
		if rs := px.met.replica(r); rs.info.Model == c.pickModel() {
			rs.prompt.Add(float64(res.usage.Prompt))
			rs.completion.Add(float64(res.usage.Completion))
		} else {
			px.met.tokens.WithLabelValues(c.pickModel(), info.Service, info.ID, info.Provider, info.Region, string(info.Capacity), info.Accelerator, "prompt").Add(float64(res.usage.Prompt))
			px.met.tokens.WithLabelValues(c.pickModel(), info.Service, info.ID, info.Provider, info.Region, string(info.Capacity), info.Accelerator, "completion").Add(float64(res.usage.Completion))
		}
		if c.key != nil {
			px.met.keyTokens.WithLabelValues(c.key.Name, c.service, "prompt").Add(float64(res.usage.Prompt))
			px.met.keyTokens.WithLabelValues(c.key.Name, c.service, "completion").Add(float64(res.usage.Completion))
		}
		if c.key != nil {
			tokens := float64(res.usage.Prompt + res.usage.Completion)
			dollars := tokens * r.DollarsPerToken()
			px.Load.spend.add(c.tenant, dollars, tokens)
			px.met.tenantDollars.WithLabelValues(c.service, c.tenant).Add(dollars)
		}
		if c.key != nil || px.queueOf(c).Enabled {
			band := c.band.String()
			px.met.tenantTokens.WithLabelValues(c.service, c.tenant, band, "prompt").Add(float64(res.usage.Prompt))
			px.met.tenantTokens.WithLabelValues(c.service, c.tenant, band, "completion").Add(float64(res.usage.Completion))
		}
	}
	if res.usage.AudioSeconds > 0 {
		px.met.audioSeconds.WithLabelValues(c.model, info.Service, info.ID).Add(float64(res.usage.AudioSeconds))
	}
	if code != 200 || res.clientGone || res.failed != "" {
		return
	}
	ms := px.met.model(c.pickModel(), info.Service)
	e2e := res.endAt.Sub(res.sentAt).Seconds()
	ms.e2e.Observe(e2e + c.queued.Seconds())
	ttft := e2e
	if !res.firstAt.IsZero() {
		ttft = res.firstAt.Sub(res.sentAt).Seconds()
	}
	out := res.usage.Completion
	if out == 0 {
		out = res.events
	}
	tpot := 0.0
	// What the client waited: the time in the router's queue too (the replica's model
	// learns from ttft alone, which starts when the replica was sent the request).
	waited := c.queued.Seconds()
	if res.streamed {
		ms.ttft.Observe(ttft + waited)
		if out > 1 {
			tpot = (e2e - ttft) / float64(out-1)
			ms.itl.Observe(tpot)
		}
	}
	meets := func(waited float64) bool {
		return (c.slo.E2E <= 0 || e2e+waited <= c.slo.E2E) && (!res.streamed || ((c.slo.TTFT <= 0 || ttft+waited <= c.slo.TTFT) && (c.slo.TPOT <= 0 || tpot <= c.slo.TPOT)))
	}
	if meets(waited) {
		ms.sloMet.Inc()
	} else {
		ms.sloMissed.Inc()
	}
	// The replica is judged on what it did: the router's queue is not its doing.
	r.judge(meets(0))
	if !c.kind.Generates() {
		// No decode to learn from: a pooling, scoring, tokenizing or audio request.
		return
	}
	if res.streamed {
		ms.predicted.Observe(res.pred.TTFT)
		ms.predErr.Observe(ttft - res.pred.TTFT)
	}
	r.Completed(&c.route, res.pred, ttft, e2e, out, res.streamed)
}

// upstreamFailed counts a replica failure for passive health.
func (px *Proxy) upstreamFailed(r *Replica, reason string, err error) {
	px.met.fail(reason, r.Info().Service)
	if r.requestFailed(px.Now(), px.cfg.Ejection.MaxFails, px.cfg.Ejection.BaseBackoff, px.cfg.Ejection.MaxBackoff) {
		px.met.ejections.WithLabelValues(r.Info().ID).Inc()
		px.log.Warn("replica ejected", "replica", r.Info().ID, "reason", reason, "err", err)
	} else {
		px.log.Debug("replica failure", "replica", r.Info().ID, "reason", reason, "err", err)
	}
}

func (px *Proxy) clientGone(c *call, r *Replica) {
	px.account(c, r, result{code: 499, clientGone: true})
}
