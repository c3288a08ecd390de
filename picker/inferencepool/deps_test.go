package inferencepool

import (
	"os/exec"
	"strings"
	"testing"
)

// The picker is data plane: it may read the kubernetes provider's node pricing, but never
// links the control plane, its state or a cloud's SDK; nor client-go's clientset and
// informers, which register every API group (the build time they cost: coreclient's
// deps_test), except through picker/lease: -leader-elect is client-go's leaderelection,
// which imports them itself, as the autoscaler's Lease does through control/kubelease.
func TestPickerBinaryLinksNoControlPlane(t *testing.T) {
	const mod = "github.com/arbiter-serve/arbiter/"
	out, err := exec.Command("go", "list", "-deps", mod+"cmd/picker").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	banned := []string{mod + "control", mod + "state", "modernc.org/sqlite", "github.com/aws/", "cloud.google.com/go/", "github.com/Azure/"}
	for _, dep := range strings.Fields(string(out)) {
		for _, b := range banned {
			if strings.HasPrefix(dep, b) {
				t.Errorf("cmd/picker links %s", dep)
			}
		}
	}
	imports, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, mod+"cmd/picker").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, imports)
	}
	for _, imp := range strings.Fields(string(imports)) {
		if imp == mod+"picker/lease" || !strings.HasPrefix(imp, mod) && !strings.HasPrefix(imp, "k8s.io/") {
			continue
		}
		out, err := exec.Command("go", "list", "-deps", imp).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "k8s.io/client-go/kubernetes") || strings.HasPrefix(dep, "k8s.io/client-go/informers") {
				t.Errorf("cmd/picker links %s through %s", dep, imp)
			}
		}
	}
}
