package router

import (
	"encoding/json"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbiter-serve/arbiter/fleet"
)

// /sd/replicas is Prometheus' HTTP service discovery format: a JSON list (never null),
// one target group per replica with the labels that join its metrics to Arbiter's.
func TestServiceDiscoveryListsReplicasWithTheirLabels(t *testing.T) {
	pool := NewPool(&Config{}, slog.New(slog.NewTextHandler(io.Discard, nil)), NewMetrics(prometheus.NewRegistry()), nil)
	if got := string(serviceDiscovery(pool.Snapshot())); got != "[]" {
		t.Fatalf("no replicas: %s; want []", got)
	}
	pool.SetReplicas([]fleet.Replica{
		{ID: "svc-1", Address: "10.0.0.7:8000", Model: "m", Service: "svc", Provider: "aws", Region: "us-east-1", Zone: "use1-az4", Capacity: fleet.Spot},
		{ID: "r2", Address: "127.0.0.1:9000", Model: "m", Capacity: fleet.Reserved},
	})
	var groups []sdTarget
	if err := json.Unmarshal(serviceDiscovery(pool.Snapshot()), &groups); err != nil {
		t.Fatal(err)
	}
	byTarget := map[string]map[string]string{}
	for _, g := range groups {
		if len(g.Targets) != 1 {
			t.Fatalf("group %+v", g)
		}
		byTarget[g.Targets[0]] = g.Labels
	}
	want := map[string]string{"replica": "svc-1", "model": "m", "service": "svc", "provider": "aws", "region": "us-east-1", "zone": "use1-az4", "capacity": "spot"}
	for k, v := range want {
		if byTarget["10.0.0.7:8000"][k] != v {
			t.Errorf("label %s = %q, want %q", k, byTarget["10.0.0.7:8000"][k], v)
		}
	}
	if l := byTarget["127.0.0.1:9000"]; l["replica"] != "r2" || l["service"] != "" || len(l) != 3 {
		t.Errorf("standalone replica's labels %v: want replica, model and capacity only", l)
	}
}
