package router

import (
	"os/exec"
	"strings"
	"testing"
)

// The data plane never links the control plane or a provider's SDK: a router binary stays
// small, and nothing in the request path can wait on them.
func TestRouterBinaryLinksNoControlPlane(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/arbiter-serve/arbiter/cmd/router").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	banned := []string{"github.com/arbiter-serve/arbiter/control", "github.com/arbiter-serve/arbiter/scaling", "github.com/arbiter-serve/arbiter/replicas",
		"github.com/arbiter-serve/arbiter/state", "k8s.io/", "modernc.org/sqlite"}
	for _, dep := range strings.Fields(string(out)) {
		for _, b := range banned {
			if strings.HasPrefix(dep, b) {
				t.Errorf("cmd/router links %s", dep)
			}
		}
	}
}
