package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// client talks to the control plane's API.
type client struct {
	base, token string
	http        *http.Client
}

// apiError is a non-2xx answer.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func (c *client) do(ctx context.Context, method, path string, body, out any) (http.Header, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fail(exitUnreachable, "control plane at %s is unreachable (%v); start one with `serve up FILE`", c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var e control.APIError
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
		}
		return resp.Header, &apiError{status: resp.StatusCode, msg: e.Error}
	}
	if out == nil {
		return resp.Header, nil
	}
	if raw, ok := out.(*[]byte); ok {
		*raw, err = io.ReadAll(resp.Body)
		return resp.Header, err
	}
	return resp.Header, json.NewDecoder(resp.Body).Decode(out)
}

func notFound(err error) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.status == http.StatusNotFound
}

func (c *client) healthy(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := c.do(ctx, http.MethodGet, "/v1/health", nil, nil)
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
