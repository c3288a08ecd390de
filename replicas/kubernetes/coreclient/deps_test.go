package coreclient

import (
	"os/exec"
	"strings"
	"testing"
)

// The binaries that run a control plane link one API group, core/v1: client-go's clientset,
// its informer factory and its scheme register all of them, which tripled the project's
// build time (CI builds it twice, once with -race). One exception: the standalone
// autoscaler's `--lease kubernetes` is client-go's leaderelection (the well-kept library,
// not a home-made election), which imports the clientset and informers itself; it may come
// in through control/kubelease and nothing else. `serve` links none of it.
func TestControlPlaneLinksOneAPIGroup(t *testing.T) {
	const mod = "github.com/arbiter-serve/arbiter/"
	targets := []string{mod + "cmd/serve"}
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, mod+"cmd/autoscaler").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, imp := range strings.Fields(string(out)) {
		if imp != mod+"control/kubelease" && (strings.HasPrefix(imp, mod) || strings.HasPrefix(imp, "k8s.io/")) {
			targets = append(targets, imp)
		}
	}
	for _, cmd := range targets {
		out, err := exec.Command("go", "list", "-deps", cmd).CombinedOutput()
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
		if !core && cmd == mod+"cmd/serve" {
			t.Errorf("%s does not link k8s.io/api/core/v1: is the kubernetes provider still in it?", cmd)
		}
	}
}
