package runpod

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/arbiter-serve/arbiter/replicas"
)

// client calls RunPod's GraphQL API: POST {"query", "variables"} with the key as a bearer
// token (https://graphql-spec.runpod.io/, "Headers"). Errors come back as HTTP 200 with an
// "errors" list, or as an HTTP status (401, 429, 5xx).
type client struct {
	endpoint, key string
	http          *http.Client
	log           func(msg string, args ...any)
}

// apiError is an error RunPod answered.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string {
	if e.status != 0 && e.status != http.StatusOK {
		return fmt.Sprintf("runpod API: HTTP %d: %s", e.status, e.msg)
	}
	return "runpod API: " + e.msg
}

// noCapacity is RunPod's answer when no machine has the GPUs asked for now (seen in its
// SDKs' and users' reports: "There are no longer any instances available with the
// requested specifications. Please refresh and try again.").
func noCapacity(err error) bool {
	var ae *apiError
	return errors.As(err, &ae) && (strings.Contains(ae.msg, "no longer any instances available") ||
		strings.Contains(ae.msg, "not enough free GPUs") || strings.Contains(ae.msg, "No instances currently available"))
}

// classify turns an API error into what the control plane acts on.
func classify(err error, what string) error {
	var ae *apiError
	switch {
	case noCapacity(err):
		return fmt.Errorf("%s: %w: %v", what, replicas.ErrNoCapacity, err)
	case errors.As(err, &ae) && (ae.status == http.StatusUnauthorized || ae.status == http.StatusForbidden):
		return fmt.Errorf("%s: RunPod refused the API key (check RUNPOD_API_KEY and its permissions): %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// call runs one GraphQL operation and decodes data into out. Throttling (429) and the
// API's own failures (5xx) are retried with backoff, a few times; the rest is returned.
func (c *client) call(ctx context.Context, query string, vars map[string]any, out any) error {
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err != nil {
		return err
	}
	backoff := 500 * time.Millisecond
	for try := 0; ; try++ {
		err := c.once(ctx, body, out)
		var ae *apiError
		retry := errors.As(err, &ae) && (ae.status == http.StatusTooManyRequests || ae.status >= 500)
		if !retry || try == 3 {
			return err
		}
		c.log("runpod API busy; retrying", "try", try+1, "after", backoff, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff *= 2
	}
}

func (c *client) once(ctx context.Context, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.key)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return &apiError{status: resp.StatusCode, msg: strings.TrimSpace(string(truncate(b, 300)))}
	}
	var r struct {
		Data   json.RawMessage `json:"data"`
		Errors []struct {
			Message string `json:"message"`
		} `json:"errors"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("runpod API: malformed answer: %w", err)
	}
	if len(r.Errors) > 0 {
		msgs := make([]string, len(r.Errors))
		for i, e := range r.Errors {
			msgs[i] = e.Message
		}
		return &apiError{status: http.StatusOK, msg: strings.Join(msgs, "; ")}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(r.Data, out); err != nil {
		return fmt.Errorf("runpod API: unexpected data: %w", err)
	}
	return nil
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return append(b[:n:n], "…"...)
	}
	return b
}

// envList is RunPod's env input: a list of {key, value}, in key order.
func envList(m map[string]string) []map[string]string {
	out := make([]map[string]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, map[string]string{"key": k, "value": m[k]})
	}
	return out
}

// envMap reads a pod's env, which the API lists as "KEY=value" strings.
func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

func formatPrice(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
