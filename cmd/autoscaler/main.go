// Command autoscaler is Arbiter's control plane daemon: services, replicas, autoscaling,
// state, and the API that routers and the serve CLI use. `serve up` starts one embedded
// with a router when none runs; run this one on its own to put routers elsewhere.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/httplog"
)

func main() {
	home, _ := os.UserHomeDir()
	var (
		homeDir  = flag.String("home", envOr("ARBITER_HOME", filepath.Join(home, ".arbiter")), "state directory (state.db, token, logs)")
		api      = flag.String("api", "127.0.0.1:8081", "API listen address (loopback by default; routers and the CLI call it)")
		admin    = flag.String("admin", "127.0.0.1:9091", "metrics and health listen address (empty: none)")
		endpoint = flag.String("endpoint", "", "router URL shown to users by `serve status`")
		tick     = flag.Duration("tick", time.Second, "reconcile interval")
		drain    = flag.Duration("drain-timeout", 120*time.Second, "longest wait for a draining replica's requests")
		grace    = flag.Duration("grace", 10*time.Second, "SIGTERM to SIGKILL grace for local replicas")
		logLevel = flag.String("log-level", "info", "debug, info, warn or error")
	)
	flag.Parse()
	log, err := httplog.NewLogger(*logLevel)
	if err == nil {
		exe, _ := os.Executable()
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		err = control.Serve(ctx, control.DaemonOptions{Home: *homeDir, API: *api, Tick: *tick, DrainTimeout: *drain, Endpoint: *endpoint,
			BinDir: filepath.Dir(exe), LocalGrace: *grace, Log: log, Admin: *admin})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "autoscaler:", err)
		os.Exit(2)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
