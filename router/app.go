package router

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/valyala/fasthttp"

	"github.com/arbiter-serve/arbiter/internal/conn/fdlimit"
	"github.com/arbiter-serve/arbiter/internal/conn/linger"
	"github.com/arbiter-serve/arbiter/internal/httplog"
)

// Options is a whole router: where it listens and where its replica set comes from (a
// file, or the control plane).
type Options struct {
	Listen, Admin string
	Config        Config
	// ReplicaFile is a replica list reloaded when it changes (standalone use).
	ReplicaFile string
	// ControlURL, Token and RouterID link the router to a control plane instead.
	ControlURL, Token, RouterID string
	// Source keeps replicas of its own in the pool (Pool.SetSource) until ctx ends (the
	// endpoint picker's InferencePool watch), instead of a file and beside or instead of
	// the control plane's: it returns once it has started, with synced saying whether its
	// set has been received once.
	Source func(ctx context.Context, pool *Pool) (synced func() bool, err error)
	Log    *slog.Logger
	// Ready, if set, receives the bound addresses once both listeners are up.
	Ready func(listen, admin net.Addr)
	// Reload, if set, receives a function that reads the TLS pair again at once (cmd/router
	// calls it on SIGHUP); the files are also watched.
	Reload func(reload func())
	// ControlMetrics merges the control plane's own metrics (its API's /v1/metrics) into
	// the admin port's /metrics: the embedded daemon's router and control plane are two
	// processes behind one scrape target.
	ControlMetrics bool
	// FrontDoors are other front doors served beside the client port, each until ctx ends,
	// on this router's proxy (its pool, policies and accounting): the endpoint picker
	// (package picker) is one. synced says the replica set has been received once. An
	// error from one ends the router.
	FrontDoors []func(ctx context.Context, px *Proxy, synced func() bool) error
	// Peers, if set, shares this router's view of the fleet with other routers serving it
	// (peers.go): what each sent where, so each routes on the whole load and every prefix.
	Peers *PeerOptions
}

// Run serves until ctx ends, then finishes in-flight requests (up to 30 s).
func Run(ctx context.Context, o Options) error {
	cfg, log := o.Config, o.Log
	if o.ReplicaFile != "" && (o.ControlURL != "" || o.Source != nil) || o.ReplicaFile == "" && o.ControlURL == "" && o.Source == nil {
		return errors.New("router: give a replica file, or a control plane URL, a replica source or both")
	}
	// Idle connections must not exhaust the descriptors the router needs to serve: take
	// the hard limit, and hold fewer client connections than it leaves room for (the ones
	// beyond are answered 503 and closed).
	limit, err := fdlimit.Raise()
	if err != nil {
		log.Warn("file-descriptor limit not raised", "err", err)
	}
	if budget := fdlimit.ClientBudget(limit); limit > 0 && cfg.MaxConnections > budget {
		log.Info("max_connections lowered to what the file-descriptor limit leaves room for", "max_connections", budget, "configured", cfg.MaxConnections, "nofile", limit)
		cfg.MaxConnections = budget
	}
	if limit, ok := memoryLimit(&cfg, os.Getenv("GOMEMLIMIT")); ok {
		debug.SetMemoryLimit(limit)
		log.Debug("soft memory limit set", "bytes", limit)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	met := NewMetrics(reg)
	var aff *Affinity
	if cfg.AffinitySize > 0 {
		var err error
		if aff, err = NewAffinity(cfg.AffinitySize, defaultBlockTokens); err != nil {
			return err
		}
	}
	pool := NewPool(&cfg, log, met, aff)
	if o.Peers != nil {
		po := *o.Peers
		if po.Name == "" {
			po.Name = o.RouterID
		}
		v, stopPeers, err := startPeers(po, pool, reg, log)
		if err != nil {
			return err
		}
		defer stopPeers()
		pool.sharePeers(v)
		log.Info("sharing the view of the fleet with peers", "gossip", v.Addr(), "name", po.Name, "join", po.Join)
	}
	px, err := NewProxy(&cfg, pool, met, log)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	var certs *CertReloader
	if cfg.TLSCertFile != "" {
		if certs, err = NewCertReloader(cfg.TLSCertFile, cfg.TLSKeyFile, log); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if certs != nil {
		go certs.Watch(ctx, time.Second)
		if o.Reload != nil {
			o.Reload(func() {
				if changed, err := certs.Reload(); err != nil {
					log.Error("tls certificate not reloaded; serving the previous one", "err", err)
				} else if changed {
					log.Info("tls certificate reloaded", "cert", cfg.TLSCertFile)
				}
			})
		}
	}
	if err := px.loadKeys(ctx, cfg.APIKeysFile, os.Getenv(KeysEnv), o.ControlURL != "", log); err != nil {
		ln.Close()
		return err
	}
	if px.keys.Load() == nil && !isLoopback(ln.Addr()) {
		log.Warn("the router listens beyond loopback without API keys: anyone who can reach it can use it (set api_keys_file or "+KeysEnv+")", "listen", ln.Addr().String())
	}
	aln, err := net.Listen("tcp", o.Admin)
	if err != nil {
		ln.Close()
		return err
	}
	synced := func() bool { return true } // the file is read before serving
	if o.ReplicaFile != "" {
		if err := WatchReplicaFile(ctx, o.ReplicaFile, pool, log, time.Second); err != nil {
			ln.Close()
			aln.Close()
			return err
		}
	}
	if o.Source != nil {
		if synced, err = o.Source(ctx, pool); err != nil {
			ln.Close()
			aln.Close()
			return err
		}
		if synced == nil {
			synced = func() bool { return true }
		}
	}
	if o.ControlURL != "" {
		cp := NewControlPlane(o.ControlURL, o.Token, o.RouterID, pool, px.Load, log)
		px.ControlPlane = cp
		cp.OnAdaptersRemoved = px.unloadAdapters
		sourceSynced := synced
		synced = func() bool { return cp.Revision() > 0 && sourceSynced() }
		go cp.Run(ctx)
	}
	go pool.Run(ctx)

	srv := NewServer(&cfg, px.Handle, log)
	var gather prometheus.Gatherer = reg
	if o.ControlMetrics && o.ControlURL != "" {
		gather = prometheus.Gatherers{newControlMetrics(o.ControlURL, o.Token, reg), reg}
	}
	adminSrv := &fasthttp.Server{Handler: AdminHandler(gather, pool, cfg.Pprof), Name: "arbiter-admin", ReadTimeout: 10 * time.Second, Logger: httplog.Fasthttp{L: log}}
	log.Info("router serving", "listen", ln.Addr().String(), "tls", certs != nil, "admin", aln.Addr().String(), "policy", cfg.Policy, "control_plane", o.ControlURL)
	errc := make(chan error, 2+len(o.FrontDoors))
	for _, fd := range o.FrontDoors {
		go func() { errc <- fd(ctx, px, synced) }()
	}
	// A request refused before it was read whole (413, a shed connection's 503) must reach
	// the client rather than be destroyed by the reset of a plain close. Lingering holds
	// descriptors: at most a sixteenth of the budget's worth at once.
	lingerMax := 1024
	if limit > 0 {
		lingerMax = max(16, int(limit/16))
	}
	cln := linger.Listener(fdlimit.Listener(ln, log), 250*time.Millisecond, 5*time.Second, lingerMax)
	if certs != nil {
		// TLS over the lingering listener: a lingering close then finishes the TLS
		// record's bytes too. The handshake runs on the connection's first read, inside
		// the server's read timeout.
		cln = tls.NewListener(cln, certs.Config())
	}
	go func() { errc <- srv.Serve(cln) }()
	go func() { errc <- adminSrv.Serve(fdlimit.Listener(aln, log)) }()
	if o.Ready != nil {
		o.Ready(ln.Addr(), aln.Addr())
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("router shutting down: finishing in-flight requests")
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	_ = adminSrv.ShutdownWithContext(sctx)
	err = srv.ShutdownWithContext(sctx)
	if px.ControlPlane != nil {
		px.ControlPlane.LastReport()
	}
	return err
}

// loadKeys installs the client API keys, reloading the file when it changes.
// Budgets need a control plane (controlled): it adds every router's spend up and keeps it.
func (px *Proxy) loadKeys(ctx context.Context, file, env string, controlled bool, log *slog.Logger) error {
	if file == "" {
		ks, err := ParseKeys(nil, env)
		px.SetKeys(ks)
		return err
	}
	return watchFile(ctx, file, "api keys file", log, time.Second, func(b []byte) error {
		ks, err := ParseKeys(b, env)
		if err != nil {
			return err
		}
		if ks.HasBudgets() && !controlled {
			return errors.New("api keys: tenants' budgets need a control plane (-control, or serve up), which adds every router's spend up and keeps it across restarts; this router has none")
		}
		px.SetKeys(ks)
		return nil
	})
}

func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// memoryLimit is the soft memory limit the router sets, if any: none when GOMEMLIMIT is set
// (the runtime has read it) or memory_limit_bytes is negative.
func memoryLimit(cfg *Config, env string) (int64, bool) {
	switch {
	case env != "" || cfg.MemoryLimitBytes < 0:
		return 0, false
	case cfg.MemoryLimitBytes > 0:
		return cfg.MemoryLimitBytes, true
	}
	return int64(cfg.MaxBodyBufferBytes) + parseBudget(cfg) + 256<<20, true
}

// ReloadOnSIGHUP is an Options.Reload that calls the router's reload on each SIGHUP until
// ctx ends: `kill -HUP` reads the TLS pair again at once, instead of at the next poll of the
// files.
func ReloadOnSIGHUP(ctx context.Context) func(func()) {
	return func(reload func()) {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		go func() {
			defer signal.Stop(hup)
			for {
				select {
				case <-ctx.Done():
					return
				case <-hup:
					reload()
				}
			}
		}()
	}
}
