package state

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// Several control planes opening one store at once, each with its own idea of the owner (its
// home's): every one gets the same, the first stored, and a later one's seed is not asked
// for.
func TestDeploymentOwnerSharedByEveryControlPlane(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, setting string) {
		ctx := context.Background()
		const n = 4
		stores := make([]*Store, n)
		for i := range stores {
			stores[i] = openSetting(t, setting, Options{})
			defer stores[i].Close()
		}
		got := make([]string, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				got[i], errs[i] = stores[i].DeploymentValue(ctx, LocalOwnerKey, func() (string, error) { return "arbiter-home" + string(rune('a'+i)), nil })
			})
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("control plane %d: %v", i, errs[i])
			}
			if got[i] != got[0] {
				t.Fatalf("owners %v; want one for all", got)
			}
		}
		v, err := stores[0].DeploymentValue(ctx, LocalOwnerKey, func() (string, error) { t.Fatal("seeded again"); return "", nil })
		if err != nil || v != got[0] {
			t.Fatalf("read again: %q, %v; want %q", v, err, got[0])
		}
		boom := errors.New("no entropy")
		if _, err := stores[1].DeploymentValue(ctx, ProviderOwnerKey, func() (string, error) { return "", boom }); !errors.Is(err, boom) {
			t.Fatalf("a failing seed: %v; want it returned", err)
		}
		if _, err := stores[1].DeploymentValue(ctx, ProviderOwnerKey, func() (string, error) { return " ", nil }); err == nil {
			t.Fatal("an empty owner stored")
		}
		all, err := stores[2].Deployment(ctx)
		if err != nil || len(all) != 1 || all[LocalOwnerKey] != got[0] {
			t.Fatalf("deployment: %v, %v; want only %s=%s", all, err, LocalOwnerKey, got[0])
		}
	})
}
