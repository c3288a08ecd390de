package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/internal/httplog"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/replicas/providers"
)

// daemonInfo is what a running embedded daemon publishes in its home, so the CLI can find
// it: <home>/daemon.json.
type daemonInfo struct {
	PID      int    `json:"pid"`
	API      string `json:"api"`      // http://host:port of the control plane
	Endpoint string `json:"endpoint"` // http://host:port of the router (OpenAI base URL without /v1)
	Admin    string `json:"admin"`    // router admin (metrics)
	// RouterPID is the router process's: it outlives a daemon that crashes.
	RouterPID int `json:"router_pid,omitempty"`
	// TLSCert and TLSKey are the pair the endpoint serves HTTPS with (service.tls); empty
	// for plain HTTP.
	TLSCert string `json:"tls_certfile,omitempty"`
	TLSKey  string `json:"tls_keyfile,omitempty"`
}

func daemonInfoPath(home string) string { return filepath.Join(home, "daemon.json") }

func readDaemonInfo(home string) (daemonInfo, error) {
	return readJSONFile[daemonInfo](daemonInfoPath(home))
}

func readJSONFile[T any](path string) (T, error) {
	var v T
	b, err := os.ReadFile(path)
	if err != nil {
		return v, err
	}
	return v, json.Unmarshal(b, &v)
}

type daemonFlags struct {
	api, listen, admin string
	tick, drain, grace time.Duration
	logLevel           string
	apiKeys            string
	providers          string
	zoneCooldown       time.Duration
	maxReplicas        int
	localMaxReplicas   int
	// tlsCert and tlsKey: the endpoint serves HTTPS with this pair (service.tls).
	tlsCert, tlsKey string
}

// runDaemon runs the embedded default in the foreground: a control plane with the local
// provider, and a router process that follows it over loopback HTTP exactly as a
// standalone one would. The daemon supervises the router (it starts it again if it
// dies) but does not share its fate: killed, it leaves the router serving, and the next
// daemon adopts it. Stopped (SIGTERM, `serve stop`), it stops the router too.
func runDaemon(ctx context.Context, home string, f daemonFlags) error {
	log, err := httplog.NewLogger(f.logLevel)
	if err != nil {
		return err
	}
	// Absolute: the router process is recognised by its --home.
	if home, err = filepath.Abs(home); err != nil {
		return err
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	token, err := control.EnsureToken(home)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	rf := routerFlags{admin: f.admin, logLevel: f.logLevel}
	if f.apiKeys != "" {
		if rf.apiKeys, err = filepath.Abs(f.apiKeys); err != nil {
			return err
		}
	}
	if f.tlsCert != "" || f.tlsKey != "" {
		if f.tlsCert == "" || f.tlsKey == "" {
			return errors.New("--tls-certfile and --tls-keyfile: give both or neither")
		}
		if rf.tlsCert, err = filepath.Abs(f.tlsCert); err != nil {
			return err
		}
		if rf.tlsKey, err = filepath.Abs(f.tlsKey); err != nil {
			return err
		}
	}
	rf.config = fmt.Sprintf("listen=%s admin=%s api-keys=%s log-level=%s tls=%s,%s", f.listen, f.admin, rf.apiKeys, f.logLevel, rf.tlsCert, rf.tlsKey)
	rlog := log.With("part", "daemon")
	rp := adoptRouter(home, rf.config)
	if rp != nil {
		rf.listen, rf.admin = rp.info.Listen, rp.info.Admin
		rlog.Info("adopted the router a previous daemon left serving", "pid", rp.info.PID, "listen", rf.listen)
	} else {
		// Bound first so that a taken port fails here, and the control plane can show the
		// real address.
		rln, err := net.Listen("tcp", f.listen)
		if err != nil {
			return fmt.Errorf("router endpoint %s: %w", f.listen, err)
		}
		rf.listen = rln.Addr().String()
		rln.Close()
	}
	endpoint := "http://" + rf.listen
	if rf.tlsCert != "" {
		endpoint = "https://" + rf.listen
	}
	cctx, stopControl := context.WithCancel(ctx)
	defer stopControl()
	apic := make(chan net.Addr, 1)
	controlDone := make(chan error, 1)
	go func() {
		controlDone <- control.Serve(cctx, control.DaemonOptions{Home: home, API: f.api, Token: token, Tick: f.tick, DrainTimeout: f.drain,
			Endpoint: endpoint, BinDir: filepath.Dir(exe), LocalGrace: f.grace, Log: log.With("part", "control"),
			Ready: func(a net.Addr) { apic <- a }, ZoneCooldown: f.zoneCooldown,
			MaxReplicas: f.maxReplicas, LocalMaxReplicas: f.localMaxReplicas,
			Providers: providersFrom(home, f.providers, log.With("part", "control"))})
	}()
	var api net.Addr
	select {
	case api = <-apic:
	case err := <-controlDone:
		return err
	}
	rf.control = "http://" + api.String()
	if rp != nil && rp.info.Control != rf.control {
		rlog.Info("the adopted router follows another control plane address; replacing it", "was", rp.info.Control, "now", rf.control)
		rp.stop(40 * time.Second)
		rp = nil
	}
	if rp == nil {
		if rp, err = startRouter(home, exe, rf); err != nil {
			stopControl()
			<-controlDone
			return err
		}
		rf.admin = rp.info.Admin // a restarted router keeps the metrics address
	}
	publish := func() error {
		info := daemonInfo{PID: os.Getpid(), API: rf.control, Endpoint: endpoint, Admin: "http://" + rp.info.Admin, RouterPID: rp.info.PID,
			TLSCert: rf.tlsCert, TLSKey: rf.tlsKey}
		b, _ := json.MarshalIndent(info, "", "  ")
		return writeFileAtomic(daemonInfoPath(home), b)
	}
	if err := publish(); err != nil {
		rp.stop(40 * time.Second)
		stopControl()
		<-controlDone
		return err
	}
	backoff := time.Second
	for {
		select {
		case err := <-controlDone:
			// The control plane failed: the router keeps serving its last ready set, and
			// the next daemon for this home adopts it.
			rlog.Error("the control plane stopped; the router keeps serving", "router_pid", rp.info.PID, "err", err)
			return err
		case <-ctx.Done():
			rp.stop(40 * time.Second)
			stopControl()
			err := <-controlDone
			_ = os.Remove(daemonInfoPath(home))
			return err
		case <-rp.done:
		}
		if time.Since(rp.started) > time.Minute {
			backoff = time.Second // it had served a while: not a crash loop
		}
		rlog.Error("the router process exited; starting another", "pid", rp.info.PID, "err", rp.err, "after", backoff)
		select {
		case <-ctx.Done():
			stopControl()
			err := <-controlDone
			_ = os.Remove(daemonInfoPath(home))
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
		next, err := startRouter(home, exe, rf)
		if err != nil {
			rlog.Error("the router did not start again", "err", err)
			rp.started = time.Now() // its done stays closed: the next round tries again
			continue
		}
		rp = next
		if err := publish(); err != nil {
			rlog.Error("cannot publish the daemon's addresses", "err", err)
		}
	}
}

// providersFrom builds the clusters of a providers file: the one named, else
// <home>/providers.yaml when it exists.
func providersFrom(home, path string, log *slog.Logger) func(context.Context, string) ([]replicas.Provider, error) {
	return func(ctx context.Context, owner string) ([]replicas.Provider, error) {
		optional := path == ""
		if optional {
			path = filepath.Join(home, "providers.yaml")
		}
		return providers.FromFile(ctx, path, optional, owner, log)
	}
}

func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ensureDaemon returns a client for the home's control plane, starting the embedded
// daemon in the background when none answers.
func ensureDaemon(ctx context.Context, home string, f daemonFlags, log *slog.Logger) (*client, daemonInfo, error) {
	token, err := control.EnsureToken(mkdirAll(home))
	if err != nil {
		return nil, daemonInfo{}, err
	}
	if info, err := readDaemonInfo(home); err == nil {
		c := &client{base: info.API, token: token, http: &http.Client{}}
		if c.healthy(ctx) {
			return c, info, nil
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, daemonInfo{}, err
	}
	logf, err := os.OpenFile(filepath.Join(home, "daemon.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, daemonInfo{}, err
	}
	defer logf.Close()
	_ = os.Remove(daemonInfoPath(home))
	cmd := exec.Command(exe, "daemon", "--home", home, "--control-listen", f.api, "--listen", f.listen, "--admin", f.admin,
		"--tick", f.tick.String(), "--drain-timeout", f.drain.String(), "--grace", f.grace.String(), "--log-level", f.logLevel)
	if f.apiKeys != "" {
		abs, err := filepath.Abs(f.apiKeys)
		if err != nil {
			return nil, daemonInfo{}, err
		}
		cmd.Args = append(cmd.Args, "--api-keys", abs)
	}
	if f.providers != "" {
		abs, err := filepath.Abs(f.providers)
		if err != nil {
			return nil, daemonInfo{}, err
		}
		cmd.Args = append(cmd.Args, "--providers", abs)
	}
	if f.tlsCert != "" {
		cmd.Args = append(cmd.Args, "--tls-certfile", f.tlsCert, "--tls-keyfile", f.tlsKey)
	}
	cmd.Args = append(cmd.Args, "--zone-cooldown", f.zoneCooldown.String(),
		"--max-replicas", strconv.Itoa(f.maxReplicas), "--local-max-replicas", strconv.Itoa(f.localMaxReplicas))
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session: the daemon outlives this command and the terminal's Ctrl-C.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, daemonInfo{}, fmt.Errorf("start the control plane: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	log.Info("started the control plane and router", "pid", cmd.Process.Pid, "log", filepath.Join(home, "daemon.log"))
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return nil, daemonInfo{}, fail(exitErr, "the control plane exited at start (%v); see %s", err, filepath.Join(home, "daemon.log"))
		case <-time.After(100 * time.Millisecond):
		}
		info, err := readDaemonInfo(home)
		if err != nil || info.PID != cmd.Process.Pid {
			continue
		}
		c := &client{base: info.API, token: token, http: &http.Client{}}
		if c.healthy(ctx) {
			return c, info, nil
		}
	}
	return nil, daemonInfo{}, fail(exitErr, "the control plane did not come up within 30s; see %s", filepath.Join(home, "daemon.log"))
}

func mkdirAll(home string) string {
	_ = os.MkdirAll(home, 0o700)
	return home
}

// The API token and the failover wait of the CLI's calls, from the global flags (root).
var (
	tokenFile    string
	failoverWait = time.Minute
)

// frozenAfter is how long the CLI waits for one of several control planes to answer a
// call before it takes that one for frozen: far longer than any API call takes, shorter
// than a person waits.
const frozenAfter = 30 * time.Second

// tokenEnv holds the API token, for a CLI that talks to a control plane whose home is not
// this machine's (--api): as --token-file, it takes the place of <--home>/token.
const tokenEnv = "ARBITER_TOKEN"

// cliToken is the token the CLI sends: --token-file's, else $ARBITER_TOKEN, else the
// home's token file ("" if there is none: a control plane without one).
func cliToken(home string) (string, error) {
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return "", fail(exitUsage, "--token-file: %v", err)
		}
		t := string(bytes.TrimSpace(b))
		if t == "" {
			return "", fail(exitUsage, "--token-file %s is empty", tokenFile)
		}
		return t, nil
	}
	if t := strings.TrimSpace(os.Getenv(tokenEnv)); t != "" {
		return t, nil
	}
	b, err := os.ReadFile(control.TokenPath(home))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	return string(bytes.TrimSpace(b)), nil
}

// connect returns a client for a running control plane, or an unreachable error.
func connect(ctx context.Context, home, apiOverride string) (*client, daemonInfo, error) {
	token, err := cliToken(home)
	if err != nil {
		return nil, daemonInfo{}, err
	}
	info, ierr := readDaemonInfo(home)
	base := apiOverride
	if base == "" {
		if ierr != nil {
			return nil, info, fail(exitUnreachable, "no control plane is running for %s (start one with `serve up FILE`)", home)
		}
		base = info.API
	}
	c := &client{token: token, http: &http.Client{}, wait: failoverWait, note: os.Stderr}
	// Several control planes, comma-separated: the first that answers is talked to first.
	for u := range strings.SplitSeq(base, ",") {
		if u = strings.TrimSuffix(strings.TrimSpace(u), "/"); u != "" {
			c.bases = append(c.bases, u)
		}
	}
	if len(c.bases) == 0 {
		return nil, info, fail(exitUsage, "--api %q names no control plane", base)
	}
	if len(c.bases) > 1 {
		// A control plane frozen (SIGSTOP, a hung host) takes the connection and never
		// answers: past this, the call goes to another, a write with its Idempotency-Key.
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.ResponseHeaderTimeout = frozenAfter
		c.http = &http.Client{Transport: tr}
	}
	for _, u := range c.bases {
		c.base = u
		if c.healthy(ctx) {
			return c, info, nil
		}
	}
	return nil, info, fail(exitUnreachable, "the control plane at %s does not answer (start one with `serve up FILE`)", strings.Join(c.bases, ", "))
}
