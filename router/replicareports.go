package router

import (
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/oai"
)

// What a replica says is input like a client's: its usage counts and its /metrics figures
// are checked where they are read (oai.ReadUsage, ParseEngineGauges), and what fails is
// dropped, never passed on, and counted here against the replica: in
// arbiter_router_replica_reports_rejected_total and in a warning that names it.

// Sources of a rejected replica report: the source label of
// arbiter_router_replica_reports_rejected_total.
const (
	sourceUsage   = "usage"   // a response's or a stream's final usage object
	sourceMetrics = "metrics" // a /metrics scrape
	sourceHeaders = "headers" // a response's header fields (respheaders.go)
)

// rejectLogEvery spaces the warnings about one replica's rejected reports: a replica that
// lies on every answer must not flood the log at the request rate (the metric counts each).
const rejectLogEvery = 10 * time.Second

// rejectReport counts one report of r refused for reason, and logs it with what was wrong
// (detail) at most once per rejectLogEvery per replica, with the number refused since.
func rejectReport(met *Metrics, log *slog.Logger, r *Replica, source, reason, detail string, now time.Time) {
	info := r.Info()
	met.rejected.WithLabelValues(info.ID, source, reason).Inc()
	n := r.rejectsUnlogged.Add(1)
	last := r.rejectLoggedAt.Load()
	if now.UnixNano()-last < int64(rejectLogEvery) || !r.rejectLoggedAt.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	r.rejectsUnlogged.Add(-n)
	log.Warn("replica report rejected: its numbers are dropped, not counted", "replica", info.ID, "service", info.Service, "address", info.Address,
		"source", source, "reason", reason, "detail", detail, "rejected_since_last_warning", n)
}

// checkedUsage is the usage of a finished request that accounting may count: res's, or
// none when the replica's report was refused (which is counted against it).
func (px *Proxy) checkedUsage(r *Replica, u oai.Usage) oai.Usage {
	if u.Invalid == "" {
		return u
	}
	rejectReport(px.met, px.log, r, sourceUsage, u.Invalid, u.Detail, px.Now())
	return oai.Usage{}
}

// survive ends a panic in accounting, which runs after the client has its answer (a whole
// response is in the client's response already; a stream has been written): a bug there
// must cost the request's figures, not the answer nor the stream's bookkeeping after it.
// Deferred by account.
func (px *Proxy) survive(r *Replica) {
	if v := recover(); v != nil {
		px.met.fail("panic_after_answer", r.Info().Service)
		px.log.Error("panic in accounting; the request's answer stands, its figures are lost", "replica", r.Info().ID, "panic", v, "stack", string(debug.Stack()))
	}
}

// recovered answers a panic in the request handler. Before a response was set, the client
// gets a 500; once a replica's answer (or any error already written) is the response, it
// stands: a bug after the first byte must never turn a delivered answer into an error.
func (px *Proxy) recovered(ctx *fasthttp.RequestCtx, v any) {
	answered := ctx.Response.IsBodyStream() || len(ctx.Response.Body()) > 0
	px.met.fail("panic", "")
	px.log.Error("panic in request handler", "panic", v, "path", string(ctx.Path()), "answer_kept", answered, "stack", string(debug.Stack()))
	if !answered {
		oai.WriteError(ctx, fasthttp.StatusInternalServerError, oai.ServerError, "internal error")
	}
}
