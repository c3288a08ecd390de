package router

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCA is a certificate authority made at test time, which clients are told to trust.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "arbiter test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf issues a server certificate for 127.0.0.1 and localhost with the given serial,
// as PEM certificate and key.
func (ca *testCA) leaf(t *testing.T, serial int64) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// writeAtomic replaces path as rotation tools do: a new file renamed over the old.
func writeAtomic(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// The router serves its endpoint over HTTPS with the configured pair, to a client that
// verifies it against the CA; after the files change, new connections get the new
// certificate; a half-done rotation (a certificate whose key is not there yet) keeps the
// previous one serving.
func TestRouterServesTLSAndRotates(t *testing.T) {
	s := startSim(t, simOpts{echo: true})
	dir := t.TempDir()
	ca := newTestCA(t)
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	c1, k1 := ca.leaf(t, 101)
	writeAtomic(t, certFile, c1)
	writeAtomic(t, keyFile, k1)
	replicaFile := filepath.Join(dir, "replicas.yaml")
	if err := os.WriteFile(replicaFile, fmt.Appendf(nil, "replicas:\n  - {id: r1, address: %q, model: %s, provider: local, capacity: reserved}\n", s.addr, testModel), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Defaults()
	cfg.TLSCertFile, cfg.TLSKeyFile = certFile, keyFile
	cfg.Probe.Interval = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	reloadc := make(chan func(), 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", Config: cfg, ReplicaFile: replicaFile,
			Log: slog.New(slog.DiscardHandler), Ready: func(l, _ net.Addr) { ready <- l }, Reload: func(f func()) { reloadc <- f }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("router did not start")
	}
	reload := <-reloadc
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.pem)
	// A new connection for every request, so each sees the certificate served now.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true}}
	url := "https://" + addr.String() + "/v1/chat/completions"
	serial := func() int64 {
		t.Helper()
		resp, err := client.Post(url, "application/json", strings.NewReader(chatBody(false, "")))
		if err != nil {
			t.Fatalf("POST over TLS: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber.Int64()
	}
	waitFor(t, "the replica to be ready behind TLS", func() bool {
		resp, err := client.Post(url, "application/json", strings.NewReader(chatBody(false, "")))
		if err != nil {
			t.Fatalf("POST over TLS: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if got := serial(); got != 101 {
		t.Fatalf("serial %d, want 101", got)
	}
	// Plain HTTP on the TLS port is not served.
	if resp, err := http.Post("http://"+addr.String()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(false, ""))); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP answered 200 on the TLS endpoint")
		}
	}

	// Rotation: the watcher picks up the new pair.
	c2, k2 := ca.leaf(t, 102)
	writeAtomic(t, keyFile, k2)
	writeAtomic(t, certFile, c2)
	waitFor(t, "new connections to get the rotated certificate", func() bool { return serial() == 102 })

	// Half a rotation: the new certificate without its key keeps 102 serving.
	c3, k3 := ca.leaf(t, 103)
	writeAtomic(t, certFile, c3)
	reload()
	for range 5 {
		if got := serial(); got != 102 {
			t.Fatalf("serial %d during a half-done rotation, want the previous 102", got)
		}
	}
	// The key arrives; a reload (SIGHUP) serves it at once.
	writeAtomic(t, keyFile, k3)
	reload()
	if got := serial(); got != 103 {
		t.Fatalf("serial %d right after the reload, want 103", got)
	}
}

func TestTLSConfigNeedsBoth(t *testing.T) {
	cfg := Defaults()
	cfg.TLSCertFile = "cert.pem"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "give both") {
		t.Fatalf("Validate = %v", err)
	}
}
