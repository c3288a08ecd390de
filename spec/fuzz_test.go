package spec

import (
	"fmt"
	"os"
	"strconv"
	"testing"
)

// embedTemplates place one fuzzed string in each of the places a string can sit, because
// random mutation of whole files rarely yields a valid one: these make the round trip meet
// every awkward string (quotes, newlines, "true", "8080", leading spaces, unicode) in every
// position ResolvedYAML writes.
var embedTemplates = []string{
	"run: %s\nservice: {}\n",
	"run: x\nsetup: %s\nworkdir: %[1]s\nname: n\nservice: {}\n",
	"run: x\nenvs: {V: %s}\nsecrets: {S: %[1]s}\nservice: {}\n",
	"run: x\nresources: {labels: {%s: %[1]s}, region: %[1]s, zone: %[1]s, instance_type: %[1]s, image_id: %[1]s}\nservice: {}\n",
	"run: x\nresources: {infra: %s}\nservice: {}\n",
	"run: x\nresources:\n  cloud: aws\n  any_of: [{region: %s}, {labels: {k: %[1]s}}, {}]\nservice: {}\n",
	"run: x\nenvs: {V: %s}\nservice:\n  readiness_probe: {path: /$V, post_data: {k: $V, %[1]s: [%[1]s]}, headers: {X-A: $V}}\n",
	"run: x\nservice:\n  readiness_probe: {path: /, post_data: %s}\n",
	"run: x\nservice: {}\narbiter: {models: [%s], local: {region: %[1]s, zone: %[1]s}}\n",
	"run: x\nservice: {}\narbiter: {reserved: [{provider: local, accelerator: L4, region: %s, zone: %[1]s}]}\n",
	"run: x\nservice: {}\nresources: {accelerators: %s, ports: %[1]s, cpus: %[1]s, memory: %[1]s, disk_size: %[1]s}\n",
}

// FuzzParse checks that Parse never panics, and that any file it accepts renders with
// ResolvedYAML to a file that parses back to an equal Service (checkRoundTrip).
func FuzzParse(f *testing.F) {
	for _, path := range []string{"../examples/skyserve-vllm.yaml", "../examples/local.yaml"} {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, src := range roundTripSources {
		f.Add([]byte(src))
	}
	for _, s := range []string{"true", "8080", " lead", "a: b", "x\ny\n", "\n", "#", "- x", "\"", "'", "{}", "A100:2", "null", "\u2028", "\ufeff"} {
		for i := range 2 * len(embedTemplates) {
			f.Add(append([]byte{byte(i)}, s...))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := Parse("fuzz.yaml", data); err == nil {
			checkRoundTrip(t, data)
		}
		// The first byte picks a template and whether the rest goes in raw or quoted (Go's
		// quoting is valid YAML double-quoted syntax: the same escapes); one template per
		// input keeps the fuzzer fast. Long inputs only slow it down: a string's shape, not
		// its length, is what trips an encoder.
		if len(data) == 0 || len(data) > 4096 {
			return
		}
		tmpl := embedTemplates[int(data[0])%len(embedTemplates)]
		v := string(data[1:])
		if (int(data[0])/len(embedTemplates))%2 == 1 {
			v = strconv.Quote(v)
		}
		src := []byte(fmt.Sprintf(tmpl, v))
		if _, err := Parse("fuzz.yaml", src); err == nil {
			checkRoundTrip(t, src)
		}
	})
}
