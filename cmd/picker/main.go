// Command picker is Arbiter's endpoint picker for one Gateway API Inference Extension
// InferencePool: the router's policy behind Envoy's ext_proc gRPC (package picker), its
// endpoints the pool's ready pods, watched and priced from their nodes (package
// picker/inferencepool), and with -control also the replicas the control plane placed. It is a program of its own because it links client-go, which the
// router binary does not; `router -ext-proc-listen` serves the same picker over a replica
// file or the control plane's replicas.
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

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/internal/httplog"
	"github.com/arbiter-serve/arbiter/picker"
	"github.com/arbiter-serve/arbiter/picker/inferencepool"
	"github.com/arbiter-serve/arbiter/picker/lease"
	"github.com/arbiter-serve/arbiter/router"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "picker:", err)
		os.Exit(2)
	}
}

// serviceAccountNamespace is where a pod's own namespace is mounted.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

func run() error {
	host, _ := os.Hostname()
	var (
		extProc    = flag.String("ext-proc-listen", "0.0.0.0:9002", "the endpoint picker's address: Envoy ext_proc gRPC (GIE's Endpoint Picker Protocol) and gRPC health")
		bodyMode   = flag.String("ext-proc-body-mode", "", "the gateway's ext_proc request_body_mode where its messages do not say it (protocol_config): FULL_DUPLEX_STREAMED (default), BUFFERED, BUFFERED_PARTIAL, STREAMED or NONE (the last two pick from the headers alone)")
		listen     = flag.String("listen", "127.0.0.1:0", "the router's own client-facing address (the gateway carries the traffic; loopback by default)")
		admin      = flag.String("admin", "127.0.0.1:8082", "admin address (/metrics, /health, /replicas)")
		config     = flag.String("config", "", "router config YAML (defaults if empty)")
		policy     = flag.String("policy", "", "override the config's routing policy")
		apiKeys    = flag.String("api-keys", "", "client API keys file (overrides the config's api_keys_file; also $"+router.KeysEnv+")")
		logLevel   = flag.String("log-level", "info", "debug, info, warn or error")
		poolName   = flag.String("pool-name", "", "name of the InferencePool (inference.networking.k8s.io/v1) this picker serves: its ready pods are the endpoints (required)")
		poolNS     = flag.String("pool-namespace", "", "namespace of the InferencePool (default: the picker's own, in a pod; else default)")
		kubeconfig = flag.String("kubeconfig", "", "kubeconfig to reach the cluster (default: in-cluster, else $KUBECONFIG or ~/.kube/config)")
		control    = flag.String("control", "", "also take the replicas Arbiter's control plane placed, and report load to it (e.g. http://arbiter-control.arbiter.svc:8081): a pod both name is the control plane's replica")
		tokenFile  = flag.String("token-file", "", "file holding the control plane's API token (with -control)")
		model      = flag.String("model", "", "the model the pool's pods serve, as clients name it; a pod annotated "+inferencepool.AnnotationModel+" names its own")
		elect      = flag.Bool("leader-elect", false, "active-passive: the pickers of this pool campaign for a Kubernetes Lease and only its holder reports ready, so the gateway sends every request to one picker (needs get, create and update on leases.coordination.k8s.io)")
		leaseName  = flag.String("leader-elect-lease", "", "the Lease's name with -leader-elect (default arbiter-picker-<pool-name>), in the pool's namespace")
		leaseFor   = flag.Duration("leader-elect-lease-duration", lease.DefaultDuration, "with -leader-elect, how long a holder that stops renewing keeps the Lease: the longest a takeover waits")
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
	if *poolName == "" {
		return fmt.Errorf("-pool-name is required")
	}
	if *poolNS == "" {
		*poolNS = "default"
		if b, err := os.ReadFile(serviceAccountNamespace); err == nil && strings.TrimSpace(string(b)) != "" {
			*poolNS = strings.TrimSpace(string(b))
		}
	}
	rc, err := restConfig(*kubeconfig)
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
	token := ""
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("-token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	ln, err := net.Listen("tcp", *extProc)
	if err != nil {
		return fmt.Errorf("-ext-proc-listen: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log.Info("endpoint picker serving", "ext_proc", ln.Addr().String(), "pool", *poolNS+"/"+*poolName)
	o := router.Options{Listen: *listen, Admin: *admin, Config: cfg, RouterID: host, Log: log,
		ControlURL: strings.TrimSuffix(*control, "/"), Token: token,
		Source: func(ctx context.Context, pool *router.Pool) (func() bool, error) {
			w, err := inferencepool.Watch(ctx, inferencepool.Config{Rest: rc, Namespace: *poolNS, Name: *poolName, Model: *model, Log: log},
				func(set []fleet.Replica) { pool.SetSource(inferencepool.SourceName, set) })
			if err != nil {
				return nil, err
			}
			return w.Synced, nil
		}}
	if o.Peers, err = peerOpts(); err != nil {
		return err
	}
	o.FrontDoors = append(o.FrontDoors, func(ctx context.Context, px *router.Proxy, synced func() bool) error {
		p := &picker.Picker{Router: px, Endpoints: cfg.MaxAttempts, MaxBody: cfg.MaxRequestBodyBytes, BodyMode: *bodyMode, Log: log}
		ready := synced
		if *elect {
			name := *leaseName
			if name == "" {
				name = "arbiter-picker-" + *poolName
			}
			held, err := lease.Campaign(ctx, lease.Config{Rest: rc, Namespace: *poolNS, Name: name,
				Holder: fmt.Sprintf("%s_%d", host, os.Getpid()), Duration: *leaseFor, Log: log})
			if err != nil {
				return fmt.Errorf("-leader-elect: %w", err)
			}
			ready = func() bool { return synced() && held() }
		}
		return picker.Serve(ctx, ln, p, ready)
	})
	return router.Run(ctx, o)
}

// restConfig reaches the cluster: a kubeconfig named, else the pod's own service account,
// else the default kubeconfig.
func restConfig(path string) (*rest.Config, error) {
	if path == "" {
		if rc, err := rest.InClusterConfig(); err == nil {
			return rc, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return rc, nil
}
