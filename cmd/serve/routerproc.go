package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/internal/httplog"
	"github.com/arbiter-serve/arbiter/router"
)

// The embedded daemon runs its router as a process of its own (`serve router`, hidden),
// in its own session: a crash of the control plane, or a kill -9 of the daemon, leaves the
// data plane serving its last ready set, as the split deployment does, and the next daemon
// for the home adopts it instead of starting another (issue 18 item 9). A router that
// dies is started again by the daemon.

// routerInfo is what the router process publishes in the home once it serves.
type routerInfo struct {
	PID     int    `json:"pid"`
	Listen  string `json:"listen"`  // bound client address
	Admin   string `json:"admin"`   // bound admin address
	Control string `json:"control"` // the control plane URL it follows
	// Config names the daemon settings it was started for: a daemon started with other
	// settings replaces it rather than adopt it.
	Config string `json:"config"`
}

func routerInfoPath(home string) string { return filepath.Join(home, "router.json") }

func readRouterInfo(home string) (routerInfo, error) {
	return readJSONFile[routerInfo](routerInfoPath(home))
}

type routerFlags struct {
	listen, admin, control, apiKeys, logLevel, config string
	tlsCert, tlsKey                                   string // service.tls: the endpoint serves HTTPS
}

func routerCmd(g *globals) *cobra.Command {
	var f routerFlags
	cmd := &cobra.Command{
		Use:    "router",
		Short:  "The embedded daemon's router process (started by `serve daemon`; not for direct use: run bin/router for a standalone one)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runRouterProcess(cmd.Context(), g.home, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "", "client address")
	fl.StringVar(&f.admin, "admin", "", "admin address")
	fl.StringVar(&f.control, "control", "", "control plane URL")
	fl.StringVar(&f.apiKeys, "api-keys", "", "client API keys file")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level")
	fl.StringVar(&f.config, "config", "", "the daemon settings this router was started for")
	fl.StringVar(&f.tlsCert, "tls-certfile", "", "serve HTTPS with this PEM certificate (reloaded when it changes, or on SIGHUP)")
	fl.StringVar(&f.tlsKey, "tls-keyfile", "", "the certificate's PEM private key")
	return cmd
}

func runRouterProcess(ctx context.Context, home string, f routerFlags) error {
	log, err := httplog.NewLogger(f.logLevel)
	if err != nil {
		return err
	}
	log = log.With("part", "router")
	b, err := os.ReadFile(control.TokenPath(home))
	if err != nil {
		return fmt.Errorf("control plane token: %w", err)
	}
	cfg := router.Defaults()
	cfg.APIKeysFile = f.apiKeys
	cfg.TLSCertFile, cfg.TLSKeyFile = f.tlsCert, f.tlsKey
	err = router.Run(ctx, router.Options{Listen: f.listen, Admin: f.admin, Config: cfg, ControlURL: f.control,
		Token: string(bytes.TrimSpace(b)), RouterID: "embedded", Log: log, ControlMetrics: true, Reload: router.ReloadOnSIGHUP(ctx),
		Ready: func(l, a net.Addr) {
			info := routerInfo{PID: os.Getpid(), Listen: l.String(), Admin: a.String(), Control: f.control, Config: f.config}
			b, _ := json.MarshalIndent(info, "", "  ")
			if err := writeFileAtomic(routerInfoPath(home), b); err != nil {
				log.Error("cannot publish the router's addresses; the daemon will not find it", "err", err)
			}
		}})
	if cur, rerr := readRouterInfo(home); rerr == nil && cur.PID == os.Getpid() {
		_ = os.Remove(routerInfoPath(home))
	}
	return err
}

// routerProc is a running router process, started by this daemon or adopted from one
// that crashed.
type routerProc struct {
	info    routerInfo
	started time.Time
	done    chan struct{} // closed once the process is gone
	err     error         // why it ended, when this daemon started it; set before done closes
}

// isRouterProcess reports whether pid is a live `serve router` of home. The command line
// is checked, not only the PID, since a PID left in router.json may have been reused.
func isRouterProcess(pid int, home string) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false // gone, or a zombie (whose command line reads empty)
	}
	args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
	if len(args) < 4 || args[1] != "router" {
		return false
	}
	for i := 2; i+1 < len(args); i++ {
		if args[i] == "--home" {
			return args[i+1] == home
		}
	}
	return false
}

// running reports whether pid is a live process: a zombie is not (a daemon whose
// parent has not reaped it yet has stopped all the same).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	return pid > 0 && err == nil && !strings.Contains(string(b), "State:\tZ")
}

func routerHealthy(admin string) bool {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + admin + "/health")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// adoptRouter returns the router a previous daemon left running for home, when it was
// started for the same settings and answers; a leftover that is not fit to adopt is
// stopped, so that its addresses are free for a new one.
func adoptRouter(home, config string) *routerProc {
	info, err := readRouterInfo(home)
	if err != nil || !isRouterProcess(info.PID, home) {
		return nil
	}
	p := &routerProc{info: info, started: time.Now(), done: make(chan struct{})}
	go func() {
		for isRouterProcess(info.PID, home) {
			time.Sleep(250 * time.Millisecond)
		}
		p.err = errors.New("the adopted router process is gone")
		close(p.done)
	}()
	if info.Config == config && routerHealthy(info.Admin) {
		return p
	}
	p.stop(10 * time.Second)
	return nil
}

// startRouter starts a router process and waits until it serves.
func startRouter(home, exe string, f routerFlags) (*routerProc, error) {
	args := []string{"router", "--home", home, "--listen", f.listen, "--admin", f.admin, "--control", f.control,
		"--log-level", f.logLevel, "--config", f.config}
	if f.apiKeys != "" {
		args = append(args, "--api-keys", f.apiKeys)
	}
	if f.tlsCert != "" {
		args = append(args, "--tls-certfile", f.tlsCert, "--tls-keyfile", f.tlsKey)
	}
	cmd := exec.Command(exe, args...)
	// The daemon's own output (its log file when serve up started it).
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// Its own session: a signal to the daemon's process group does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the router: %w", err)
	}
	p := &routerProc{info: routerInfo{PID: cmd.Process.Pid}, started: time.Now(), done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case <-p.done:
			return nil, fmt.Errorf("the router exited at start: %v", p.err)
		case <-deadline:
			p.stop(5 * time.Second)
			return nil, errors.New("the router did not serve within 30s")
		case <-time.After(50 * time.Millisecond):
		}
		if info, err := readRouterInfo(home); err == nil && info.PID == p.info.PID && routerHealthy(info.Admin) {
			p.info = info
			return p, nil
		}
	}
}

// stop ends the router gracefully (it finishes in-flight requests), then by SIGKILL.
func (p *routerProc) stop(grace time.Duration) {
	_ = syscall.Kill(p.info.PID, syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(p.info.PID, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
}
