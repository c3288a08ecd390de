package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKubernetesGatewayManifests installs deploy/kubernetes/gateway (the endpoint picker,
// its RBAC, an InferencePool and an HTTPRoute) into a real kube-apiserver: with stand-ins for
// GIE's InferencePool CRD and Gateway API's HTTPRoute CRD (testdata/gateway-crds: the
// published schemas of the fields the manifests use; no network here to fetch the real
// ones), every manifest passes the server's dry run, and the picker's account may read pods,
// nodes and InferencePools and do nothing else.
func TestKubernetesGatewayManifests(t *testing.T) {
	k := startKube(t, "gateway", "127.0.58.1/24")
	gw := filepath.Join("..", "deploy", "kubernetes", "gateway")
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := k.Kubectl(args...)
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	kubectl("apply", "-f", filepath.Join("testdata", "gateway-crds"))
	kubectl("wait", "--for=condition=Established", "--timeout=120s",
		"crd/inferencepools.inference.networking.k8s.io", "crd/httproutes.gateway.networking.k8s.io")
	out := kubectl("apply", "--dry-run=server", "-k", gw)
	for _, want := range []string{"deployment.apps/arbiter-picker", "service/arbiter-picker",
		"inferencepool.inference.networking.k8s.io/llama", "httproute.gateway.networking.k8s.io/llama",
		"role.rbac.authorization.k8s.io/arbiter-picker", "clusterrole.rbac.authorization.k8s.io/arbiter-picker-node-reader"} {
		if !strings.Contains(out, want) {
			t.Errorf("the dry run did not apply %s:\n%s", want, out)
		}
	}

	// The stand-in CRDs check what they claim to: an InferencePool with a failureMode GIE
	// does not define is refused, so the dry run above was validated, not waved through.
	pool, err := os.ReadFile(filepath.Join(gw, "inferencepool.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad-pool.yaml")
	if err := os.WriteFile(bad, []byte(strings.Replace(string(pool), "failureMode: FailClose", "failureMode: FailSometimes", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := k.Kubectl("apply", "--dry-run=server", "-f", bad); err == nil || !strings.Contains(out, "failureMode") {
		t.Errorf("an InferencePool with failureMode FailSometimes: want it refused, naming the field; got err %v:\n%s", err, out)
	}

	// Least privilege, as the apiserver's RBAC decides it for the picker's ServiceAccount.
	kubectl("apply", "-f", filepath.Join(gw, "rbac.yaml"))
	as := "--as=system:serviceaccount:arbiter:arbiter-picker"
	for _, c := range []struct {
		verb, resource, ns string
		want               bool
	}{
		{"list", "pods", "arbiter", true},
		{"watch", "pods", "arbiter", true},
		{"watch", "nodes", "", true},
		{"get", "nodes", "", true},
		{"watch", "inferencepools.inference.networking.k8s.io", "arbiter", true},
		{"get", "inferencepools.inference.networking.k8s.io", "arbiter", true},
		{"create", "pods", "arbiter", false},
		{"delete", "pods", "arbiter", false},
		{"list", "pods", "default", false},
		{"get", "secrets", "arbiter", false},
		{"update", "inferencepools.inference.networking.k8s.io", "arbiter", false},
		{"patch", "nodes", "", false},
		{"list", "httproutes.gateway.networking.k8s.io", "arbiter", false},
	} {
		args := []string{"auth", "can-i", c.verb, c.resource, as}
		if c.ns != "" {
			args = append(args, "-n", c.ns)
		}
		out, _ := k.Kubectl(args...) // exit status 1 means "no"
		// The answer is the last line (kubectl warns first that nodes have no namespace).
		lines := strings.Split(strings.TrimSpace(out), "\n")
		got := lines[len(lines)-1]
		if want := map[bool]string{true: "yes", false: "no"}[c.want]; got != want {
			t.Errorf("may the picker %s %s (namespace %q)? got %q, want %q", c.verb, c.resource, c.ns, got, want)
		}
	}
	// -leader-elect's Lease: create, read and renew it in its namespace, nothing more.
	kubectl("apply", "-f", filepath.Join(gw, "leader-election.yaml"))
	for _, c := range []struct {
		verb, ns string
		want     bool
	}{{"create", "arbiter", true}, {"update", "arbiter", true}, {"get", "arbiter", true}, {"delete", "arbiter", false}, {"update", "default", false}} {
		out, _ := k.Kubectl("auth", "can-i", c.verb, "leases.coordination.k8s.io", as, "-n", c.ns)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if got, want := lines[len(lines)-1], map[bool]string{true: "yes", false: "no"}[c.want]; got != want {
			t.Errorf("may the picker %s leases (namespace %q)? got %q, want %q", c.verb, c.ns, got, want)
		}
	}
}
