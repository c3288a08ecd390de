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

// AdminHandler serves /metrics, /health, /replicas (the router's view, as JSON) and
// /sd/replicas (Prometheus HTTP service discovery of the replicas' own /metrics) on the
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
		case "/sd/replicas":
			ctx.SetContentType("application/json")
			ctx.SetBody(serviceDiscovery(pool.Snapshot()))
		default:
			oai.WriteError(ctx, fasthttp.StatusNotFound, oai.NotFound, "unknown admin path")
		}
	}
}

// sdTarget is one target group of Prometheus' HTTP service discovery
// (https://prometheus.io/docs/prometheus/latest/http_sd/).
type sdTarget struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// serviceDiscovery lists the replicas the router serves (ready, or draining their last
// requests) with the labels that join their engine metrics (vllm:…) to Arbiter's own:
// service, replica, model, provider, region, zone and capacity. Always a list, never null:
// Prometheus refuses null.
func serviceDiscovery(rs []*Replica) []byte {
	out := make([]sdTarget, 0, len(rs))
	for _, r := range rs {
		info := r.Info()
		labels := map[string]string{"replica": info.ID, "model": info.Model, "capacity": string(info.Capacity)}
		for k, v := range map[string]string{"service": info.Service, "provider": info.Provider, "region": info.Region, "zone": info.Zone} {
			if v != "" {
				labels[k] = v
			}
		}
		out = append(out, sdTarget{Targets: []string{info.Address}, Labels: labels})
	}
	b, _ := json.Marshal(out)
	return b
}
