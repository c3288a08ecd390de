package control

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/replicas"
	"github.com/arbiter-serve/arbiter/state"
)

const zeroSpec = `service:
  readiness_probe: /health
  replica_policy: {min_replicas: 0, max_replicas: 2}
run: exec replicasim -listen 127.0.0.1:$PORT
arbiter:
  model: m1
  scale_to_zero_after_seconds: 60
  autoscaling: {signal: concurrency}
`

// newTestAPI is a controller with a real state file and the local provider; its services
// stay at zero replicas, so nothing is launched.
func newTestAPI(t *testing.T) (*Controller, *httptest.Server) {
	t.Helper()
	c := newTestController(t)
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	return c, srv
}

func newTestController(t testing.TB) *Controller {
	t.Helper()
	dir := t.TempDir()
	st, err := state.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	local, err := replicas.NewLocal(replicas.LocalConfig{Owner: "api-test-" + filepath.Base(dir), LogDir: filepath.Join(dir, "logs")})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(context.Background(), Config{Store: st, Providers: map[string]replicas.Provider{"local": local}, Token: "secret",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func call(t *testing.T, srv *httptest.Server, method, path, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func submit(name, spec string) string {
	b, _ := json.Marshal(SubmitRequest{Name: name, Spec: spec})
	return string(b)
}

func TestAPIServicesAndErrors(t *testing.T) {
	_, srv := newTestAPI(t)
	if code, _ := call(t, srv, "GET", "/v1/services", "", ""); code != 401 {
		t.Fatalf("no token: %d; want 401", code)
	}
	if code, _ := call(t, srv, "GET", "/v1/services", "wrong", ""); code != 401 {
		t.Fatalf("wrong token: %d; want 401", code)
	}
	if code, _ := call(t, srv, "GET", "/v1/health", "", ""); code != 200 {
		t.Fatalf("health needs no token: %d", code)
	}
	if code, body := call(t, srv, "POST", "/v1/services", "secret", submit("svc", zeroSpec)); code != 201 || !strings.Contains(body, `"version":1`) {
		t.Fatalf("create: %d %s", code, body)
	}
	if code, body := call(t, srv, "POST", "/v1/services", "secret", submit("svc", zeroSpec)); code != 200 || !strings.Contains(body, `"version":1,"unchanged":true`) {
		t.Fatalf("create twice with the same spec: %d %s; want 200, version 1, unchanged", code, body)
	}
	if code, body := call(t, srv, "POST", "/v1/services", "secret", submit("svc", strings.Replace(zeroSpec, "max_replicas: 2", "max_replicas: 3", 1))); code != 409 || !strings.Contains(body, "serve update") {
		t.Fatalf("create twice with another spec: %d %s; want 409 pointing at serve update", code, body)
	}
	bad := strings.Replace(zeroSpec, "replica_policy", "replica_polcy", 1)
	if code, body := call(t, srv, "POST", "/v1/services", "secret", submit("other", bad)); code != 400 || !strings.Contains(body, "other.yaml:3:") || !strings.Contains(body, "replica_policy") {
		t.Fatalf("bad spec: %d %s; want 400 with file:line and the suggestion", code, body)
	}
	if code, _ := call(t, srv, "POST", "/v1/services", "secret", submit("Bad Name", zeroSpec)); code != 400 {
		t.Fatalf("invalid service name: %d; want 400", code)
	}
	if code, _ := call(t, srv, "POST", "/v1/services", "secret", "{not json"); code != 400 {
		t.Fatalf("malformed JSON: %d; want 400", code)
	}
	if code, _ := call(t, srv, "PUT", "/v1/services/nope", "secret", submit("", zeroSpec)); code != 404 {
		t.Fatalf("update unknown: %d; want 404", code)
	}
	if code, body := call(t, srv, "PUT", "/v1/services/svc", "secret", submit("", zeroSpec+"# unchanged\n")); code != 200 || !strings.Contains(body, `"version":1,"unchanged":true`) {
		t.Fatalf("update with the spec version 1 runs: %d %s; want version 1, unchanged", code, body)
	}
	// Another service claiming svc's model (m1) is refused, at create and at update, naming svc.
	if code, body := call(t, srv, "POST", "/v1/services", "secret", submit("rival", zeroSpec)); code != 409 || !strings.Contains(body, `model \"m1\" is served by service \"svc\"`) {
		t.Fatalf("a second service claiming svc's model: %d %s; want 409 naming svc", code, body)
	}
	own := strings.Replace(zeroSpec, "model: m1", "model: m2", 1)
	if code, body := call(t, srv, "POST", "/v1/services", "secret", submit("rival", own)); code != 201 {
		t.Fatalf("rival with its own model: %d %s", code, body)
	}
	if code, body := call(t, srv, "PUT", "/v1/services/rival", "secret", submit("", zeroSpec)); code != 409 || !strings.Contains(body, `served by service \"svc\"`) {
		t.Fatalf("rival updated to claim svc's model: %d %s; want 409", code, body)
	}
	if code, body := call(t, srv, "DELETE", "/v1/services/rival", "secret", ""); code >= 300 {
		t.Fatalf("delete rival: %d %s", code, body)
	}
	changed := strings.Replace(zeroSpec, "max_replicas: 2", "max_replicas: 3", 1)
	if code, body := call(t, srv, "PUT", "/v1/services/svc", "secret", submit("", changed)); code != 200 || !strings.Contains(body, `"version":2`) || strings.Contains(body, "unchanged") {
		t.Fatalf("update: %d %s", code, body)
	}
	code, body := call(t, srv, "GET", "/v1/services/svc", "secret", "")
	var st ServiceStatus
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil || st.Version != 2 || st.Status != "scaled_to_zero" || st.Models[0] != "m1" {
		t.Fatalf("get: %d %s", code, body)
	}
	if code, _ := call(t, srv, "POST", "/v1/wake", "secret", `{"model":"unknown"}`); code != 404 {
		t.Fatalf("wake unknown model: %d; want 404", code)
	}
	if code, _ := call(t, srv, "POST", "/v1/load", "secret", `{"models":[]}`); code != 400 {
		t.Fatalf("load report without router: %d; want 400", code)
	}
	if code, _ := call(t, srv, "POST", "/v1/services", "secret", strings.Repeat("x", maxBody+10)); code != 400 {
		t.Fatalf("oversized body that is not JSON: %d; want 400", code)
	}
	if code, body := call(t, srv, "POST", "/v1/services", "secret", `{"name":"big","spec":"`+strings.Repeat("x", maxBody+10)+`"}`); code != 413 || !strings.Contains(body, "over") {
		t.Fatalf("oversized spec: %d %s; want 413", code, body)
	}
	if code, _ := call(t, srv, "GET", "/v1/services/nope", "secret", ""); code != 404 {
		t.Fatalf("get unknown: %d", code)
	}
}

// The ready set is a long poll: a caller at the current revision is answered when the set
// changes, not after its whole wait.
func TestReadySetLongPoll(t *testing.T) {
	c, srv := newTestAPI(t)
	set, _ := c.ReadySet()
	done := make(chan fleet.ReadySet, 1)
	start := time.Now()
	go func() {
		_, body := call(t, srv, "GET", "/v1/readyset?after="+strconv.FormatUint(set.Revision, 10)+"&wait=20s", "secret", "")
		var got fleet.ReadySet
		_ = json.Unmarshal([]byte(body), &got)
		done <- got
	}()
	time.Sleep(100 * time.Millisecond)
	if _, _, err := c.Create(context.Background(), "svc", zeroSpec, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-done:
		if got.Revision <= set.Revision || len(got.Services) != 1 || got.Services[0].Models[0] != "m1" {
			t.Fatalf("ready set after create: %+v", got)
		}
		if waited := time.Since(start); waited > 5*time.Second {
			t.Fatalf("long poll answered after %v; want at the change", waited)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("long poll not answered after the set changed")
	}
	if err := c.Wake("m1"); err != nil {
		t.Fatalf("wake a known model: %v", err)
	}
}

// Every number in a router's load report is checked: one absurd report (1e308 tokens once
// made the totals +Inf and broke every status after it) is refused with 400 and changes
// nothing; the service's status still renders and good reports still count.
func TestAbsurdLoadReportsAreRefused(t *testing.T) {
	c, srv := newTestAPI(t)
	if code, body := call(t, srv, "POST", "/v1/services", "secret", submit("svc", zeroSpec)); code != 201 && code != 200 {
		t.Fatalf("create: %d %s", code, body)
	}
	report := func(models, replicas string) string {
		return `{"router":"r1","models":[` + models + `],"replicas":[` + replicas + `]}`
	}
	for _, bad := range []string{
		report(`{"model":"m1","tokens":1e308}`, ``),
		report(`{"model":"m1","requests":-1}`, ``),
		report(`{"model":"m1","in_flight":1e9}`, ``),
		report(``, `{"replica_id":"x","kv_usage":7}`),
		report(``, `{"replica_id":"x","tokens_per_second":1e300}`),
		report(``, `{"replica_id":"x","slo_judged":3,"slo_misses":5}`), // more misses than answers judged
		report(``, `{"replica_id":"x","slo_judged":-3}`),
		`{"router":"","models":[]}`,
		`{"router":"r1","models":[{"model":"m1","tokens":1e400}]}`, // not even a float64
		// The request mix: a class that does not exist, a NaN-like count, a mean outside
		// its class, a class given twice.
		report(`{"model":"m1","mix":[{"prompt":9,"output":0,"requests":1,"prompt_tokens":5,"output_tokens":5}]}`, ``),
		report(`{"model":"m1","mix":[{"prompt":0,"output":0,"requests":1e300,"prompt_tokens":5,"output_tokens":5}]}`, ``),
		report(`{"model":"m1","mix":[{"prompt":0,"output":0,"requests":10,"prompt_tokens":5000,"output_tokens":10}]}`, ``),
		report(`{"model":"m1","mix":[{"prompt":0,"output":0,"requests":1,"prompt_tokens":5,"output_tokens":5},{"prompt":0,"output":0,"requests":1,"prompt_tokens":5,"output_tokens":5}]}`, ``),
	} {
		if code, body := call(t, srv, "POST", "/v1/load", "secret", bad); code != 400 {
			t.Fatalf("report %s: %d %s; want 400", bad, code, body)
		}
	}
	if code, body := call(t, srv, "POST", "/v1/load", "secret", report(`{"model":"m1","mix":[{"prompt":0,"output":0,"requests":10,"prompt_tokens":5000,"output_tokens":10}]}`, ``)); code != 400 ||
		!strings.Contains(body, "models[0] (m1): mix[0]: prompt_tokens: 5000 over 10 requests: want a mean from 0 to 127 tokens") {
		t.Fatalf("a mix out of its class: %d %s; want 400 saying which cell and why", code, body)
	}
	if got := c.Mix("svc"); got != nil {
		t.Fatalf("refused reports changed the mix: %+v", got)
	}
	if code, body := call(t, srv, "POST", "/v1/load", "secret", report(`{"model":"m1","requests":3,"tokens":1200}`, ``)); code != 200 {
		t.Fatalf("a good report: %d %s", code, body)
	}
	c.tick(context.Background())
	c.wg.Wait()
	code, body := call(t, srv, "GET", "/v1/services/svc", "secret", "")
	if code != 200 || !strings.Contains(body, `"tokens":1200`) {
		t.Fatalf("status after the reports: %d %s; want 1200 tokens counted", code, body)
	}
}

// What a version stores beside its file: a flat map of --env values (all that earlier
// versions stored, and still what one without secrets stores), or both kinds; either reads
// back as it was given.
func TestStoredVarsReadBothForms(t *testing.T) {
	for _, v := range []Vars{
		{},
		{Envs: map[string]string{"MODEL": "m", "v": "2"}},
		{Envs: map[string]string{"MODEL": "m"}, Secrets: map[string]string{"HF_TOKEN": "hf_x"}},
		{Secrets: map[string]string{"HF_TOKEN": "hf_x"}},
	} {
		text := varsJSON(v)
		got, err := storedVars(text)
		if err != nil {
			t.Fatalf("%s: %v", text, err)
		}
		if len(got.Envs) != len(v.Envs) || len(got.Secrets) != len(v.Secrets) || got.Envs["MODEL"] != v.Envs["MODEL"] || got.Secrets["HF_TOKEN"] != v.Secrets["HF_TOKEN"] {
			t.Errorf("%s read back as %+v, want %+v", text, got, v)
		}
	}
	if got, err := storedVars(`{"MODEL":"m"}`); err != nil || got.Envs["MODEL"] != "m" || got.Secrets != nil {
		t.Errorf("an earlier version's envs: %+v %v", got, err)
	}
	// The update mode rides with them, and an env named mode is not one.
	text := versionJSON(Vars{Envs: map[string]string{"mode": "x"}}, ModeBlueGreen)
	if got, err := storedVars(text); err != nil || got.Envs["mode"] != "x" || storedMode(text) != ModeBlueGreen {
		t.Errorf("%s read back as %+v (mode %q) %v", text, got, storedMode(text), err)
	}
	if m := storedMode(varsJSON(Vars{Envs: map[string]string{"mode": "blue_green"}})); m != "" {
		t.Errorf("an env named mode read as the update mode %q", m)
	}
	if text := versionJSON(Vars{Envs: map[string]string{"A": "b"}}, ModeRolling); text != `{"A":"b"}` {
		t.Errorf("a rolling update stores %s; want the flat form earlier versions read", text)
	}
}
