package router

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// controlMetrics gathers the control plane's own metrics from its API, so that the
// embedded daemon's two processes keep one scrape target: the router's admin port. A
// control plane that does not answer costs the scrape nothing but its own series (and
// arbiter_router_control_metrics_up drops to 0): the data plane's metrics must not go
// missing because the control plane is down.
type controlMetrics struct {
	url, token string
	client     *http.Client
	up         prometheus.Gauge
}

// maxControlMetrics bounds what a scrape reads from the control plane.
const maxControlMetrics = 16 << 20

func newControlMetrics(controlURL, token string, reg prometheus.Registerer) *controlMetrics {
	up := prometheus.NewGauge(prometheus.GaugeOpts{Name: "arbiter_router_control_metrics_up",
		Help: "1 when the last scrape of this router's admin port could include the control plane's metrics, 0 when the control plane did not answer."})
	reg.MustRegister(up)
	return &controlMetrics{url: strings.TrimSuffix(controlURL, "/") + "/v1/metrics", token: token, client: &http.Client{}, up: up}
}

// Gather implements prometheus.Gatherer. It must come before the router's registry in
// a prometheus.Gatherers, so that the up gauge it sets is the one gathered after it.
func (m *controlMetrics) Gather() ([]*dto.MetricFamily, error) {
	fams, err := m.fetch()
	if err != nil {
		m.up.Set(0)
		return nil, nil
	}
	m.up.Set(1)
	return fams, nil
}

func (m *controlMetrics) fetch() ([]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+m.token)
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := m.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("control plane metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	byName, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, maxControlMetrics))
	if err != nil {
		return nil, fmt.Errorf("control plane metrics: %w", err)
	}
	out := make([]*dto.MetricFamily, 0, len(byName))
	for _, f := range byName {
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out, nil
}
