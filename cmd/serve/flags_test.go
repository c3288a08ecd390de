package main

import (
	"os"
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
