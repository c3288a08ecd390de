// Command router is Arbiter's data plane: an OpenAI-compatible edge proxy in front of a
// set of vLLM replicas, from a replica file or from the control plane.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/arbiter-serve/arbiter/internal/httplog"
	"github.com/arbiter-serve/arbiter/picker"
	"github.com/arbiter-serve/arbiter/router"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "router:", err)
		os.Exit(2)
	}
}

func run() error {
	host, _ := os.Hostname()
	var (
		listen    = flag.String("listen", "127.0.0.1:8080", "client-facing address")
		admin     = flag.String("admin", "127.0.0.1:8082", "admin address (/metrics, /health, /replicas; not 9090, which is Prometheus' own)")
		config    = flag.String("config", "", "router config YAML (defaults if empty)")
		replicas  = flag.String("replicas", "", "replica list YAML, reloaded when it changes")
		control   = flag.String("control", "", "control plane URL (e.g. http://127.0.0.1:8081), or several control planes sharing one store, comma-separated (the router talks to the one that leads); instead of -replicas")
		tokenFile = flag.String("token-file", "", "file holding the control plane's API token")
		id        = flag.String("id", fmt.Sprintf("%s-%d", host, os.Getpid()), "this router's name in load reports")
		policy    = flag.String("policy", "", "override the config's routing policy")
		apiKeys   = flag.String("api-keys", "", "client API keys file (overrides the config's api_keys_file; also $"+router.KeysEnv+")")
		tlsCert   = flag.String("tls-certfile", "", "serve HTTPS with this PEM certificate (chain); with -tls-keyfile; overrides the config's tls_cert_file. Reloaded when it changes, or on SIGHUP")
		tlsKey    = flag.String("tls-keyfile", "", "the PEM private key of -tls-certfile; overrides the config's tls_key_file")
		logLevel  = flag.String("log-level", "info", "debug, info, warn or error")
		extProc   = flag.String("ext-proc-listen", "", "also serve the endpoint picker for Kubernetes gateways (Gateway API Inference Extension, Envoy ext_proc gRPC, with gRPC health) on this address, e.g. 0.0.0.0:9002; same config, replicas and policy as the router")
		bodyMode  = flag.String("ext-proc-body-mode", "", "the gateway's ext_proc request_body_mode where its messages do not say it (protocol_config): FULL_DUPLEX_STREAMED (default), BUFFERED, BUFFERED_PARTIAL, STREAMED or NONE (the last two pick from the headers alone)")
	)
	peerOpts := router.PeerFlags(flag.CommandLine)
	flag.Parse()
	if _, err := picker.ParseBodyMode(*bodyMode); err != nil {
		return fmt.Errorf("-ext-proc-body-mode: %w", err)
	}
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
	if *apiKeys != "" {
		cfg.APIKeysFile = *apiKeys
	}
	if *tlsCert != "" || *tlsKey != "" {
		cfg.TLSCertFile, cfg.TLSKeyFile = *tlsCert, *tlsKey
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("-tls-certfile and -tls-keyfile: %w", err)
		}
	}
	token := ""
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("-token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	o := router.Options{Listen: *listen, Admin: *admin, Config: cfg, ReplicaFile: *replicas,
		ControlURL: strings.TrimSuffix(*control, "/"), Token: token, RouterID: *id, Log: log, Reload: router.ReloadOnSIGHUP(ctx)}
	if o.Peers, err = peerOpts(); err != nil {
		return err
	}
	if *extProc != "" {
		ln, err := net.Listen("tcp", *extProc)
		if err != nil {
			return fmt.Errorf("-ext-proc-listen: %w", err)
		}
		log.Info("endpoint picker serving", "ext_proc", ln.Addr().String())
		o.FrontDoors = append(o.FrontDoors, func(ctx context.Context, px *router.Proxy, synced func() bool) error {
			p := &picker.Picker{Router: px, Endpoints: cfg.MaxAttempts, MaxBody: cfg.MaxRequestBodyBytes, BodyMode: *bodyMode, Log: log}
			return picker.Serve(ctx, ln, p, synced)
		})
	}
	return router.Run(ctx, o)
}
