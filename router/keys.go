package router

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/valyala/fasthttp"
	"golang.org/x/time/rate"
	"gopkg.in/yaml.v3"

	"github.com/arbiter-serve/arbiter/fleet"
	"github.com/arbiter-serve/arbiter/oai"
)

// KeysEnv holds API keys given in the environment: name=key pairs separated by commas
// (a bare key is named key-N).
const KeysEnv = "ARBITER_API_KEYS"

// KeySpec is one client API key as written in a keys file. Give sha256 (the hex digest of
// the key, so the file holds no secret) or key (hashed on load and then forgotten).
type KeySpec struct {
	Name   string `yaml:"name"`
	SHA256 string `yaml:"sha256"`
	Key    string `yaml:"key"`
	// RequestsPerSecond and Burst limit the key's request rate (0: unlimited); Burst
	// defaults to one second's worth.
	RequestsPerSecond float64 `yaml:"requests_per_second"`
	Burst             int     `yaml:"burst"`
	// MaxConcurrency bounds the key's requests in flight, streams included (0: unlimited).
	MaxConcurrency int `yaml:"max_concurrency"`
	// Tenant groups keys that share one fair share and one budget (default: the key's
	// name). Priority is the band of the key's requests and the highest they may ask for
	// (critical, standard or sheddable; default standard); Weight its tenant's share of its
	// band when the fleet is saturated (default 1; keys of one tenant must agree).
	Tenant   string  `yaml:"tenant"`
	Priority string  `yaml:"priority"`
	Weight   float64 `yaml:"weight"`
}

type keysFile struct {
	Keys []KeySpec `yaml:"keys"`
	// Tenants gives tenants budgets (budgets.go).
	Tenants []TenantSpec `yaml:"tenants"`
}

// Key is a loaded client key: its name (the only thing metrics and logs show) and limits.
type Key struct {
	Name    string
	digest  [sha256.Size]byte
	limiter *rate.Limiter // nil: no rate limit
	maxConc int64
	// inflight is shared with the key of the same name in a reloaded set, so a reload
	// neither forgets nor double-counts the requests already open.
	inflight *atomic.Int64
	tenant   string
	band     Band
	weight   float64
}

// Keys authenticates client requests. A nil *Keys lets every request through.
type Keys struct {
	byDigest map[[sha256.Size]byte]*Key
	// budgets are the tenants' budgets, by tenant.
	budgets map[string]budget
}

// ParseKeys parses a keys file's content (nil: none) plus KeysEnv's value. It returns
// nil, nil when neither names a key: the router is then open, which is right on loopback
// and wrong anywhere else (Run warns).
func ParseKeys(file []byte, env string) (*Keys, error) {
	var specs []KeySpec
	var tenants []TenantSpec
	if file != nil {
		var f keysFile
		dec := yaml.NewDecoder(bytes.NewReader(file))
		dec.KnownFields(true)
		if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("api keys: %w", err)
		}
		if len(f.Keys) == 0 {
			return nil, errors.New("api keys: no keys (write keys: [{name: ..., sha256: ...}])")
		}
		specs, tenants = f.Keys, f.Tenants
	}
	for i, pair := range strings.Split(env, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		name, key, ok := strings.Cut(pair, "=")
		if !ok {
			name, key = "key-"+strconv.Itoa(i+1), pair
		}
		specs = append(specs, KeySpec{Name: name, Key: key})
	}
	if len(specs) == 0 {
		return nil, nil
	}
	ks := &Keys{byDigest: make(map[[sha256.Size]byte]*Key, len(specs))}
	names, weights := map[string]bool{}, map[string]*Key{}
	for i, s := range specs {
		k, err := s.load()
		if err != nil {
			return nil, fmt.Errorf("api keys[%d] (%s): %w", i, s.Name, err)
		}
		if names[k.Name] {
			return nil, fmt.Errorf("api keys[%d]: duplicate name %q", i, k.Name)
		}
		if ks.byDigest[k.digest] != nil {
			return nil, fmt.Errorf("api keys[%d] (%s): the same key as %s", i, k.Name, ks.byDigest[k.digest].Name)
		}
		// A tenant's keys share its weight: two that disagree would make its share depend
		// on which key asked last.
		if o := weights[k.tenant]; o != nil && o.weight != k.weight {
			return nil, fmt.Errorf("api keys[%d] (%s): tenant %q has weight %g here and %g on key %s; give its keys one weight", i, k.Name, k.tenant, k.weight, o.weight, o.Name)
		}
		weights[k.tenant] = k
		names[k.Name] = true
		ks.byDigest[k.digest] = k
	}
	if err := ks.loadTenants(tenants); err != nil {
		return nil, fmt.Errorf("api keys: %w", err)
	}
	return ks, nil
}

func (s KeySpec) load() (*Key, error) {
	if s.Name == "" {
		return nil, errors.New("name: required (it labels the key's metrics)")
	}
	k := &Key{Name: s.Name, maxConc: int64(s.MaxConcurrency), inflight: new(atomic.Int64)}
	switch {
	case (s.SHA256 == "") == (s.Key == ""):
		return nil, errors.New("give exactly one of sha256 (hex digest of the key) and key")
	case s.Key != "":
		if len(s.Key) < 16 {
			return nil, errors.New("key: shorter than 16 characters; use a random one (serve keys new)")
		}
		k.digest = sha256.Sum256([]byte(s.Key))
	default:
		d, err := hex.DecodeString(s.SHA256)
		if err != nil || len(d) != sha256.Size {
			return nil, fmt.Errorf("sha256 %q: want 64 hex digits (sha256sum of the key)", s.SHA256)
		}
		copy(k.digest[:], d)
	}
	if s.RequestsPerSecond < 0 || s.Burst < 0 || s.MaxConcurrency < 0 {
		return nil, errors.New("requests_per_second, burst and max_concurrency must be >= 0")
	}
	band, err := ParseBand(s.Priority)
	if err != nil {
		return nil, fmt.Errorf("priority: %w", err)
	}
	if math.IsNaN(s.Weight) || math.IsInf(s.Weight, 0) || s.Weight < 0 || s.Weight > 1e6 {
		return nil, fmt.Errorf("weight %g: want a positive number up to 1e6 (default 1)", s.Weight)
	}
	k.band, k.weight, k.tenant = band, s.Weight, s.Tenant
	if k.weight == 0 {
		k.weight = 1
	}
	if k.tenant == "" {
		k.tenant = s.Name
	}
	if err := fleet.CheckTenantName(k.tenant); err != nil {
		return nil, err
	}
	if s.RequestsPerSecond > 0 {
		burst := s.Burst
		if burst == 0 {
			burst = max(1, int(math.Ceil(s.RequestsPerSecond)))
		}
		k.limiter = rate.NewLimiter(rate.Limit(s.RequestsPerSecond), burst)
	}
	return k, nil
}

// carryOver makes ks continue old's in-flight counts for keys of the same name.
func (ks *Keys) carryOver(old *Keys) {
	if ks == nil || old == nil {
		return
	}
	byName := map[string]*Key{}
	for _, k := range old.byDigest {
		byName[k.Name] = k
	}
	for _, k := range ks.byDigest {
		if o := byName[k.Name]; o != nil {
			k.inflight = o.inflight
		}
	}
}

// HashKey is the digest a keys file stores for a key.
func HashKey(key string) string {
	d := sha256.Sum256([]byte(key))
	return hex.EncodeToString(d[:])
}

// authenticate finds the request's key. On failure it has answered 401.
func (ks *Keys) authenticate(ctx *fasthttp.RequestCtx) (*Key, bool) {
	k, f := ks.lookup(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
	if f != nil {
		f.writeTo(ctx)
		return nil, false
	}
	return k, true
}

// lookup finds the key an Authorization header names (nil Keys: none needed). Only
// digests are kept and compared: the map is keyed by the digest of what the client sent,
// so lookup time says nothing about how close a guess was, and the final comparison is
// constant-time.
func (ks *Keys) lookup(auth []byte) (*Key, *refusal) {
	if ks == nil {
		return nil, nil
	}
	const bearer = "Bearer "
	if len(auth) <= len(bearer) || !strings.EqualFold(string(auth[:len(bearer)]), bearer) {
		return nil, authRefusal("You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
	}
	d := sha256.Sum256(bytes.TrimSpace(auth[len(bearer):]))
	k := ks.byDigest[d]
	if k == nil || subtle.ConstantTimeCompare(k.digest[:], d[:]) != 1 {
		return nil, authRefusal("Incorrect API key provided.")
	}
	return k, nil
}

func authRefusal(msg string) *refusal {
	return &refusal{status: fasthttp.StatusUnauthorized, errType: oai.InvalidRequest, msg: msg, code: "invalid_api_key",
		reason: "unauthenticated", wwwAuthenticate: `Bearer realm="arbiter"`}
}

// admit applies the key's limits to one request; on refusal it has answered 429. A
// request admitted must call done exactly once when it ends (streams: when the stream does).
func (k *Key) admit(ctx *fasthttp.RequestCtx) bool {
	if f := k.take(); f != nil {
		f.writeTo(ctx)
		return false
	}
	return true
}

// take applies the key's limits to one request (nil: none); a request admitted must call
// done exactly once when it ends.
func (k *Key) take() *refusal {
	if k == nil {
		return nil
	}
	if k.limiter != nil && !k.limiter.Allow() {
		retry := max(1, int(math.Ceil(1/float64(k.limiter.Limit()))))
		return tooMany(retry, fmt.Sprintf("Rate limit reached for key %s: %.3g requests per second. Retry after %d s.", k.Name, float64(k.limiter.Limit()), retry))
	}
	if n := k.inflight.Add(1); k.maxConc > 0 && n > k.maxConc {
		k.inflight.Add(-1)
		return tooMany(1, fmt.Sprintf("Concurrency limit reached for key %s: %d requests in flight.", k.Name, k.maxConc))
	}
	return nil
}

func (k *Key) done() { k.inflight.Add(-1) }

// InFlight is the key's requests in flight.
func (k *Key) InFlight() int64 { return k.inflight.Load() }

func tooMany(retryAfter int, msg string) *refusal {
	return &refusal{status: fasthttp.StatusTooManyRequests, errType: oai.RateLimit, msg: msg, code: "rate_limit_exceeded",
		reason: "key_limited", retryAfter: retryAfter}
}

// label is the key's name for metrics ("" without authentication).
func (k *Key) label() string {
	if k == nil {
		return ""
	}
	return k.Name
}
