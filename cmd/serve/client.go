package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/state"
)

// Exit codes.
const (
	exitErr         = 1 // the operation failed (unknown name, rejected spec, timeout)
	exitUsage       = 2 // bad command line or invalid file
	exitUnreachable = 3 // no control plane answered
)

// cliError carries an exit code.
type cliError struct {
	code int
	err  error
}

func (e *cliError) Error() string { return e.err.Error() }
func (e *cliError) Unwrap() error { return e.err }

func fail(code int, format string, args ...any) error {
	return &cliError{code: code, err: fmt.Errorf(format, args...)}
}

// client talks to the control plane's API. With several control planes on one store (one
// leads, the others stand by and forward writes to it), bases lists them all: a call goes to
// the one that answered last, and moves on to the next when one does not answer or says it
// cannot take the call (HTTP 503: a standby whose leader did not answer, or one that does
// not lead), as the routers do. base is the one that answered last.
//
// While none can take it (a failover: the leader gone and its lease not yet taken), a call
// is tried again, every control plane in turn, for up to wait, as each 503's Retry-After
// says; a write carries one Idempotency-Key through all its tries, so that one which landed
// before its answer was lost is answered as it was, not applied twice.
type client struct {
	base, token string
	bases       []string // every control plane given (empty: base only)
	http        *http.Client
	// wait bounds the retries through a failover (0: none); note, if set, is told once
	// that the call waits for one.
	wait time.Duration
	note io.Writer
}

// apiError is a non-2xx answer.
type apiError struct {
	status int
	msg    string
	// retryAfter is the answer's Retry-After (0: none given).
	retryAfter time.Duration
}

func (e *apiError) Error() string { return e.msg }

// maxRetryPause bounds one pause between tries through a failover, whatever Retry-After
// says: a leader may be there sooner than the lease's end predicts (its successor takes
// the lease the moment it ends).
const maxRetryPause = 2 * time.Second

func (c *client) do(ctx context.Context, method, path string, body, out any) (http.Header, error) {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	key := ""
	if method != http.MethodGet && method != http.MethodHead {
		key = newKey()
	}
	deadline := time.Now().Add(c.wait)
	noted := false
	for {
		h, again, err := c.tryEach(ctx, method, path, key, b, out)
		pause, failing := failingOver(err, len(c.bases) > 1)
		if !again || !failing || ctx.Err() != nil || time.Now().Add(pause).After(deadline) {
			return h, err
		}
		if !noted && c.note != nil {
			fmt.Fprintf(c.note, "waiting for a control plane to take the call (for up to %s): %v\n", c.wait, err)
			noted = true
		}
		select {
		case <-ctx.Done():
			return h, err
		case <-time.After(pause):
		}
	}
}

// failingOver says whether an error from every control plane is one a later try may not
// meet (a 503, or none answered), and how long to pause first.
func failingOver(err error, several bool) (time.Duration, bool) {
	if !several {
		// One control plane (the embedded daemon): no other to take over; its answer is
		// the answer, as before.
		return 0, false
	}
	var ae *apiError
	if errors.As(err, &ae) {
		if ae.status != http.StatusServiceUnavailable {
			return 0, false
		}
		if ae.retryAfter <= 0 {
			return time.Second, true
		}
		return min(ae.retryAfter, maxRetryPause), true
	}
	var ce *cliError
	if errors.As(err, &ce) && ce.code == exitUnreachable {
		return time.Second, true // every control plane given is down at once: they may be restarting
	}
	return 0, false
}

// tryEach makes the call to each control plane in turn, from the one that answered last,
// until one takes it; again says that the last may be tried again (as doAt's).
func (c *client) tryEach(ctx context.Context, method, path, key string, body []byte, out any) (http.Header, bool, error) {
	order := []string{c.base}
	for _, u := range c.bases {
		if u != c.base {
			order = append(order, u)
		}
	}
	var (
		h       http.Header
		again   bool
		err     error
		refusal error // the first answer that refused the call: it says why (a failover)
	)
	for i, base := range order {
		h, again, err = c.doAt(ctx, base, method, path, key, body, out)
		var ae *apiError
		if refusal == nil && errors.As(err, &ae) {
			refusal = err
		}
		if !again || i == len(order)-1 || ctx.Err() != nil {
			if err == nil {
				c.base = base
			} else if again && refusal != nil {
				err = refusal
			}
			return h, again, err
		}
	}
	return h, again, err
}

// resent says whether a write whose request was sent, but got no answer, may be sent again
// (to this control plane or another): the API answers a retried service write by its
// Idempotency-Key, and a deletion or a replica's take-down asked twice is asked once. Any
// other write (a preemption notice) is not sent twice.
func resent(method, path string) bool {
	switch {
	case method == http.MethodGet || method == http.MethodHead, method == http.MethodDelete:
		return true
	case path == "/v1/services" || strings.HasPrefix(path, "/v1/services/") && method == http.MethodPut:
		return true
	}
	return strings.HasPrefix(path, "/v1/replicas/") && strings.HasSuffix(strings.SplitN(path, "?", 2)[0], "/down")
}

// newKey is a write's Idempotency-Key: 128 random bits.
func newKey() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// doAt makes one call to the control plane at base; again says that another control plane
// may take it: this one did not answer before the call was sent (or the call may be sent
// again, resent), or it answered 503 (nothing changed here).
func (c *client) doAt(ctx context.Context, base, method, path, key string, body []byte, out any) (http.Header, bool, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return nil, false, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var op *net.OpError
		again := resent(method, path) || errors.As(err, &op) && op.Op == "dial"
		return nil, again, fail(exitUnreachable, "control plane at %s is unreachable (%v); start one with `serve up FILE`", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var e control.APIError
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
		}
		ae := &apiError{status: resp.StatusCode, msg: e.Error}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			ae.retryAfter = time.Duration(s) * time.Second
		}
		return resp.Header, resp.StatusCode == http.StatusServiceUnavailable, ae
	}
	if out == nil {
		return resp.Header, false, nil
	}
	if raw, ok := out.(*[]byte); ok {
		*raw, err = io.ReadAll(resp.Body)
		return resp.Header, false, err
	}
	return resp.Header, false, json.NewDecoder(resp.Body).Decode(out)
}

func notFound(err error) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.status == http.StatusNotFound
}

// healthy says whether the control plane at base answers (within 2 s).
func (c *client) healthy(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, _, err := c.doAt(ctx, c.base, http.MethodGet, "/v1/health", "", nil, nil)
	return err == nil
}

func (c *client) services(ctx context.Context) ([]control.ServiceStatus, error) {
	return c.servicesWith(ctx, "")
}

// servicesWith lists the services; query is appended to the path (?all=1: ended replicas too).
func (c *client) servicesWith(ctx context.Context, query string) ([]control.ServiceStatus, error) {
	var out []control.ServiceStatus
	_, err := c.do(ctx, http.MethodGet, "/v1/services"+query, nil, &out)
	return out, err
}

func (c *client) service(ctx context.Context, name string) (control.ServiceStatus, error) {
	return c.serviceWith(ctx, name, "")
}

func (c *client) serviceWith(ctx context.Context, name, query string) (control.ServiceStatus, error) {
	var out control.ServiceStatus
	_, err := c.do(ctx, http.MethodGet, "/v1/services/"+name+query, nil, &out)
	return out, err
}

func (c *client) events(ctx context.Context, service, replica string, after int64) ([]state.Event, error) {
	var out []state.Event
	path := "/v1/events?service=" + service + "&replica=" + replica + "&after=" + strconv.FormatInt(after, 10)
	_, err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}
