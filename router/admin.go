package router

import (
	"encoding/json"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/arbiter-serve/arbiter/oai"
)

// AdminHandler serves /metrics, /health and /replicas (the router's view, as JSON) on the
// admin port, away from client traffic.
// withPprof adds /debug/pprof (router config pprof: true).
func AdminHandler(reg prometheus.Gatherer, pool *Pool, withPprof bool) fasthttp.RequestHandler {
	metrics := fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	profiles := fasthttpadaptor.NewFastHTTPHandlerFunc(pprof.Index)
	cpuProfile := fasthttpadaptor.NewFastHTTPHandlerFunc(pprof.Profile)
	return func(ctx *fasthttp.RequestCtx) {
		path := string(ctx.Path())
		switch {
		case !withPprof:
		case path == "/debug/pprof/profile":
			cpuProfile(ctx)
			return
		case strings.HasPrefix(path, "/debug/pprof/"):
			profiles(ctx)
			return
		}
		switch path {
		case "/metrics":
			metrics(ctx)
		case "/health":
			ctx.SetStatusCode(fasthttp.StatusOK)
		case "/replicas":
			type view struct {
				ID        string  `json:"id"`
				Address   string  `json:"address"`
				Available bool    `json:"available"`
				InFlight  int64   `json:"in_flight"`
				Load      float64 `json:"predicted_load"`
			}
			now := time.Now()
			var out []view
			for _, r := range pool.Snapshot() {
				out = append(out, view{ID: r.Info().ID, Address: r.Info().Address, Available: r.Available(now), InFlight: r.InFlight(), Load: r.Load(now, time.Second)})
			}
			b, _ := json.Marshal(out)
			ctx.SetContentType("application/json")
			ctx.SetBody(b)
		default:
			oai.WriteError(ctx, fasthttp.StatusNotFound, oai.NotFound, "unknown admin path")
		}
	}
}
