package main

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
)

// The daemon's admin port is where the shipped Prometheus configuration scrapes, and it is
// not Prometheus' own port (9090), so the two run side by side with their defaults.
func TestAdminDefaultIsWherePrometheusScrapes(t *testing.T) {
	up, _, err := root().Find([]string{"up"})
	if err != nil {
		t.Fatal(err)
	}
	admin := up.Flags().Lookup("admin").DefValue
	if strings.HasSuffix(admin, ":9090") {
		t.Fatalf("--admin defaults to %s, Prometheus' own port", admin)
	}
	cfg, err := os.ReadFile("../../monitoring/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cfg), `"`+admin+`"`) {
		t.Fatalf("monitoring/prometheus.yml does not scrape the default admin address %s", admin)
	}
}

// The image runs the daemon by default: its command is one this binary accepts, binds the
// endpoint and admin port on every interface (a container's loopback is its own), and
// exposes those ports; the build context leaves binaries and node_modules out.
func TestDockerImageRunsTheDaemon(t *testing.T) {
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var entry, cmdArgs []string
	var expose []string
	for _, line := range strings.Split(string(b), "\n") {
		switch f := strings.Fields(line); {
		case len(f) > 1 && f[0] == "ENTRYPOINT":
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "ENTRYPOINT")), &entry); err != nil {
				t.Fatalf("ENTRYPOINT %q: %v", line, err)
			}
		case len(f) > 1 && f[0] == "CMD":
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "CMD")), &cmdArgs); err != nil {
				t.Fatalf("CMD %q: %v", line, err)
			}
		case len(f) > 1 && f[0] == "EXPOSE":
			expose = f[1:]
		}
	}
	if len(entry) != 1 || !strings.HasSuffix(entry[0], "/serve") {
		t.Fatalf("ENTRYPOINT %v: want the serve binary", entry)
	}
	cmd, args, err := root().Find(cmdArgs)
	if err != nil || cmd.Name() != "daemon" {
		t.Fatalf("CMD %v: %v (found %s)", cmdArgs, err, cmd.Name())
	}
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatalf("CMD %v: %v", cmdArgs, err)
	}
	for _, name := range []string{"listen", "admin"} {
		v := cmd.Flags().Lookup(name).Value.String()
		_, port, _ := strings.Cut(v, ":")
		if !strings.HasPrefix(v, "0.0.0.0:") || !slices.Contains(expose, port) {
			t.Errorf("--%s %s: want every interface, on a port the image exposes (%v)", name, v, expose)
		}
	}
	ignore, err := os.ReadFile("../../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"bin/", "node_modules", ".git"} {
		if !strings.Contains(string(ignore), want) {
			t.Errorf(".dockerignore does not leave out %s", want)
		}
	}
}
