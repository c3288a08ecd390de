package control

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/internal/conn/fdlimit"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
)

// DaemonOptions is a whole control-plane process: its home directory (state file, token,
// replica logs), where its API listens, and how it runs local replicas.
type DaemonOptions struct {
	Home string
	// State is where the state lives: "" for the SQLite file <home>/state.db, or a
	// postgres:// URL for a PostgreSQL database (which several control planes can share).
	State string
	API   string // listen address of the HTTP API
	// Token protects the API; empty: read <home>/token, creating it if missing.
	Token        string
	Tick         time.Duration
	DrainTimeout time.Duration
	Endpoint     string
	// BinDir is prepended to replicas' PATH (where Arbiter's own binaries live).
	BinDir string
	// LocalGrace is how long a local replica has between SIGTERM and SIGKILL.
	LocalGrace time.Duration
	Log        *slog.Logger
	// Ready, if set, is called with the API's bound address once it serves.
	Ready func(api net.Addr)
	// Admin, if set, is where /metrics (with the process's Go and process metrics) and
	// /health are served without a token. The API serves the control plane's own metrics
	// at /v1/metrics either way, behind the token: the embedded daemon's router merges them
	// into its admin port's /metrics, so one scrape target shows both halves.
	Admin string
	// Providers, if set, builds providers beyond local and sim (the kubernetes clusters of
	// the providers file) for the deployment's owner (the store's, first taken from a
	// home's ProviderOwner); the binaries that run a control plane
	// supply it, so that this package does not link their SDKs.
	Providers func(ctx context.Context, owner string) ([]replicas.Provider, error)
	// ZoneCooldown: see Config.ZoneCooldown.
	ZoneCooldown time.Duration
	// MaxReplicas: see Config.MaxReplicas.
	MaxReplicas int
	// LeaseDuration, when set, makes this one of several control planes sharing State:
	// one leads, holding a lease in the store for this long per renewal, and the others
	// stand by (lease.go); 0: the only control plane, no lease. LeaseHolder names this one
	// to the others (default: host name and process ID).
	LeaseDuration time.Duration
	LeaseHolder   string
	// NewLease, if set with LeaseDuration, makes the lease instead of the store's own: a
	// lock outside the store elects the leader while the store's term fences its writes
	// (cmd/autoscaler's --lease kubernetes: a Kubernetes Lease, package kubelease, so that
	// this package does not link client-go's leader election).
	NewLease func(ctx context.Context, store *state.Store, holder string, ttl time.Duration) (Lease, error)
	// Advertise, with a lease, is the URL other control planes reach this one's API at, to
	// forward the writes a standby is sent to the leader (forward.go); default: http:// and
	// the API's bound address (its host name in place of an unspecified address).
	Advertise string
	// LocalMaxReplicas bounds the replicas the local machine runs at once (the local and
	// sim providers); 0: replicas.DefaultLocalMaxReplicas.
	LocalMaxReplicas int
}

// Paths inside a home directory.
func StatePath(home string) string { return filepath.Join(home, "state.db") }
func TokenPath(home string) string { return filepath.Join(home, "token") }

// Owner names a home's replicas to its provider (the local provider's process tag): two
// control planes with different homes never touch each other's replicas. It is the owner a
// store takes when it has none yet; after that the store's is every control plane's on it
// (state.LocalOwnerKey), so that several with their own homes share one deployment's.
func Owner(home string) string {
	abs, err := filepath.Abs(home)
	if err != nil {
		abs = home
	}
	sum := sha256.Sum256([]byte(abs))
	return "arbiter-" + hex.EncodeToString(sum[:6])
}

// ProviderOwner is the tag this home's replicas carry in shared infrastructure (the
// owner label of its pods in a cluster): random, made once and kept in <home>/owner, so
// that two control planes whose homes have the same path (every one deployed from
// deploy/kubernetes has /var/lib/arbiter) never take each other's pods for their own. A
// home that is wiped gets a new one; its old pods are then found by the label
// app.kubernetes.io/managed-by=arbiter and the old owner's value.
func ProviderOwner(home string) (string, error) {
	path := filepath.Join(home, "owner")
	if b, err := os.ReadFile(path); err == nil {
		if o := strings.TrimSpace(string(b)); o != "" {
			return o, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var raw [6]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	o := "arbiter-" + hex.EncodeToString(raw[:])
	if err := os.WriteFile(path, []byte(o+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write owner: %w", err)
	}
	return o, nil
}

// EnsureToken returns the home's API token, creating a random one (mode 0600) if missing.
func EnsureToken(home string) (string, error) {
	if b, err := os.ReadFile(TokenPath(home)); err == nil {
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	t := hex.EncodeToString(raw[:])
	if err := os.WriteFile(TokenPath(home), []byte(t+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write token: %w", err)
	}
	return t, nil
}

// Serve runs a control plane until ctx ends.
func Serve(ctx context.Context, o DaemonOptions) error {
	if err := os.MkdirAll(o.Home, 0o700); err != nil {
		return fmt.Errorf("home %s: %w", o.Home, err)
	}
	// Routers' reports, probes and replicas' pipes all take descriptors: take the hard limit
	// (net/http's server already waits out a shortage rather than failing).
	if _, err := fdlimit.Raise(); err != nil {
		o.Log.Warn("file-descriptor limit not raised", "err", err)
	}
	// Only its owner reads a home (token, state, replica logs), whoever created it.
	if err := os.Chmod(o.Home, 0o700); err != nil {
		return fmt.Errorf("home %s: %w", o.Home, err)
	}
	if o.Token == "" {
		t, err := EnsureToken(o.Home)
		if err != nil {
			return err
		}
		o.Token = t
	}
	if h, _, err := net.SplitHostPort(o.API); err == nil && !loopback(h) {
		o.Log.Warn("the control plane API listens beyond loopback; its token is its only protection", "api", o.API)
	}
	setting := o.State
	if setting == "" {
		setting = StatePath(o.Home)
	}
	store, err := state.OpenSetting(ctx, setting, state.Options{})
	if err != nil {
		return err
	}
	defer store.Close()
	o.Log.Info("state", "store", state.Describe(setting))
	// The owners are the deployment's, kept in the store: every control plane on it tags
	// and finds the same replicas, whatever its home (state/owner.go). A store without them
	// yet (a new one, or one from before they were kept there) takes this home's, as its
	// replicas already carry.
	localOwner, err := store.DeploymentValue(ctx, state.LocalOwnerKey, func() (string, error) { return Owner(o.Home), nil })
	if err != nil {
		return err
	}
	procs := replicas.LocalConfig{Owner: localOwner, LogDir: filepath.Join(o.Home, "logs"), ExtraPath: o.BinDir,
		Capacity: fleet.Reserved, Region: "local", Zone: "local", Grace: o.LocalGrace, Log: o.Log, MaxReplicas: o.LocalMaxReplicas,
		FallbackPath: vllmStandIn(o.Home, o.BinDir, o.Log)}
	local, err := replicas.NewLocal(procs)
	if err != nil {
		return err
	}
	sim, err := replicas.NewSim(ctx, replicas.SimConfig{Local: procs, ClockPath: filepath.Join(o.Home, "sim-markets.json"), Log: o.Log})
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	if o.Admin != "" {
		runtime := prometheus.NewRegistry()
		runtime.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", metricsHandler(prometheus.Gatherers{reg, runtime}, o.Log))
		mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, map[string]bool{"ok": true}) })
		aln, err := net.Listen("tcp", o.Admin)
		if err != nil {
			return fmt.Errorf("control plane admin: %w", err)
		}
		adminSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = adminSrv.Serve(aln) }()
		defer adminSrv.Close()
		o.Log.Info("control plane metrics", "admin", aln.Addr().String())
	}
	providers := map[string]replicas.Provider{"local": local, "sim": sim}
	if o.Providers != nil {
		owner, err := store.DeploymentValue(ctx, state.ProviderOwnerKey, func() (string, error) { return ProviderOwner(o.Home) })
		if err != nil {
			return err
		}
		more, err := o.Providers(ctx, owner)
		if err != nil {
			return err
		}
		for _, p := range more {
			if providers[p.Name()] != nil {
				return fmt.Errorf("provider %s is configured twice", p.Name())
			}
			providers[p.Name()] = p
		}
	}
	var lease Lease // nil, not a nil *state.Lease: no lease
	if o.LeaseDuration != 0 {
		holder := o.LeaseHolder
		if holder == "" {
			host, _ := os.Hostname()
			holder = fmt.Sprintf("%s/%d", host, os.Getpid())
		}
		if o.NewLease != nil {
			if lease, err = o.NewLease(ctx, store, holder, o.LeaseDuration); err != nil {
				return err
			}
			o.Log.Info("one of several control planes: leads only while elected, its writes fenced by the store's term", "holder", holder, "lease", o.LeaseDuration)
		} else {
			if lease, err = store.NewLease(holder, o.LeaseDuration, nil); err != nil {
				return err
			}
			o.Log.Info("one of several control planes: leads only while it holds the store's lease", "holder", holder, "lease", o.LeaseDuration)
		}
	} else if o.NewLease != nil {
		return errors.New("a lease outside the store needs a lease duration")
	}
	c, err := New(ctx, Config{Store: store, Providers: providers, Token: o.Token, Tick: o.Tick, DrainTimeout: o.DrainTimeout,
		Endpoint: o.Endpoint, Log: o.Log, Metrics: reg, ZoneCooldown: o.ZoneCooldown, MaxReplicas: o.MaxReplicas, Lease: lease})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.API)
	if err != nil {
		return fmt.Errorf("control plane API: %w", err)
	}
	if lease != nil {
		adv, err := advertised(o.Advertise, ln.Addr())
		if err != nil {
			ln.Close()
			return err
		}
		store.Advertise(adv)
		o.Log.Info("standbys forward writes here while this control plane leads", "advertise", adv)
	}
	api := http.NewServeMux()
	api.Handle("/", c.Handler())
	api.Handle("GET /v1/metrics", c.auth(metricsHandler(reg, o.Log).ServeHTTP))
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(runCtx); close(done) }()
	o.Log.Info("control plane serving", "api", ln.Addr().String(), "home", o.Home, "owner", localOwner)
	if o.Ready != nil {
		o.Ready(ln.Addr())
	}
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	stop()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-done
	return err
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// advertised is the URL other control planes reach this one's API at: the one given, or
// http:// and the bound address (the host name for an unspecified one).
func advertised(given string, bound net.Addr) (string, error) {
	if given != "" {
		u, err := url.Parse(given)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "", fmt.Errorf("advertise URL %q: want http://host:port (where other control planes reach this one's API)", given)
		}
		return strings.TrimSuffix(given, "/"), nil
	}
	host, port, err := net.SplitHostPort(bound.String())
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if host, err = os.Hostname(); err != nil {
			return "", fmt.Errorf("advertise URL: no host name for the API's unspecified address (%w); give one", err)
		}
	}
	return "http://" + net.JoinHostPort(host, port), nil
}

// vllmStandIn makes a folder holding a vllm that runs replicasim, for the end of the local
// and sim replicas' PATH: a SkyServe run: line (vllm serve MODEL …) then runs on a machine
// with no vLLM, simulated, and a machine with one runs its own. The stand-in is a script
// readable by its owner only, as every file in the home is. "" where replicasim is not
// beside the daemon.
func vllmStandIn(home, binDir string, log *slog.Logger) string {
	if binDir == "" {
		return ""
	}
	sim := filepath.Join(binDir, "replicasim")
	if _, err := os.Stat(sim); err != nil {
		return ""
	}
	dir := filepath.Join(home, "vllm-stand-in")
	script := "#!/bin/sh\n# replicasim standing in for vllm: `vllm serve MODEL ...` runs simulated (docs/lora.md).\nexec " +
		shellQuote(sim) + " \"$@\"\n"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		log.Warn("no vllm stand-in for replicas", "err", err)
		return ""
	}
	path := filepath.Join(dir, "vllm")
	_ = os.Remove(path) // never write through what is there (a link would lead elsewhere)
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
		log.Warn("no vllm stand-in for replicas", "err", err)
		return ""
	}
	return dir
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
