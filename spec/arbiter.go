package spec

import (
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/arbiter-serve/arbiter/engine"
	"github.com/arbiter-serve/arbiter/fleet"
)

var (
	arbiterKeys = []string{
		"model", "models", "routing_policy", "slo", "spot_policy", "reserved", "providers",
		"scale_to_zero_after_seconds", "autoscaling", "readiness", "local", "sim", "profile", "tasks",
		"workload", "adapters", "queue", "tenants", "availability",
	}
	tenantKeys      = []string{"name", "priority", "weight"}
	queueKeys       = []string{"enabled", "max_wait_seconds", "sheddable_fill", "engine_priority"}
	workloadKeys    = []string{"prompt_tokens", "output_tokens"}
	sloKeys         = []string{"ttft_seconds", "tpot_seconds", "e2e_seconds", "percentile"}
	spotPolicyKeys  = []string{"max_price_ratio", "rebalance_min_saving", "min_zones"}
	reservedKeys    = []string{"provider", "region", "zone", "accelerator", "count", "price_per_hour"}
	autoscalingKeys = []string{
		"signal", "target_concurrency_per_replica", "target_tokens_per_second_per_replica",
		"stable_window_seconds", "panic_window_seconds", "panic_threshold", "max_scale_up_rate", "decision_interval_seconds",
	}
	readinessKeys = []string{"probe_interval_seconds", "failure_threshold", "ready_budget_seconds"}
	localKeys     = []string{"capacity", "price_per_hour", "region", "zone"}
	simKeys       = []string{"cloud", "spot_trace", "speedup", "start_hours", "prices_at", "notice_seconds"}

	routingPolicies = []string{"slo_cheapest", "least_load", "round_robin"}
	knownProviders  = []string{"local", "sim", "kubernetes", "aws", "runpod"}
	signals         = []string{"qps", "concurrency", "tokens_per_second"}
	capacities      = []string{"reserved", "spot", "on_demand"}
)

// readyBudgetMargin is added to initial_delay_seconds for the default ready budget: the
// initial delay is how long SkyServe tolerates failing probes, and a replica still not ready
// some minutes later is stuck rather than slow.
const readyBudgetMargin = 300

func defaultArbiter() Arbiter {
	return Arbiter{
		RoutingPolicy:           "slo_cheapest",
		SLO:                     SLO{TTFTSeconds: 2, TPOTSeconds: 0.1, Percentile: 0.9},
		SpotPolicy:              SpotPolicy{MaxPriceRatio: 0.6, MinZones: 2, RebalanceWhenItPays: true},
		Queue:                   Queue{MaxWaitSeconds: 30, SheddableFill: 1},
		Providers:               []string{"local"},
		ScaleToZeroAfterSeconds: 300,
		Autoscaling: Autoscaling{
			Signal:                      "concurrency",
			TargetConcurrencyPerReplica: 8,
			StableWindowSeconds:         60,
			PanicWindowSeconds:          6,
			PanicThreshold:              2,
			MaxScaleUpRate:              4,
			DecisionIntervalSeconds:     1,
		},
		Readiness: Readiness{ProbeIntervalSeconds: 10, FailureThreshold: 3},
		Local:     Local{Capacity: "reserved", Region: "local", Zone: "local"},
		Sim:       Sim{SpotTrace: "skypilot-preemption-aws-04-22-2023-v100_1", Speedup: 60, PricesAt: "2026-08-01"},
	}
}

// arbiter reads the arbiter: section over the defaults in a. Defaults that depend on other
// sections (signal, routing policy, ready budget) are settled in crossCheck.
func (d *decoder) arbiter(n, at *yaml.Node, a *Arbiter) {
	b := d.block("arbiter", at, n, arbiterKeys)
	if b == nil {
		return
	}
	d.models(b, a)
	d.adapters(b, a)
	d.tasks(b, a)
	b.enum("routing_policy", routingPolicies, &a.RoutingPolicy)
	if n := b.get("profile"); n != nil {
		// Measured profiles, and any GPU-MODEL pair the engine can generate a profile for
		// (l4-llama-3.1-8b): the check is the engine's own, so what passes here runs.
		if v, ok := d.str(b.sub("profile"), n); ok {
			v = strings.ToLower(strings.TrimSpace(v))
			if err := engine.CheckProfileName(v); err != nil {
				d.errorf(n, "%s: %v", b.sub("profile"), err)
			} else {
				a.Profile = v
			}
		}
	}

	if v := b.get("slo"); v != nil {
		s := d.block("arbiter.slo", b.key("slo"), v, sloKeys)
		const want = "a number of seconds ≥ 0 (0: no target)"
		s.number("ttft_seconds", want, nonNegative, &a.SLO.TTFTSeconds)
		s.number("tpot_seconds", want, nonNegative, &a.SLO.TPOTSeconds)
		s.number("e2e_seconds", want, nonNegative, &a.SLO.E2ESeconds)
		// Written as 90 or 0.9; values above 1 can only be percents.
		s.number("percentile", "a percentile such as 90, 99.9 or 0.9", between(0, 100), &a.SLO.Percentile)
		if a.SLO.Percentile > 1 {
			// Rounded so that 99.9 reads as 0.999, not 0.9990000000000001.
			a.SLO.Percentile = math.Round(a.SLO.Percentile*1e10) / 1e12
		}
	}
	if v := b.get("workload"); v != nil {
		s := d.block("arbiter.workload", b.key("workload"), v, workloadKeys)
		const want = "a number of tokens from 1 to %d"
		in := func(v int) bool { return v >= 1 && v <= fleet.MaxMixTokens }
		s.integer("prompt_tokens", fmt.Sprintf(want, fleet.MaxMixTokens), in, &a.Workload.PromptTokens)
		s.integer("output_tokens", fmt.Sprintf(want, fleet.MaxMixTokens), in, &a.Workload.OutputTokens)
		if s != nil && (!s.has("prompt_tokens") || !s.has("output_tokens")) {
			d.errorf(v, "arbiter.workload: give both prompt_tokens and output_tokens (a typical request's lengths)")
		}
	}
	if v := b.get("queue"); v != nil {
		s := d.block("arbiter.queue", b.key("queue"), v, queueKeys)
		s.boolean("enabled", &a.Queue.Enabled)
		s.number("max_wait_seconds", "a number of seconds greater than 0, up to 3600", func(v float64) bool { return v > 0 && v <= 3600 }, &a.Queue.MaxWaitSeconds)
		s.number("sheddable_fill", "a share of the SLO greater than 0 and at most 1, such as 0.8", between(0, 1), &a.Queue.SheddableFill)
		s.boolean("engine_priority", &a.Queue.EnginePriority)
	}
	if v := b.get("tenants"); v != nil {
		a.Tenants = d.tenants("arbiter.tenants", v)
	}
	if v := b.get("spot_policy"); v != nil {
		s := d.block("arbiter.spot_policy", b.key("spot_policy"), v, spotPolicyKeys)
		s.number("max_price_ratio", "a ratio greater than 0 and at most 1, such as 0.6", between(0, 1), &a.SpotPolicy.MaxPriceRatio)
		if n := s.get("rebalance_min_saving"); n != nil && n.Kind == yaml.ScalarNode && n.Value == "auto" {
			a.SpotPolicy.RebalanceMinSaving, a.SpotPolicy.RebalanceWhenItPays = 0, true
		} else if n != nil {
			a.SpotPolicy.RebalanceWhenItPays = false
			s.number("rebalance_min_saving", "auto (move when it pays for its cold start), or a fraction from 0 (never move) to below 1, such as 0.2", func(v float64) bool { return v >= 0 && v < 1 }, &a.SpotPolicy.RebalanceMinSaving)
		}
		s.integer("min_zones", "a number of zones from 1 (no hedge, no spread) to 16", func(v int) bool { return v >= 1 && v <= 16 }, &a.SpotPolicy.MinZones)
	}
	// Written as 99.9 (percent) or 0.999; 1 and 100 are refused: no spot fleet promises
	// every second.
	b.number("availability", "a target below 100 %, such as 99.9 (percent) or 0.999 (leave it out for none)", func(v float64) bool { return v > 0 && v < 100 && v != 1 }, &a.Availability)
	if a.Availability > 1 {
		a.Availability = math.Round(a.Availability*1e10) / 1e12
	}
	if v := b.get("providers"); v != nil {
		a.Providers = d.providers("arbiter.providers", v)
	}
	if v := b.get("reserved"); v != nil {
		a.Reserved = d.reserved("arbiter.reserved", v)
	}
	b.number("scale_to_zero_after_seconds", "a number of seconds ≥ 0", nonNegative, &a.ScaleToZeroAfterSeconds)

	if v := b.get("autoscaling"); v != nil {
		s := d.block("arbiter.autoscaling", b.key("autoscaling"), v, autoscalingKeys)
		as := &a.Autoscaling
		s.enum("signal", signals, &as.Signal)
		s.number("target_concurrency_per_replica", "a number > 0", positive, &as.TargetConcurrencyPerReplica)
		s.number("target_tokens_per_second_per_replica", "a number > 0", positive, &as.TargetTokensPerSecondPerReplica)
		s.number("stable_window_seconds", "a number of seconds > 0", positive, &as.StableWindowSeconds)
		s.number("panic_window_seconds", "a number of seconds ≥ 0 (0 turns panic mode off)", nonNegative, &as.PanicWindowSeconds)
		s.number("panic_threshold", "a number ≥ 1 (a multiple of ready capacity)", func(v float64) bool { return v >= 1 }, &as.PanicThreshold)
		s.number("max_scale_up_rate", "a number ≥ 1 (a multiple of ready replicas)", func(v float64) bool { return v >= 1 }, &as.MaxScaleUpRate)
		s.number("decision_interval_seconds", "a number of seconds > 0", positive, &as.DecisionIntervalSeconds)
	}
	if v := b.get("readiness"); v != nil {
		s := d.block("arbiter.readiness", b.key("readiness"), v, readinessKeys)
		r := &a.Readiness
		s.number("probe_interval_seconds", "a number of seconds > 0", positive, &r.ProbeIntervalSeconds)
		s.integer("failure_threshold", "an integer ≥ 1", atLeast(1), &r.FailureThreshold)
		s.number("ready_budget_seconds", "a number of seconds > 0", positive, &r.ReadyBudgetSeconds)
	}
	if v := b.get("local"); v != nil {
		s := d.block("arbiter.local", b.key("local"), v, localKeys)
		l := &a.Local
		s.enum("capacity", capacities, &l.Capacity)
		s.number("price_per_hour", "a price in dollars per hour ≥ 0", nonNegative, &l.PricePerHour)
		s.str("region", &l.Region)
		s.str("zone", &l.Zone)
	}
	if v := b.get("sim"); v != nil {
		s := d.block("arbiter.sim", b.key("sim"), v, simKeys)
		m := &a.Sim
		s.str("cloud", &m.Cloud)
		s.str("spot_trace", &m.SpotTrace)
		s.number("speedup", "a number > 0 of trace seconds per wall-clock second, such as 60", positive, &m.Speedup)
		s.number("start_hours", "a number of hours ≥ 0 into the trace", nonNegative, &m.StartHours)
		s.str("prices_at", &m.PricesAt)
		if s != nil && s.has("prices_at") {
			if _, err := time.Parse(time.DateOnly, m.PricesAt); err != nil {
				d.errorf(s.get("prices_at"), "arbiter.sim.prices_at: want a date such as 2026-08-01, got %s", quote(m.PricesAt))
			}
		}
		s.number("notice_seconds", "a number of seconds ≥ 0 (0: the cloud's own notice)", nonNegative, &m.NoticeSeconds)
	}
}

// models reads "model: name" or "models: [a, b]".
func (d *decoder) models(b *block, a *Arbiter) {
	if b.has("model") && b.has("models") {
		d.errorf(b.key("models"), "arbiter: give model or models, not both")
		return
	}
	var items []*yaml.Node
	path := "arbiter.model"
	if v := b.get("model"); v != nil {
		items = []*yaml.Node{v}
	} else if v := b.get("models"); v != nil {
		path = "arbiter.models"
		if v.Kind != yaml.SequenceNode {
			d.errorf(v, "%s: want a list of model names, got %s", path, describe(v))
			return
		}
		items = v.Content
	}
	for _, it := range items {
		if isNull(it) {
			d.errorf(it, "%s: want a model name, got nothing", path)
			continue
		}
		name, ok := d.str(path, it)
		switch {
		case !ok:
		case strings.TrimSpace(name) == "":
			d.errorf(it, "%s: want a model name, got an empty string", path)
		case contains(a.Models, name):
			d.errorf(it, "%s: %s is listed twice", path, quote(name))
		default:
			a.Models = append(a.Models, name)
		}
	}
}

// tasks reads "tasks: [generate]", what the model serves, by vLLM's task names (a single
// name is taken as a list of one).
func (d *decoder) tasks(b *block, a *Arbiter) {
	n := b.get("tasks")
	if n == nil {
		return
	}
	items := []*yaml.Node{n}
	if n.Kind == yaml.SequenceNode {
		items = n.Content
	}
	if len(items) == 0 {
		d.errorf(n, "arbiter.tasks: want at least one of %s, or leave tasks out", strings.Join(fleet.TaskNames, ", "))
		return
	}
	for _, it := range items {
		name, ok := d.str("arbiter.tasks", it)
		switch {
		case !ok:
		case !contains(fleet.TaskNames, name):
			d.errorf(it, "arbiter.tasks: %s is not a task vLLM serves: want one of %s", quote(name), strings.Join(fleet.TaskNames, ", "))
		case contains(a.Tasks, name):
			d.errorf(it, "arbiter.tasks: %s is listed twice", quote(name))
		default:
			a.Tasks = append(a.Tasks, name)
		}
	}
}

// providers reads a list of provider names (a single name is taken as a list of one).
func (d *decoder) providers(path string, n *yaml.Node) []string {
	items := []*yaml.Node{n}
	if n.Kind == yaml.SequenceNode {
		items = n.Content
	}
	if len(items) == 0 {
		d.errorf(n, "%s: want at least one of %s", path, strings.Join(knownProviders, ", "))
		return []string{"local"}
	}
	var out []string
	for _, it := range items {
		p, ok := d.providerName(path, it)
		switch {
		case !ok:
		case contains(out, p):
			d.errorf(it, "%s: %s is listed twice", path, quote(p))
		default:
			out = append(out, p)
		}
	}
	return out
}

// providerName reads one provider: a known name, or kubernetes:<cluster> for one of the
// control plane's configured clusters (plain kubernetes means all of them).
func (d *decoder) providerName(path string, n *yaml.Node) (string, bool) {
	if s, ok := n.Value, n.Kind == yaml.ScalarNode; ok {
		if cluster, found := strings.CutPrefix(strings.TrimSpace(s), "kubernetes:"); found {
			if !clusterName.MatchString(cluster) {
				d.errorf(n, "%s: %s: after kubernetes: give a cluster name from the control plane's providers file (letters, digits, '-', '_', '.')", path, quote(s))
				return "", false
			}
			return "kubernetes:" + cluster, true
		}
	}
	return d.enum(path, n, knownProviders)
}

var clusterName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// IsKubernetes reports whether a provider name is kubernetes or kubernetes:<cluster>.
func IsKubernetes(provider string) bool {
	return provider == "kubernetes" || strings.HasPrefix(provider, "kubernetes:")
}

// reserved reads the list of capacity already paid for.
func (d *decoder) reserved(path string, n *yaml.Node) []ReservedCapacity {
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, "%s: want a list such as [{provider: aws, region: us-east-1, accelerator: \"H100:8\", price_per_hour: 55}], got %s", path, describe(n))
		return nil
	}
	var out []ReservedCapacity
	for i, e := range n.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		b := d.block(p, e, e, reservedKeys)
		if b == nil {
			continue
		}
		var rc ReservedCapacity
		if v := b.get("provider"); v != nil {
			rc.Provider, _ = d.providerName(p+".provider", v)
		} else {
			d.errorf(b.at, "%s: provider is required, one of %s", p, strings.Join(knownProviders, ", "))
		}
		b.str("region", &rc.Region)
		b.str("zone", &rc.Zone)
		acc := Accelerator{Count: 1}
		accNode := b.get("accelerator")
		if v := accNode; v != nil {
			if s, ok := d.str(p+".accelerator", v); ok {
				var err error
				if acc, err = parseAccelerator(s); err != nil {
					d.errorf(v, "%s.accelerator: %v", p, err)
				}
			}
		} else {
			d.errorf(b.at, "%s: accelerator is required, e.g. accelerator: \"H100:8\"", p)
		}
		rc.Accelerator, rc.Count = acc.Name, acc.Count
		if v := b.get("count"); v != nil {
			if c, ok := d.integer(p+".count", v, "an integer ≥ 1", atLeast(1)); ok {
				// "H100:8" already says how many; a second, different count is a mistake.
				if accNode != nil && strings.Contains(accNode.Value, ":") && c != acc.Count {
					d.errorf(v, "%s.count: %d disagrees with accelerator %s; give the count once", p, c, quote(accNode.Value))
				}
				rc.Count = c
			}
		}
		b.number("price_per_hour", "a price in dollars per hour ≥ 0", nonNegative, &rc.PricePerHour)
		out = append(out, rc)
	}
	return out
}

// tenants reads arbiter.tenants: each tenant's band and share weight on this service, which
// outrank the routers' keys file for the service's requests.
func (d *decoder) tenants(path string, n *yaml.Node) []fleet.TenantBand {
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, "%s: want a list such as [{name: nightly, priority: sheddable}, {name: app, priority: critical, weight: 2}], got %s", path, describe(n))
		return nil
	}
	var out []fleet.TenantBand
	seen := map[string]bool{}
	for i, e := range n.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		b := d.block(p, e, e, tenantKeys)
		if b == nil {
			continue
		}
		var t fleet.TenantBand
		b.str("name", &t.Name)
		if err := fleet.CheckTenantName(t.Name); err != nil {
			d.errorf(b.at, "%s.name: %v", p, err)
			continue
		}
		if seen[t.Name] {
			d.errorf(b.at, "%s: tenant %s is listed twice", p, quote(t.Name))
			continue
		}
		seen[t.Name] = true
		b.enum("priority", fleet.TenantBands, &t.Priority)
		b.number("weight", fmt.Sprintf("a share weight greater than 0, up to %d", fleet.MaxTenantWeight), func(v float64) bool { return v > 0 && v <= fleet.MaxTenantWeight }, &t.Weight)
		if t.Priority == "" && t.Weight == 0 {
			d.errorf(b.at, "%s: tenant %s gives neither priority nor weight: give one, or leave the tenant out", p, quote(t.Name))
		}
		out = append(out, t)
	}
	return out
}
