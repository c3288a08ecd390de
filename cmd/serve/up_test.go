package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/control"
	"github.com/arbiter-serve/arbiter/state"
)

// serve up follows the service's events from its submission on: a name's older events (a
// deleted service of that name, which a control plane of an older version still lists as
// the name's; an earlier version's long history, listed a page at a time) are not replayed
// as if they happened now.
func TestUpShowsOnlyEventsFromTheSubmission(t *testing.T) {
	at := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	ev := func(id int64, replica, kind, msg string) state.Event {
		return state.Event{ID: id, At: at.Add(time.Duration(id) * time.Second), Service: "svc", Replica: replica, Kind: kind, Message: msg}
	}
	log := []state.Event{
		ev(1, "", "service", "version 1 submitted"),
		ev(2, "", "error", "placement waits: the old service's quote failed"),
		ev(3, "svc-1", "state", "ready → draining: service deleted"),
		ev(4, "", "service", "deleted"),
		ev(5, "", "service", "version 1 submitted"),
		ev(6, "svc-1", "state", "starting → ready: readiness probe passed after 2s"),
	}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/events":
			after, _ := strconv.ParseInt(r.URL.Query().Get("after"), 10, 64)
			var page []state.Event
			for _, e := range log {
				if e.ID > after && len(page) < 2 { // two a page, as a long log is read
					page = append(page, e)
				}
			}
			_ = json.NewEncoder(w).Encode(append([]state.Event{}, page...))
		case "/v1/services/svc":
			_ = json.NewEncoder(w).Encode(control.ServiceStatus{Name: "svc", Version: 1, Target: 1, Ready: 1, Live: 1,
				Replicas: []state.Replica{{ID: "svc-1", Service: "svc", Version: 1, State: "ready"}}})
		default:
			http.NotFound(w, r)
		}
	}))
	defer api.Close()
	var out bytes.Buffer
	c := &client{base: api.URL, http: api.Client()}
	if err := waitService(context.Background(), c, "svc", 1, 30*time.Second, &out); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); strings.Contains(got, "old service") || strings.Contains(got, "deleted") || !strings.Contains(got, "readiness probe passed") {
		t.Fatalf("serve up printed:\n%s\nwant only what followed the last submission of version 1", got)
	}
}
