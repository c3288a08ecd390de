// Package s3fake is a stateful stand-in for Amazon S3's REST API, for tests: the official
// SDK talks to it over real HTTP on loopback (s3.Options.BaseEndpoint, path-style
// addressing: /BUCKET/KEY), and curl fetches from it by presigned URL as an EC2 instance's
// user data does. It answers the operations the aws provider uses, shaped on the S3 API
// Reference:
//
//   - PutObject (https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObject.html):
//     200 with an ETag, checking x-amz-checksum-sha256 when the request gives one;
//   - HeadObject (https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadObject.html):
//     200 with Content-Length, ETag and Last-Modified, or the status alone (a HEAD
//     response has no body): 404 for a missing key, 403 when access is denied;
//   - GetObject (https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html),
//     signed or by a presigned URL (SigV4 query parameters,
//     https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-query-string-auth.html), whose
//     signature it checks with the account's secret key and whose expiry it enforces.
//
// Errors use S3's XML error document and codes
// (https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html): NoSuchBucket,
// NoSuchKey, AccessDenied, SlowDown (503), BadDigest. Faults are injected on purpose:
// SlowDown answers to the next PUTs, and buckets that deny every request.
package s3fake

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// Config shapes the fake account.
type Config struct {
	// Buckets that exist.
	Buckets []string
	// AccessKeyID and SecretAccessKey are the account's credentials: a presigned URL must
	// be signed with them.
	AccessKeyID, SecretAccessKey string
	// MaxObject bounds one PUT's body (default 64 MiB).
	MaxObject int64
}

// Object is a stored object.
type Object struct {
	Data         []byte
	ContentType  string
	ETag         string
	LastModified time.Time
}

// Server is the fake endpoint; serve it with httptest.NewServer(s).
type Server struct {
	cfg Config

	mu       sync.Mutex
	objects  map[string]Object // bucket/key → object
	buckets  map[string]bool
	denied   map[string]bool // buckets that answer AccessDenied
	slowDown int             // PUTs still to answer 503 SlowDown
	calls    map[string]int
}

// New returns a fake account.
func New(cfg Config) *Server {
	if cfg.MaxObject <= 0 {
		cfg.MaxObject = 64 << 20
	}
	s := &Server{cfg: cfg, objects: map[string]Object{}, buckets: map[string]bool{}, denied: map[string]bool{}, calls: map[string]int{}}
	for _, b := range cfg.Buckets {
		s.buckets[b] = true
	}
	return s
}

// SlowDown makes the next n PUTs answer 503 SlowDown, as S3 does to a request rate it
// has not scaled to yet.
func (s *Server) SlowDown(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slowDown = n
}

// Deny makes every request to bucket answer 403 AccessDenied (a bucket policy, or
// credentials without s3:PutObject), or lifts that.
func (s *Server) Deny(bucket string, deny bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.denied[bucket] = deny
}

// Calls counts the requests of one operation (PutObject, HeadObject, GetObject), failed
// ones included; presigned GETs count as GetObject.
func (s *Server) Calls(op string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[op]
}

// Objects lists the stored keys as bucket/key.
func (s *Server) Objects() map[string]Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Object, len(s.objects))
	for k, v := range s.objects {
		out[k] = v
	}
	return out
}

var credentialRE = regexp.MustCompile(`Credential=([^/]+)/(\d{8})/([a-z0-9-]+)/s3/aws4_request`)

type errorXML struct {
	XMLName   xml.Name `xml:"Error"`
	Code      string   `xml:"Code"`
	Message   string   `xml:"Message"`
	Resource  string   `xml:"Resource,omitempty"`
	RequestID string   `xml:"RequestId"`
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reqID := fmt.Sprintf("%016X", time.Now().UnixNano())
	w.Header().Set("x-amz-request-id", reqID)
	fail := func(status int, code, msg string) {
		if r.Method == http.MethodHead {
			// A HEAD response carries no body: the SDK reads the status alone.
			w.WriteHeader(status)
			return
		}
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, xml.Header)
		_ = xml.NewEncoder(w).Encode(errorXML{Code: code, Message: msg, Resource: r.URL.Path, RequestID: reqID})
	}
	bucket, key, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	op := map[string]string{http.MethodPut: "PutObject", http.MethodHead: "HeadObject", http.MethodGet: "GetObject"}[r.Method]
	s.mu.Lock()
	s.calls[op]++
	s.mu.Unlock()
	if op == "" || bucket == "" || key == "" {
		fail(http.StatusNotImplemented, "NotImplemented", "A header or operation you provided implies functionality that is not implemented.")
		return
	}
	q := r.URL.Query()
	if q.Get("X-Amz-Signature") != "" {
		if r.Method != http.MethodGet {
			fail(http.StatusForbidden, "AccessDenied", "Only GET is presigned here.")
			return
		}
		if code, msg := s.checkPresigned(r); code != "" {
			fail(http.StatusForbidden, code, msg)
			return
		}
	} else if m := credentialRE.FindStringSubmatch(r.Header.Get("Authorization")); m == nil || m[1] != s.cfg.AccessKeyID {
		fail(http.StatusForbidden, "AccessDenied", "Access Denied")
		return
	}
	s.mu.Lock()
	exists, denied := s.buckets[bucket], s.denied[bucket]
	slow := r.Method == http.MethodPut && s.slowDown > 0
	if slow {
		s.slowDown--
	}
	obj, found := s.objects[bucket+"/"+key]
	s.mu.Unlock()
	switch {
	case !exists:
		fail(http.StatusNotFound, "NoSuchBucket", "The specified bucket does not exist")
		return
	case denied:
		fail(http.StatusForbidden, "AccessDenied", "Access Denied")
		return
	case slow:
		_, _ = io.Copy(io.Discard, r.Body)
		fail(http.StatusServiceUnavailable, "SlowDown", "Please reduce your request rate.")
		return
	}
	switch r.Method {
	case http.MethodPut:
		if r.Header.Get("x-amz-copy-source") != "" || strings.Contains(r.Header.Get("Content-Encoding"), "aws-chunked") {
			fail(http.StatusNotImplemented, "NotImplemented", "s3fake: copies and aws-chunked uploads are not implemented")
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, s.cfg.MaxObject+1))
		if err != nil {
			fail(http.StatusBadRequest, "IncompleteBody", err.Error())
			return
		}
		if int64(len(body)) > s.cfg.MaxObject {
			fail(http.StatusBadRequest, "EntityTooLarge", "Your proposed upload exceeds the maximum allowed object size.")
			return
		}
		sum := sha256.Sum256(body)
		if h := r.Header.Get("x-amz-checksum-sha256"); h != "" && h != base64.StdEncoding.EncodeToString(sum[:]) {
			fail(http.StatusBadRequest, "BadDigest", "The SHA256 you specified did not match the calculated checksum.")
			return
		}
		if h := r.Header.Get("x-amz-content-sha256"); h != "" && !strings.HasPrefix(h, "UNSIGNED") && !strings.HasPrefix(h, "STREAMING") && h != hex.EncodeToString(sum[:]) {
			fail(http.StatusBadRequest, "XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match what was computed.")
			return
		}
		m := md5.Sum(body)
		o := Object{Data: body, ContentType: r.Header.Get("Content-Type"), ETag: `"` + hex.EncodeToString(m[:]) + `"`, LastModified: time.Now().UTC()}
		s.mu.Lock()
		s.objects[bucket+"/"+key] = o
		s.mu.Unlock()
		w.Header().Set("ETag", o.ETag)
		if h := r.Header.Get("x-amz-checksum-sha256"); h != "" {
			w.Header().Set("x-amz-checksum-sha256", h)
		}
		w.WriteHeader(http.StatusOK)
	case http.MethodHead, http.MethodGet:
		if !found {
			fail(http.StatusNotFound, "NoSuchKey", "The specified key does not exist.")
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(obj.Data)))
		w.Header().Set("ETag", obj.ETag)
		w.Header().Set("Last-Modified", obj.LastModified.Format(http.TimeFormat))
		if obj.ContentType != "" {
			w.Header().Set("Content-Type", obj.ContentType)
		}
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			_, _ = io.Copy(w, bytes.NewReader(obj.Data))
		}
	}
}

// checkPresigned checks a presigned URL's SigV4 query parameters: its credential, its
// expiry, and its signature, recomputed with the account's secret key.
func (s *Server) checkPresigned(r *http.Request) (code, msg string) {
	q := r.URL.Query()
	for _, k := range []string{"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders"} {
		if q.Get(k) == "" {
			return "AuthorizationQueryParametersError", "Query-string authentication version 4 requires the X-Amz-Algorithm, X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, and X-Amz-Expires parameters."
		}
	}
	cred := strings.Split(q.Get("X-Amz-Credential"), "/")
	if len(cred) != 5 || cred[0] != s.cfg.AccessKeyID || cred[3] != "s3" {
		return "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."
	}
	signed, err := time.Parse("20060102T150405Z", q.Get("X-Amz-Date"))
	expires, err2 := strconv.Atoi(q.Get("X-Amz-Expires"))
	if err != nil || err2 != nil || expires < 1 || expires > 604800 {
		return "AuthorizationQueryParametersError", "X-Amz-Date or X-Amz-Expires is malformed (X-Amz-Expires must be 1 to 604800 seconds)."
	}
	if time.Now().After(signed.Add(time.Duration(expires) * time.Second)) {
		return "AccessDenied", "Request has expired"
	}
	// Sign the same request again (the URL less its signature) and compare.
	u := *r.URL
	u.Scheme, u.Host = "http", r.Host
	uq := u.Query()
	sig := uq.Get("X-Amz-Signature")
	uq.Del("X-Amz-Signature")
	u.RawQuery = uq.Encode()
	req, err := http.NewRequest(http.MethodGet, u.String(), nil)
	if err != nil {
		return "AccessDenied", err.Error()
	}
	creds := aws.Credentials{AccessKeyID: s.cfg.AccessKeyID, SecretAccessKey: s.cfg.SecretAccessKey, SessionToken: q.Get("X-Amz-Security-Token")}
	again, _, err := v4.NewSigner().PresignHTTP(context.Background(), creds, req, "UNSIGNED-PAYLOAD", "s3", cred[2], signed)
	if err != nil {
		return "AccessDenied", err.Error()
	}
	au, err := url.Parse(again)
	if err != nil || au.Query().Get("X-Amz-Signature") != sig {
		return "SignatureDoesNotMatch", "The request signature we calculated does not match the signature you provided. Check your key and signing method."
	}
	return "", ""
}
