package spec

import (
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

var (
	resourceKeys = []string{
		"infra", "cloud", "region", "zone", "accelerators", "accelerator_args", "instance_type",
		"cpus", "memory", "use_spot", "disk_size", "disk_tier", "network_tier", "ports",
		"labels", "image_id", "any_of", "ordered", "job_recovery", "spot_recovery",
	}
	// mergeKeys are the keys an any_of or ordered entry overrides, in the order merge
	// applies them (any order gives the same result: each key sets its own fields).
	mergeKeys = []string{
		"infra", "cloud", "region", "zone", "accelerators", "instance_type", "cpus", "memory",
		"use_spot", "disk_size", "disk_tier", "network_tier", "ports", "labels", "image_id",
	}
	locationKeys = []string{"cloud", "region", "zone"}
	diskTiers    = []string{"low", "medium", "high", "ultra", "best"}
	networkTiers = []string{"standard", "best"}
)

// written is one resources mapping as written, with the block it came from: any_of and
// ordered entries override the base key by key, so which keys each gave matters.
type written struct {
	r Resources
	b *block
}

// resources reads the resources: section and expands any_of or ordered into candidates.
func (d *decoder) resources(n, at *yaml.Node) Resources {
	const path = "resources"
	base := d.resourceBlock(path, at, n, false)
	b := base.b
	if b == nil {
		return Resources{}
	}
	r := base.r.clone()
	finishLocation(&r)

	anyOf, ordered := b.get("any_of"), b.get("ordered")
	if anyOf != nil && ordered != nil {
		d.errorf(b.key("ordered"), "resources: give any_of or ordered, not both")
	}
	listKey, list := "any_of", anyOf
	if list == nil {
		listKey, list = "ordered", ordered
	}
	if list == nil {
		return r
	}
	// SkyPilot's rule: several accelerators already make a set of candidates; crossing a
	// preference list with more candidates has no single meaning.
	if len(r.Accelerators) > 1 && (r.AcceleratorsOrdered || listKey == "ordered") {
		d.errorf(b.get("accelerators"), "resources.accelerators: several accelerators cannot be combined with %s; give each its own %s entry", listKey, listKey)
	}
	cands := d.candidates(path+"."+listKey, list, base)
	if listKey == "any_of" {
		r.AnyOf = cands
	} else {
		r.Ordered = cands
	}
	return r
}

// candidates reads the entries of any_of or ordered, each merged over the base keys.
func (d *decoder) candidates(path string, list *yaml.Node, base written) []Resources {
	if list.Kind != yaml.SequenceNode {
		d.errorf(list, "%s: want a list of resource mappings, got %s", path, describe(list))
		return nil
	}
	if len(list.Content) == 0 {
		d.errorf(list, "%s: want at least one entry", path)
		return nil
	}
	out := make([]Resources, 0, len(list.Content))
	var entries []written
	for i, e := range list.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		if e.Kind != yaml.MappingNode {
			d.errorf(e, "%s: want a mapping of resource keys, got %s", p, describe(e))
			continue
		}
		w := d.resourceBlock(p, e, e, true)
		if w.b == nil {
			continue
		}
		d.checkMergedLocation(p, base, w)
		out = append(out, merge(base, w))
		entries = append(entries, w)
	}
	// SkyServe splits replicas into spot and on-demand by one flag for the whole service.
	for i := 1; i < len(out); i++ {
		if out[i].UseSpot != out[0].UseSpot {
			at := entries[i].b.key("use_spot")
			if at == nil {
				at = entries[i].b.at
			}
			d.errorf(at, "%s: every candidate must agree on use_spot (a service is all spot or all on-demand); set use_spot once, outside %s", path, path[strings.LastIndexByte(path, '.')+1:])
			break
		}
	}
	return out
}

// checkMergedLocation reports infra meeting cloud/region/zone across the base and an entry;
// within one mapping resourceBlock already reported it.
func (d *decoder) checkMergedLocation(path string, base, entry written) {
	from := func(k string) *block { // the mapping that gives key k after the merge
		if entry.b.present(k) {
			if entry.b.has(k) {
				return entry.b
			}
			return nil
		}
		if base.b.has(k) {
			return base.b
		}
		return nil
	}
	infra := from("infra")
	if infra == nil {
		return
	}
	for _, k := range locationKeys {
		if other := from(k); other != nil && other != infra {
			at, what := entry.b.key(k), k
			if infra == entry.b {
				at, what = entry.b.key("infra"), "infra"
			}
			d.errorf(at, "%s.%s: the base resources give the location the other way (infra vs cloud/region/zone); use one form, or clear the other here with null", path, what)
			return
		}
	}
}

// resourceBlock reads one resources mapping: the base, or an any_of/ordered entry.
func (d *decoder) resourceBlock(path string, at, n *yaml.Node, entry bool) written {
	b := d.block(path, at, n, resourceKeys)
	w := written{b: b}
	if b == nil {
		return w
	}
	r := &w.r
	if v := b.get("infra"); v != nil {
		if s, ok := d.str(path+".infra", v); ok {
			if _, _, _, err := splitInfra(s); err != nil {
				d.errorf(v, "%s.infra: %v", path, err)
			} else {
				r.Infra = strings.TrimSpace(s)
			}
		}
		for _, k := range locationKeys {
			if b.has(k) {
				d.errorf(b.key(k), "%s: give infra or %s, not both; e.g. infra: gcp/us-east1/us-east1-b", path, k)
			}
		}
	}
	if v := b.get("cloud"); v != nil {
		if s, ok := d.str(path+".cloud", v); ok {
			if c, err := cloudName(s); err != nil {
				d.errorf(v, "%s.cloud: %v", path, err)
			} else {
				r.Cloud = c
			}
		}
	}
	b.str("region", &r.Region)
	b.str("zone", &r.Zone)
	if v := b.get("accelerators"); v != nil {
		r.Accelerators, r.AcceleratorsOrdered = d.accelerators(path+".accelerators", v)
	}
	b.str("instance_type", &r.InstanceType)
	if v := b.get("cpus"); v != nil {
		r.CPUs = d.quantity(path+".cpus", v, cpusForm, "a number of CPUs such as 4, or 4+ for at least 4")
	}
	if v := b.get("memory"); v != nil {
		r.Memory = d.quantity(path+".memory", v, memoryForm, "a size in GB such as 32, 32+ or 32GB+")
	}
	b.boolean("use_spot", &r.UseSpot)
	if v := b.get("disk_size"); v != nil {
		r.DiskSize = d.diskSize(path+".disk_size", v)
	}
	b.enum("disk_tier", diskTiers, &r.DiskTier)
	b.enum("network_tier", networkTiers, &r.NetworkTier)
	if v := b.get("ports"); v != nil {
		r.Ports = d.ports(path+".ports", v)
	}
	if v := b.get("labels"); v != nil {
		r.Labels = d.stringMap(path+".labels", v)
	}
	if v := b.get("image_id"); v != nil {
		if v.Kind == yaml.MappingNode {
			d.errorf(v, "%s.image_id: a per-region mapping of images is not supported; give one image", path)
		} else {
			b.str("image_id", &r.ImageID)
		}
	}
	if v := b.get("accelerator_args"); v != nil && v.Kind != yaml.MappingNode {
		// Carried for SkyPilot compatibility (TPU runtime versions); no provider here uses it.
		d.errorf(v, "%s.accelerator_args: want a mapping, got %s", path, describe(v))
	}
	for _, k := range []string{"job_recovery", "spot_recovery"} {
		if b.present(k) {
			d.errorf(b.key(k), "%s.%s: remove it: job_recovery is for managed jobs; a service replaces failed replicas itself", path, k)
		}
	}
	if entry {
		for _, k := range []string{"any_of", "ordered"} {
			if b.present(k) {
				d.errorf(b.key(k), "%s.%s: any_of and ordered cannot be nested inside an entry", path, k)
			}
		}
	}
	return w
}

// merge applies an entry over the base, key by key, as SkyPilot does with a dict update:
// a key the entry gives (null included) replaces the base's.
func merge(base, entry written) Resources {
	r, e := base.r.clone(), entry.r.clone()
	for _, k := range mergeKeys {
		if !entry.b.present(k) {
			continue
		}
		switch k {
		case "infra":
			r.Infra = e.Infra
		case "cloud":
			r.Cloud = e.Cloud
		case "region":
			r.Region = e.Region
		case "zone":
			r.Zone = e.Zone
		case "accelerators":
			r.Accelerators, r.AcceleratorsOrdered = e.Accelerators, e.AcceleratorsOrdered
		case "instance_type":
			r.InstanceType = e.InstanceType
		case "cpus":
			r.CPUs = e.CPUs
		case "memory":
			r.Memory = e.Memory
		case "use_spot":
			r.UseSpot = e.UseSpot
		case "disk_size":
			r.DiskSize = e.DiskSize
		case "disk_tier":
			r.DiskTier = e.DiskTier
		case "network_tier":
			r.NetworkTier = e.NetworkTier
		case "ports":
			r.Ports = e.Ports
		case "labels":
			r.Labels = e.Labels
		case "image_id":
			r.ImageID = e.ImageID
		}
	}
	finishLocation(&r)
	return r
}

// clone copies r without its candidates, so that candidates share no slices or maps.
func (r Resources) clone() Resources {
	r.Accelerators = slices.Clone(r.Accelerators)
	r.Ports = slices.Clone(r.Ports)
	r.Labels = maps.Clone(r.Labels)
	r.AnyOf, r.Ordered = nil, nil
	return r
}

// finishLocation fills Cloud, Region and Zone from Infra.
func finishLocation(r *Resources) {
	if r.Infra == "" {
		return
	}
	if c, rg, z, err := splitInfra(r.Infra); err == nil {
		r.Cloud, r.Region, r.Zone = c, rg, z
	}
}

var cloudRE = regexp.MustCompile(`^[a-z][a-z0-9_-]*$`)

func cloudName(s string) (string, error) {
	c := strings.ToLower(strings.TrimSpace(s))
	if c == "k8s" {
		c = "kubernetes"
	}
	if !cloudRE.MatchString(c) {
		return "", fmt.Errorf("want a cloud name such as aws, gcp or kubernetes, got %s", quote(s))
	}
	return c, nil
}

// splitInfra splits SkyPilot's infra shorthand: cloud[/region[/zone]], with * for any
// part, or k8s/<context> and ssh/<pool> whose rest is one name that may hold slashes.
func splitInfra(s string) (cloud, region, zone string, err error) {
	s = strings.TrimSpace(s)
	const form = "want cloud[/region[/zone]] such as aws, gcp/us-east1 or k8s/my-context"
	head, rest, more := strings.Cut(s, "/")
	if head != "*" {
		if cloud, err = cloudName(head); err != nil {
			return "", "", "", fmt.Errorf("%s, got %s", form, quote(s))
		}
	}
	anyPart := func(p string) string {
		if p == "*" {
			return ""
		}
		return p
	}
	if !more {
		return cloud, "", "", nil
	}
	if cloud == "kubernetes" || cloud == "ssh" {
		if strings.TrimSpace(rest) == "" {
			return "", "", "", fmt.Errorf("%s, got %s", form, quote(s))
		}
		return cloud, anyPart(rest), "", nil
	}
	parts := strings.Split(rest, "/")
	if len(parts) > 2 || slices.ContainsFunc(parts, func(p string) bool { return strings.TrimSpace(p) == "" }) {
		return "", "", "", fmt.Errorf("%s, got %s", form, quote(s))
	}
	region = anyPart(parts[0])
	if len(parts) == 2 {
		zone = anyPart(parts[1])
	}
	return cloud, region, zone, nil
}

// accName is an accelerator name as SkyPilot's catalogs spell them (A100-80GB, tpu-v5e-8).
var accName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.\-]*$`)

// maxAcceleratorCount bounds counts so that arithmetic on them cannot overflow.
const maxAcceleratorCount = 1 << 16

// parseAccelerator reads "NAME" or "NAME:COUNT".
func parseAccelerator(s string) (Accelerator, error) {
	name, count, hasCount := strings.Cut(strings.TrimSpace(s), ":")
	name = strings.TrimSpace(name)
	if err := checkAcceleratorName(name); err != nil {
		return Accelerator{}, err
	}
	a := Accelerator{Name: name, Count: 1}
	if hasCount {
		n, err := parseCount(strings.TrimSpace(count))
		if err != nil {
			return Accelerator{}, err
		}
		a.Count = n
	}
	return a, nil
}

func checkAcceleratorName(name string) error {
	if !accName.MatchString(name) || !strings.ContainsFunc(name, func(r rune) bool {
		return r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z'
	}) {
		return fmt.Errorf("want an accelerator such as A100, A100-80GB:8 or L4:1, got %s", quote(name))
	}
	return nil
}

func parseCount(s string) (int, error) {
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil || math.IsNaN(f) || f < 1:
		return 0, fmt.Errorf("want a whole number of accelerators ≥ 1, got %s", quote(s))
	case f != math.Trunc(f):
		return 0, fmt.Errorf("fractional accelerator counts (%s) are not supported; use a whole number", s)
	case f > maxAcceleratorCount:
		return 0, fmt.Errorf("%s accelerators per replica is more than any machine has", s)
	}
	return int(f), nil
}

// accelerators reads the three forms: "A100:1" (one), {L4: 1, A10G: 1} (any of them) and
// [A100, V100] (in order of preference).
func (d *decoder) accelerators(path string, n *yaml.Node) ([]Accelerator, bool) {
	var out []Accelerator
	// One GPU at several counts is several candidates, as in SkyPilot ({A100:4, A100:8}:
	// each name:count is its own choice); only the same name at the same count twice is
	// a mistake.
	add := func(at *yaml.Node, a Accelerator) {
		for _, x := range out {
			if strings.EqualFold(x.Name, a.Name) && x.Count == a.Count {
				d.errorf(at, "%s: %s is listed twice", path, quote(a.Name+":"+strconv.Itoa(a.Count)))
				return
			}
		}
		out = append(out, a)
		d.notePos(a.Name, at)
	}
	ordered := false
	switch n.Kind {
	case yaml.ScalarNode:
		if a, err := parseAccelerator(n.Value); err != nil {
			d.errorf(n, "%s: %v", path, err)
		} else {
			add(n, a)
		}
	case yaml.MappingNode:
		ps, _ := d.pairs(path, n, "a mapping")
		for _, p := range ps {
			if a, ok := d.acceleratorPair(path, p); ok {
				add(p.key, a)
			}
		}
	case yaml.SequenceNode:
		ordered = true
		for _, item := range n.Content {
			switch item.Kind {
			case yaml.ScalarNode:
				if a, err := parseAccelerator(item.Value); err != nil {
					d.errorf(item, "%s: %v", path, err)
				} else {
					add(item, a)
				}
			case yaml.MappingNode:
				ps, _ := d.pairs(path, item, "a mapping")
				if len(ps) != 1 {
					d.errorf(item, "%s: want one accelerator per list item, such as A100:8 or {A100: 8}", path)
					continue
				}
				if a, ok := d.acceleratorPair(path, ps[0]); ok {
					add(ps[0].key, a)
				}
			default:
				d.errorf(item, "%s: want an accelerator such as A100:8, got %s", path, describe(item))
			}
		}
	default:
		d.errorf(n, "%s: want an accelerator such as A100:8, a mapping {L4: 1, A10G: 1} or a list [A100, V100], got %s", path, describe(n))
	}
	if (n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode) && len(n.Content) == 0 {
		d.errorf(n, "%s: want at least one accelerator; to ask for none, leave accelerators out", path)
	}
	return out, ordered
}

// acceleratorPair reads NAME: COUNT. A null count is 1, so that the flow set {L4, A10G}
// reads as intended; and {L4:1, A10G:1}, which YAML reads as keys "L4:1" and "A10G:1"
// with null values (no space after the colon), reads as the user meant.
func (d *decoder) acceleratorPair(path string, p pair) (Accelerator, bool) {
	a, err := parseAccelerator(p.name)
	if err != nil {
		d.errorf(p.key, "%s: %v", path, err)
		return Accelerator{}, false
	}
	if isNull(p.val) {
		return a, true
	}
	if strings.Contains(p.name, ":") {
		d.errorf(p.val, "%s: %s already gives a count; write %s: %s or %s", path, quote(p.name), a.Name, p.val.Value, p.name)
		return Accelerator{}, false
	}
	if tag := p.val.ShortTag(); p.val.Kind != yaml.ScalarNode || (tag != "!!int" && tag != "!!float") {
		d.errorf(p.val, "%s.%s: want a whole number of accelerators ≥ 1, got %s", path, a.Name, describe(p.val))
		return Accelerator{}, false
	}
	n, err := parseCount(p.val.Value)
	if err != nil {
		d.errorf(p.val, "%s.%s: %v", path, a.Name, err)
		return Accelerator{}, false
	}
	a.Count = n
	return a, true
}

func validPort(p int) bool { return p >= 1 && p <= 65535 }

// ports reads 8080, "8080", "8080-8090" or a list of those, normalised to "8080" and
// "8080-8090".
func (d *decoder) ports(path string, n *yaml.Node) []string {
	items := []*yaml.Node{n}
	if n.Kind == yaml.SequenceNode {
		items = n.Content
		if len(items) == 0 {
			d.errorf(n, "%s: want at least one port; to open none, leave ports out", path)
			return nil
		}
	}
	const want = `a port (8080), a range ("8080-8090") or a list of those`
	var out []string
	for _, it := range items {
		if it.Kind != yaml.ScalarNode || isNull(it) {
			d.errorf(it, "%s: want %s, got %s", path, want, describe(it))
			continue
		}
		lo, hi, err := portRange(it.Value)
		if err != nil {
			d.errorf(it, "%s: want %s from 1 to 65535, got %s", path, want, describe(it))
			continue
		}
		if lo == hi {
			out = append(out, strconv.Itoa(lo))
		} else {
			out = append(out, strconv.Itoa(lo)+"-"+strconv.Itoa(hi))
		}
	}
	return out
}

func portRange(s string) (lo, hi int, err error) {
	a, b, isRange := strings.Cut(strings.TrimSpace(s), "-")
	if lo, err = strconv.Atoi(strings.TrimSpace(a)); err != nil {
		return 0, 0, err
	}
	hi = lo
	if isRange {
		if hi, err = strconv.Atoi(strings.TrimSpace(b)); err != nil {
			return 0, 0, err
		}
	}
	if !validPort(lo) || !validPort(hi) || lo > hi {
		return 0, 0, fmt.Errorf("out of range")
	}
	return lo, hi, nil
}

// singlePort is the one port in ports, if there is exactly one.
func singlePort(ports []string) (int, bool) {
	if len(ports) != 1 {
		return 0, false
	}
	lo, hi, err := portRange(ports[0])
	return lo, err == nil && lo == hi
}

var (
	cpusForm   = regexp.MustCompile(`^(\d+(\.\d*)?|\.\d+)\+?$`)
	memoryForm = regexp.MustCompile(`(?i)^(\d+(\.\d*)?|\.\d+)\s*([kmgtp]i?b?|b)?\+?$`)
	diskForm   = regexp.MustCompile(`(?i)^(\d+)\s*(gb|tb)?$`)
)

// quantity reads cpus or memory, kept as text: "4+" (at least 4) has no number form.
func (d *decoder) quantity(path string, n *yaml.Node, form *regexp.Regexp, want string) string {
	s := strings.TrimSpace(n.Value)
	// A digit other than 0 somewhere means the amount is positive.
	if n.Kind != yaml.ScalarNode || !form.MatchString(s) || !strings.ContainsAny(s, "123456789") {
		d.errorf(n, "%s: want %s, got %s", path, want, describe(n))
		return ""
	}
	return s
}

// diskSize reads GB as a number, or "256GB" / "1TB" as newer SkyPilot files write it.
func (d *decoder) diskSize(path string, n *yaml.Node) int {
	const want = "a disk size in GB such as 256 or \"1TB\""
	m := diskForm.FindStringSubmatch(strings.TrimSpace(n.Value))
	if n.Kind != yaml.ScalarNode || m == nil {
		d.errorf(n, "%s: want %s, got %s", path, want, describe(n))
		return 0
	}
	gb, err := strconv.Atoi(m[1])
	if strings.EqualFold(m[2], "tb") {
		gb *= 1024
	}
	if err != nil || gb < 1 || gb > 1<<24 {
		d.errorf(n, "%s: want %s, got %s", path, want, describe(n))
		return 0
	}
	return gb
}
