package s3fake

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

const keyID, secret = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"

// presign signs a GET of url as of when, valid for expires (SigV4 query parameters).
func presign(t *testing.T, url string, when time.Time, expires time.Duration, key string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+"?X-Amz-Expires="+strconv.Itoa(int(expires.Seconds())), nil)
	if err != nil {
		t.Fatal(err)
	}
	signed, _, err := v4.NewSigner().PresignHTTP(context.Background(), aws.Credentials{AccessKeyID: keyID, SecretAccessKey: key},
		req, "UNSIGNED-PAYLOAD", "s3", "us-east-1", when)
	if err != nil {
		t.Fatal(err)
	}
	return signed
}

func status(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A presigned GET is served while it is valid and signed with the account's key; an
// expired one, one signed with another key, and an unsigned GET are refused with S3's
// codes.
func TestPresignedGet(t *testing.T) {
	s := New(Config{Buckets: []string{"b"}, AccessKeyID: keyID, SecretAccessKey: secret})
	s.objects["b/k.tar.gz"] = Object{Data: []byte("archive"), ETag: `"x"`, LastModified: time.Now()}
	srv := httptest.NewServer(s)
	defer srv.Close()
	obj := srv.URL + "/b/k.tar.gz"
	if code, body := status(t, presign(t, obj, time.Now(), 3600*time.Second, secret)); code != 200 || body != "archive" {
		t.Fatalf("valid: %d %s", code, body)
	}
	for name, c := range map[string]struct {
		url, want string
	}{
		"expired":  {presign(t, obj, time.Now().Add(-2*time.Hour), 3600*time.Second, secret), "<Code>AccessDenied</Code><Message>Request has expired</Message>"},
		"wrongkey": {presign(t, obj, time.Now(), 3600*time.Second, "not-the-secret"), "<Code>SignatureDoesNotMatch</Code>"},
		"unsigned": {obj, "<Code>AccessDenied</Code>"},
	} {
		if code, body := status(t, c.url); code != http.StatusForbidden || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %s; want 403 with %s", name, code, body, c.want)
		}
	}
}
