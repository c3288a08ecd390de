package control

import (
	"math"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/state"
)

// Replicas are billed from launch to end (or now), ready or not; $/M tokens follows.
func TestBill(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	rows := []state.Replica{
		{PricePerHour: 2, LaunchedAt: now.Add(-3 * time.Hour), EndedAt: now.Add(-time.Hour)}, // $4, ended
		{PricePerHour: 1.5, LaunchedAt: now.Add(-30 * time.Minute), State: "starting"},       // $0.75, still billed
		{PricePerHour: 0, LaunchedAt: now.Add(-10 * time.Hour), State: "ready"},              // reserved: $0
	}
	st := ServiceStatus{Tokens: 2_375_000}
	bill(&st, rows, now)
	if math.Abs(st.Dollars-4.75) > 1e-9 || st.DollarsPerHour != 1.5 || math.Abs(st.DollarsPerMillionTokens-2) > 1e-9 {
		t.Fatalf("bill = $%v, $%v/h, $%v/M; want 4.75, 1.5, 2", st.Dollars, st.DollarsPerHour, st.DollarsPerMillionTokens)
	}
	zero := ServiceStatus{}
	bill(&zero, rows, now)
	if zero.DollarsPerMillionTokens != 0 {
		t.Fatal("$/M tokens before any token must be 0, not Inf")
	}
}

func TestProviderOwnerIsRandomPerHomeAndKept(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	oa, err := ProviderOwner(a)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := ProviderOwner(a)
	ob, _ := ProviderOwner(b)
	if oa != again || oa == ob || len(oa) != len("arbiter-")+12 {
		t.Errorf("owners %q, %q (same home again), %q (another home)", oa, again, ob)
	}
}
