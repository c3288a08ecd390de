package router

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The admin port's /metrics carries the control plane's families while it answers (with
// the token), and only the router's own, with the up gauge at 0, when it does not.
func TestControlMetricsMergeAndDegrade(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/metrics" || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte("# TYPE arbiter_control_spend_dollars_total counter\narbiter_control_spend_dollars_total{service=\"s\"} 4.5\n"))
	}))
	reg := prometheus.NewRegistry()
	own := prometheus.NewCounter(prometheus.CounterOpts{Name: "arbiter_router_requests_total", Help: "h"})
	reg.MustRegister(own)
	cm := newControlMetrics(srv.URL+"/", "tok", reg)
	g := prometheus.Gatherers{cm, reg}

	names := func() map[string]bool {
		t.Helper()
		fams, err := g.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, f := range fams {
			out[f.GetName()] = true
		}
		return out
	}
	got := names()
	if !got["arbiter_control_spend_dollars_total"] || !got["arbiter_router_requests_total"] {
		t.Fatalf("with the control plane up: %v", got)
	}
	if v := testutil.ToFloat64(cm.up); v != 1 {
		t.Fatalf("up = %v with the control plane answering", v)
	}

	cm.token = "wrong"
	if got := names(); got["arbiter_control_spend_dollars_total"] || !got["arbiter_router_requests_total"] {
		t.Fatalf("refused by the control plane: %v", got)
	}
	if v := testutil.ToFloat64(cm.up); v != 0 {
		t.Fatalf("up = %v with the control plane refusing", v)
	}
	cm.token = "tok"
	srv.Close()
	if got := names(); got["arbiter_control_spend_dollars_total"] || !got["arbiter_router_requests_total"] {
		t.Fatalf("with the control plane down: %v", got)
	}
}
