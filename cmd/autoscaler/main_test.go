package main

import (
	"strings"
	"testing"
	"time"
)

// Bad lease flags are refused with what is wrong, before anything starts.
func TestLeaseFlagsChecked(t *testing.T) {
	for _, c := range []struct {
		kind, ns, name, kubeconfig string
		want                       string
	}{
		{"etcd", "", "arbiter-control", "", `--lease "etcd": want store or kubernetes`},
		{"store", "arbiter", "arbiter-control", "", "are for --lease kubernetes"},
		{"store", "", "other", "", "are for --lease kubernetes"},
		{"kubernetes", "arbiter", "arbiter-control", "/nonexistent/kubeconfig", "kubeconfig /nonexistent/kubeconfig"},
	} {
		dur := time.Duration(0)
		if _, err := leaseSetting(c.kind, c.ns, c.name, c.kubeconfig, &dur, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--lease %s --lease-namespace %q --lease-name %q --lease-kubeconfig %q: %v; want an error saying %q", c.kind, c.ns, c.name, c.kubeconfig, err, c.want)
		}
	}
	dur := time.Duration(0)
	if f, err := leaseSetting("store", "", "arbiter-control", "", &dur, nil); err != nil || f != nil || dur != 0 {
		t.Errorf("--lease store: %v, %v, %v; want the store's own lease, the duration as given", f != nil, err, dur)
	}
}
