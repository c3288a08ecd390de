package router

import (
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

// fakeControlPlane serves the control plane's router-facing API from a settable ready set.
type fakeControlPlane struct {
	mu      sync.Mutex
	set     fleet.ReadySet
	changed chan struct{}
	wakes   []string
	reports []fleet.LoadReport
	// standby: refuse wakes and load reports as a standby control plane does (503).
	standby bool
	// spend adds up the tenants' reported spend, which load reports are answered with, as
	// the control plane does (control/tenants.go); lost: take reports but answer 502, as
	// when the answer is lost on the way back.
	spend map[string]fleet.TenantSpend
	lose  bool
}

func (f *fakeControlPlane) publish(services []fleet.Service, replicas []fleet.Replica) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set = fleet.ReadySet{Revision: f.set.Revision + 1, Services: services, Replicas: replicas}
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeControlPlane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer tok" {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	f.mu.Lock()
	standby := f.standby
	f.mu.Unlock()
	if standby && (r.URL.Path == "/v1/wake" || r.URL.Path == "/v1/load") {
		http.Error(w, `{"error":"this control plane does not hold the lease; only the leader writes"}`, http.StatusServiceUnavailable)
		return
	}
	switch r.URL.Path {
	case "/v1/readyset":
		after, _ := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
		f.mu.Lock()
		set, ch := f.set, f.changed
		f.mu.Unlock()
		if set.Revision == after {
			select {
			case <-ch:
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
				return
			}
			f.mu.Lock()
			set = f.set
			f.mu.Unlock()
		}
		_ = json.NewEncoder(w).Encode(set)
	case "/v1/wake":
		var req struct{ Model string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.wakes = append(f.wakes, req.Model)
		f.mu.Unlock()
	case "/v1/load":
		var rep fleet.LoadReport
		_ = json.NewDecoder(r.Body).Decode(&rep)
		if err := rep.Validate(); err != nil {
			// As the real control plane does (control/api.go): a report it cannot add up is
			// refused whole.
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.reports = append(f.reports, rep)
		if f.spend == nil {
			f.spend = map[string]fleet.TenantSpend{}
		}
		for _, u := range rep.Tenants {
			t := f.spend[u.Tenant]
			t.Tenant = u.Tenant
			t.DayDollars += u.Dollars
			t.MonthDollars += u.Dollars
			f.spend[u.Tenant] = t
		}
		ans := fleet.LoadAnswer{OK: true, Day: time.Now().UTC().Format(time.DateOnly)}
		for _, t := range f.spend {
			ans.Tenants = append(ans.Tenants, t)
		}
		lose := f.lose
		f.mu.Unlock()
		if lose {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		_ = json.NewEncoder(w).Encode(ans)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

// startWithControlPlane is a router following fake (a control plane on loopback, whose
// first ready set is published already), mod adjusting its config, replicas listed as well
// as the set's; it returns once the router has the first set.
func startWithControlPlane(t *testing.T, fake *fakeControlPlane, mod func(*Config), replicas ...fleet.Replica) (*rig, *ControlPlane) {
	t.Helper()
	cps := httptest.NewServer(fake)
	t.Cleanup(cps.Close)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var cp *ControlPlane
	rig := startRouterWith(t, mod, func(px *Proxy, pool *Pool) {
		cp = NewControlPlane(cps.URL, "tok", "r1", pool, px.Load, slog.New(slog.DiscardHandler))
		px.ControlPlane = cp
		cp.OnAdaptersRemoved = px.unloadAdapters // as Run wires it
	}, replicas...)
	go cp.Run(ctx)
	waitFor(t, "the first ready set", func() bool { return cp.Revision() >= 1 })
	return rig, cp
}

// A request for a service with no ready replica is held, wakes the control plane at once,
// and is answered when the control plane publishes a replica; load reports count it; the
// service's routing policy and SLO come with the set.
func TestHeldAtZeroUntilTheControlPlanePublishesAReplica(t *testing.T) {
	fake := &fakeControlPlane{changed: make(chan struct{})}
	fake.publish([]fleet.Service{{Name: "svc", Models: []string{testModel}, Policy: "round_robin",
		SLO: &fleet.SLO{TTFTSeconds: 0.5, Percentile: 0.9}}}, nil)
	cps := httptest.NewServer(fake)
	defer cps.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cp *ControlPlane
	rig := startRouterWith(t, nil, func(px *Proxy, pool *Pool) {
		cp = NewControlPlane(cps.URL, "tok", "r1", pool, px.Load, slog.New(slog.DiscardHandler))
		cp.ReportEvery = 100 * time.Millisecond
		px.ControlPlane = cp
	})
	go cp.Run(ctx)
	waitFor(t, "the first ready set", func() bool { return cp.Revision() == 1 })
	if rt, ok := cp.Routing(testModel); !ok || rt.Service != "svc" || rt.Policy != "round_robin" || rt.SLO.TTFT != 0.5 {
		t.Fatalf("Routing = %+v %v", rt, ok)
	}
	// At zero replicas the endpoint lists the model its service declares (clients that list
	// models first work), and a model no service declares is 404 model_not_found, as when
	// replicas run.
	resp, body := get(t, rig.url+"/v1/models")
	if resp.StatusCode != 200 || !strings.Contains(body, `"id":"`+testModel+`"`) {
		t.Fatalf("/v1/models at zero: %d %s", resp.StatusCode, body)
	}
	resp, body = post(t, rig.url+"/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 404 || !strings.Contains(body, "model_not_found") || !strings.Contains(body, testModel) {
		t.Fatalf("unknown model at zero: %d %s; want 404 model_not_found naming the served model", resp.StatusCode, body)
	}

	type result struct {
		code int
		body string
	}
	done := make(chan result, 1)
	go func() {
		resp, body := post(t, rig.url+"/v1/chat/completions", chatBody(false, ""))
		done <- result{resp.StatusCode, body}
	}()
	waitFor(t, "a wake for the held model", func() bool {
		fake.mu.Lock()
		defer fake.mu.Unlock()
		return len(fake.wakes) > 0 && fake.wakes[0] == testModel
	})
	waitFor(t, "a load report showing the held request", func() bool {
		fake.mu.Lock()
		defer fake.mu.Unlock()
		for _, r := range fake.reports {
			for _, m := range r.Models {
				if m.Model == testModel && m.Held == 1 {
					return true
				}
			}
		}
		return false
	})
	select {
	case r := <-done:
		t.Fatalf("answered before any replica existed: %d %s", r.code, r.body)
	case <-time.After(200 * time.Millisecond):
	}
	s := startSim(t, simOpts{echo: true})
	fake.publish(fake.set.Services, []fleet.Replica{replica("a", s, fleet.Reserved, 0)})
	select {
	case r := <-done:
		if r.code != 200 {
			t.Fatalf("held request: %d %s", r.code, r.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("held request not answered after a replica was published")
	}
	// An unknown model is still refused at once, not held.
	resp, _ = post(t, rig.url+"/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 404 {
		t.Fatalf("unknown model: %d; want 404", resp.StatusCode)
	}
	// The answer was judged against the SLO and the replica's report says so, once (the
	// control plane learns each GPU type's headroom from it).
	var judged, missed int64
	waitFor(t, "a load report judging replica a's answer", func() bool {
		fake.mu.Lock()
		defer fake.mu.Unlock()
		judged, missed = 0, 0
		for _, r := range fake.reports {
			for _, l := range r.Replicas {
				if l.ReplicaID == "a" {
					judged += l.SLOJudged
					missed += l.SLOMisses
				}
			}
		}
		return judged > 0
	})
	// Reports after the one that judged it must not count it again.
	fake.mu.Lock()
	n := len(fake.reports)
	fake.mu.Unlock()
	waitFor(t, "three more load reports", func() bool {
		fake.mu.Lock()
		defer fake.mu.Unlock()
		return len(fake.reports) >= n+3
	})
	fake.mu.Lock()
	again := int64(0)
	for _, r := range fake.reports {
		for _, l := range r.Replicas {
			again += l.SLOJudged
		}
	}
	fake.mu.Unlock()
	if judged != 1 || missed != 0 || again != 1 {
		t.Fatalf("replica a's reports judged %d answers (%d missed), %d in all; want its one answer once, within the SLO", judged, missed, again)
	}
}

// A client that gives up while held is let go, and the held count returns to zero.
func TestHeldRequestWithDeadlineTimesOut(t *testing.T) {
	fake := &fakeControlPlane{changed: make(chan struct{})}
	fake.publish([]fleet.Service{{Name: "svc", Models: []string{testModel}}}, nil)
	rig, _ := startWithControlPlane(t, fake, nil)
	start := time.Now()
	resp, body := post(t, rig.url+"/v1/chat/completions", chatBody(false, ""), "X-Arbiter-Deadline-Ms", "300")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || time.Since(start) > 5*time.Second {
		t.Fatalf("held past its deadline: %d %s after %v", resp.StatusCode, body, time.Since(start))
	}
	if n := rig.px.held.Load(); n != 0 {
		t.Fatalf("held count %d after the request ended", n)
	}
}

// A router given several control planes (one leading, one standing by) sends its load
// reports to the leader, and follows the lease when it moves: the old leader, now a
// standby, refuses them; the new one takes them.
func TestLoadReportsFollowTheLeader(t *testing.T) {
	a := &fakeControlPlane{changed: make(chan struct{}), standby: true}
	b := &fakeControlPlane{changed: make(chan struct{})}
	for _, f := range []*fakeControlPlane{a, b} {
		f.publish([]fleet.Service{{Name: "svc", Models: []string{testModel}}}, nil)
	}
	sa, sb := httptest.NewServer(a), httptest.NewServer(b)
	defer sa.Close()
	defer sb.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cp *ControlPlane
	startRouterWith(t, nil, func(px *Proxy, pool *Pool) {
		cp = NewControlPlane(sa.URL+", "+sb.URL+"/", "tok", "r1", pool, px.Load, slog.New(slog.DiscardHandler))
		cp.ReportEvery = 50 * time.Millisecond
		px.ControlPlane = cp
	})
	go cp.Run(ctx)
	reports := func(f *fakeControlPlane) int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.reports)
	}
	waitFor(t, "reports at the leader b", func() bool { return reports(b) >= 3 })
	if n := reports(a); n != 0 {
		t.Fatalf("the standby a took %d reports", n)
	}
	// The lease moves to a.
	a.mu.Lock()
	a.standby = false
	a.mu.Unlock()
	b.mu.Lock()
	b.standby = true
	b.mu.Unlock()
	waitFor(t, "reports at the new leader a", func() bool { return reports(a) >= 3 })
	cp.Wake(testModel)
	waitFor(t, "a wake at the new leader a", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.wakes) == 1
	})
	// b, gone altogether, is not missed.
	sb.Close()
	n := reports(a)
	waitFor(t, "reports at a with b gone", func() bool { return reports(a) >= n+3 })
}

// latePolicy has room for a late request (Request.Late) only while it holds tokens; any
// other request goes to the first candidate.
type latePolicy struct {
	mu   sync.Mutex
	room int
	late int // late requests answered no room
}

func (p *latePolicy) Pick(req *Request, cands []*Replica, _ *rand.Rand) *Replica {
	if len(cands) == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if req.Late {
		if p.room == 0 {
			p.late++
			return nil
		}
		p.room--
	}
	return cands[0]
}

// Requests held past their TTFT target are late: when a replica comes up they wait in the
// router for room (the policy's), counted as held, and a fresh request goes first; they are
// answered as room comes, and once they have waited as long again as they were held, they
// go as any request does. Released at once, the backlog would queue every fresh request
// behind it in the engine.
func TestLateHeldRequestsWaitForRoom(t *testing.T) {
	fake := &fakeControlPlane{changed: make(chan struct{})}
	fake.publish([]fleet.Service{{Name: "svc", Models: []string{testModel}, SLO: &fleet.SLO{TTFTSeconds: 0.5, Percentile: 0.9}}}, nil)
	cps := httptest.NewServer(fake)
	defer cps.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cp *ControlPlane
	room := &latePolicy{}
	rig := startRouterWith(t, nil, func(px *Proxy, pool *Pool) {
		cp = NewControlPlane(cps.URL, "tok", "r1", pool, px.Load, slog.New(slog.DiscardHandler))
		cp.ReportEvery = 100 * time.Millisecond
		px.ControlPlane = cp
		px.policies["late"] = room
	})
	go cp.Run(ctx)
	waitFor(t, "the first ready set", func() bool { return cp.Revision() == 1 })
	held := func() float64 {
		for _, m := range rig.px.Load.report(nil) {
			if m.Model == testModel {
				return m.Held
			}
		}
		return 0
	}
	codes := make(chan int, 3)
	for range 3 {
		go func() {
			resp, _ := post(t, rig.url+"/v1/chat/completions", chatBody(false, ""), "X-Arbiter-Policy", "late")
			codes <- resp.StatusCode
		}()
	}
	waitFor(t, "three requests held", func() bool { return held() == 3 })
	// A cold start, short: the hold's length is what the test is about (past the 0.5 s
	// TTFT target, and how long the late requests then wait for room).
	const hold = 3 * time.Second
	time.Sleep(hold)
	s := startSim(t, simOpts{echo: true})
	fake.publish(fake.set.Services, []fleet.Replica{replica("a", s, fleet.Reserved, 0)})
	released := time.Now()
	waitFor(t, "the late requests asking for room", func() bool {
		room.mu.Lock()
		defer room.mu.Unlock()
		return room.late >= 3
	})
	if h := held(); h != 3 {
		t.Fatalf("%v requests held once a replica was ready; want the 3 late ones, waiting for room", h)
	}
	resp, body := post(t, rig.url+"/v1/chat/completions", chatBody(false, ""), "X-Arbiter-Policy", "late")
	if resp.StatusCode != 200 {
		t.Fatalf("a fresh request while the late ones wait: %d %s", resp.StatusCode, body)
	}
	select {
	case code := <-codes:
		t.Fatalf("a late request was answered (%d) before it had room", code)
	default:
	}
	// Room for one: one goes.
	room.mu.Lock()
	room.room = 1
	room.mu.Unlock()
	select {
	case code := <-codes:
		if code != 200 {
			t.Fatalf("a late request, given room: %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a late request not answered once it had room")
	}
	waitFor(t, "two requests held", func() bool { return held() == 2 })
	// No more room: the other two go once they have waited as long as they were held.
	for range 2 {
		select {
		case code := <-codes:
			if code != 200 {
				t.Fatalf("a late request past its wait for room: %d", code)
			}
			if waited := time.Since(released); waited < hold*9/10 {
				t.Fatalf("a late request with no room went %v after the replica came up; want it to wait about %v", waited, hold)
			}
		case <-time.After(hold + 10*time.Second):
			t.Fatal("a late request still waiting for room long after it was held as long again")
		}
	}
	waitFor(t, "no request held", func() bool { return held() == 0 })
}
