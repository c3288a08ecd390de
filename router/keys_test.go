package router

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/arbiter-serve/arbiter/fleet"
)

const (
	aliceKey = "sk-alice-0123456789abcdef"
	bobKey   = "sk-bob-0123456789abcdef01"
)

func keyedRouter(t *testing.T, s *sim, keysYAML string, mod func(*Config)) *rig {
	t.Helper()
	ks, err := ParseKeys([]byte(keysYAML), "")
	if err != nil {
		t.Fatal(err)
	}
	return startRouterWith(t, mod, func(px *Proxy, _ *Pool) { px.SetKeys(ks) }, replica("a", s, fleet.Reserved, 0))
}

func openAIError(t *testing.T, body string) (typ, code string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" {
		t.Fatalf("not an OpenAI error body: %q (%v)", body, err)
	}
	if e.Error.Code != nil {
		code = *e.Error.Code
	}
	return e.Error.Type, code
}

// Without a key, or with a wrong one, every /v1 path answers 401 in OpenAI's shape; a
// listed key (stored only as its digest) passes, and its requests and tokens are counted
// under its name.
func TestAPIKeysAuthenticate(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	r := keyedRouter(t, s, fmt.Sprintf("keys:\n  - {name: alice, sha256: %s}\n  - {name: bob, key: %s}\n", HashKey(aliceKey), bobKey), nil)
	for _, tc := range []struct{ name, auth string }{
		{"no header", ""}, {"wrong key", "Bearer sk-not-a-key-000000000"}, {"basic auth", "Basic " + aliceKey},
		{"key's digest instead of the key", "Bearer " + HashKey(aliceKey)},
	} {
		var hdr []string
		if tc.auth != "" {
			hdr = []string{"Authorization", tc.auth}
		}
		resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""), hdr...)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s: status %d; want 401", tc.name, resp.StatusCode)
		}
		if _, code := openAIError(t, body); code != "invalid_api_key" {
			t.Errorf("%s: error code %q; want invalid_api_key", tc.name, code)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, r.url+"/v1/models", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/v1/models without a key: %v %v; want 401", resp.StatusCode, err)
	}
	for _, k := range []string{aliceKey, aliceKey, bobKey} {
		resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "Authorization", "Bearer "+k)
		if resp.StatusCode != 200 {
			t.Fatalf("with a valid key: %d %s", resp.StatusCode, body)
		}
	}
	if got := r.counter(t, "arbiter_router_key_requests_total", "key", "alice", "code", "200"); got != 2 {
		t.Errorf("alice's requests = %v; want 2", got)
	}
	if got := r.counter(t, "arbiter_router_key_tokens_total", "key", "bob", "type", "completion"); got != 5 {
		t.Errorf("bob's completion tokens = %v; want 5", got)
	}
	if got := r.counter(t, "arbiter_router_errors_total", "reason", "unauthenticated"); got != 5 {
		t.Errorf("unauthenticated errors = %v; want 5", got)
	}
}

// A key's concurrency limit counts a stream until its end; the key's count returns to 0
// on every exit path; its rate limit refuses with 429 and Retry-After.
func TestAPIKeyLimits(t *testing.T) {
	s := startSim(t, simOpts{echo: true, interval: 40 * time.Millisecond})
	r := keyedRouter(t, s, fmt.Sprintf("keys:\n  - {name: one, key: %s, max_concurrency: 1}\n  - {name: rl, key: %s, requests_per_second: 0.5, burst: 2}\n", aliceKey, bobKey), nil)
	key := r.px.keys.Load().byDigest
	var one *Key
	for _, k := range key {
		if k.Name == "one" {
			one = k
		}
	}

	// A stream holds the key's only slot until it ends.
	req, _ := http.NewRequest(http.MethodPost, r.url+"/v1/chat/completions", strings.NewReader(chatBody(true, "")))
	req.Header.Set("Authorization", "Bearer "+aliceKey)
	stream, err := http.DefaultClient.Do(req)
	if err != nil || stream.StatusCode != 200 {
		t.Fatalf("stream: %v %v", stream, err)
	}
	resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "Authorization", "Bearer "+aliceKey)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second request while the stream runs: %d %s; want 429", resp.StatusCode, body)
	}
	if typ, code := openAIError(t, body); typ != "rate_limit_error" || code != "rate_limit_exceeded" {
		t.Errorf("429 body type %q code %q", typ, code)
	}
	_, _ = io.Copy(io.Discard, stream.Body)
	stream.Body.Close()
	waitFor(t, "the key's slot released after the stream", func() bool { return one.InFlight() == 0 })
	// Bad input and a client that leaves mid-stream release it too.
	if resp, _ := post(t, r.url+"/v1/chat/completions", `{"model":`, "Authorization", "Bearer "+aliceKey); resp.StatusCode != 400 {
		t.Fatalf("malformed JSON: %d", resp.StatusCode)
	}
	if one.InFlight() != 0 {
		t.Fatalf("in flight %d after a 400", one.InFlight())
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	b := chatBody(true, "")
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", aliceKey, len(b), b)
	if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || !strings.Contains(line, "200") {
		t.Fatalf("raw stream: %q %v", line, err)
	}
	conn.Close()
	waitFor(t, "the key's slot released after the client left", func() bool { return one.InFlight() == 0 })
	if resp, body := post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "Authorization", "Bearer "+aliceKey); resp.StatusCode != 200 {
		t.Fatalf("after the stream: %d %s", resp.StatusCode, body)
	}

	// Rate: a burst of 2, then refused with a Retry-After.
	codes := []int{}
	var last *http.Response
	for range 3 {
		last, _ = post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "Authorization", "Bearer "+bobKey)
		codes = append(codes, last.StatusCode)
	}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
		t.Fatalf("codes %v; want 200 200 429", codes)
	}
	if ra := last.Header.Get("Retry-After"); ra != "2" {
		t.Errorf("Retry-After %q; want 2 (one request per 2 s)", ra)
	}
	if got := r.counter(t, "arbiter_router_key_requests_total", "key", "rl", "code", "429"); got != 1 {
		t.Errorf("rl's 429s = %v; want 1", got)
	}
}

// A reloaded key set keeps counting the requests already open under each key's name.
func TestKeysReloadKeepsInFlight(t *testing.T) {
	old, err := ParseKeys(nil, "a="+aliceKey)
	if err != nil {
		t.Fatal(err)
	}
	var k *Key
	for _, v := range old.byDigest {
		k = v
	}
	k.inflight.Add(1)
	nu, err := ParseKeys(nil, "a="+bobKey)
	if err != nil {
		t.Fatal(err)
	}
	nu.carryOver(old)
	for _, v := range nu.byDigest {
		if v.InFlight() != 1 {
			t.Fatalf("in flight after reload %d; want 1", v.InFlight())
		}
	}
}

func TestParseKeysErrors(t *testing.T) {
	for _, tc := range []struct{ file, env, want string }{
		{"keys: []", "", "no keys"},
		{"keys: [{sha256: " + HashKey(aliceKey) + "}]", "", "name: required"},
		{"keys: [{name: a}]", "", "exactly one of sha256"},
		{"keys: [{name: a, key: short}]", "", "shorter than 16"},
		{"keys: [{name: a, sha256: abc}]", "", "64 hex digits"},
		{"keys: [{name: a, key: " + aliceKey + "}, {name: a, key: " + bobKey + "}]", "", "duplicate name"},
		{"keys: [{name: a, key: " + aliceKey + "}]", "b=" + aliceKey, "the same key as a"},
		{"keys: [{name: a, key: " + aliceKey + ", max_concurrency: -1}]", "", ">= 0"},
		{"keys: [{name: a, kee: x}]", "", "field kee not found"},
		{"keys: [{name: a, key: " + aliceKey, "", "api keys"},
		{"keys: [{name: a, key: " + aliceKey + ", priority: urgent}]", "", `unknown priority "urgent"`},
		{"keys: [{name: a, key: " + aliceKey + ", weight: -1}]", "", "weight -1"},
		{"keys: [{name: a, key: " + aliceKey + ", tenant: t, weight: 2}, {name: b, key: " + bobKey + ", tenant: t}]", "", `tenant "t" has weight 1 here and 2 on key a`},
		{"keys: [{name: a, key: " + aliceKey + ", tenant: \"x\\ty\"}]", "", "control characters"},
	} {
		_, err := ParseKeys([]byte(tc.file), tc.env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseKeys(%q, %q) = %v; want an error with %q", tc.file, tc.env, err, tc.want)
		}
	}
	if ks, err := ParseKeys(nil, " "); ks != nil || err != nil {
		t.Errorf("no keys at all: %v %v; want nil, nil (open)", ks, err)
	}
}

// A client that sends its headers slowly is cut off at read_timeout; headers over
// max_header_bytes get 431.
func TestSlowAndOversizedHeaders(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	r := startRouter(t, func(c *Config) { c.ReadTimeout = 300 * time.Millisecond; c.MaxHeaderBytes = 4096 }, replica("a", s, fleet.Reserved, 0))
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	_, _ = conn.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	for {
		// Trickle one header byte at a time, slower than any real client.
		if _, err := conn.Write([]byte("X")); err != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := conn.Read(buf); err != nil && !isTimeout(err) {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("a slow client held its connection for 5 s against a 300 ms read timeout")
		}
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("slow client cut off after %s; want about the 300 ms read timeout", el)
	}
	resp, _ := post(t, r.url+"/v1/chat/completions", chatBody(false, ""), "X-Big", strings.Repeat("a", 8000))
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("8 KB header against a 4 KB limit: %d; want 431", resp.StatusCode)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// A key's priority is its requests' band and the highest they may ask for: a lower band
// is taken, a higher one capped, an unknown one refused; a tenant groups keys.
func TestRequestBand(t *testing.T) {
	ks, err := ParseKeys([]byte("keys: [{name: app, key: "+aliceKey+", tenant: acme, priority: critical, weight: 3}, {name: batch, key: "+bobKey+", tenant: acme-batch, priority: sheddable}]"), "k3=sk-k3-0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	key := func(k string) *Key { return lookupKey(t, ks, k) }
	app, batch, k3 := key(aliceKey), key(bobKey), key("sk-k3-0123456789abcdef")
	if tenantOf(app) != "acme" || weightOf(app) != 3 || tenantOf(k3) != "k3" || weightOf(k3) != 1 || tenantOf(nil) != DefaultTenant {
		t.Fatalf("tenants %q %v, %q %v, %q", tenantOf(app), weightOf(app), tenantOf(k3), weightOf(k3), tenantOf(nil))
	}
	hdr := func(name, value string) func(string) []byte {
		return func(h string) []byte {
			if h == name {
				return []byte(value)
			}
			return nil
		}
	}
	for _, tc := range []struct {
		k           *Key
		header      func(string) []byte
		want        Band
		capped      bool
		errContains string
	}{
		{app, hdr("", ""), Critical, false, ""},
		{app, hdr(PriorityHeader, "sheddable"), Sheddable, false, ""},
		{batch, hdr("", ""), Sheddable, false, ""},
		{batch, hdr(PriorityHeader, "critical"), Sheddable, true, ""},
		{batch, hdr(gieObjectiveHeader, "Standard"), Sheddable, true, ""},
		{k3, hdr("", ""), Standard, false, ""},
		{k3, hdr(PriorityHeader, "critical"), Standard, true, ""},
		{nil, hdr(PriorityHeader, "critical"), Critical, false, ""},
		{nil, hdr(gieObjectiveHeader, "sheddable"), Sheddable, false, ""},
		{nil, hdr(PriorityHeader, "urgent"), 0, false, `X-Arbiter-Priority: unknown priority "urgent"`},
		{nil, hdr(gieObjectiveHeader, "premium-traffic"), 0, false, `X-Gateway-Inference-Objective: unknown priority "premium-traffic"`},
	} {
		ceiling, keyed, _ := serviceBand(tc.k, nil)
		b, capped, err := requestBand(ceiling, keyed, tc.header)
		if tc.errContains != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errContains) {
				t.Errorf("key %s: err %v; want %q", tc.k.label(), err, tc.errContains)
			}
			continue
		}
		if err != nil || b != tc.want || capped != tc.capped {
			t.Errorf("key %s: band %v capped %v err %v; want %v capped %v", tc.k.label(), b, capped, err, tc.want, tc.capped)
		}
	}
}

// A service's own bands and weights for its tenants (arbiter.tenants) outrank the keys
// file's for its requests; a tenant it does not name keeps the keys file's, and a request
// without a key runs in the "default" tenant's band where the service names one.
func TestServiceBandOutranksTheKeysFile(t *testing.T) {
	ks, err := ParseKeys([]byte("keys: [{name: app, key: "+appKey+", priority: critical, weight: 2}, {name: batch, key: "+batchKey+", tenant: nightly, priority: standard}]"), "")
	if err != nil {
		t.Fatal(err)
	}
	app, batch := lookupKey(t, ks, appKey), lookupKey(t, ks, batchKey)
	svc := []fleet.TenantBand{{Name: "nightly", Priority: "sheddable", Weight: 3}, {Name: "app", Weight: 5}, {Name: DefaultTenant, Priority: "sheddable"}}
	for _, c := range []struct {
		k      *Key
		svc    []fleet.TenantBand
		band   Band
		keyed  bool
		weight float64
	}{
		{batch, nil, Standard, true, 1},
		{batch, svc, Sheddable, true, 3},
		{app, svc, Critical, true, 5}, // its weight from the service, its band from its key
		{nil, nil, Critical, false, 1},
		{nil, svc, Sheddable, true, 1},
	} {
		band, keyed, weight := serviceBand(c.k, c.svc)
		if band != c.band || keyed != c.keyed || weight != c.weight {
			t.Errorf("key %s, service tenants %v: band %v keyed %v weight %v; want %v %v %v", c.k.label(), c.svc, band, keyed, weight, c.band, c.keyed, c.weight)
		}
	}
	// A keyless request in a service that makes "default" sheddable cannot raise itself.
	ceiling, keyed, _ := serviceBand(nil, svc)
	if b, capped, _ := requestBand(ceiling, keyed, func(h string) []byte {
		if h == PriorityHeader {
			return []byte("critical")
		}
		return nil
	}); b != Sheddable || !capped {
		t.Errorf("keyless, default sheddable, asking critical: %v capped %v; want sheddable, capped", b, capped)
	}
}

// lookupKey is the key ks knows by its secret k.
func lookupKey(t *testing.T, ks *Keys, k string) *Key {
	t.Helper()
	got, f := ks.lookup([]byte("Bearer " + k))
	if f != nil {
		t.Fatal(f.msg)
	}
	return got
}
