package e2e

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestKubernetesHAManifests installs deploy/kubernetes-ha (three control planes on
// PostgreSQL, a Lease electing the leader) into a real kube-apiserver: every manifest passes
// the server's dry run; the control plane is three replicas that elect with the Lease, read
// the PostgreSQL URL from its Secret and advertise their pod IP, with no volume claim left
// from the single form; and its ServiceAccount may hold the Lease.
func TestKubernetesHAManifests(t *testing.T) {
	k := startKube(t, "hamanifest", "127.0.61.1/24")
	ha := filepath.Join("..", "deploy", "kubernetes-ha")
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := k.Kubectl(args...)
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	out := kubectl("apply", "--dry-run=server", "-k", ha)
	for _, want := range []string{"deployment.apps/arbiter-control", "deployment.apps/arbiter-router", "service/arbiter-control",
		"poddisruptionbudget.policy/arbiter-control", "role.rbac.authorization.k8s.io/arbiter-replicas"} {
		if !strings.Contains(out, want) {
			t.Errorf("the dry run did not apply %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "persistentvolumeclaim") {
		t.Errorf("the HA form applies a volume claim (its state is in PostgreSQL):\n%s", out)
	}

	// The control plane's Deployment, as the apiserver would store it.
	var list struct {
		Items []struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				Replicas int `json:"replicas"`
				Strategy struct {
					Type string `json:"type"`
				} `json:"strategy"`
				Template struct {
					Spec struct {
						Containers []struct {
							Args []string `json:"args"`
							Env  []struct {
								Name      string `json:"name"`
								ValueFrom struct {
									FieldRef struct {
										FieldPath string `json:"fieldPath"`
									} `json:"fieldRef"`
								} `json:"valueFrom"`
							} `json:"env"`
						} `json:"containers"`
						Volumes []struct {
							Name   string `json:"name"`
							Secret *struct {
								SecretName string `json:"secretName"`
							} `json:"secret"`
							PVC *struct{} `json:"persistentVolumeClaim"`
						} `json:"volumes"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(kubectl("apply", "--dry-run=server", "-k", ha, "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, it := range list.Items {
		if it.Kind != "Deployment" || it.Metadata.Name != "arbiter-control" {
			continue
		}
		found = true
		if it.Spec.Replicas != 3 || it.Spec.Strategy.Type != "RollingUpdate" {
			t.Errorf("the control plane: %d replicas, strategy %s; want 3, RollingUpdate", it.Spec.Replicas, it.Spec.Strategy.Type)
		}
		c := it.Spec.Template.Spec.Containers[0]
		for _, want := range []string{"--lease=kubernetes", "--state-file=/etc/arbiter/state/dsn", "--lease-holder=$(POD_NAME)", "--advertise-url=http://$(POD_IP):8081"} {
			if !slices.Contains(c.Args, want) {
				t.Errorf("the control plane's args %v lack %s", c.Args, want)
			}
		}
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
		if env["POD_NAME"] != "metadata.name" || env["POD_IP"] != "status.podIP" {
			t.Errorf("the control plane's env %v: want POD_NAME and POD_IP from the downward API", env)
		}
		dsn := false
		for _, v := range it.Spec.Template.Spec.Volumes {
			if v.PVC != nil {
				t.Errorf("volume %s is a volume claim", v.Name)
			}
			dsn = dsn || v.Secret != nil && v.Secret.SecretName == "arbiter-state-dsn"
		}
		if !dsn {
			t.Errorf("no volume from the arbiter-state-dsn Secret: %+v", it.Spec.Template.Spec.Volumes)
		}
	}
	if !found {
		t.Fatalf("no arbiter-control Deployment in the dry run")
	}

	// The Lease, as the apiserver's RBAC decides it for the control plane's ServiceAccount.
	as := "--as=system:serviceaccount:arbiter:arbiter-control"
	for _, c := range [][]string{{"create", "leases"}, {"get", "leases/arbiter-control"}, {"update", "leases/arbiter-control"}} {
		if out, err := k.Kubectl("auth", "can-i", c[0], c[1], "-n", "arbiter", as); err != nil || strings.TrimSpace(out) != "yes" {
			t.Errorf("can the control plane %s %s: %q %v; want yes", c[0], c[1], out, err)
		}
	}
	if out, _ := k.Kubectl("auth", "can-i", "update", "leases/another", "-n", "arbiter", as); strings.TrimSpace(out) != "no" {
		t.Errorf("can the control plane update leases/another: %q; want no", out)
	}
}
