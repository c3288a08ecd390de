// Package pgtest runs a real PostgreSQL server for tests: initdb'd into a temporary folder,
// listening on a free loopback port (and a unix socket in that folder), stopped when the
// test ends. A test takes a database of its own from one server shared by its process
// (DSN), or a server of its own that it may stop and start again (Start).
//
// The binaries (initdb, pg_ctl's companions, postgres) are found in $ARBITER_POSTGRES_BIN,
// else on $PATH, else in Debian's /usr/lib/postgresql/<version>/bin. Without them a test
// skips, or fails where ARBITER_REQUIRE_POSTGRES=1 (CI). PostgreSQL refuses to run as root:
// run as root, the server runs as the user nobody.
package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Bin is the folder holding initdb and postgres, or "" when none is found.
func Bin() string {
	if d := os.Getenv("ARBITER_POSTGRES_BIN"); d != "" {
		return d
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("postgres"); err == nil {
			return filepath.Dir(p)
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	return ""
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// skipOrFail skips the test, or fails it where CI requires PostgreSQL.
func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("ARBITER_REQUIRE_POSTGRES") == "1" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format+" (ARBITER_REQUIRE_POSTGRES=1 makes this a failure)", args...)
}

// Cluster is one running PostgreSQL server.
type Cluster struct {
	bin, dir string
	port     int
	cred     *syscall.Credential // whom the server runs as; nil: this process's user
	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	dbs      atomic.Int64
}

// template is an initdb'd data folder that servers start from as copies: initdb takes
// seconds, a copy a fraction of that. It is kept in the temporary folder under a name of
// the binaries' folder and the user, for later test processes too (about 40 MB, once).
var template struct {
	once sync.Once
	dir  string
	cred *syscall.Credential
	err  error
}

func initTemplate(bin string) (string, *syscall.Credential, error) {
	template.once.Do(func() {
		var cred *syscall.Credential
		if os.Geteuid() == 0 {
			u, err := user.Lookup("nobody")
			if err != nil {
				template.err = fmt.Errorf("running as root, and no user nobody to run PostgreSQL as: %w", err)
				return
			}
			uid, _ := strconv.Atoi(u.Uid)
			gid, _ := strconv.Atoi(u.Gid)
			cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		}
		sum := sha256.Sum256([]byte(fmt.Sprintf("%s %d", bin, os.Geteuid())))
		final := filepath.Join(os.TempDir(), "arbiter-pgtemplate-"+hex.EncodeToString(sum[:6]))
		if _, err := os.Stat(filepath.Join(final, "data", "PG_VERSION")); err == nil {
			template.dir, template.cred = final, cred
			return
		}
		dir, err := os.MkdirTemp("", "arbiter-pgtemplate-new-")
		if err != nil {
			template.err = err
			return
		}
		defer os.RemoveAll(dir) // left only when the rename below did not take it
		if err := own(dir, cred); err != nil {
			template.err = err
			return
		}
		cmd := exec.Command(filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--locale=C")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			template.err = fmt.Errorf("initdb: %v\n%s", err, out)
			return
		}
		// Another process may have made it meanwhile: either one serves.
		if err := os.Rename(dir, final); err != nil {
			if _, serr := os.Stat(filepath.Join(final, "data", "PG_VERSION")); serr != nil {
				template.err = fmt.Errorf("keep the template cluster: %w", err)
				return
			}
		}
		template.dir, template.cred = final, cred
	})
	return template.dir, template.cred, template.err
}

func own(path string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	return os.Chown(path, int(cred.Uid), int(cred.Gid))
}

// Start runs a server of the test's own, stopped when the test ends.
func Start(t testing.TB) *Cluster {
	t.Helper()
	c, err := start()
	if err != nil {
		if errors.Is(err, errNoBinaries) {
			skipOrFail(t, "%v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

var errNoBinaries = errors.New("PostgreSQL's initdb and postgres not found (set ARBITER_POSTGRES_BIN, or install Debian's postgresql)")

func start() (*Cluster, error) {
	bin := Bin()
	if bin == "" {
		return nil, errNoBinaries
	}
	tmpl, cred, err := initTemplate(bin)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "arbiter-pg-")
	if err != nil {
		return nil, err
	}
	if err := own(dir, cred); err != nil {
		return nil, err
	}
	// cp -a keeps the owner and the 0700 mode postgres insists on.
	if out, err := exec.Command("cp", "-a", filepath.Join(tmpl, "data"), filepath.Join(dir, "data")).CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("copy the template cluster: %v: %s", err, out)
	}
	c := &Cluster{bin: bin, dir: dir, cred: cred}
	var last error
	for range 5 { // a free port may be taken between choosing it and binding it
		if c.port, err = freePort(); err != nil {
			return nil, err
		}
		if last = c.run(); last == nil {
			return c, nil
		}
	}
	c.Close()
	return nil, last
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// run starts the server and waits until it answers.
func (c *Cluster) run() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	logf, err := os.OpenFile(filepath.Join(c.dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), "-D", filepath.Join(c.dir, "data"), "-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+c.dir, "-c", "max_connections=200",
		"-c", "shared_buffers=16MB")
	// Pdeathsig is set after the credentials change, so it holds for the server: a test
	// process that dies takes its server with it (SIGQUIT: postgres's immediate shutdown).
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	c.cmd, c.exited = cmd, exited
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, c.url("postgres"))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return nil
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(c.dir, "postgres.log"))
			return fmt.Errorf("postgres exited at start: %s", lastLines(string(b), 10))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.stopLocked()
			return fmt.Errorf("postgres did not answer within 60 s: %v", err)
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (c *Cluster) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// Port is the server's loopback TCP port.
func (c *Cluster) Port() int { return c.port }

// NewDatabase creates an empty database and returns its URL.
func (c *Cluster) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("test_%d", c.dbs.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.url("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	return c.url(name)
}

// Stop stops the server (its fast shutdown: clients are cut off); Restart starts it again
// on the same port with the same data.
func (c *Cluster) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopLocked()
}

func (c *Cluster) stopLocked() {
	if c.cmd == nil {
		return
	}
	// SIGINT is postgres's fast shutdown: clients cut, a clean checkpoint.
	c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		<-c.exited
	}
	c.cmd = nil
}

// Restart starts a stopped server again.
func (c *Cluster) Restart() error { return c.run() }

// Close stops the server and removes its folder.
func (c *Cluster) Close() {
	c.Stop()
	os.RemoveAll(c.dir)
}

var shared struct {
	mu sync.Mutex
	c  *Cluster
}

// DSN returns the URL of a new, empty database on the process's shared server, started at
// the first call. Call Shutdown from TestMain to stop it.
func DSN(t testing.TB) string {
	t.Helper()
	shared.mu.Lock()
	if shared.c == nil {
		c, err := start()
		if err != nil {
			shared.mu.Unlock()
			if errors.Is(err, errNoBinaries) {
				skipOrFail(t, "%v", err)
			}
			t.Fatal(err)
		}
		shared.c = c
	}
	c := shared.c
	shared.mu.Unlock()
	return c.NewDatabase(t)
}

// Shutdown stops the shared server, if it was started, and removes its folder.
func Shutdown() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c != nil {
		shared.c.Close()
		shared.c = nil
	}
}
