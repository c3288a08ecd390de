package spec

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// SkyPilot's LLM examples ask for one GPU at several counts; each name:count is its own
// candidate. The forms below are the ones those files use, written here afresh.
func TestAcceleratorSetsWithCounts(t *testing.T) {
	for _, tt := range []struct {
		name, yaml string
		want       []Accelerator
		ordered    bool
	}{
		{"flow set of name:count keys", `{A100:4, A100:8, A100-80GB:2, A100-80GB:4, A100-80GB:8}`,
			[]Accelerator{{"A100", 4}, {"A100", 8}, {"A100-80GB", 2}, {"A100-80GB", 4}, {"A100-80GB", 8}}, false},
		{"two counts of one GPU", `{L4:1, L4:4}`, []Accelerator{{"L4", 1}, {"L4", 4}}, false},
		{"quoted keys with null values", `{"L4:1": null, "L4:4": null}`, []Accelerator{{"L4", 1}, {"L4", 4}}, false},
		{"list", `[A100:4, A100:8, H100:8]`, []Accelerator{{"A100", 4}, {"A100", 8}, {"H100", 8}}, true},
		{"list of mappings", `[{A100: 4}, {A100: 8}]`, []Accelerator{{"A100", 4}, {"A100", 8}}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src := minimal + "resources: {accelerators: " + tt.yaml + "}\n"
			r := mustParse(t, src).Resources
			if !reflect.DeepEqual(r.Accelerators, tt.want) || r.AcceleratorsOrdered != tt.ordered {
				t.Errorf("→ %+v ordered=%v, want %+v ordered=%v", r.Accelerators, r.AcceleratorsOrdered, tt.want, tt.ordered)
			}
			checkRoundTrip(t, []byte(src))
		})
	}
	// Block style, as the examples are laid out, inside an any_of entry too.
	src := minimal + `resources:
  use_spot: true
  any_of:
    - accelerators:
        A100:4:
        A100:8:
    - infra: gcp
      accelerators: {L4:1, L4:4}
`
	s := mustParse(t, src)
	if got := s.Resources.AnyOf[0].Accelerators; !reflect.DeepEqual(got, []Accelerator{{"A100", 4}, {"A100", 8}}) {
		t.Errorf("any_of[0] = %+v", got)
	}
	if got := s.Resources.AnyOf[1].Accelerators; !reflect.DeepEqual(got, []Accelerator{{"L4", 1}, {"L4", 4}}) {
		t.Errorf("any_of[1] = %+v", got)
	}
	checkRoundTrip(t, []byte(src))
	if got := s.AcceleratorPositions("a100"); len(got) != 2 || got[0].Line != 8 || got[1].Line != 9 {
		t.Errorf("positions of A100 = %+v, want lines 8 and 9", got)
	}
}

const unpricedSet = `run: x
service: {readiness_probe: /health}
resources:
  accelerators: {L4:1, L40:1, a100:8, GB200:4}
`

func TestDropAccelerators(t *testing.T) {
	s := mustParse(t, unpricedSet)
	s.RenameAccelerators(func(n string) string {
		if strings.EqualFold(n, "A100") {
			return "A100"
		}
		return ""
	})
	known := map[string]bool{"L4": true, "A100": true}
	warn, err := s.DropAccelerators(func(n string) string {
		if known[n] {
			return ""
		}
		return "no catalog prices it"
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []Accelerator{{"L4", 1}, {"A100", 8}}; !reflect.DeepEqual(s.Resources.Accelerators, want) {
		t.Errorf("kept %+v, want %+v", s.Resources.Accelerators, want)
	}
	got := warn.Error()
	for _, w := range []string{
		`svc.yaml:4:24: resources.accelerators: "L40": no catalog prices it; left out`,
		`svc.yaml:4:39: resources.accelerators: "GB200": no catalog prices it; left out`,
	} {
		if !strings.Contains(got, w) {
			t.Errorf("warnings:\n%s\nwant a line %q", got, w)
		}
	}
	if out, err := s.ResolvedYAML(); err != nil || !strings.Contains(string(out), "accelerators: {L4: 1, A100: 8}") {
		t.Errorf("resolved:\n%s\n%v", out, err)
	}

	// Nothing left: an error at every name, and the service untouched.
	s = mustParse(t, unpricedSet)
	before := s.Resources.Accelerators
	_, err = s.DropAccelerators(func(string) string { return "no catalog prices it" })
	var el *ErrorList
	if !errors.As(err, &el) || len(*el) != 4 || (*el)[0].Line != 4 || !strings.Contains(err.Error(), "no other accelerator is left") {
		t.Fatalf("err = %v", err)
	}
	if !reflect.DeepEqual(s.Resources.Accelerators, before) {
		t.Errorf("service changed on error: %+v", s.Resources.Accelerators)
	}
}

func TestDropAcceleratorsFromCandidates(t *testing.T) {
	s := mustParse(t, minimal+`resources:
  ordered:
    - accelerators: B100:8
    - accelerators: {H100:8, GB200:4}
    - instance_type: g5.xlarge
`)
	warn, err := s.DropAccelerators(func(n string) string {
		if n == "B100" || n == "GB200" {
			return "nothing prices it"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(warn) != 2 || warn[0].Line != 6 || warn[1].Line != 7 {
		t.Errorf("warnings = %v", warn)
	}
	o := s.Resources.Ordered
	if len(o) != 2 || !reflect.DeepEqual(o[0].Accelerators, []Accelerator{{"H100", 8}}) || o[1].InstanceType != "g5.xlarge" {
		t.Errorf("ordered = %+v", o)
	}
}

func TestServiceTLS(t *testing.T) {
	src := "run: x\nservice:\n  readiness_probe: /\n  tls:\n    keyfile: ~/certs/key.pem\n    certfile: certs/cert.pem\n"
	s := mustParse(t, src)
	if got := s.Service.TLS; got == nil || got.KeyFile != "~/certs/key.pem" || got.CertFile != "certs/cert.pem" {
		t.Fatalf("TLS = %+v", got)
	}
	checkRoundTrip(t, []byte(src))
	if s := mustParse(t, minimal); s.Service.TLS != nil {
		t.Errorf("TLS without the key: %+v", s.Service.TLS)
	}
	for _, tc := range []struct{ src, want string }{
		{"run: x\nservice:\n  tls: {keyfile: k.pem}\n", `svc.yaml:3:3: service.tls.certfile: missing; give the path of the PEM certificate (chain)`},
		{"run: x\nservice:\n  tls: {keyfile: k.pem, certfile: c.pem, ca: x}\n", `svc.yaml:3:42: unknown key "ca" in service.tls; allowed: keyfile, certfile`},
		{"run: x\nservice:\n  tls: k.pem\n", `svc.yaml:3:8: service.tls: want a mapping`},
	} {
		_, err := Parse("svc.yaml", []byte(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want %q", tc.src, err, tc.want)
		}
	}
}
