package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// haPlane is a control plane on loopback: a leader takes writes; a standby answers reads
// and refuses writes with 503, as one whose leader did not answer does (control/forward.go);
// a broken one takes the write's request and closes the connection without an answer.
type haPlane struct {
	srv    *httptest.Server
	writes atomic.Int64
	reads  atomic.Int64
}

func startPlane(t *testing.T, role string) *haPlane {
	p := &haPlane{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			p.reads.Add(1)
			_, _ = w.Write([]byte(`{}`))
			return
		}
		p.writes.Add(1)
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

// A write whose request was sent and then got no answer is not sent again elsewhere: it may
// have been taken, and a second control plane would apply it twice.
func TestCLIDoesNotResendAWriteThatWasSent(t *testing.T) {
	broken, leader := startPlane(t, "broken"), startPlane(t, "leader")
	ctx := context.Background()
	c, _, err := connect(ctx, t.TempDir(), broken.srv.URL+","+leader.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.do(ctx, http.MethodPost, "/v1/services", map[string]string{"name": "x"}, nil)
	var ce *cliError
	if err == nil || !errors.As(err, &ce) || ce.code != exitUnreachable {
		t.Fatalf("a write whose connection closed unanswered: %v; want the unreachable error", err)
	}
	if broken.writes.Load() != 1 || leader.writes.Load() != 0 {
		t.Fatalf("writes: %d to the broken control plane, %d to the next; want 1 and 0", broken.writes.Load(), leader.writes.Load())
	}
}
