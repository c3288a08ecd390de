package pricing

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/spec"
)

// An accelerator set naming one GPU at several counts quotes each count as its own
// candidate, and a name no catalog knows beside priced ones is left out, not an error.
func TestQuoteSetWithCountsAndUnknownNames(t *testing.T) {
	r := spec.Resources{Accelerators: []spec.Accelerator{{Name: "A100", Count: 4}, {Name: "A100", Count: 8}, {Name: "GB200", Count: 4}, {Name: "a100-80gb", Count: 8}}}
	offers := quote(t, r, time.Time{})
	counts := map[string]bool{}
	for _, o := range offers {
		counts[o.Accelerator+":"+string(rune('0'+o.AcceleratorCount))] = true
		if o.Accelerator == "GB200" {
			t.Fatalf("offer for an unknown accelerator: %+v", o)
		}
	}
	for _, want := range []string{"A100:8", "A100-80GB:8"} {
		if !counts[want] {
			t.Errorf("no offer for %s; have %v", want, counts)
		}
	}
	sortedWithin(t, offers)
}

const resolveFile = `run: x
service: {readiness_probe: /health}
resources:
  accelerators: {l4:1, L40:1, A100:8, GB200:4}
`

func TestResolve(t *testing.T) {
	c := catalog(t)
	for _, tc := range []struct {
		name, providers string
		accs            string // kept, in order
		warn            []string
		err             string
	}{{
		name: "priced providers leave out what no catalog prices", providers: "[sim]",
		accs: "L4:1 A100:8",
		warn: []string{
			`svc.yaml:4:24: resources.accelerators: "L40": no price catalog lists it (closest known: L4, L40S, A10), and none of this service's providers (sim) offers a GPU no catalog lists (kubernetes and runpod match names against their own nodes and GPU types); left out, the others remain`,
			`svc.yaml:4:39: resources.accelerators: "GB200": no price catalog lists it`,
		},
	}, {
		name: "the local machine offers no GPU by name: left out too", providers: "[local]",
		accs: "L4:1 A100:8",
		warn: []string{`svc.yaml:4:24: resources.accelerators: "L40": no price catalog lists it (closest known: L4, L40S, A10), and none of this service's providers (local) offers`},
	}, {
		name: "kubernetes matches names against its nodes: kept, and said so", providers: "[kubernetes]",
		accs: "L4:1 L40:1 A100:8 GB200:4",
		warn: []string{`svc.yaml:4:24: resources.accelerators: "L40": no price catalog lists it (closest known: L4, L40S, A10); kept, as kubernetes can run it without one`},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			sp, err := spec.Parse("svc.yaml", []byte(resolveFile+"arbiter: {providers: "+tc.providers+"}\n"))
			if err != nil {
				t.Fatal(err)
			}
			warn, err := Resolve(sp, c)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, a := range sp.Resources.Accelerators {
				got = append(got, a.Name+":"+string(rune('0'+a.Count)))
			}
			if strings.Join(got, " ") != tc.accs {
				t.Errorf("kept %v, want %s", got, tc.accs)
			}
			for _, w := range tc.warn {
				if !strings.Contains(warn.Error(), w) {
					t.Errorf("warnings:\n%v\nwant one starting %q", warn, w)
				}
			}
		})
	}
	sp, err := spec.Parse("svc.yaml", []byte("run: x\nservice: {readiness_probe: /health}\nresources:\n  accelerators: [B100:8, GB200:4]\narbiter: {providers: [sim]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Resolve(sp, c)
	var el *spec.ErrorList
	if !errors.As(err, &el) || len(*el) != 2 || !strings.HasPrefix(err.Error(), `svc.yaml:4:18: resources.accelerators: "B100": no price catalog lists it`) ||
		!strings.Contains(err.Error(), "no other accelerator is left") {
		t.Errorf("err = %v", err)
	}
}
