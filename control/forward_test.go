package control

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/state"
)

// What a write refused during a failover says, and when it asks to be retried: when the
// lease is expected to be taken (its end, plus a standby's renewal period).
func TestFailoverAnswer(t *testing.T) {
	now := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	every := 5 * time.Second
	refused := errors.New("dial tcp 127.0.0.1:8081: connect: connection refused")
	for _, tc := range []struct {
		name    string
		li      state.LeaderInfo
		cause   error
		sent    bool
		after   time.Duration
		want    []string
		wantNot []string
	}{
		{"the leader is gone, its lease runs 8 s more", state.LeaderInfo{Holder: "cp-a", Address: "http://10.0.0.1:8081", Expires: now.Add(8 * time.Second)}, refused, false,
			13 * time.Second, []string{"a failover is under way: the leader cp-a (http://10.0.0.1:8081) did not answer", "its lease ends in 8s", "retry after 13s", "nothing was written"}, nil},
		{"the leader took the write and died", state.LeaderInfo{Holder: "cp-a", Address: "http://10.0.0.1:8081", Expires: now.Add(2 * time.Second)}, errors.New("EOF"), true,
			7 * time.Second, []string{"did not answer (EOF)", "may have landed", "same Idempotency-Key"}, []string{"nothing was written"}},
		{"the lease ended, no one has taken it", state.LeaderInfo{Holder: "cp-a", Address: "http://10.0.0.1:8081", Expires: now.Add(-1500 * time.Millisecond)}, nil, false,
			every, []string{"the lease of cp-a ended 1.5s ago and no control plane has taken it yet", "retry after 5s"}, nil},
		{"no lease was ever taken", state.LeaderInfo{}, nil, false, every, []string{"no control plane has taken the lease yet"}, nil},
		{"a leader with no address", state.LeaderInfo{Holder: "cp-a", Expires: now.Add(10 * time.Second)}, nil, false,
			15 * time.Second, []string{"does not say where its API answers (start it with --advertise-url)"}, []string{"failover"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, after := failover(tc.li, every, tc.cause, tc.sent, now)
			if after != tc.after {
				t.Errorf("retry after %v; want %v", after, tc.after)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%q lacks %q", msg, w)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(msg, w) {
					t.Errorf("%q says %q", msg, w)
				}
			}
		})
	}
	if h := retryAfterHeader(1200 * time.Millisecond); h != "2" {
		t.Errorf("Retry-After for 1.2 s: %s; want 2 (whole seconds, rounded up)", h)
	}
	if h := retryAfterHeader(0); h != "1" {
		t.Errorf("Retry-After for 0: %s; want 1", h)
	}
}
