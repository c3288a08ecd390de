package replicas

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// ProbeSpec is a readiness probe with SkyServe's semantics: GET path, or POST of PostData
// (JSON) when set, with Headers; only HTTP 200 counts as success.
type ProbeSpec struct {
	Path     string
	PostData string
	Headers  map[string]string
	Timeout  time.Duration
}

// Probe checks one replica once.
func Probe(ctx context.Context, client *http.Client, addr string, p ProbeSpec) error {
	ctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	method, body := http.MethodGet, io.Reader(nil)
	if p.PostData != "" {
		method, body = http.MethodPost, strings.NewReader(p.PostData)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+p.Path, body)
	if err != nil {
		return fmt.Errorf("probe %s: %w", addr, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range p.Headers {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("probe %s%s: %w", addr, p.Path, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe %s%s: HTTP %d", addr, p.Path, resp.StatusCode)
	}
	return nil
}
