package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// haPlane is a control plane on loopback: a leader takes writes; a standby answers reads
// and refuses writes with 503, as one whose leader did not answer does (control/forward.go);
// a broken one takes the write's request and closes the connection without an answer.
type haPlane struct {
	srv    *httptest.Server
	writes atomic.Int64
	reads  atomic.Int64
	key    atomic.Value // the last write's Idempotency-Key
}

func (p *haPlane) lastKey() string { k, _ := p.key.Load().(string); return k }

func startPlane(t *testing.T, role string) *haPlane {
	p := &haPlane{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			p.reads.Add(1)
			_, _ = w.Write([]byte(`{}`))
			return
		}
		p.writes.Add(1)
		p.key.Store(r.Header.Get("Idempotency-Key"))
		switch role {
		case "standby":
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":"this control plane does not hold the lease, and the leader did not answer"}`))
		case "broken":
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		default:
			_, _ = w.Write([]byte(`{}`))
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// serve --api a,b,c: the CLI talks to a control plane that answers, moves on past one that
// is down or cannot take a write (503), and keeps to the one that took it.
func TestCLIReachesTheLeaderOfSeveral(t *testing.T) {
	dead := startPlane(t, "leader")
	deadURL := dead.srv.URL
	dead.srv.Close() // nothing listens there now: connection refused
	standby, leader := startPlane(t, "standby"), startPlane(t, "leader")
	ctx := context.Background()
	c, _, err := connect(ctx, t.TempDir(), deadURL+", "+standby.srv.URL+"/,"+leader.srv.URL)
	if err != nil {
		t.Fatalf("connect with the first control plane down: %v", err)
	}
	if c.base != standby.srv.URL {
		t.Fatalf("talking to %s; want the first that answers, %s", c.base, standby.srv.URL)
	}
	if _, err := c.do(ctx, http.MethodPost, "/v1/services", map[string]string{"name": "x"}, nil); err != nil {
		t.Fatalf("a write through a standby that cannot take it: %v", err)
	}
	if standby.writes.Load() != 1 || leader.writes.Load() != 1 || c.base != leader.srv.URL {
		t.Fatalf("writes: standby %d, leader %d, now talking to %s; want 1, 1 and the leader", standby.writes.Load(), leader.writes.Load(), c.base)
	}
	if _, err := c.do(ctx, http.MethodGet, "/v1/services", nil, nil); err != nil || leader.reads.Load() != 1 {
		t.Fatalf("a read after the write: %v, %d reads at the leader; want it there", err, leader.reads.Load())
	}

	// Every control plane down: one clear error naming them all.
	leader.srv.Close()
	standby.srv.Close()
	if _, _, err := connect(ctx, t.TempDir(), deadURL+","+standby.srv.URL+","+leader.srv.URL); err == nil || !strings.Contains(err.Error(), deadURL) || !strings.Contains(err.Error(), leader.srv.URL) {
		t.Fatalf("connect with every control plane down: %v; want an error naming each", err)
	}
	if _, _, err := connect(ctx, t.TempDir(), " , "); err == nil || !strings.Contains(err.Error(), "names no control plane") {
		t.Fatalf("--api naming none: %v", err)
	}
}

// A write whose request was sent and then got no answer may have been taken: a service
// write is sent again (elsewhere) with the same Idempotency-Key, which the API answers as
// the first time; a preemption notice, which has no key, is not sent twice.
func TestCLIResendsOnlyWritesThatLandOnce(t *testing.T) {
	broken, leader := startPlane(t, "broken"), startPlane(t, "leader")
	ctx := context.Background()
	c, _, err := connect(ctx, t.TempDir(), broken.srv.URL+","+leader.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = c.do(ctx, http.MethodPost, "/v1/services", map[string]string{"name": "x"}, nil); err != nil {
		t.Fatalf("a service write whose connection closed unanswered, then taken by the next: %v", err)
	}
	if broken.writes.Load() != 1 || leader.writes.Load() != 1 {
		t.Fatalf("writes: %d to the broken control plane, %d to the next; want 1 and 1", broken.writes.Load(), leader.writes.Load())
	}
	if k1, k2 := broken.lastKey(), leader.lastKey(); k1 == "" || k1 != k2 {
		t.Fatalf("Idempotency-Keys %q and %q; want one key, sent with both tries", k1, k2)
	}
	c.base = broken.srv.URL
	_, err = c.do(ctx, http.MethodPost, "/v1/replicas/x-1/preempt", nil, nil)
	var ce *cliError
	if err == nil || !errors.As(err, &ce) || ce.code != exitUnreachable {
		t.Fatalf("a preemption whose connection closed unanswered: %v; want the unreachable error", err)
	}
	if broken.writes.Load() != 2 || leader.writes.Load() != 1 {
		t.Fatalf("writes: %d to the broken control plane, %d to the next; want 2 and 1 (the notice not sent again)", broken.writes.Load(), leader.writes.Load())
	}
}

// Through a failover (issue 46 §2): every control plane refuses the write with 503 and a
// Retry-After until a new leader takes the lease; the CLI waits, tries again with the same
// key, and the write lands once, within --failover-wait. Past it, the 503's message is the
// error.
func TestCLIWaitsThroughAFailover(t *testing.T) {
	var refusals atomic.Int64
	var keys sync.Map
	plane := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			_, _ = w.Write([]byte(`{}`))
			return
		}
		keys.Store(r.Header.Get("Idempotency-Key"), true)
		if refusals.Add(1) <= 4 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":"a failover is under way: the leader cp-a did not answer"}`))
			return
		}
		_, _ = w.Write([]byte(`{"name":"x","version":2}`))
	}))
	defer plane.Close()
	other := startPlane(t, "standby") // refuses every write
	ctx := context.Background()
	c, _, err := connect(ctx, t.TempDir(), plane.URL+","+other.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var note strings.Builder
	c.note, c.wait = &note, 30*time.Second
	var res struct{ Version int }
	if _, err := c.do(ctx, http.MethodPut, "/v1/services/x", map[string]string{"spec": "y"}, &res); err != nil || res.Version != 2 {
		t.Fatalf("a write through a failover: %v, %+v; want it landed", err, res)
	}
	n := 0
	keys.Range(func(any, any) bool { n++; return true })
	if n != 1 || refusals.Load() != 5 || other.writes.Load() < 2 {
		t.Fatalf("%d keys over %d tries (%d at the other control plane); want one key, 5 tries there", n, refusals.Load(), other.writes.Load())
	}
	if !strings.Contains(note.String(), "waiting for a control plane to take the call") {
		t.Errorf("the CLI said %q; want that it waits", note.String())
	}
	// No time to wait: the refusal is the answer.
	refusals.Store(0)
	c.wait = 0
	_, err = c.do(ctx, http.MethodPut, "/v1/services/x", map[string]string{"spec": "y"}, &res)
	var ae *apiError
	if !errors.As(err, &ae) || ae.status != http.StatusServiceUnavailable || refusals.Load() != 1 {
		t.Fatalf("a write refused with no wait: %v after %d tries; want the 503 after one", err, refusals.Load())
	}
}
