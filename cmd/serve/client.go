package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
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
type client struct {
	base, token string
	bases       []string // every control plane given (empty: base only)
	http        *http.Client
}

// apiError is a non-2xx answer.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func (c *client) do(ctx context.Context, method, path string, body, out any) (http.Header, error) {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	order := []string{c.base}
	for _, u := range c.bases {
		if u != c.base {
			order = append(order, u)
		}
	}
	var (
		h   http.Header
		err error
	)
	for i, base := range order {
		var again bool
		h, again, err = c.doAt(ctx, base, method, path, b, out)
		if !again || i == len(order)-1 || ctx.Err() != nil {
			if err == nil {
				c.base = base
			}
			return h, err
		}
	}
	return h, err
}

// doAt makes one call to the control plane at base; again says that another control plane
// may take it: this one did not answer before the call was sent (or the call only reads),
// or it answered 503 (nothing changed here).
func (c *client) doAt(ctx context.Context, base, method, path string, body []byte, out any) (http.Header, bool, error) {
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
	resp, err := c.http.Do(req)
	if err != nil {
		var op *net.OpError
		again := method == http.MethodGet || method == http.MethodHead || errors.As(err, &op) && op.Op == "dial"
		return nil, again, fail(exitUnreachable, "control plane at %s is unreachable (%v); start one with `serve up FILE`", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var e control.APIError
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
		}
		return resp.Header, resp.StatusCode == http.StatusServiceUnavailable, &apiError{status: resp.StatusCode, msg: e.Error}
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
	_, _, err := c.doAt(ctx, c.base, http.MethodGet, "/v1/health", nil, nil)
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
