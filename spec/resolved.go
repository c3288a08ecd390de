package spec

import (
	"bytes"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// ResolvedYAML renders the service with every default written out, for `serve validate`:
// what the file means, not only what it says. Keys come in a fixed order and maps sorted,
// so equal services render to equal bytes, and parsing the output gives an equal Service.
func (s *Service) ResolvedYAML() ([]byte, error) {
	doc := mapping()
	if s.Name != "" {
		put(doc, "name", str(s.Name))
	}
	if s.Workdir != "" {
		put(doc, "workdir", str(s.Workdir))
	}
	if s.NumNodes > 1 {
		put(doc, "num_nodes", integer(s.NumNodes))
	}
	if len(s.Envs) > 0 {
		put(doc, "envs", stringMapNode(s.Envs, false))
	}
	if len(s.Secrets) > 0 {
		put(doc, "secrets", stringMapNode(s.Secrets, false))
	}
	if res := resourcesNode(s.Resources); len(res.Content) > 0 {
		put(doc, "resources", res)
	}
	if len(s.FileMounts) > 0 {
		fm := mapping()
		for _, m := range s.FileMounts {
			if m.Local() {
				put(fm, m.Path, str(m.Source))
				continue
			}
			b := mapping()
			b.Style = yaml.FlowStyle
			put(b, "source", str(m.Source))
			put(b, "mode", str(m.Mode))
			put(fm, m.Path, b)
		}
		put(doc, "file_mounts", fm)
	}
	if len(s.Volumes) > 0 {
		vm := mapping()
		for _, v := range s.Volumes {
			put(vm, v.Path, str(v.Name))
		}
		put(doc, "volumes", vm)
	}
	if c := s.Config; c.KubernetesLabels != nil || c.KubernetesAnnotations != nil {
		cm := mapping()
		if c.KubernetesLabels != nil {
			put(cm, "labels", stringMapNode(c.KubernetesLabels, true))
		}
		if c.KubernetesAnnotations != nil {
			put(cm, "annotations", stringMapNode(c.KubernetesAnnotations, true))
		}
		k := mapping()
		put(k, "custom_metadata", cm)
		conf := mapping()
		put(conf, "kubernetes", k)
		put(doc, "config", conf)
	}
	if s.Setup != "" {
		put(doc, "setup", str(s.Setup))
	}
	put(doc, "run", str(s.Run))
	put(doc, "service", serviceNode(&s.Service))
	put(doc, "arbiter", arbiterNode(&s.Arbiter))

	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func serviceNode(svc *ServiceSection) *yaml.Node {
	p := svc.ReadinessProbe
	path, postData, headers := p.Path, p.PostData, p.Headers
	if p.tmpl != nil { // as written, so that a re-parse substitutes $VARS once
		path, postData, headers = p.tmpl.path, p.tmpl.postData, p.tmpl.headers
	}
	probe := mapping()
	put(probe, "path", str(path))
	put(probe, "initial_delay_seconds", num(p.InitialDelaySeconds))
	put(probe, "timeout_seconds", num(p.TimeoutSeconds))
	if postData != "" {
		put(probe, "post_data", str(postData))
	}
	if len(headers) > 0 {
		put(probe, "headers", stringMapNode(headers, false))
	}

	m := mapping()
	put(m, "readiness_probe", probe)
	rp := svc.ReplicaPolicy
	if svc.Fixed {
		put(m, "replicas", integer(rp.MinReplicas))
	} else {
		pol := mapping()
		put(pol, "min_replicas", integer(rp.MinReplicas))
		put(pol, "max_replicas", integer(rp.MaxReplicas))
		switch {
		case rp.TargetQPSByAccelerator != nil:
			q := mapping()
			q.Style = yaml.FlowStyle
			for _, k := range sortedKeys(rp.TargetQPSByAccelerator) {
				put(q, k, num(rp.TargetQPSByAccelerator[k]))
			}
			put(pol, "target_qps_per_replica", q)
		case rp.TargetQPSPerReplica > 0:
			put(pol, "target_qps_per_replica", num(rp.TargetQPSPerReplica))
		}
		put(pol, "upscale_delay_seconds", num(rp.UpscaleDelaySeconds))
		put(pol, "downscale_delay_seconds", num(rp.DownscaleDelaySeconds))
		put(pol, "num_overprovision", integer(rp.NumOverprovision))
		if rp.BaseOndemandFallbackReplicas > 0 {
			put(pol, "base_ondemand_fallback_replicas", integer(rp.BaseOndemandFallbackReplicas))
		}
		if rp.DynamicOndemandFallback {
			put(pol, "dynamic_ondemand_fallback", boolean(true))
		}
		if rp.SpotPlacer != "" {
			put(pol, "spot_placer", str(rp.SpotPlacer))
		}
		put(m, "replica_policy", pol)
	}
	put(m, "load_balancing_policy", str(svc.LoadBalancingPolicy))
	if svc.Port != 0 {
		put(m, "ports", integer(svc.Port))
	}
	if svc.TLS != nil {
		t := mapping()
		put(t, "keyfile", str(svc.TLS.KeyFile))
		put(t, "certfile", str(svc.TLS.CertFile))
		put(m, "tls", t)
	}
	return m
}

// resourceField renders one resources key. node returns nil when the field is unset.
type resourceField struct {
	key  string
	get  func(r *Resources) any
	node func(r *Resources) *yaml.Node
}

// resourceFields lists the keys besides the location, which is rendered as one unit
// because infra and cloud/region/zone are two spellings of it.
var resourceFields = []resourceField{
	{"accelerators", func(r *Resources) any { return [2]any{r.Accelerators, r.AcceleratorsOrdered} }, acceleratorsNode},
	{"instance_type", func(r *Resources) any { return r.InstanceType }, func(r *Resources) *yaml.Node { return optStr(r.InstanceType) }},
	{"cpus", func(r *Resources) any { return r.CPUs }, func(r *Resources) *yaml.Node { return optStr(r.CPUs) }},
	{"memory", func(r *Resources) any { return r.Memory }, func(r *Resources) *yaml.Node { return optStr(r.Memory) }},
	{"use_spot", func(r *Resources) any { return r.UseSpot }, func(r *Resources) *yaml.Node {
		if !r.UseSpot {
			return nil
		}
		return boolean(true)
	}},
	{"disk_size", func(r *Resources) any { return r.DiskSize }, func(r *Resources) *yaml.Node {
		if r.DiskSize == 0 {
			return nil
		}
		return integer(r.DiskSize)
	}},
	{"disk_tier", func(r *Resources) any { return r.DiskTier }, func(r *Resources) *yaml.Node { return optStr(r.DiskTier) }},
	{"network_tier", func(r *Resources) any { return r.NetworkTier }, func(r *Resources) *yaml.Node { return optStr(r.NetworkTier) }},
	{"ports", func(r *Resources) any { return r.Ports }, func(r *Resources) *yaml.Node {
		if len(r.Ports) == 0 {
			return nil
		}
		return strList(r.Ports)
	}},
	{"labels", func(r *Resources) any { return r.Labels }, func(r *Resources) *yaml.Node {
		if len(r.Labels) == 0 {
			return nil
		}
		return stringMapNode(r.Labels, true)
	}},
	{"image_id", func(r *Resources) any { return r.ImageID }, func(r *Resources) *yaml.Node { return optStr(r.ImageID) }},
}

// location is the location keys r was written with.
func location(r *Resources) map[string]string {
	if r.Infra != "" {
		return map[string]string{"infra": r.Infra}
	}
	loc := map[string]string{}
	for k, v := range map[string]string{"cloud": r.Cloud, "region": r.Region, "zone": r.Zone} {
		if v != "" {
			loc[k] = v
		}
	}
	return loc
}

var locationOrder = []string{"infra", "cloud", "region", "zone"}

func resourcesNode(r Resources) *yaml.Node {
	m := mapping()
	loc := location(&r)
	for _, k := range locationOrder {
		if v, ok := loc[k]; ok {
			put(m, k, str(v))
		}
	}
	for _, f := range resourceFields {
		if n := f.node(&r); n != nil {
			put(m, f.key, n)
		}
	}
	for _, l := range []struct {
		key   string
		cands []Resources
	}{{"any_of", r.AnyOf}, {"ordered", r.Ordered}} {
		if l.cands == nil {
			continue
		}
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for i := range l.cands {
			seq.Content = append(seq.Content, candidateNode(&r, &l.cands[i]))
		}
		put(m, l.key, seq)
	}
	return m
}

// candidateNode renders a merged candidate as the entry that produces it over base: the
// keys where it differs, with null for a base value it clears.
func candidateNode(base, c *Resources) *yaml.Node {
	m := mapping()
	if bl, cl := location(base), location(c); !reflectEqual(bl, cl) {
		for _, k := range locationOrder {
			if v, ok := cl[k]; ok {
				put(m, k, str(v))
			} else if _, ok := bl[k]; ok {
				put(m, k, null())
			}
		}
	}
	for _, f := range resourceFields {
		if reflectEqual(f.get(base), f.get(c)) {
			continue
		}
		n := f.node(c)
		if n == nil {
			n = null()
		}
		put(m, f.key, n)
	}
	return m
}

func acceleratorsNode(r *Resources) *yaml.Node {
	spec := func(a Accelerator) string { return a.Name + ":" + strconv.Itoa(a.Count) }
	switch {
	case len(r.Accelerators) == 0:
		return nil
	case r.AcceleratorsOrdered:
		names := make([]string, len(r.Accelerators))
		for i, a := range r.Accelerators {
			names[i] = spec(a)
		}
		return strList(names)
	case len(r.Accelerators) == 1:
		return str(spec(r.Accelerators[0]))
	}
	m := mapping()
	m.Style = yaml.FlowStyle
	names := map[string]bool{}
	repeated := false
	for _, a := range r.Accelerators {
		repeated = repeated || names[strings.ToLower(a.Name)]
		names[strings.ToLower(a.Name)] = true
	}
	for _, a := range r.Accelerators { // in the order written: it is the order of preference to show
		if repeated {
			put(m, acceleratorKey(a), null())
		} else {
			put(m, a.Name, integer(a.Count))
		}
	}
	return m
}

func arbiterNode(a *Arbiter) *yaml.Node {
	m := mapping()
	if len(a.Models) > 0 {
		put(m, "models", strList(a.Models))
	}
	// The run: command's --lora-modules are read from it again; the declared ones are kept
	// as written, where the replicas read them being settled from the file again.
	var ads []*yaml.Node
	for _, ad := range a.Adapters {
		if ad.Static {
			continue
		}
		e := mapping()
		put(e, "name", str(ad.Name))
		put(e, "source", str(ad.Source))
		if ad.Parent != "" {
			put(e, "parent", str(ad.Parent))
		}
		if ad.Merged != "" {
			put(e, "merged", str(ad.Merged))
		}
		ads = append(ads, e)
	}
	if len(ads) > 0 {
		put(m, "adapters", &yaml.Node{Kind: yaml.SequenceNode, Content: ads})
	}
	put(m, "routing_policy", str(a.RoutingPolicy))
	if a.Queue.Enabled || a.Queue.EnginePriority {
		q := mapping()
		put(q, "enabled", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(a.Queue.Enabled)})
		put(q, "max_wait_seconds", num(a.Queue.MaxWaitSeconds))
		put(q, "sheddable_fill", num(a.Queue.SheddableFill))
		if a.Queue.EnginePriority {
			put(q, "engine_priority", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: "true"})
		}
		put(m, "queue", q)
	}
	if len(a.Tenants) > 0 {
		var ts []*yaml.Node
		for _, t := range a.Tenants {
			e := mapping()
			put(e, "name", str(t.Name))
			if t.Priority != "" {
				put(e, "priority", str(t.Priority))
			}
			if t.Weight > 0 {
				put(e, "weight", num(t.Weight))
			}
			ts = append(ts, e)
		}
		put(m, "tenants", &yaml.Node{Kind: yaml.SequenceNode, Content: ts})
	}
	if a.Profile != "" {
		put(m, "profile", str(a.Profile))
	}
	if len(a.Tasks) > 0 {
		put(m, "tasks", strList(a.Tasks))
	}

	slo := mapping()
	put(slo, "ttft_seconds", num(a.SLO.TTFTSeconds))
	put(slo, "tpot_seconds", num(a.SLO.TPOTSeconds))
	put(slo, "e2e_seconds", num(a.SLO.E2ESeconds))
	put(slo, "percentile", num(a.SLO.Percentile))
	put(m, "slo", slo)
	if w := a.Workload; w.PromptTokens > 0 {
		wl := mapping()
		put(wl, "prompt_tokens", integer(w.PromptTokens))
		put(wl, "output_tokens", integer(w.OutputTokens))
		put(m, "workload", wl)
	}

	sp := mapping()
	put(sp, "max_price_ratio", num(a.SpotPolicy.MaxPriceRatio))
	if a.SpotPolicy.RebalanceWhenItPays {
		put(sp, "rebalance_min_saving", str("auto"))
	} else {
		put(sp, "rebalance_min_saving", num(a.SpotPolicy.RebalanceMinSaving))
	}
	put(sp, "min_zones", num(float64(a.SpotPolicy.MinZones)))
	put(m, "spot_policy", sp)
	if a.Availability > 0 {
		put(m, "availability", num(a.Availability))
	}

	if len(a.Reserved) > 0 {
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, r := range a.Reserved {
			e := mapping()
			put(e, "provider", str(r.Provider))
			if r.Region != "" {
				put(e, "region", str(r.Region))
			}
			if r.Zone != "" {
				put(e, "zone", str(r.Zone))
			}
			put(e, "accelerator", str(r.Accelerator))
			put(e, "count", integer(r.Count))
			put(e, "price_per_hour", num(r.PricePerHour))
			seq.Content = append(seq.Content, e)
		}
		put(m, "reserved", seq)
	}
	put(m, "providers", strList(a.Providers))
	put(m, "scale_to_zero_after_seconds", num(a.ScaleToZeroAfterSeconds))

	as := mapping()
	put(as, "signal", str(a.Autoscaling.Signal))
	put(as, "target_concurrency_per_replica", num(a.Autoscaling.TargetConcurrencyPerReplica))
	if a.Autoscaling.TargetTokensPerSecondPerReplica > 0 {
		put(as, "target_tokens_per_second_per_replica", num(a.Autoscaling.TargetTokensPerSecondPerReplica))
	}
	put(as, "stable_window_seconds", num(a.Autoscaling.StableWindowSeconds))
	put(as, "panic_window_seconds", num(a.Autoscaling.PanicWindowSeconds))
	put(as, "panic_threshold", num(a.Autoscaling.PanicThreshold))
	put(as, "max_scale_up_rate", num(a.Autoscaling.MaxScaleUpRate))
	put(as, "decision_interval_seconds", num(a.Autoscaling.DecisionIntervalSeconds))
	put(m, "autoscaling", as)

	rd := mapping()
	put(rd, "probe_interval_seconds", num(a.Readiness.ProbeIntervalSeconds))
	put(rd, "failure_threshold", integer(a.Readiness.FailureThreshold))
	put(rd, "ready_budget_seconds", num(a.Readiness.ReadyBudgetSeconds))
	put(m, "readiness", rd)

	l := mapping()
	put(l, "capacity", str(a.Local.Capacity))
	put(l, "price_per_hour", num(a.Local.PricePerHour))
	put(l, "region", str(a.Local.Region))
	put(l, "zone", str(a.Local.Zone))
	put(m, "local", l)
	if slices.Contains(a.Providers, "sim") {
		sm := mapping()
		if a.Sim.Cloud != "" {
			put(sm, "cloud", str(a.Sim.Cloud))
		}
		put(sm, "spot_trace", str(a.Sim.SpotTrace))
		put(sm, "speedup", num(a.Sim.Speedup))
		put(sm, "start_hours", num(a.Sim.StartHours))
		put(sm, "prices_at", str(a.Sim.PricesAt))
		put(sm, "notice_seconds", num(a.Sim.NoticeSeconds))
		put(m, "sim", sm)
	}
	return m
}

// Node builders. Scalars carry their tag so that the encoder quotes strings that would
// otherwise read back as numbers or booleans ("8000", "true").

func mapping() *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"} }

// put appends key: v. Keys never take the literal style, which YAML does not allow there.
func put(m *yaml.Node, key string, v *yaml.Node) {
	k := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}
	if strings.ContainsFunc(key, func(r rune) bool { return r < ' ' || r > '~' }) {
		k.Style = yaml.DoubleQuotedStyle // left to itself the encoder may pick a block style
	}
	m.Content = append(m.Content, k, v)
}

func str(s string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
	if strings.Contains(s, "\n") {
		// Scripts stay readable as literal blocks, but yaml.v3 writes some strings in that
		// style that do not read back (a lone "\n" becomes ""), so keep the block only when
		// it survives its own round trip, and quote otherwise.
		n.Style = yaml.DoubleQuotedStyle
		if literalReadsBack(s) {
			n.Style = yaml.LiteralStyle
		}
	}
	return n
}

func literalReadsBack(s string) bool {
	out, err := yaml.Marshal(&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s, Style: yaml.LiteralStyle})
	var back string
	return err == nil && yaml.Unmarshal(out, &back) == nil && back == s
}

func optStr(s string) *yaml.Node {
	if s == "" {
		return nil
	}
	return str(s)
}

func integer(i int) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(i)}
}

// num writes a float in the shortest form that reads back exactly; whole numbers without a
// fraction (300, not 300.0), as a person would write them.
func num(f float64) *yaml.Node {
	var v string
	if a := math.Abs(f); a == 0 || (a >= 1e-4 && a < 1e15) {
		v = strconv.FormatFloat(f, 'f', -1, 64)
	} else {
		v = strconv.FormatFloat(f, 'g', -1, 64)
	}
	tag := "!!int"
	if strings.ContainsAny(v, ".eE") {
		tag = "!!float"
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: v}
}

func boolean(b bool) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(b)}
}

func null() *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"} }

func strList(items []string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Style: yaml.FlowStyle}
	for _, s := range items {
		n.Content = append(n.Content, str(s))
	}
	if slices.ContainsFunc(items, func(s string) bool { return strings.Contains(s, "\n") }) {
		n.Style = 0 // a literal block cannot sit inside a flow list
	}
	return n
}

func stringMapNode(m map[string]string, flow bool) *yaml.Node {
	n := mapping()
	if flow {
		n.Style = yaml.FlowStyle
	}
	for _, k := range sortedKeys(m) {
		put(n, k, str(m[k]))
		if strings.Contains(m[k], "\n") {
			n.Style = 0
		}
	}
	return n
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func reflectEqual(a, b any) bool { return reflect.DeepEqual(a, b) }
