package spec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// maxFileSize bounds the input. A service.yaml is a few KiB; a file near this size is a
// mistake (a weights file passed by accident), and yaml.v3's cost grows with its input
// (about 150 ms for 256 KiB of tiny flow-list items, the worst shape we found).
const maxFileSize = 256 << 10

// decoder walks a yaml.Node tree by hand rather than through struct tags, so that every
// problem is reported at the exact key or value, and so that decoding goes on after the
// first problem and reports all of them.
type decoder struct {
	file string
	errs ErrorList
	// deferMissing and missing: null envs and secrets accepted, and which (Overrides.DeferMissing).
	deferMissing bool
	missing      []string
	// keys and vals index every key given in the file by dotted path ("service.replicas"),
	// so that rules spanning sections can blame the right place and can tell an explicit
	// value from a default.
	keys map[string]*yaml.Node
	vals map[string]*yaml.Node
	// accPos is where each accelerator name (lower-cased) is written (Service.accPos).
	accPos map[string][]Pos
	// mountAt and volumeAt are where each entry of Service.FileMounts and Volumes is
	// written; configAt where each config key is; warns the warnings (Service.Warnings).
	mountAt, volumeAt []*yaml.Node
	// adapterAt is where each arbiter.adapters entry is written.
	adapterAt []*yaml.Node
	configAt  map[string]*yaml.Node
	warns     ErrorList
}

func newDecoder(file string) *decoder {
	return &decoder{file: file, keys: map[string]*yaml.Node{}, vals: map[string]*yaml.Node{}, accPos: map[string][]Pos{}, configAt: map[string]*yaml.Node{}}
}

// given reports whether the file sets path to a non-null value.
func (d *decoder) given(path string) bool {
	n, ok := d.vals[path]
	return ok && !isNull(n)
}

// document parses data into its single top-level mapping, or records why it cannot.
func (d *decoder) document(data []byte) *yaml.Node {
	if len(data) > maxFileSize {
		d.errorf(nil, "file is over %d bytes; a service.yaml is a few KiB, so this is likely the wrong file", maxFileSize)
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := decodeSafely(dec, &doc); {
	case errors.Is(err, io.EOF):
		d.errorf(nil, "file is empty; a service needs at least run: and service:")
		return nil
	case err != nil:
		d.yamlError(err)
		return nil
	}
	var extra yaml.Node
	switch err := decodeSafely(dec, &extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		d.yamlError(err)
		return nil
	default:
		d.errorf(&extra, "a second YAML document (after ---); a service.yaml holds one, so remove the ---")
		return nil
	}
	// Aliases are refused before anything reads the tree: expanding them is how a small
	// file becomes a huge one ("billion laughs"), and no SkyServe file needs them.
	if a := findAlias(&doc); a != nil {
		d.errorf(a, "anchors and aliases (*%s) are not supported; write the value out", clip(a.Value))
		return nil
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			d.errorf(nil, "file is empty; a service needs at least run: and service:")
			return nil
		}
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		if isNull(root) {
			d.errorf(root, "the document is empty; a service needs at least run: and service:")
		} else {
			d.errorf(root, "want a mapping of keys such as service:, resources: and run:, got %s", describe(root))
		}
		return nil
	}
	return root
}

// decodeSafely turns a panic inside yaml.v3 into an error: Parse must never panic on any
// input, and the parser is third-party code we cannot fix in place.
func decodeSafely(dec *yaml.Decoder, n *yaml.Node) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml: cannot parse this file (%v)", r)
		}
	}()
	return dec.Decode(n)
}

// yamlLine matches yaml.v3's "yaml: line N: msg" so the line moves into the position.
var yamlLine = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

// parserProblems are the messages of yaml.v3's parser, as opposed to its scanner. For these
// yaml.v3 prints the 0-based line (and no line at all for the first), so one is added.
var parserProblems = []string{
	"did not find expected <stream-start>", "did not find expected <document start>",
	"did not find expected node content", "did not find expected '-' indicator",
	"did not find expected key", "did not find expected ',' or ']'",
	"did not find expected ',' or '}'", "found duplicate %YAML directive",
	"found incompatible YAML document", "found duplicate %TAG directive",
	"found undefined tag handle",
}

func (d *decoder) yamlError(err error) {
	e := &Error{File: d.file, Msg: "invalid YAML: " + err.Error()}
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		e.Msg = "invalid YAML: " + m[2]
		if slices.Contains(parserProblems, m[2]) {
			e.Line++
		}
	}
	d.errs = append(d.errs, e)
}

// findAlias returns the first alias node in the tree, walking with an explicit stack so that
// deeply nested input cannot exhaust the goroutine stack.
func findAlias(root *yaml.Node) *yaml.Node {
	stack := []*yaml.Node{root}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if n.Kind == yaml.AliasNode {
			return n
		}
		for i := len(n.Content) - 1; i >= 0; i-- {
			stack = append(stack, n.Content[i])
		}
	}
	return nil
}

func isNull(n *yaml.Node) bool {
	return n != nil && n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// join builds the dotted path used in messages.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// where names a block in an "unknown key" message.
func where(path string) string {
	if path == "" {
		return "at the top level"
	}
	return "in " + path
}

// pair is one key and its value in a mapping, key text already checked.
type pair struct {
	name     string
	key, val *yaml.Node
}

// pairs returns the entries of a mapping node, reporting keys that are not plain names and
// keys given twice (yaml.v3 leaves both to the caller when decoding into a Node).
func (d *decoder) pairs(path string, n *yaml.Node, want string) ([]pair, bool) {
	if n.Kind != yaml.MappingNode {
		d.errorf(n, "%s: want %s, got %s", path, want, describe(n))
		return nil, false
	}
	out := make([]pair, 0, len(n.Content)/2)
	first := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || isNull(k) {
			d.errorf(k, "%s: want a key name here, got %s", path, describe(k))
			continue
		}
		if f, dup := first[k.Value]; dup {
			d.errorf(k, "%s: %q is given twice (first at line %d); keep one", path, k.Value, f.Line)
			continue
		}
		first[k.Value] = k
		out = append(out, pair{k.Value, k, v})
	}
	return out, true
}

// block is one mapping of known keys being decoded.
type block struct {
	d    *decoder
	path string     // dotted path of the block; "" at the top level
	at   *yaml.Node // where to report a missing key: the block's own key, or the mapping
	vals map[string]*yaml.Node
	keys map[string]*yaml.Node
}

// block checks that n is a mapping holding only allowed keys. It returns nil (which every
// block method accepts) when n is not a mapping, so callers need no special case.
func (d *decoder) block(path string, at, n *yaml.Node, allowed []string) *block {
	ps, ok := d.pairs(path, n, "a mapping of "+strings.Join(allowed, ", "))
	if !ok {
		return nil
	}
	if at == nil {
		at = n
	}
	b := &block{d: d, path: path, at: at, vals: map[string]*yaml.Node{}, keys: map[string]*yaml.Node{}}
	for _, p := range ps {
		if !contains(allowed, p.name) {
			d.errorf(p.key, "unknown key %q %s; %s", clip(p.name), where(path), hint(p.name, allowed))
			continue
		}
		b.vals[p.name], b.keys[p.name] = p.val, p.key
		d.vals[join(path, p.name)], d.keys[join(path, p.name)] = p.val, p.key
	}
	return b
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// get returns the value of key, or nil when it is absent or null: YAML users write
// "setup:" with nothing after it to mean "none".
func (b *block) get(key string) *yaml.Node {
	if b == nil {
		return nil
	}
	if v := b.vals[key]; v != nil && !isNull(v) {
		return v
	}
	return nil
}

func (b *block) has(key string) bool { return b.get(key) != nil }

// present reports whether key was written at all, null included (a null in an any_of entry
// clears the base value).
func (b *block) present(key string) bool {
	if b == nil {
		return false
	}
	_, ok := b.vals[key]
	return ok
}

func (b *block) key(key string) *yaml.Node {
	if b == nil {
		return nil
	}
	return b.keys[key]
}

func (b *block) sub(key string) string {
	if b == nil {
		return key
	}
	return join(b.path, key)
}

// The typed readers below write dst only when the key is given and valid, so callers fill
// defaults first and read over them.

func (b *block) str(key string, dst *string) {
	if n := b.get(key); n != nil {
		if s, ok := b.d.str(b.sub(key), n); ok {
			*dst = s
		}
	}
}

func (b *block) integer(key, want string, valid func(int) bool, dst *int) {
	if n := b.get(key); n != nil {
		if v, ok := b.d.integer(b.sub(key), n, want, valid); ok {
			*dst = v
		}
	}
}

func (b *block) number(key, want string, valid func(float64) bool, dst *float64) {
	if n := b.get(key); n != nil {
		if v, ok := b.d.number(b.sub(key), n, want, valid); ok {
			*dst = v
		}
	}
}

func (b *block) boolean(key string, dst *bool) {
	if n := b.get(key); n != nil {
		if v, ok := b.d.boolean(b.sub(key), n); ok {
			*dst = v
		}
	}
}

func (b *block) enum(key string, allowed []string, dst *string) {
	if n := b.get(key); n != nil {
		if v, ok := b.d.enum(b.sub(key), n, allowed); ok {
			*dst = v
		}
	}
}

// str reads any scalar as text: YAML makes "name: 123" an integer, but the user meant the
// text, and SkyPilot's own loader is as lenient for envs.
func (d *decoder) str(path string, n *yaml.Node) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		d.errorf(n, "%s: want a string, got %s", path, describe(n))
		return "", false
	}
	if strings.ContainsRune(n.Value, 0) {
		// Commands, variables and paths end up in execve, which cannot carry a NUL.
		d.errorf(n, "%s: contains a NUL character; remove it", path)
		return "", false
	}
	return n.Value, true
}

func (d *decoder) integer(path string, n *yaml.Node, want string, valid func(int) bool) (int, bool) {
	var v int
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil || !valid(v) {
		d.errorf(n, "%s: want %s, got %s", path, want, describe(n))
		return 0, false
	}
	return v, true
}

func (d *decoder) number(path string, n *yaml.Node, want string, valid func(float64) bool) (float64, bool) {
	var v float64
	tag := n.ShortTag()
	if n.Kind != yaml.ScalarNode || (tag != "!!int" && tag != "!!float") || n.Decode(&v) != nil ||
		math.IsNaN(v) || math.IsInf(v, 0) || !valid(v) {
		d.errorf(n, "%s: want %s, got %s", path, want, describe(n))
		return 0, false
	}
	return v, true
}

// boolean also takes YAML 1.1's yes/no/on/off, because SkyPilot reads files with PyYAML,
// for which "use_spot: yes" is true; yaml.v3 alone would call it a string.
func (d *decoder) boolean(path string, n *yaml.Node) (bool, bool) {
	if n.Kind == yaml.ScalarNode {
		switch n.Value {
		case "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON":
			if tag := n.ShortTag(); tag == "!!bool" || n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
				return true, true
			}
		case "false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF":
			if tag := n.ShortTag(); tag == "!!bool" || n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
				return false, true
			}
		}
	}
	d.errorf(n, "%s: want true or false, got %s", path, describe(n))
	return false, false
}

// enum reads one of a fixed set of words, case-insensitively as SkyServe does, and returns
// it lower-cased.
func (d *decoder) enum(path string, n *yaml.Node, allowed []string) (string, bool) {
	s, ok := d.str(path, n)
	if !ok {
		return "", false
	}
	if l := strings.ToLower(strings.TrimSpace(s)); contains(allowed, l) {
		return l, true
	}
	msg := fmt.Sprintf("%s: want one of %s, got %s", path, strings.Join(allowed, ", "), quote(s))
	if sug := suggest(s, allowed); sug != "" {
		msg += fmt.Sprintf("; did you mean %q?", sug)
	}
	d.errorf(n, "%s", msg)
	return "", false
}

// stringMap reads a mapping of names to scalar values (labels, headers).
func (d *decoder) stringMap(path string, n *yaml.Node) map[string]string {
	ps, ok := d.pairs(path, n, "a mapping of names to values")
	if !ok || len(ps) == 0 {
		return nil
	}
	m := make(map[string]string, len(ps))
	for _, p := range ps {
		if p.val.Kind != yaml.ScalarNode {
			d.errorf(p.val, "%s.%s: want a string, got %s", path, clip(p.name), describe(p.val))
			continue
		}
		if isNull(p.val) {
			d.errorf(p.val, "%s.%s: no value; give one", path, clip(p.name))
			continue
		}
		if v, ok := d.str(join(path, p.name), p.val); ok {
			m[p.name] = v
		}
	}
	return m
}

// Range predicates for the typed readers, named for how the messages read.
func atLeast(lo int) func(int) bool { return func(v int) bool { return v >= lo } }
func nonNegative(v float64) bool    { return v >= 0 }
func positive(v float64) bool       { return v > 0 }
func between(lo, hi float64) func(float64) bool {
	return func(v float64) bool { return v > lo && v <= hi }
}
