package router

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// The routers tell the control plane the service's request mix: each finished generating
// request counted by its prompt and output length class, with the tokens it had, from the
// usage the replica reported.
func TestLoadReportsCarryTheRequestMix(t *testing.T) {
	h := startHostile(t, testModel, vllmUsage(3000, 300, 3300))
	fake := &fakeControlPlane{changed: make(chan struct{})}
	rep := fleet.Replica{ID: "a", Service: "svc", Address: h.addr(), Model: testModel, Capacity: fleet.Reserved, Accelerator: "L4"}
	fake.publish([]fleet.Service{{Name: "svc", Models: []string{testModel}}}, []fleet.Replica{rep})
	cps := httptest.NewServer(fake)
	defer cps.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cp *ControlPlane
	rig := startRouterWith(t, nil, func(px *Proxy, pool *Pool) {
		cp = NewControlPlane(cps.URL, "tok", "r1", pool, px.Load, slog.New(slog.DiscardHandler))
		cp.ReportEvery = 50 * time.Millisecond
		px.ControlPlane = cp
	})
	go cp.Run(ctx)
	waitFor(t, "the replica ready", func() bool { return rig.pool.Get("a") != nil && rig.pool.Get("a").Available(time.Now()) })
	for range 3 {
		if resp, body := post(t, rig.url+"/v1/chat/completions", chatBody(false, "")); resp.StatusCode != 200 {
			t.Fatalf("chat: %d %s", resp.StatusCode, body)
		}
	}
	p, o := fleet.MixClassOf(3000, 300)
	var got fleet.MixCell
	waitFor(t, "load reports with the three requests in the mix", func() bool {
		fake.mu.Lock()
		defer fake.mu.Unlock()
		got = fleet.MixCell{Prompt: p, Output: o}
		for _, r := range fake.reports {
			for _, m := range r.Models {
				for _, c := range m.Mix {
					if m.Model != testModel || c.Prompt != p || c.Output != o {
						t.Errorf("a mix cell %+v of %s; want only class (%d, %d) of %s", c, m.Model, p, o, testModel)
						continue
					}
					got.Requests += c.Requests
					got.PromptTokens += c.PromptTokens
					got.OutputTokens += c.OutputTokens
				}
			}
		}
		return got.Requests >= 3
	})
	if want := (fleet.MixCell{Prompt: p, Output: o, Requests: 3, PromptTokens: 9000, OutputTokens: 900}); got != want {
		t.Errorf("mix reported %+v; want %+v", got, want)
	}
	// Tokens by GPU type: the token series carry the replica's accelerator.
	if n := rig.counter(t, "arbiter_router_tokens_total", "accelerator", "L4"); n != 3*3300 {
		t.Errorf("tokens on the L4 = %v; want %v", n, 3*3300)
	}
}

// A mix that fails validation (a bug in counting) costs only the mix: the model's other
// counts still reach the control plane, which refuses a report whole.
func TestABadMixIsDroppedAlone(t *testing.T) {
	fake := &fakeControlPlane{changed: make(chan struct{})}
	fake.publish([]fleet.Service{{Name: "svc", Models: []string{testModel}}}, nil)
	cps := httptest.NewServer(fake)
	defer cps.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cp *ControlPlane
	rig := startRouterWith(t, nil, func(px *Proxy, pool *Pool) {
		cp = NewControlPlane(cps.URL, "tok", "r1", pool, px.Load, slog.New(slog.DiscardHandler))
		cp.ReportEvery = 50 * time.Millisecond
		px.ControlPlane = cp
	})
	l := rig.px.Load.get(testModel)
	l.requests.Add(7)
	// 5,000 prompt tokens in one request of the shortest class (under 128).
	l.mix[0][0].requests = 1
	l.mix[0][0].prompt = 5000
	go cp.Run(ctx)
	waitFor(t, "a report with the model's requests", func() bool {
		fake.mu.Lock()
		defer fake.mu.Unlock()
		for _, r := range fake.reports {
			for _, m := range r.Models {
				if m.Model == testModel && m.Requests == 7 {
					if len(m.Mix) != 0 {
						t.Errorf("the bad mix was sent: %+v", m.Mix)
					}
					return true
				}
			}
		}
		return false
	})
}

// Requests finishing while the tracker reports never tear a cell: every report's mix holds
// whole requests (it validates), and the reports add up to every request counted.
func TestMixReportsAreWholeUnderConcurrency(t *testing.T) {
	var lt LoadTracker
	const workers, each = 4, 2000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := lt.get(testModel)
			for i := range each {
				l.served(100+w, 40+i%20) // class (0, 0): under 128 and 64
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	total := 0.0
	check := func() {
		for _, m := range lt.report(nil) {
			if err := m.Validate(); err != nil {
				t.Fatalf("a torn report: %v", err)
			}
			for _, c := range m.Mix {
				total += c.Requests
			}
		}
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		check()
	}
	check()
	if total != workers*each {
		t.Fatalf("reports counted %v requests; want %d", total, workers*each)
	}
}
