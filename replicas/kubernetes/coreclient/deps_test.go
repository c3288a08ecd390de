package coreclient

import (
	"os/exec"
	"strings"
	"testing"
)

// The binaries that run a control plane link one API group, core/v1: client-go's clientset,
// its informer factory and its scheme register all of them, which tripled the project's
// build time (CI builds it twice, once with -race).
func TestControlPlaneLinksOneAPIGroup(t *testing.T) {
	for _, cmd := range []string{"cmd/serve", "cmd/autoscaler"} {
		out, err := exec.Command("go", "list", "-deps", "github.com/arbiter-serve/arbiter/"+cmd).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		deps := strings.Fields(string(out))
		core := false
		for _, dep := range deps {
			core = core || dep == "k8s.io/api/core/v1"
			if strings.HasPrefix(dep, "k8s.io/api/") && dep != "k8s.io/api/core/v1" ||
				strings.HasPrefix(dep, "k8s.io/client-go/kubernetes") || strings.HasPrefix(dep, "k8s.io/client-go/informers") {
				t.Errorf("%s links %s", cmd, dep)
			}
		}
		if !core {
			t.Errorf("%s does not link k8s.io/api/core/v1: is the kubernetes provider still in it?", cmd)
		}
	}
}
