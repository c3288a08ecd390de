package router

import (
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

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

// A replica that left the set keeps its counters for goneRetention (every scrape sees its
// last requests' tokens), then they are deleted; one still in the set keeps them.
func TestGoneReplicasSeriesAreDeletedAfterRetention(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	pool := NewPool(&Config{}, slog.New(slog.NewTextHandler(io.Discard, nil)), m, nil)
	pool.SetReplicas([]fleet.Replica{{ID: "a", Address: "127.0.0.1:1", Model: "m"}, {ID: "b", Address: "127.0.0.1:2", Model: "m"}})
	for _, r := range pool.Snapshot() {
		m.request("m", r, 200)
		m.replica(r).prompt.Add(10)
	}
	count := func(id string) int {
		n := 0
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			for _, mt := range mf.GetMetric() {
				for _, l := range mt.GetLabel() {
					if l.GetName() == "replica" && l.GetValue() == id && strings.HasSuffix(mf.GetName(), "_total") {
						n++
					}
				}
			}
		}
		return n
	}
	if count("a") == 0 || count("b") == 0 {
		t.Fatal("no series to start with")
	}
	now := time.Now()
	all := pool.Snapshot()
	keep := all[1:] // a leaves
	m.forgetGone(all, keep, now)
	m.forgetGone(keep, keep, now.Add(goneRetention/2))
	if count("a") == 0 {
		t.Fatal("a's series deleted before the retention")
	}
	m.forgetGone(keep, keep, now.Add(goneRetention+time.Second))
	if count("a") != 0 || count("b") == 0 {
		t.Fatalf("after the retention: a %d series (want 0), b %d (want kept)", count("a"), count("b"))
	}
}
