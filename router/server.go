package router

import (
	"log/slog"

	"github.com/arbiter-serve/arbiter/internal/httplog"

	"github.com/valyala/fasthttp"
)

// NewServer returns the client-facing fasthttp server with the router's limits: bounded
// bodies and headers, read timeouts against slow clients, and idle keep-alive.
func NewServer(cfg *Config, h fasthttp.RequestHandler, log *slog.Logger) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:            h,
		Logger:             httplog.Fasthttp{L: log},
		ErrorHandler:       ErrorHandler,
		Name:               "arbiter",
		MaxRequestBodySize: cfg.MaxRequestBodyBytes,
		ReadBufferSize:     cfg.MaxHeaderBytes, // also the header size limit (nginx's default is 8 KB too)
		ReadTimeout:        cfg.ReadTimeout,
		IdleTimeout:        cfg.IdleTimeout,
		// Responses stream for minutes; the per-request deadline bounds them instead.
		WriteTimeout:                 0,
		Concurrency:                  cfg.MaxConnections,
		MaxConnsPerIP:                cfg.MaxConnectionsPerIP,
		ReduceMemoryUsage:            false,
		NoDefaultServerHeader:        false,
		DisablePreParseMultipartForm: true,
		// Bodies are read by the handler, after authentication and within a budget (body.go).
		StreamRequestBody:                  true,
		CloseOnShutdown:                    true,
		SleepWhenConcurrencyLimitsExceeded: 0,
	}
}
