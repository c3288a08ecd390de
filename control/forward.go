package control

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"time"

	"github.com/arbiter-serve/arbiter/state"
)

// A standby answers reads itself (from the store) and forwards the writes it is sent (the
// CLI's, routers' load reports and wakes) to the leader, whose API address the lease's row
// holds (state.Store.Advertise): serve and the routers may be pointed at any control plane.
// A forwarded request carries forwardedHeader; one that reaches a control plane that does
// not lead either (the lease moved meanwhile) is answered 503, not forwarded again, so two
// standbys never pass a request back and forth. All control planes of a deployment share
// its API token, which the forwarded request carries as it came.
//
// While no control plane can take a write (the leader died or froze and its lease has not
// ended, or it ended and no standby has taken it yet: a failover), a write is answered 503
// with Retry-After set to when a new leader is expected and a message that says so; serve
// waits that long and sends it again with the same Idempotency-Key, which lands it once.

const forwardedHeader = "X-Arbiter-Forwarded-By"

// leaderURL is where the current leader's API answers, or nil when this control plane leads,
// the lease has expired, or its holder did not say; li is the lease as last read. It reads
// the lease's row at most once a second.
func (c *Controller) leaderURL(ctx context.Context) (*url.URL, state.LeaderInfo, error) {
	c.fwdMu.Lock()
	defer c.fwdMu.Unlock()
	now := time.Now()
	if now.Sub(c.fwdRead) < time.Second {
		return c.fwdURL, c.fwdInfo, c.fwdErr
	}
	c.fwdRead, c.fwdURL = now, nil
	li, err := c.store.Leader(ctx)
	c.fwdInfo, c.fwdErr = li, err
	if err != nil || li.Address == "" || !now.Before(li.Expires) || li.Holder == c.cfg.Lease.Holder() {
		return nil, li, err
	}
	if u, err := url.Parse(li.Address); err == nil && u.Scheme != "" && u.Host != "" {
		c.fwdURL = u
	}
	return c.fwdURL, li, nil
}

// localWrites are the POSTs that write nothing (a spec checked, a launch previewed): a
// standby answers them itself when no leader can.
var localWrites = map[string]bool{"/v1/validate": true, "/v1/preview": true}

// forgetLeader drops the leader's address read last, after it did not answer: the next
// write reads the lease again (a new leader may hold it by then).
func (c *Controller) forgetLeader() {
	c.fwdMu.Lock()
	c.fwdRead = time.Time{}
	c.fwdMu.Unlock()
}

// failover says why no control plane takes a write now and when one is expected to: the
// lease as last read (li), what forwarding to its holder met (cause; nil when nothing was
// forwarded), and now. sent: the request may have reached the leader (it failed after the
// connection was made), so it may have landed.
func failover(li state.LeaderInfo, renewEvery time.Duration, cause error, sent bool, now time.Time) (msg string, retryAfter time.Duration) {
	left := li.Expires.Sub(now)
	// A standby tries to take the lease every renewal period: one is expected that long
	// after the lease ends.
	retryAfter = max(left, 0) + renewEvery
	written := "nothing was written"
	if sent {
		written = "the write may have landed before the answer was lost: retry it with the same Idempotency-Key (serve does), which lands it once"
	}
	switch {
	case li.Holder == "":
		msg = fmt.Sprintf("no control plane has taken the lease yet; a standby takes it within %s", secs(renewEvery))
	case cause != nil && left > 0:
		msg = fmt.Sprintf("a failover is under way: the leader %s (%s) did not answer (%v); its lease ends in %s unless it renews, and a standby takes it then",
			li.Holder, li.Address, cause, secs(left))
	case left > 0:
		// It holds the lease but says nowhere to reach it.
		return fmt.Sprintf("this control plane does not hold the lease, and the leader %s does not say where its API answers (start it with --advertise-url): send writes to it; %s", li.Holder, written), retryAfter
	default:
		msg = fmt.Sprintf("a failover is under way: the lease of %s ended %s ago and no control plane has taken it yet; a standby takes it within %s",
			li.Holder, secs(-left), secs(renewEvery))
	}
	return fmt.Sprintf("%s; retry after %s; %s", msg, secs(retryAfter), written), retryAfter
}

func secs(d time.Duration) string { return d.Round(100 * time.Millisecond).String() }

// retryAfterHeader is Retry-After in whole seconds (RFC 9110 §10.2.3), at least 1.
func retryAfterHeader(d time.Duration) string {
	return strconv.Itoa(max(1, int(math.Ceil(d.Seconds()))))
}

// forwardWrites wraps the API: while this control plane stands by, a request that may write
// (any but GET and HEAD) goes to the leader; without a lease, or while leading, to next.
func (c *Controller) forwardWrites(next http.Handler) http.Handler {
	if c.cfg.Lease == nil {
		return next
	}
	// A leader that has not answered within its lease (frozen, or cut off) is no longer
	// one: the request fails, and its client retries it with a new leader.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.ResponseHeaderTimeout = c.cfg.Lease.TTL() + c.renewEvery()
	proxy := &httputil.ReverseProxy{
		Transport: transport,
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(r.In.Context().Value(leaderKey{}).(*url.URL))
			r.Out.Header.Set(forwardedHeader, c.cfg.Lease.Holder())
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			c.forgetLeader()
			_, li, _ := c.leaderURL(r.Context())
			var op *net.OpError
			sent := !(errors.As(err, &op) && op.Op == "dial")
			msg, after := failover(li, c.renewEvery(), err, sent, time.Now())
			c.log.Warn("forwarding to the leader failed", "path", r.URL.Path, "err", err, "leader", li.Holder)
			w.Header().Set("Retry-After", retryAfterHeader(after))
			writeJSON(w, http.StatusServiceUnavailable, APIError{Error: msg})
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead || c.leading() || r.Header.Get(forwardedHeader) != "" {
			next.ServeHTTP(w, r)
			return
		}
		u, li, err := c.leaderURL(r.Context())
		if u == nil {
			if localWrites[r.URL.Path] || li.Holder == c.cfg.Lease.Holder() && time.Now().Before(li.Expires) {
				// Nothing to write, or the row says this one leads: it takes the write, or
				// refuses it as fenced.
				next.ServeHTTP(w, r)
				return
			}
			if err != nil {
				w.Header().Set("Retry-After", retryAfterHeader(c.renewEvery()))
				writeJSON(w, http.StatusServiceUnavailable, APIError{Error: fmt.Sprintf(
					"no control plane can take a write while the state store is out of reach (reading who leads: %v); nothing was written", err)})
				return
			}
			msg, after := failover(li, c.renewEvery(), nil, false, time.Now())
			c.log.Info("write refused: no control plane can take it now", "path", r.URL.Path, "lease", li.Holder, "retry_after", after)
			w.Header().Set("Retry-After", retryAfterHeader(after))
			writeJSON(w, http.StatusServiceUnavailable, APIError{Error: msg})
			return
		}
		proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), leaderKey{}, u)))
	})
}

type leaderKey struct{}
