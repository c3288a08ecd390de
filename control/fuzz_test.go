package control

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The control-plane API under arbitrary bodies on every route that reads one: no panic, no
// 5xx (bad input is the caller's error, answered 4xx), and always a JSON body.
func FuzzAPI(f *testing.F) {
	routes := []struct{ method, path string }{
		{"POST", "/v1/services"}, {"PUT", "/v1/services/svc"}, {"POST", "/v1/validate"},
		{"POST", "/v1/load"}, {"POST", "/v1/wake"}, {"POST", "/v1/replicas/svc-1/preempt"},
		{"GET", "/v1/readyset?after=0&wait=1ms"}, {"GET", "/v1/events?after=-1&limit=x"}, {"DELETE", "/v1/services/svc"},
	}
	for i := range routes {
		f.Add(uint8(i), "")
	}
	f.Add(uint8(0), submit("svc", zeroSpec))
	f.Add(uint8(1), submit("", zeroSpec))
	f.Add(uint8(2), submit("v", strings.Replace(zeroSpec, "max_replicas: 2", "max_replicas: -1", 1)))
	f.Add(uint8(3), `{"router":"r1","models":[{"model":"m1","requests":3,"in_flight":2}],"replicas":[{"replica_id":"x","in_flight":-5}]}`)
	f.Add(uint8(4), `{"model":"m1"}`)
	f.Add(uint8(5), `{"notice":"30s"}`)
	f.Add(uint8(0), `{"name":"a","spec":"service: {replicas: 99999999999999999999}\nrun: x"}`)
	f.Add(uint8(0), `{"name":"`+strings.Repeat("a", 300)+`","spec":""}`)
	c := newTestController(f)
	h := c.Handler()
	f.Fuzz(func(t *testing.T, route uint8, body string) {
		r := routes[int(route)%len(routes)]
		req := httptest.NewRequest(r.method, r.path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer secret")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code >= 500 {
			t.Fatalf("%s %s with %q: %d %s", r.method, r.path, body, w.Code, w.Body)
		}
		if w.Code != http.StatusNoContent && !json.Valid(w.Body.Bytes()) {
			t.Fatalf("%s %s with %q: body is not JSON: %q", r.method, r.path, body, w.Body)
		}
	})
}
