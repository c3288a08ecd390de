package inferencepool

import (
	"os/exec"
	"strings"
	"testing"
)

// The picker is data plane: it may read the kubernetes provider's node pricing, but never
// links the control plane, its state or a cloud's SDK.
func TestPickerBinaryLinksNoControlPlane(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/arbiter-serve/arbiter/cmd/picker").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	banned := []string{"github.com/arbiter-serve/arbiter/control", "github.com/arbiter-serve/arbiter/state",
		"modernc.org/sqlite", "github.com/aws/", "cloud.google.com/go/", "github.com/Azure/", "k8s.io/client-go/informers", "k8s.io/client-go/kubernetes"}
	for _, dep := range strings.Fields(string(out)) {
		for _, b := range banned {
			if strings.HasPrefix(dep, b) {
				t.Errorf("cmd/picker links %s", dep)
			}
		}
	}
}
