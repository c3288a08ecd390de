package spec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// SkyServe's defaults, kept so that a SkyServe file behaves here as it did there.
const (
	defaultProbePath             = "/"
	defaultInitialDelaySeconds   = 1200
	defaultProbeTimeoutSeconds   = 15
	defaultUpscaleDelaySeconds   = 300
	defaultDownscaleDelaySeconds = 1200
	defaultLoadBalancingPolicy   = "least_load"
)

var (
	serviceKeys = []string{"readiness_probe", "replicas", "replica_policy", "load_balancing_policy", "ports", "tls"}
	tlsKeys     = []string{"keyfile", "certfile"}
	probeKeys   = []string{"path", "initial_delay_seconds", "timeout_seconds", "post_data", "headers"}
	policyKeys  = []string{
		"min_replicas", "max_replicas", "target_qps_per_replica", "upscale_delay_seconds",
		"downscale_delay_seconds", "num_overprovision", "base_ondemand_fallback_replicas",
		"dynamic_ondemand_fallback", "spot_placer",
	}
	lbPolicies  = []string{"round_robin", "least_load", "instance_aware_least_load"}
	spotPlacers = []string{"dynamic_fallback"}
)

func defaultServiceSection() ServiceSection {
	return ServiceSection{
		ReadinessProbe: ReadinessProbe{
			Path:                defaultProbePath,
			InitialDelaySeconds: defaultInitialDelaySeconds,
			TimeoutSeconds:      defaultProbeTimeoutSeconds,
		},
		ReplicaPolicy: ReplicaPolicy{
			MinReplicas:           1,
			MaxReplicas:           1,
			UpscaleDelaySeconds:   defaultUpscaleDelaySeconds,
			DownscaleDelaySeconds: defaultDownscaleDelaySeconds,
		},
		Fixed:               true,
		LoadBalancingPolicy: defaultLoadBalancingPolicy,
	}
}

func (d *decoder) serviceSection(n, at *yaml.Node, vars map[string]string) ServiceSection {
	s := defaultServiceSection()
	b := d.block("service", at, n, serviceKeys)
	if b == nil {
		return s
	}
	if p := b.get("readiness_probe"); p != nil {
		s.ReadinessProbe = d.probe(p, b.key("readiness_probe"), vars)
	}
	if b.has("replicas") && b.has("replica_policy") {
		d.errorf(b.key("replica_policy"), "service: give replicas (a fixed size) or replica_policy (autoscaling), not both")
		var ignored ReplicaPolicy // still read, to report its own mistakes in the same run
		d.replicaPolicy(b.get("replica_policy"), b.key("replica_policy"), &ignored)
	}
	switch {
	case b.has("replicas"):
		n := s.ReplicaPolicy.MinReplicas
		b.integer("replicas", replicaCountWant, replicaCount, &n)
		s.ReplicaPolicy.MinReplicas, s.ReplicaPolicy.MaxReplicas = n, n
	case b.has("replica_policy"):
		s.Fixed = false
		d.replicaPolicy(b.get("replica_policy"), b.key("replica_policy"), &s.ReplicaPolicy)
	}
	b.enum("load_balancing_policy", lbPolicies, &s.LoadBalancingPolicy)
	b.integer("ports", "a port number from 1 to 65535", validPort, &s.Port)
	if n := b.get("tls"); n != nil {
		s.TLS = d.tls(n, b.key("tls"))
	}
	return s
}

// tls reads SkyServe's service.tls: the endpoint serves HTTPS with this key and
// certificate. Both are required; the files are checked where they are read (serve up,
// the router), since the file may be validated on another machine.
func (d *decoder) tls(n, at *yaml.Node) *TLS {
	const path = "service.tls"
	b := d.block(path, at, n, tlsKeys)
	if b == nil {
		return nil
	}
	t := &TLS{}
	b.str("keyfile", &t.KeyFile)
	b.str("certfile", &t.CertFile)
	for _, k := range []struct {
		key, val string
	}{{"keyfile", t.KeyFile}, {"certfile", t.CertFile}} {
		if strings.TrimSpace(k.val) == "" && !d.failed(path+"."+k.key) {
			at := b.get(k.key)
			if at == nil {
				at = b.at
			}
			d.errorf(at, "%s.%s: missing; give the path of the PEM %s, e.g. tls: {keyfile: ~/certs/key.pem, certfile: ~/certs/cert.pem}", path, k.key, map[string]string{"keyfile": "private key", "certfile": "certificate (chain)"}[k.key])
		}
	}
	return t
}

// MaxReplicas bounds any replica count a spec may ask for. Far above what one service
// runs, it catches the typo that would otherwise launch until the machine or the budget
// gives out; the daemon's own ceiling (serve daemon --max-replicas) and its providers'
// capacity are checked when the spec is submitted.
const MaxReplicas = 1000

var replicaCountWant = fmt.Sprintf("an integer from 0 to %d", MaxReplicas)

func replicaCount(v int) bool { return v >= 0 && v <= MaxReplicas }

func (d *decoder) replicaPolicy(n, at *yaml.Node, p *ReplicaPolicy) {
	const path = "service.replica_policy"
	b := d.block(path, at, n, policyKeys)
	if b == nil {
		return
	}
	if !b.has("min_replicas") {
		d.errorf(b.at, "%s: min_replicas is required, e.g. min_replicas: 1", path)
	}
	b.integer("min_replicas", replicaCountWant, replicaCount, &p.MinReplicas)
	p.MaxReplicas = p.MinReplicas
	b.integer("max_replicas", replicaCountWant, replicaCount, &p.MaxReplicas)
	if q := b.get("target_qps_per_replica"); q != nil {
		if q.Kind == yaml.MappingNode {
			p.TargetQPSByAccelerator = d.qpsByAccelerator(path+".target_qps_per_replica", q)
		} else {
			b.number("target_qps_per_replica", "a number > 0, or a mapping of accelerator to number", positive, &p.TargetQPSPerReplica)
		}
	}
	b.number("upscale_delay_seconds", "a number of seconds ≥ 0", nonNegative, &p.UpscaleDelaySeconds)
	b.number("downscale_delay_seconds", "a number of seconds ≥ 0", nonNegative, &p.DownscaleDelaySeconds)
	b.integer("num_overprovision", replicaCountWant, replicaCount, &p.NumOverprovision)
	b.integer("base_ondemand_fallback_replicas", replicaCountWant, replicaCount, &p.BaseOndemandFallbackReplicas)
	b.boolean("dynamic_ondemand_fallback", &p.DynamicOndemandFallback)
	b.enum("spot_placer", spotPlacers, &p.SpotPlacer)
}

// qpsByAccelerator reads the map form of target_qps_per_replica ({"A100:1": 5, L4: 2}).
func (d *decoder) qpsByAccelerator(path string, n *yaml.Node) map[string]float64 {
	ps, _ := d.pairs(path, n, "a mapping of accelerator to number")
	if len(ps) == 0 {
		d.errorf(n, "%s: want at least one accelerator, e.g. {A100: 5, L4: 2}", path)
		return nil
	}
	m := make(map[string]float64, len(ps))
	for _, p := range ps {
		if _, err := parseAccelerator(p.name); err != nil {
			d.errorf(p.key, "%s: %s: %v", path, quote(p.name), err)
			continue
		}
		if v, ok := d.number(path+"."+p.name, p.val, "a number > 0", positive); ok {
			m[strings.TrimSpace(p.name)] = v
		}
	}
	return m
}

// probe reads readiness_probe, either a bare path or a block.
func (d *decoder) probe(n, at *yaml.Node, vars map[string]string) ReadinessProbe {
	const path = "service.readiness_probe"
	p := defaultServiceSection().ReadinessProbe
	t := probeTemplate{path: p.Path}
	var pathNode *yaml.Node
	var body any
	hasBody := false
	switch n.Kind {
	case yaml.ScalarNode:
		pathNode = n
		d.str(path, n)
	case yaml.SequenceNode:
		d.errorf(n, "%s: want a path such as /health, or a mapping with path:, got a list", path)
		return p
	default:
		b := d.block(path, at, n, probeKeys)
		if b == nil {
			return p
		}
		if !b.has("path") {
			d.errorf(b.at, "%s: path is required in the block form, e.g. path: /health", path)
		}
		pathNode = b.get("path")
		b.number("initial_delay_seconds", "a number of seconds ≥ 0", nonNegative, &p.InitialDelaySeconds)
		b.number("timeout_seconds", "a number of seconds > 0", positive, &p.TimeoutSeconds)
		if h := b.get("headers"); h != nil {
			t.headers = d.headers(path+".headers", h)
		}
		if pd := b.get("post_data"); pd != nil {
			body, hasBody = d.postData(path+".post_data", pd)
		}
	}

	// SkyServe substitutes $VARS into the whole service section; here into the strings a
	// probe sends. The checks apply to the result, which is what goes on the wire.
	if pathNode != nil && pathNode.Kind == yaml.ScalarNode {
		t.path = pathNode.Value
		p.Path = substitute(t.path, vars)
		if !strings.HasPrefix(p.Path, "/") {
			d.errorf(pathNode, "%s: the path must start with /, e.g. /health; got %s", path, quote(p.Path))
		} else if strings.IndexFunc(p.Path, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0 {
			d.errorf(pathNode, "%s: the path must be a URL path without spaces or control characters; got %s", path, quote(p.Path))
		}
	}
	if t.headers != nil {
		p.Headers = make(map[string]string, len(t.headers))
		for k, v := range t.headers {
			p.Headers[k] = substitute(v, vars)
		}
	}
	if hasBody {
		t.postData = canonicalJSON(body)
		p.PostData = canonicalJSON(substituteJSON(body, vars))
	}
	if t.path != p.Path || t.postData != p.PostData || !maps.Equal(t.headers, p.Headers) {
		p.tmpl = &t
	}
	return p
}

// headerName is an HTTP token (RFC 9110), the characters a header name may hold.
var headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

func (d *decoder) headers(path string, n *yaml.Node) map[string]string {
	ps, _ := d.pairs(path, n, "a mapping of header names to values")
	m := make(map[string]string, len(ps))
	for _, p := range ps {
		sub := path + "." + clip(p.name)
		switch {
		case !headerName.MatchString(p.name):
			d.errorf(p.key, "%s: %s is not a valid HTTP header name", path, quote(p.name))
		case p.val.Kind != yaml.ScalarNode || isNull(p.val):
			d.errorf(p.val, "%s: want a string, got %s", sub, describe(p.val))
		case strings.ContainsAny(p.val.Value, "\r\n"):
			d.errorf(p.val, "%s: a header value cannot hold a line break", sub)
		default:
			if v, ok := d.str(sub, p.val); ok {
				m[p.name] = v
			}
		}
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

// postData reads the probe body: a mapping (SkyServe's usual form) or a string holding
// JSON. Both become a JSON value; JSON null means no body, as in SkyServe.
func (d *decoder) postData(path string, n *yaml.Node) (any, bool) {
	switch n.Kind {
	case yaml.MappingNode:
		v, ok := d.toJSON(path, n)
		return v, ok
	case yaml.ScalarNode:
		dec := json.NewDecoder(strings.NewReader(n.Value))
		dec.UseNumber() // keep numbers as written: 1e100 or 12345678901234567890 stay exact
		var v any
		if err := dec.Decode(&v); err != nil {
			d.errorf(n, "%s: want a mapping or a JSON string; this string is not JSON (%v)", path, err)
			return nil, false
		}
		if _, err := dec.Token(); err == nil {
			d.errorf(n, "%s: want a mapping or a JSON string; this string holds more than one JSON value", path)
			return nil, false
		}
		return v, v != nil
	default:
		d.errorf(n, "%s: want a mapping or a JSON string, got %s", path, describe(n))
		return nil, false
	}
}

// toJSON converts a YAML value to the value encoding/json would produce for it.
func (d *decoder) toJSON(path string, n *yaml.Node) (any, bool) {
	switch n.Kind {
	case yaml.MappingNode:
		ps, ok := d.pairs(path, n, "a mapping")
		m := make(map[string]any, len(ps))
		for _, p := range ps {
			v, vok := d.toJSON(path+"."+p.name, p.val)
			m[p.name] = v
			ok = ok && vok
		}
		return m, ok
	case yaml.SequenceNode:
		s := make([]any, len(n.Content))
		ok := true
		for i, c := range n.Content {
			var cok bool
			s[i], cok = d.toJSON(path+"["+strconv.Itoa(i)+"]", c)
			ok = ok && cok
		}
		return s, ok
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return nil, true
		case "!!bool":
			var b bool
			if n.Decode(&b) == nil {
				return b, true
			}
		case "!!int", "!!float":
			var f float64
			if n.Decode(&f) != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				d.errorf(n, "%s: %s is not a number JSON can hold", path, quote(n.Value))
				return nil, false
			}
			var i int64
			if n.ShortTag() == "!!int" && n.Decode(&i) == nil {
				return json.Number(strconv.FormatInt(i, 10)), true
			}
			return json.Number(strconv.FormatFloat(f, 'g', -1, 64)), true
		}
		return n.Value, true
	}
	d.errorf(n, "%s: want a JSON value, got %s", path, describe(n))
	return nil, false
}

// canonicalJSON renders a JSON value with sorted keys, so equal bodies compare equal and a
// re-parse reproduces the text exactly.
func canonicalJSON(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // the body goes to a replica, not into HTML
	if err := enc.Encode(v); err != nil {
		return "" // unreachable: v holds only what toJSON and json.Decoder produce
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// varRef is $NAME or ${NAME}, the references SkyServe substitutes.
var varRef = regexp.MustCompile(`\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))`)

// substitute replaces references to known variables, leaving unknown ones as written
// (a replica's shell may still define them), as SkyServe does.
func substitute(s string, vars map[string]string) string {
	if len(vars) == 0 || !strings.Contains(s, "$") {
		return s
	}
	return varRef.ReplaceAllStringFunc(s, func(ref string) string {
		if v, ok := vars[strings.Trim(ref[1:], "{}")]; ok {
			return v
		}
		return ref
	})
}

// substituteJSON substitutes inside string values only. SkyServe substitutes into the
// serialised text, which breaks the JSON when a value holds a quote; substituting values
// keeps every body valid, and leaving keys alone keeps distinct keys distinct.
func substituteJSON(v any, vars map[string]string) any {
	switch v := v.(type) {
	case string:
		return substitute(v, vars)
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[k] = substituteJSON(x, vars)
		}
		return m
	case []any:
		s := make([]any, len(v))
		for i, x := range v {
			s[i] = substituteJSON(x, vars)
		}
		return s
	}
	return v
}
