// Command serve is Arbiter's CLI: `serve up service.yaml` starts a service (and, on a bare
// machine, the embedded control plane and router with the local provider); status, update,
// down, logs and replicas manage it through the control plane's API.
package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/internal/httplog"
	"github.com/arbiter-serve/arbiter/pricing"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/router"
	"github.com/arbiter-serve/arbiter/scaling"
	"github.com/arbiter-serve/arbiter/spec"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := root().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		var ce *cliError
		if errors.As(err, &ce) {
			os.Exit(ce.code)
		}
		os.Exit(exitUsage)
	}
}

type globals struct {
	home, api string
	daemon    daemonFlags
}

func root() *cobra.Command {
	g := &globals{}
	home, _ := os.UserHomeDir()
	cmd := &cobra.Command{
		Use:           "serve",
		Short:         "Serve LLMs on the cheapest GPUs that meet your latency SLO",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       buildVersion(),
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&g.home, "home", envOr("ARBITER_HOME", filepath.Join(home, ".arbiter")), "state directory of the local control plane ($ARBITER_HOME)")
	pf.StringVar(&g.api, "api", os.Getenv("ARBITER_API"), "control plane URL (default: the one running for --home); several control planes on one store, comma-separated: the CLI talks to one that answers, and moves on when one does not")
	pf.StringVar(&tokenFile, "token-file", "", "file holding the control plane's API token (default: $"+tokenEnv+", else <--home>/token); the file given to the autoscalers' --token-file")
	pf.DurationVar(&failoverWait, "failover-wait", failoverWait, "with several control planes (--api a,b,c): how long a call waits for one to take it while none can (a failover); 0: not at all")
	up, daemon := upCmd(g), daemonCmd(g)
	addDaemonFlags(up, &g.daemon)
	addDaemonFlags(daemon, &g.daemon)
	cmd.AddCommand(up, daemon, startCmd(g), statusCmd(g), replicasCmd(g), updateCmd(g), downCmd(g), validateCmd(), logsCmd(g), stopCmd(g), preemptCmd(g), keysCmd(), routerCmd(g), stateCmd(g))
	return cmd
}

// addDaemonFlags adds the embedded daemon's flags to a command that may start it.
func addDaemonFlags(c *cobra.Command, df *daemonFlags) {
	f := c.Flags()
	f.StringVar(&df.api, "control-listen", "127.0.0.1:8081", "control plane API address (embedded daemon)")
	f.StringVar(&df.listen, "listen", "127.0.0.1:8080", "router endpoint address (embedded daemon)")
	f.StringVar(&df.admin, "admin", "127.0.0.1:8082", "router admin/metrics address (embedded daemon; not 9090, which is Prometheus' own)")
	f.DurationVar(&df.tick, "tick", time.Second, "control loop interval (embedded daemon)")
	f.DurationVar(&df.drain, "drain-timeout", 120*time.Second, "longest wait for a draining replica's requests")
	f.DurationVar(&df.grace, "grace", 10*time.Second, "SIGTERM to SIGKILL grace for local replicas")
	f.StringVar(&df.logLevel, "log-level", "info", "daemon log level")
	f.StringVar(&df.apiKeys, "api-keys", "", "client API keys file for the router (see `serve keys new`); default: $"+router.KeysEnv+", else no key needed")
	f.StringVar(&df.tlsCert, "tls-certfile", "", "serve the router endpoint over HTTPS with this PEM certificate (embedded daemon; serve up takes it from service.tls); reloaded when the file changes")
	f.StringVar(&df.tlsKey, "tls-keyfile", "", "the PEM private key of --tls-certfile")
	f.StringVar(&df.providers, "providers", "", "providers file: the Kubernetes clusters, AWS account and RunPod account replicas may run on (default: <home>/providers.yaml if it exists)")
	f.DurationVar(&df.zoneCooldown, "zone-cooldown", 10*time.Minute, "how long spot stays out of a zone that preempted a replica or refused a launch")
	f.IntVar(&df.maxReplicas, "max-replicas", control.DefaultMaxReplicas, "the most replicas the control plane runs at once, all services together")
	f.IntVar(&df.localMaxReplicas, "local-max-replicas", replicas.DefaultLocalMaxReplicas(), "the most replicas the local and sim providers run on this machine at once")
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// specVars are a command's --env and --secret flags.
type specVars struct{ envs, secrets []string }

func (v *specVars) add(c *cobra.Command) {
	c.Flags().StringArrayVar(&v.envs, "env", nil, "set or fill an env of the spec (K=V, or K to take it from this environment)")
	c.Flags().StringArrayVar(&v.secrets, "secret", nil, "set or fill a secret of the spec (K=V, or K to take it from this environment); never shown")
}

// overrides reads the flags (a bare K takes the variable from this environment, as
// SkyPilot's --env and --secret do).
func (v *specVars) overrides() (spec.Overrides, error) {
	envs, err := parseVars("--env", v.envs)
	if err != nil {
		return spec.Overrides{}, err
	}
	secrets, err := parseVars("--secret", v.secrets)
	return spec.Overrides{Envs: envs, Secrets: secrets}, err
}

func parseVars(flag string, flags []string) (map[string]string, error) {
	if len(flags) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, f := range flags {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			v, ok = os.LookupEnv(k)
			if !ok {
				return nil, fail(exitUsage, "%s %s: no value given and none in this environment; write %s %s=VALUE", flag, k, flag, k)
			}
		}
		if k == "" {
			return nil, fail(exitUsage, "%s %q: want NAME=VALUE", flag, f)
		}
		out[k] = v
	}
	return out, nil
}

// loadSpec reads and validates a service file with --env and --secret values; errors exit
// with the usage code.
func loadSpec(path string, o spec.Overrides) (*spec.Service, []byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fail(exitUsage, "%v", err)
	}
	sp, err := spec.ParseWith(path, b, o)
	if err == nil {
		// The workdir is a folder here, where serve runs (and, on aws, one it can copy).
		err = sp.CheckWorkdir()
	}
	if err != nil {
		return nil, nil, fail(exitUsage, "%s is not a valid service:\n%v", path, err)
	}
	return sp, b, nil
}

// tlsPaths is service.tls with ~ expanded and relative paths made absolute (relative to
// where serve runs, as SkyPilot reads local files), checked to load as a pair.
func tlsPaths(t *spec.TLS) (cert, key string, err error) {
	abs := func(p string) (string, error) {
		if rest, ok := strings.CutPrefix(p, "~/"); ok || p == "~" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", err
			}
			p = filepath.Join(home, rest)
		}
		return filepath.Abs(p)
	}
	if cert, err = abs(t.CertFile); err != nil {
		return "", "", err
	}
	if key, err = abs(t.KeyFile); err != nil {
		return "", "", err
	}
	if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
		return "", "", fmt.Errorf("service.tls: certfile %s and keyfile %s do not load as a pair: %v", cert, key, err)
	}
	return cert, key, nil
}

// tlsFromSpec sets the embedded daemon's TLS pair from service.tls; a pair given with
// --tls-certfile/--tls-keyfile must be the same one.
func tlsFromSpec(df *daemonFlags, sp *spec.Service) error {
	if sp.Service.TLS == nil {
		return nil
	}
	cert, key, err := tlsPaths(sp.Service.TLS)
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	if df.tlsCert != "" || df.tlsKey != "" {
		fc, _ := filepath.Abs(df.tlsCert)
		fk, _ := filepath.Abs(df.tlsKey)
		if fc != cert || fk != key {
			return fail(exitUsage, "service.tls names certfile %s and keyfile %s, --tls-certfile/--tls-keyfile name %s and %s: give one pair", cert, key, fc, fk)
		}
	}
	df.tlsCert, df.tlsKey = cert, key
	return nil
}

// checkDaemonTLS refuses to submit a service whose service.tls the running daemon's
// endpoint does not serve: one router serves every service of a daemon, so its TLS pair
// is the daemon's.
func checkDaemonTLS(info daemonInfo, df daemonFlags) error {
	if df.tlsCert == "" || (info.TLSCert == df.tlsCert && info.TLSKey == df.tlsKey) {
		return nil
	}
	now := "plain HTTP"
	if info.TLSCert != "" {
		now = "HTTPS with certfile " + info.TLSCert + " and keyfile " + info.TLSKey
	}
	return fail(exitErr, "service.tls: the running daemon's endpoint %s serves %s, not certfile %s and keyfile %s (one router serves every service of a daemon); stop it with `serve stop` and run serve up again, or give the services one pair",
		info.Endpoint, now, df.tlsCert, df.tlsKey)
}

// resolveSpec does what SkyPilot does before it optimises (pricing.Resolve): accelerator
// names spelled as the catalogs spell them, and those nothing can price or run left out,
// each with a warning at its place in the file, written to warn. A service left with no
// accelerator to run on is refused, with the places.
func resolveSpec(sp *spec.Service, path string, warn io.Writer) error {
	// What the file gives that has no effect where the service runs (config keys for a
	// platform it does not use) is said, not dropped.
	for _, w := range sp.Warnings() {
		fmt.Fprintf(warn, "warning: %v\n", w)
	}
	if len(sp.AcceleratorNames()) == 0 {
		return nil
	}
	cat, err := pricing.Embedded()
	if err != nil {
		return err
	}
	warnings, err := pricing.Resolve(sp, cat)
	if err != nil {
		return fail(exitUsage, "%s is not a valid service:\n%v", path, err)
	}
	for _, w := range warnings {
		fmt.Fprintf(warn, "warning: %v\n", w)
	}
	return nil
}

// loadSpecAsking is loadSpec for a launch: the envs and secrets the file leaves null and
// the flags do not fill (SkyServe's "give it at launch") are asked for when stdin is a
// terminal (secrets without echo); otherwise the file is refused, naming the flag.
func loadSpecAsking(cmd *cobra.Command, path string, o spec.Overrides) (*spec.Service, []byte, spec.Overrides, error) {
	deferred := o
	deferred.DeferMissing = true
	sp, b, err := loadSpec(path, deferred)
	switch {
	case err != nil:
		return nil, nil, o, err
	case len(sp.Missing) == 0:
		return sp, b, o, nil // what a strict parse gives: nothing was deferred
	case !term.IsTerminal(int(os.Stdin.Fd())):
		// No one to ask: the strict parse says which flag gives each.
		sp, b, err := loadSpec(path, o)
		return sp, b, o, err
	}
	in := bufio.NewReader(os.Stdin)
	for _, m := range sp.Missing {
		kind, key, _ := strings.Cut(m, ".")
		fmt.Fprintf(cmd.ErrOrStderr(), "%s (%s): ", key, strings.TrimSuffix(kind, "s"))
		var value string
		if kind == "secrets" {
			b, err := term.ReadPassword(int(os.Stdin.Fd()))
			fmt.Fprintln(cmd.ErrOrStderr())
			if err != nil {
				return nil, nil, o, fail(exitUsage, "read %s: %v", key, err)
			}
			value = string(b)
			o.Secrets = withValue(o.Secrets, key, value)
		} else {
			line, err := in.ReadString('\n')
			if err != nil && line == "" {
				return nil, nil, o, fail(exitUsage, "read %s: %v", key, err)
			}
			value = strings.TrimRight(line, "\r\n")
			o.Envs = withValue(o.Envs, key, value)
		}
	}
	sp, b, err = loadSpec(path, o)
	return sp, b, o, err
}

func withValue(m map[string]string, k, v string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	m[k] = v
	return m
}

var nameRE = regexp.MustCompile(`[^a-z0-9-]+`)

// serviceName picks -n, else the spec's name, else the file name, made a valid name.
func serviceName(flag string, sp *spec.Service, path string) string {
	if flag != "" {
		return flag
	}
	if sp.Name != "" {
		return sp.Name
	}
	base := strings.ToLower(strings.TrimSuffix(filepath.Base(path), filepath.Ext(path)))
	return strings.Trim(nameRE.ReplaceAllString(base, "-"), "-")
}

func upCmd(g *globals) *cobra.Command {
	var name string
	var detach, yes bool
	var wait time.Duration
	var vars specVars
	cmd := &cobra.Command{
		Use:   "up [-n NAME] [--env K=V]... [--secret K=V]... FILE",
		Short: "Start a service (and the local control plane and router if none runs)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := vars.overrides()
			if err != nil {
				return err
			}
			sp, raw, o, err := loadSpecAsking(cmd, args[0], o)
			if err != nil {
				return err
			}
			if err := resolveSpec(sp, args[0], cmd.ErrOrStderr()); err != nil {
				return err
			}
			envs := o.Envs
			name = serviceName(name, sp, args[0])
			if err := spec.CheckName(name); err != nil {
				return fail(exitUsage, "%v", err)
			}
			log, _ := httplog.NewLogger("warn")
			var c *client
			var info daemonInfo
			if g.api != "" {
				c, info, err = connect(cmd.Context(), g.home, g.api)
			} else {
				df := g.daemon
				if err := tlsFromSpec(&df, sp); err != nil {
					return err
				}
				if c, info, err = ensureDaemon(cmd.Context(), g.home, df, log); err == nil {
					err = checkDaemonTLS(info, df)
				}
			}
			if err != nil {
				return err
			}
			req := control.SubmitRequest{Name: name, Spec: string(raw), Envs: envs, Secrets: o.Secrets}
			if err := confirmLaunch(cmd, c, sp, req, yes); err != nil {
				return err
			}
			var res control.SubmitResponse
			if _, err := c.do(cmd.Context(), http.MethodPost, "/v1/services", req, &res); err != nil {
				return serviceErr(name, err)
			}
			out := cmd.OutOrStdout()
			if res.Unchanged {
				fmt.Fprintf(out, "Service %s is up already with this file (version %d).\n", name, res.Version)
			} else {
				fmt.Fprintf(out, "Service %s version %d submitted.\n", name, res.Version)
			}
			if !detach {
				if err := waitService(cmd.Context(), c, name, res.Version, wait, out); err != nil {
					return err
				}
			}
			if info.Endpoint != "" {
				model := "MODEL"
				if len(sp.Arbiter.Models) > 0 {
					model = sp.Arbiter.Models[0]
				}
				fmt.Fprintf(out, "\nEndpoint: %s/v1  (OpenAI-compatible; metrics: %s/metrics)\n", info.Endpoint, info.Admin)
				fmt.Fprintf(out, "  curl %s/v1/chat/completions -H 'Content-Type: application/json' \\\n    -d '{\"model\":%q,\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":16}'\n", info.Endpoint, model)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&name, "name", "n", "", "service name (default: the file's name: key, else its file name)")
	vars.add(cmd)
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "launch on a paid provider without asking (the price is shown either way)")
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "return once submitted, without waiting for replicas")
	cmd.Flags().DurationVar(&wait, "wait", 15*time.Minute, "how long to wait for the service to be ready")
	return cmd
}

// confirmLaunch shows, for a service on a paid provider (anything but the local machine
// and the simulated market), where its first replicas would run and at what price, from
// the providers' live quotes, and asks before launching when stdin is a terminal and -y
// was not given. A service that runs this file already launches nothing, so it is not
// asked about.
func confirmLaunch(cmd *cobra.Command, c *client, sp *spec.Service, req control.SubmitRequest, yes bool) error {
	paid := slices.ContainsFunc(sp.Arbiter.Providers, func(p string) bool { return p != "local" && p != "sim" })
	if !paid {
		return nil
	}
	if st, err := c.service(cmd.Context(), req.Name); err == nil && st.Version > 0 {
		return nil // up again: the control plane says whether it is the same file
	}
	out := cmd.OutOrStdout()
	var pv control.Preview
	if _, err := c.do(cmd.Context(), http.MethodPost, "/v1/preview", req, &pv); err != nil {
		return serviceErr(req.Name, err)
	}
	printPreview(out, req.Name, sp, &pv)
	if yes || !term.IsTerminal(int(os.Stdin.Fd())) {
		return nil
	}
	fmt.Fprint(out, "Launch? [Y/n] ")
	line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "", "y", "yes":
		return nil
	}
	return fail(exitErr, "not launched")
}

// printPreview writes what placement would launch first and what it costs.
func printPreview(out io.Writer, name string, sp *spec.Service, pv *control.Preview) {
	fmt.Fprintf(out, "Service %s on %s: min %d, max %d replicas.\n", name, strings.Join(sp.Arbiter.Providers, ", "), pv.MinReplicas, pv.MaxReplicas)
	for _, p := range pv.Problems {
		fmt.Fprintf(out, "  note: %s\n", p)
	}
	if !pv.Market {
		fmt.Fprintf(out, "  no provider quotes a price; replicas run as arbiter.local describes them ($%.4f/h each)\n", sp.Arbiter.Local.PricePerHour)
		return
	}
	if len(pv.Launches) == 0 {
		fmt.Fprintf(out, "  nothing can be placed now (%d priced offers): %s\n", pv.Offers, pv.Reason)
		return
	}
	total, dearest := 0.0, 0.0
	fmt.Fprintf(out, "  first %d replica(s), placed among %d offers:\n", len(pv.Launches), pv.Offers)
	for _, launch := range pv.Launches {
		l := launch.Offer
		what := cmp.Or(l.InstanceType, "capacity")
		if l.Accelerator != "" {
			what += fmt.Sprintf(" (%s:%d)", l.Accelerator, max(l.AcceleratorCount, 1))
		}
		where := l.Provider
		if loc := strings.Trim(l.Region+"/"+l.Zone, "/"); loc != "" { // a node without zone labels names neither
			where += " " + loc
		}
		fmt.Fprintf(out, "    %-9s %s in %s at $%.4f/h", l.Capacity, what, where, l.PricePerHour)
		if l.PriceSource != "" {
			fmt.Fprintf(out, ", priced by %s", l.PriceSource)
		}
		fmt.Fprintln(out)
		// What placement ranked it by: $ per million tokens at the SLO, and what that rests on.
		switch m := l.PerMTokens(); {
		case math.IsInf(m, 1):
			fmt.Fprintf(out, "              cannot meet the SLO (%s)\n", l.Sustains.Why)
		case m > 0:
			fmt.Fprintf(out, "              $%.3f/M tokens at the SLO: %.0f tokens/s (%s)\n", m, l.Sustains.TokensPerSecond, l.Sustains.Why)
		}
		total += l.PricePerHour
		dearest = max(dearest, l.PricePerHour)
	}
	fmt.Fprintf(out, "  $%.2f/h to start", total)
	if pv.MaxReplicas > len(pv.Launches) {
		fmt.Fprintf(out, "; about $%.2f/h at max_replicas (%d at up to $%.4f/h)", dearest*float64(pv.MaxReplicas), pv.MaxReplicas, dearest)
	}
	fmt.Fprintln(out)
	if pv.Reason != "" {
		fmt.Fprintf(out, "  placement: %s\n", pv.Reason)
	}
}

// waitService prints the service's events until version's replicas are ready (or, for a
// service at zero, until it is known to be scaled to zero), and older versions are gone.
func waitService(ctx context.Context, c *client, name string, version int, wait time.Duration, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	p := newProgress(out)
	defer p.clear()
	after := submitted(ctx, c, name, version)
	for {
		// Every page: the API answers a long log a page at a time.
		for {
			ev, err := c.events(ctx, name, "", after)
			if err != nil || len(ev) == 0 {
				break
			}
			for _, e := range ev {
				who := e.Replica
				if who == "" {
					who = e.Service
				}
				p.printf("  %s  %-14s %s\n", e.At.Format("15:04:05"), who, e.Message)
				after = e.ID
			}
		}
		st, err := c.service(ctx, name)
		if err != nil {
			if ctx.Err() != nil {
				return fail(exitErr, "service %s not ready within %s; `serve status %s` shows where it is", name, wait, name)
			}
			return serviceErr(name, err)
		}
		newReady, old := 0, 0
		states := map[string]int{}
		for _, r := range st.Replicas {
			if r.Version == version {
				states[r.State]++
				if r.State == "ready" {
					newReady++
				}
			}
			if r.Version < version {
				old++
			}
		}
		switch {
		case st.Target == 0 && st.Live == 0 && old == 0:
			p.printf("Service %s is scaled to zero: the first request starts a replica (and waits for it).\n", name)
			return nil
		case st.Target > 0 && newReady >= st.Target && old == 0:
			p.printf("Service %s is ready: %d/%d replicas of version %d.\n", name, newReady, st.Target, version)
			return nil
		}
		status := fmt.Sprintf("%s version %d: %d/%d ready", name, version, newReady, st.Target)
		for _, state := range []string{"pending", "provisioning", "starting", "not_ready", "draining"} {
			if n := states[state]; n > 0 {
				status += fmt.Sprintf(" · %d %s", n, strings.ReplaceAll(state, "_", " "))
			}
		}
		if old > 0 {
			status += fmt.Sprintf(" · %d of older versions", old)
		}
		p.status(status)
		select {
		case <-ctx.Done():
			return fail(exitErr, "service %s not ready within %s; `serve status %s` shows where it is", name, wait, name)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// submitted is the id of the event before the service's last "version N submitted": what
// happens from the submission on is what serve up shows. The last, not the first: a
// service of the same name deleted earlier had its own version 1 (a control plane before
// the state kept their logs apart lists its events as the name's), and the log is read a
// page at a time to its end. 0 when the log cannot be read.
func submitted(ctx context.Context, c *client, name string, version int) int64 {
	want := fmt.Sprintf("version %d submitted", version)
	var from, after int64
	for {
		ev, err := c.events(ctx, name, "", after)
		if err != nil || len(ev) == 0 {
			return from
		}
		for _, e := range ev {
			if e.Kind == "service" && e.Message == want {
				from = e.ID - 1
			}
			after = e.ID
		}
	}
}

// progress keeps one status line, rewritten in place, under the lines printed above it,
// when out is a terminal; anywhere else it prints only those lines (a log or a pipe gets
// no control characters, and the events say what happens).
type progress struct {
	out   io.Writer
	tty   bool
	shown bool
	start time.Time
	frame int
}

func newProgress(out io.Writer) *progress {
	f, ok := out.(*os.File)
	return &progress{out: out, tty: ok && term.IsTerminal(int(f.Fd())), start: time.Now()}
}

func (p *progress) clear() {
	if p.shown {
		fmt.Fprint(p.out, "\r\x1b[K")
		p.shown = false
	}
}

func (p *progress) printf(format string, args ...any) {
	p.clear()
	fmt.Fprintf(p.out, format, args...)
}

func (p *progress) status(s string) {
	if !p.tty {
		return
	}
	const spin = "|/-\\"
	p.frame++
	p.clear()
	fmt.Fprintf(p.out, "%c %s · %s", spin[p.frame%len(spin)], s, time.Since(p.start).Round(time.Second))
	p.shown = true
}

func daemonCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "daemon",
		Short: "Run the embedded control plane and router in the foreground (serve up starts it in the background)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDaemon(cmd.Context(), g.home, g.daemon)
		},
	}
}

func stopCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "stop",
		Short: "Stop the local control plane and router (replicas keep running: a restart adopts them; `serve down --all` first to end them)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			home, err := filepath.Abs(g.home)
			if err != nil {
				return fail(exitUsage, "--home: %v", err)
			}
			out := cmd.OutOrStdout()
			stopped := false
			if info, err := readDaemonInfo(home); err == nil && running(info.PID) {
				// The daemon stops its router first, which finishes in-flight requests.
				if err := terminate(info.PID, 60*time.Second); err != nil {
					return fail(exitErr, "stop the control plane: %v", err)
				}
				fmt.Fprintln(out, "Control plane stopped.")
				stopped = true
			}
			// A router left serving by a daemon that crashed.
			if r, err := readRouterInfo(home); err == nil && isRouterProcess(r.PID, home) {
				if err := terminate(r.PID, 40*time.Second); err != nil {
					return fail(exitErr, "stop the router: %v", err)
				}
				fmt.Fprintln(out, "Router stopped.")
				stopped = true
			}
			_ = os.Remove(daemonInfoPath(home))
			_ = os.Remove(routerInfoPath(home))
			if !stopped {
				return fail(exitUnreachable, "no control plane is running for %s", home)
			}
			return nil
		},
	}
}

// terminate sends SIGTERM to pid and waits for it to be gone.
func terminate(pid int, wait time.Duration) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("pid %d: %w", pid, err)
	}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if !running(pid) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("pid %d still running after %s", pid, wait)
}

func validateCmd() *cobra.Command {
	var vars specVars
	cmd := &cobra.Command{
		Use:   "validate [--env K=V]... [--secret K=V]... FILE",
		Short: "Check a service file without launching anything; print it with defaults filled in",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := vars.overrides()
			if err != nil {
				return err
			}
			// Null envs and secrets are SkyServe's "give it at launch": valid here.
			o.DeferMissing = true
			sp, _, err := loadSpec(args[0], o)
			if err != nil {
				return err // an invalid or missing file exits 2, as from every command
			}
			if err := resolveSpec(sp, args[0], cmd.ErrOrStderr()); err != nil {
				return err
			}
			if sp.Service.TLS != nil {
				// The pair may live only where the service is launched: say so, do not refuse.
				if _, _, err := tlsPaths(sp.Service.TLS); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: %v (serve up refuses it unless they load there)\n", err)
				}
			}
			b, err := sp.ResolvedYAML()
			if err != nil {
				return err
			}
			// The catalog check can still find the file wrong: say "valid" only after it.
			var preview strings.Builder
			if err := quotePreview(&preview, sp); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "# %s is valid. Resolved (defaults filled in):\n%s%s", args[0], b, preview.String())
			for _, m := range sp.Missing {
				kind, key, _ := strings.Cut(m, ".")
				flag := "--env"
				if kind == "secrets" {
					flag = "--secret"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "# %s has no value: give it at launch (serve up %s %s=…, or typed when asked)\n", m, flag, key)
			}
			return nil
		},
	}
	vars.add(cmd)
	return cmd
}

func updateCmd(g *globals) *cobra.Command {
	var detach bool
	var wait time.Duration
	var vars specVars
	var mode string
	cmd := &cobra.Command{
		Use:   "update NAME [--mode rolling|blue_green] [--env K=V]... [--secret K=V]... FILE",
		Short: "Roll a service to a new version: new replicas start, old ones drain as they get ready",
		Long: `Roll a service to a new version.

--mode rolling (default): new replicas start, and old ones drain one by one as new ones get
ready; both versions serve meanwhile.
--mode blue_green: the old version serves every request until the new one has as many
replicas ready as the target; then traffic switches at once and the old replicas drain.
It needs room for both fleets at once.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if mode != control.ModeRolling && mode != control.ModeBlueGreen {
				return fail(exitUsage, "--mode %q: want %s or %s", mode, control.ModeRolling, control.ModeBlueGreen)
			}
			o, err := vars.overrides()
			if err != nil {
				return err
			}
			sp, raw, o, err := loadSpecAsking(cmd, args[1], o)
			if err != nil {
				return err
			}
			if err := resolveSpec(sp, args[1], cmd.ErrOrStderr()); err != nil {
				return err
			}
			c, _, err := connect(cmd.Context(), g.home, g.api)
			if err != nil {
				return err
			}
			var res control.SubmitResponse
			if _, err := c.do(cmd.Context(), http.MethodPut, "/v1/services/"+args[0], control.SubmitRequest{Spec: string(raw), Envs: o.Envs, Secrets: o.Secrets, Mode: mode}, &res); err != nil {
				return serviceErr(args[0], err)
			}
			if res.Unchanged {
				fmt.Fprintf(cmd.OutOrStdout(), "Service %s: %s is what version %d runs already; nothing to update.\n", args[0], args[1], res.Version)
				return nil
			}
			if mode == control.ModeBlueGreen {
				fmt.Fprintf(cmd.OutOrStdout(), "Service %s: blue-green update to version %d (the old version serves until the new one is ready).\n", args[0], res.Version)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "Service %s: rolling update to version %d.\n", args[0], res.Version)
			}
			if detach {
				return nil
			}
			return waitService(cmd.Context(), c, args[0], res.Version, wait, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "return once submitted")
	vars.add(cmd)
	cmd.Flags().DurationVar(&wait, "wait", 15*time.Minute, "how long to wait for the new version")
	cmd.Flags().StringVar(&mode, "mode", control.ModeRolling, "rolling or blue_green")
	return cmd
}

func downCmd(g *globals) *cobra.Command {
	var all, purge bool
	var wait time.Duration
	var replicaID string
	cmd := &cobra.Command{
		Use:   "down NAME... | --all | NAME --replica-id ID",
		Short: "Terminate every replica of the services and remove them, or one replica",
		Long: `Terminate every replica of the services and remove them.

--replica-id drains and terminates one replica of NAME (its id, or its number: 3 for NAME-3);
the service replaces it if its target still wants one.
--purge removes the services (or the replica) even where a termination fails: a replica
whose provider cannot be reached or is no longer configured is written off, and each is
named with its handle. An instance that still runs is ended by the control plane's audit,
which finds it by its tags, once the provider answers again.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return fail(exitUsage, "give service names or --all (not both)")
			}
			if replicaID != "" && len(args) != 1 {
				return fail(exitUsage, "--replica-id takes exactly one service name")
			}
			c, err := connectOrStart(cmd, g)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), wait)
			defer cancel()
			if replicaID != "" {
				return downReplica(ctx, cmd, c, args[0], replicaID, purge, wait)
			}
			if all {
				svcs, err := c.services(cmd.Context())
				if err != nil {
					return err
				}
				for _, s := range svcs {
					args = append(args, s.Name)
				}
				if len(args) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "No services.")
					return nil
				}
			}
			out := cmd.OutOrStdout()
			since := map[string]int64{}
			for _, name := range args {
				since[name] = lastEvent(ctx, c, name)
				path := "/v1/services/" + name
				if purge {
					path += "?purge=1"
				}
				if _, err := c.do(cmd.Context(), http.MethodDelete, path, nil, nil); err != nil {
					return serviceErr(name, err)
				}
				fmt.Fprintf(out, "Service %s: shutting down.\n", name)
			}
			for _, name := range args {
				for {
					st, err := c.service(ctx, name)
					if notFound(err) {
						fmt.Fprintf(out, "Service %s: every replica terminated; removed.\n", name)
						if purge {
							printPurged(ctx, out, c, name, "", since[name])
						}
						break
					}
					if ctx.Err() != nil {
						// st came from a call the deadline cut short: ask once more for the count.
						st, _ = c.service(cmd.Context(), name)
						return fail(exitErr, "service %s still has %d replicas after %s", name, len(st.Replicas), wait)
					}
					time.Sleep(200 * time.Millisecond)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&all, "all", "a", false, "every service")
	cmd.Flags().BoolVar(&purge, "purge", false, "remove even where a termination fails, writing such replicas off")
	cmd.Flags().StringVar(&replicaID, "replica-id", "", "take down only this replica of the service (its id or number)")
	cmd.Flags().DurationVar(&wait, "wait", 5*time.Minute, "how long to wait for termination")
	addDaemonFlags(cmd, &g.daemon)
	return cmd
}

// downReplica drains and terminates one replica and waits until it has ended.
func downReplica(ctx context.Context, cmd *cobra.Command, c *client, service, id string, purge bool, wait time.Duration) error {
	out := cmd.OutOrStdout()
	since := lastEvent(ctx, c, service)
	q := url.Values{"service": {service}}
	if purge {
		q.Set("purge", "1")
	}
	var resp struct{ Replica string }
	if _, err := c.do(ctx, http.MethodPost, "/v1/replicas/"+url.PathEscape(id)+"/down?"+q.Encode(), nil, &resp); err != nil {
		if notFound(err) {
			return fail(exitErr, "%v (serve status %s lists its replicas)", err, service)
		}
		return err
	}
	fmt.Fprintf(out, "Replica %s: draining, then terminating.\n", resp.Replica)
	for {
		st, err := c.serviceWith(ctx, service, "?all=1")
		if err != nil && !notFound(err) {
			return err
		}
		ended := true
		for _, r := range st.Replicas {
			if r.ID == resp.Replica && r.EndedAt.IsZero() {
				ended = false
			}
		}
		if ended {
			fmt.Fprintf(out, "Replica %s: terminated.\n", resp.Replica)
			if purge {
				printPurged(ctx, out, c, service, resp.Replica, since)
			}
			return nil
		}
		if ctx.Err() != nil {
			return fail(exitErr, "replica %s still runs after %s", resp.Replica, wait)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// lastEvent is the id of the service's latest event, so that what a command caused can be
// read after it.
func lastEvent(ctx context.Context, c *client, service string) int64 {
	var last int64
	for after := int64(0); ; {
		ev, err := c.events(ctx, service, "", after)
		if err != nil || len(ev) == 0 {
			return last
		}
		last = ev[len(ev)-1].ID
		after = last
	}
}

// printPurged names the replicas written off since the event id after.
func printPurged(ctx context.Context, out io.Writer, c *client, service, replica string, after int64) {
	ev, err := c.events(ctx, service, replica, after)
	if err != nil {
		fmt.Fprintf(out, "(cannot read which replicas were written off: %v)\n", err)
		return
	}
	for _, e := range ev {
		if e.Kind == "purge" {
			fmt.Fprintf(out, "Replica %s: written off: %s\n", e.Replica, e.Message)
		}
	}
}

// connectOrStart returns a client for the home's control plane, starting it (with the
// command's daemon flags) when it is stopped but the home holds state: after `serve stop`
// the replicas still run, and the services can only be taken down by a control plane that
// adopts them.
func connectOrStart(cmd *cobra.Command, g *globals) (*client, error) {
	c, _, err := connect(cmd.Context(), g.home, g.api)
	var ce *cliError
	if err == nil || g.api != "" || !errors.As(err, &ce) || ce.code != exitUnreachable {
		return c, err
	}
	if _, serr := os.Stat(control.StatePath(g.home)); serr != nil {
		return nil, err // nothing was ever run here
	}
	fmt.Fprintln(cmd.OutOrStdout(), "Starting the control plane (it adopts the replicas still running).")
	log, _ := httplog.NewLogger("warn")
	c, _, err = ensureDaemon(cmd.Context(), g.home, g.daemon, log)
	return c, err
}

func startCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "start",
		Short: "Start the local control plane and router for --home, adopting the replicas that still run (after `serve stop`, or a reboot)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if c, info, err := connect(cmd.Context(), g.home, ""); err == nil {
				fmt.Fprintf(out, "The control plane is already running (API %s, endpoint %s).\n", info.API, info.Endpoint)
				return printServices(cmd, c)
			}
			log, _ := httplog.NewLogger("warn")
			c, info, err := ensureDaemon(cmd.Context(), g.home, g.daemon, log)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "Control plane started (API %s, endpoint %s).\n", info.API, info.Endpoint)
			return printServices(cmd, c)
		},
	}
	addDaemonFlags(cmd, &g.daemon)
	return cmd
}

// printServices prints one line per service: name, version, status, ready replicas.
func printServices(cmd *cobra.Command, c *client) error {
	svcs, err := c.services(cmd.Context())
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if len(svcs) == 0 {
		fmt.Fprintln(out, "No services.")
	}
	for _, s := range svcs {
		fmt.Fprintf(out, "  %s  version %d  %s  %d/%d ready\n", s.Name, s.Version, s.Status, s.Ready, s.Target)
	}
	return nil
}

func preemptCmd(g *globals) *cobra.Command {
	var notice time.Duration
	cmd := &cobra.Command{
		Use:   "preempt REPLICA [--notice 30s]",
		Short: "Make a replica's provider announce a spot preemption (drills: the replica drains and is replaced)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := connect(cmd.Context(), g.home, g.api)
			if err != nil {
				return err
			}
			if _, err := c.do(cmd.Context(), http.MethodPost, fmt.Sprintf("/v1/replicas/%s/preempt?notice=%s", args[0], notice), nil, nil); err != nil {
				return fail(exitErr, "preempt %s: %v", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Replica %s: preemption notice sent; it is reclaimed in %s.\n", args[0], notice)
			return nil
		},
	}
	cmd.Flags().DurationVar(&notice, "notice", 30*time.Second, "warning before the replica is reclaimed (AWS gives 2m, GCP 30s)")
	return cmd
}

// quotePreview prices the spec's resources: against the embedded catalogs and shows where
// its first replicas would go and why. An unknown accelerator is an error; a catalog with
// no offer for the constraints only a note (the local provider needs none).
func quotePreview(out io.Writer, sp *spec.Service) error {
	r := sp.Resources
	if len(r.Accelerators) == 0 && len(r.AnyOf) == 0 && len(r.Ordered) == 0 {
		return nil
	}
	all, err := pricing.Embedded()
	if err != nil {
		return err
	}
	// Only the clouds a provider can launch on: a marketplace's price is none a replica
	// can be bought at.
	cat, err := all.Only(pricing.Launchable...)
	if err != nil {
		return err
	}
	// resolveSpec has already refused a file with nothing to run on; a name no catalog
	// prices that is left is one a provider runs without a price (the local machine).
	offers, err := cat.Quote(r, time.Time{})
	if err != nil {
		fmt.Fprintf(out, "# price catalogs of %s: %v\n", strings.Join(pricing.Launchable, ", "), strings.ReplaceAll(err.Error(), "\n", "; "))
		return nil
	}
	fmt.Fprintf(out, "# cheapest catalog offers of the clouds Arbiter launches on, %s (%d in all, $/hour per instance):\n", strings.Join(pricing.Launchable, ", "), len(offers))
	for i, o := range offers {
		if i == 5 {
			break
		}
		fmt.Fprintf(out, "#   %-9s %-6s %-14s %-12s %-22s %s:%d  $%.2f\n", o.Capacity, o.Provider, o.Region, o.Zone, o.InstanceType, o.Accelerator, o.AcceleratorCount, o.PricePerHour)
	}
	rp := sp.Service.ReplicaPolicy
	pl, err := scaling.NewPlacer(scaling.PlacementFromSpec(sp, 0))
	if err != nil {
		return err
	}
	var cands []scaling.Offer
	for _, o := range offers {
		cands = append(cands, scaling.Offer{Provider: o.Provider, Region: o.Region, Zone: o.Zone, InstanceType: o.InstanceType, Capacity: o.Capacity, PricePerHour: o.PricePerHour})
	}
	n := max(rp.MinReplicas, 1)
	plan := pl.Plan(time.Now(), n, nil, cands)
	fmt.Fprintf(out, "# placement of %d replica(s): %s\n", n, plan.Reason)
	for _, l := range plan.Launch {
		fmt.Fprintf(out, "#   %s\n", l.Reason)
	}
	return nil
}

func keysCmd() *cobra.Command {
	keys := &cobra.Command{Use: "keys", Short: "Client API keys for the router"}
	keys.AddCommand(&cobra.Command{
		Use:   "new NAME",
		Short: "Make a random API key: prints the key (give it to the client) and the line for the keys file (only its digest)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var raw [24]byte
			if _, err := rand.Read(raw[:]); err != nil {
				return err
			}
			key := "sk-arb-" + hex.EncodeToString(raw[:])
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "key:  %s\n", key)
			fmt.Fprintf(out, "add to the keys file (serve up --api-keys FILE):\n  - {name: %s, sha256: %s}\n", args[0], router.HashKey(key))
			return nil
		},
	})
	return keys
}

// serviceErr is a failed operation on a service, named once: the control plane's errors
// often name the service already ("service \"x\": not found").
func serviceErr(name string, err error) error {
	if msg := err.Error(); strings.Contains(msg, strconv.Quote(name)) || strings.Contains(msg, "service "+name) {
		return fail(exitErr, "%v", err)
	}
	return fail(exitErr, "service %s: %v", name, err)
}

// version is set at link time for releases (-ldflags "-X main.version=v1.2.3").
var version = ""

// buildVersion is what `serve --version` prints: the release, else the module's version and
// the commit it was built from when the build recorded one, and the Go toolchain.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return cmp.Or(version, "unknown")
	}
	v := cmp.Or(version, bi.Main.Version)
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " (" + s.Value[:12] + ")"
		}
	}
	return v + " " + bi.GoVersion
}
