// Command autoscaler is Arbiter's control plane daemon: services, replicas, autoscaling,
// state, and the API that routers and the serve CLI use. `serve up` starts one embedded
// with a router when none runs; run this one on its own to put routers elsewhere.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/control/kubelease"
	"github.com/arbiter-serve/arbiter/internal/httplog"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/providers"
	"github.com/arbiter-serve/arbiter/state"
)

func main() {
	home, _ := os.UserHomeDir()
	var (
		homeDir   = flag.String("home", envOr("ARBITER_HOME", filepath.Join(home, ".arbiter")), "state directory (state.db, token, logs)")
		stateURL  = flag.String("state", os.Getenv("ARBITER_STATE_DSN"), "state in PostgreSQL: a postgres:// URL ($ARBITER_STATE_DSN; default: the SQLite file <home>/state.db)")
		stateFile = flag.String("state-file", "", "file holding the --state URL (a mounted Kubernetes Secret)")
		api       = flag.String("api", "127.0.0.1:8081", "API listen address (loopback by default; routers and the CLI call it)")
		admin     = flag.String("admin", "127.0.0.1:8083", "metrics and health listen address (empty: none)")
		endpoint  = flag.String("endpoint", "", "router URL shown to users by `serve status`")
		tick      = flag.Duration("tick", time.Second, "reconcile interval")
		drain     = flag.Duration("drain-timeout", 120*time.Second, "longest wait for a draining replica's requests")
		grace     = flag.Duration("grace", 10*time.Second, "SIGTERM to SIGKILL grace for local replicas")
		logLevel  = flag.String("log-level", "info", "debug, info, warn or error")
		provFile  = flag.String("providers", "", "providers file: the Kubernetes clusters, AWS account and RunPod account replicas may run on (default: <home>/providers.yaml if it exists)")
		tokenFile = flag.String("token-file", "", "file holding the API token routers and the CLI send (default: <home>/token, created if missing)")
		cooldown  = flag.Duration("zone-cooldown", 10*time.Minute, "how long spot stays out of a zone that preempted a replica or refused a launch")
		maxReps   = flag.Int("max-replicas", control.DefaultMaxReplicas, "the most replicas this control plane runs at once, all services together")
		leaseDur  = flag.Duration("lease-duration", 0, "run as one of several control planes sharing --state: the leader holds a lease in the store this long per renewal (15s is a good start) and the others stand by; 0: the only control plane")
		leaseName = flag.String("lease-holder", "", "this control plane's name in the lease (default: host name/process ID; on Kubernetes, the pod's name is a good choice)")
		leaseKind = flag.String("lease", "store", "what elects the leader of several control planes: store (a lease row in --state) or kubernetes (a coordination.k8s.io Lease; the store's term still fences writes)")
		leaseNS   = flag.String("lease-namespace", "", "--lease kubernetes: the Lease's namespace (default: the pod's, from its service account)")
		leaseObj  = flag.String("lease-name", kubelease.DefaultName, "--lease kubernetes: the Lease's name")
		leaseKube = flag.String("lease-kubeconfig", "", "--lease kubernetes: a kubeconfig to reach the cluster (default: the pod's service account)")
		advertise = flag.String("advertise-url", "", "with a lease: the URL other control planes reach this one's API at, to forward writes to it while it leads (default: http://<the --api address>, its host name for 0.0.0.0)")
		localMax  = flag.Int("local-max-replicas", replicas.DefaultLocalMaxReplicas(), "the most replicas the local and sim providers run on this machine at once")
	)
	flag.Parse()
	log, err := httplog.NewLogger(*logLevel)
	token := ""
	if err == nil && *tokenFile != "" {
		var b []byte
		if b, err = os.ReadFile(*tokenFile); err == nil {
			if token = strings.TrimSpace(string(b)); token == "" {
				err = fmt.Errorf("token file %s is empty", *tokenFile)
			}
		}
	}
	var setting string
	if err == nil {
		setting, err = stateSetting(*stateURL, *stateFile)
	}
	var newLease func(context.Context, *state.Store, string, time.Duration) (control.Lease, error)
	if err == nil {
		newLease, err = leaseSetting(*leaseKind, *leaseNS, *leaseObj, *leaseKube, leaseDur, log)
	}
	if err == nil {
		exe, _ := os.Executable()
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		err = control.Serve(ctx, control.DaemonOptions{Home: *homeDir, State: setting, API: *api, Token: token, Tick: *tick, DrainTimeout: *drain, Endpoint: *endpoint,
			BinDir: filepath.Dir(exe), LocalGrace: *grace, Log: log, Admin: *admin, ZoneCooldown: *cooldown,
			MaxReplicas: *maxReps, LocalMaxReplicas: *localMax, LeaseDuration: *leaseDur, LeaseHolder: *leaseName, NewLease: newLease, Advertise: *advertise,
			Providers: func(ctx context.Context, owner string) ([]replicas.Provider, error) {
				path, optional := *provFile, *provFile == ""
				if optional {
					path = filepath.Join(*homeDir, "providers.yaml")
				}
				return providers.FromFile(ctx, path, optional, owner, log)
			}})
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

// stateSetting is the state store the flags name: a postgres:// URL given as such or read
// from a file, or "" for the home's SQLite file.
func stateSetting(url, file string) (string, error) {
	if file != "" {
		if url != "" {
			return "", errors.New("--state (or $ARBITER_STATE_DSN) and --state-file both name the state: give one")
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--state-file: %w", err)
		}
		if url = strings.TrimSpace(string(b)); url == "" {
			return "", fmt.Errorf("--state-file %s is empty", file)
		}
	}
	if url != "" && !state.IsPostgres(url) {
		// Not echoed: it may hold a password.
		return "", errors.New("--state: want a postgres:// or postgresql:// URL (the SQLite file is <home>/state.db, chosen by --home)")
	}
	return url, nil
}

// inClusterNamespace is where a pod's service account says its namespace is.
const inClusterNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// leaseSetting is what elects the leader, as the flags say: nil for the store's own lease,
// or a Kubernetes Lease's candidacy (its duration defaulting to 15 s).
func leaseSetting(kind, ns, name, kubeconfig string, dur *time.Duration, log *slog.Logger) (func(context.Context, *state.Store, string, time.Duration) (control.Lease, error), error) {
	switch kind {
	case "store":
		if ns != "" || kubeconfig != "" || name != kubelease.DefaultName {
			return nil, errors.New("--lease-namespace, --lease-name and --lease-kubeconfig are for --lease kubernetes")
		}
		return nil, nil
	case "kubernetes":
	default:
		return nil, fmt.Errorf("--lease %q: want store or kubernetes", kind)
	}
	if *dur == 0 {
		*dur = 15 * time.Second // Kubernetes' own controllers' lease
	}
	if ns == "" {
		b, err := os.ReadFile(inClusterNamespace)
		if err != nil {
			return nil, errors.New("--lease kubernetes: give --lease-namespace (no pod service account to read it from)")
		}
		ns = strings.TrimSpace(string(b))
	}
	client, err := kubelease.Client(kubeconfig)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, st *state.Store, holder string, ttl time.Duration) (control.Lease, error) {
		return kubelease.Start(ctx, kubelease.Config{Client: client, Namespace: ns, Name: name, Holder: holder, Duration: ttl, Store: st, Log: log})
	}, nil
}
