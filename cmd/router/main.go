// Command router is Arbiter's data plane: an OpenAI-compatible edge proxy in front of a
// set of vLLM replicas.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/httplog"
	"github.com/arbiter-serve/arbiter/router"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "router:", err)
		os.Exit(2)
	}
}

func run() error {
	var (
		listen   = flag.String("listen", "127.0.0.1:8080", "client-facing address")
		admin    = flag.String("admin", "127.0.0.1:9090", "admin address (/metrics, /health, /replicas)")
		config   = flag.String("config", "", "router config YAML (defaults if empty)")
		replicas = flag.String("replicas", "", "replica list YAML, reloaded when it changes (required)")
		policy   = flag.String("policy", "", "override the config's routing policy")
		logLevel = flag.String("log-level", "info", "debug, info, warn or error")
	)
	flag.Parse()
	log, err := httplog.NewLogger(*logLevel)
	if err != nil {
		return err
	}
	cfg, err := router.LoadConfig(*config)
	if err != nil {
		return err
	}
	if *policy != "" {
		cfg.Policy = *policy
		if err := cfg.Validate(); err != nil {
			return err
		}
	}
	if *replicas == "" {
		return errors.New("-replicas: required (a YAML list of replicas; see README)")
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	met := router.NewMetrics(reg)
	var aff *router.Affinity
	if cfg.AffinitySize > 0 {
		if aff, err = router.NewAffinity(cfg.AffinitySize, 64); err != nil {
			return err
		}
	}
	pool := router.NewPool(&cfg, log, met, aff)
	px, err := router.NewProxy(&cfg, pool, met, log)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := router.WatchReplicaFile(ctx, *replicas, pool, log, time.Second); err != nil {
		return err
	}
	go pool.Run(ctx)

	srv := router.NewServer(&cfg, px.Handle, log)
	adminSrv := &fasthttp.Server{Handler: router.AdminHandler(reg, pool), Name: "arbiter-admin", ReadTimeout: 10 * time.Second, Logger: httplog.Fasthttp{L: log}}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	aln, err := net.Listen("tcp", *admin)
	if err != nil {
		return err
	}
	log.Info("router serving", "listen", ln.Addr().String(), "admin", aln.Addr().String(), "policy", cfg.Policy)
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	go func() { errc <- adminSrv.Serve(aln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: finishing in-flight requests")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = adminSrv.ShutdownWithContext(sctx)
	return srv.ShutdownWithContext(sctx)
}
