package router

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/arbiter-serve/arbiter/fleet"
)

// A ready set that routes one service's replica for another service's model (a control
// plane before issue 35's fix published one) must not reach the pool.
func TestReplicasAreRoutedOnlyForTheirServicesModels(t *testing.T) {
	services := []fleet.Service{{Name: "owner", Models: []string{"m"}}, {Name: "rival", Models: nil}, {Name: "both", Models: []string{"x"}}}
	set := []fleet.Replica{
		{ID: "owner-1", Service: "owner", Model: "m"},
		{ID: "rival-1", Service: "rival", Model: "m"}, // takes owner's model
		{ID: "rival-2", Service: "rival", Model: "y"}, // a name no service lists: its own
		{ID: "both-1", Service: "both", Model: "x"},
		{ID: "file-1", Model: "m"}, // no service (a replica file): not judged
	}
	got := ownedReplicas(services, set, slog.New(slog.DiscardHandler))
	var ids []string
	for _, r := range got {
		ids = append(ids, r.ID)
	}
	if want := []string{"owner-1", "rival-2", "both-1", "file-1"}; !slices.Equal(ids, want) {
		t.Fatalf("routed %v; want %v", ids, want)
	}
	if len(set) != 5 || set[1].ID != "rival-1" {
		t.Fatalf("the set was changed: %+v", set)
	}
	if got := ownedReplicas(nil, set, slog.New(slog.DiscardHandler)); len(got) != len(set) {
		t.Fatalf("without services (a standalone router) %d of %d replicas kept", len(got), len(set))
	}
}
