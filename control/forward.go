package control

import (
	"context"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"
)

// A standby answers reads itself (from the store) and forwards the writes it is sent (the
// CLI's, routers' load reports and wakes) to the leader, whose API address the lease's row
// holds (state.Store.Advertise): serve and the routers may be pointed at any control plane.
// A forwarded request carries forwardedHeader; one that reaches a control plane that does
// not lead either (the lease moved meanwhile) is answered 503, not forwarded again, so two
// standbys never pass a request back and forth. All control planes of a deployment share
// its API token, which the forwarded request carries as it came.

const forwardedHeader = "X-Arbiter-Forwarded-By"

// leaderURL is where the current leader's API answers, or nil when this control plane leads,
// the lease has expired, or its holder did not say. It reads the lease's row at most once a
// second.
func (c *Controller) leaderURL(ctx context.Context) *url.URL {
	c.fwdMu.Lock()
	defer c.fwdMu.Unlock()
	now := time.Now()
	if now.Sub(c.fwdRead) < time.Second {
		return c.fwdURL
	}
	c.fwdRead, c.fwdURL = now, nil
	li, err := c.store.Leader(ctx)
	if err != nil || li.Address == "" || !now.Before(li.Expires) || li.Holder == c.cfg.Lease.Holder() {
		return nil
	}
	if u, err := url.Parse(li.Address); err == nil && u.Scheme != "" && u.Host != "" {
		c.fwdURL = u
	}
	return c.fwdURL
}

// forwardWrites wraps the API: while this control plane stands by, a request that may write
// (any but GET and HEAD) goes to the leader; without a lease, or while leading, to next.
func (c *Controller) forwardWrites(next http.Handler) http.Handler {
	if c.cfg.Lease == nil {
		return next
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(r.In.Context().Value(leaderKey{}).(*url.URL))
			r.Out.Header.Set(forwardedHeader, c.cfg.Lease.Holder())
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			c.log.Warn("forwarding to the leader failed", "path", r.URL.Path, "err", err)
			w.Header().Set("Retry-After", "5")
			writeJSON(w, http.StatusServiceUnavailable, APIError{Error: "this control plane does not hold the lease, and the leader did not answer: " + err.Error()})
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead || c.leading() || r.Header.Get(forwardedHeader) != "" {
			next.ServeHTTP(w, r)
			return
		}
		u := c.leaderURL(r.Context())
		if u == nil {
			next.ServeHTTP(w, r) // refused there, as not the leader's (503)
			return
		}
		proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), leaderKey{}, u)))
	})
}

type leaderKey struct{}
