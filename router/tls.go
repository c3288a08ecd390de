package router

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// CertReloader serves a certificate and key read from two PEM files and reads them again
// when they change, so that a rotated certificate (certbot, cert-manager, a cron job)
// reaches new connections without a restart; connections already open keep the one they
// were made with. A pair that does not load (the two files written one after the other,
// a key that does not match) keeps the previous certificate, and the next change or
// Reload tries again.
type CertReloader struct {
	certFile, keyFile string
	log               *slog.Logger
	cert              atomic.Pointer[tls.Certificate]

	mu   sync.Mutex // serialises reloads; guards seen
	seen [2]fileStamp
}

// fileStamp is what says a file changed: a rotation by rename changes the inode's time
// and often its size, an in-place rewrite its modification time.
type fileStamp struct {
	mod  time.Time
	size int64
}

func stamp(path string) (fileStamp, error) {
	st, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{st.ModTime(), st.Size()}, nil
}

// NewCertReloader loads the pair once; an error here is the configuration's.
func NewCertReloader(certFile, keyFile string, log *slog.Logger) (*CertReloader, error) {
	r := &CertReloader{certFile: certFile, keyFile: keyFile, log: log}
	if _, err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload reads the pair again if either file changed since the last load; changed
// reports whether a new certificate is now served.
func (r *CertReloader) Reload() (changed bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cs, err := stamp(r.certFile)
	if err != nil {
		return false, fmt.Errorf("tls certificate: %w", err)
	}
	ks, err := stamp(r.keyFile)
	if err != nil {
		return false, fmt.Errorf("tls key: %w", err)
	}
	if r.cert.Load() != nil && [2]fileStamp{cs, ks} == r.seen {
		return false, nil
	}
	c, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return false, fmt.Errorf("tls certificate %s and key %s: %w", r.certFile, r.keyFile, err)
	}
	if c.Leaf == nil && len(c.Certificate) > 0 {
		c.Leaf, _ = x509.ParseCertificate(c.Certificate[0])
	}
	r.cert.Store(&c)
	r.seen = [2]fileStamp{cs, ks}
	return true, nil
}

// Watch polls the files every interval until ctx ends, reloading on a change.
func (r *CertReloader) Watch(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	var failing string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed, err := r.Reload()
		switch {
		case err != nil:
			// A rotation may be half done: say so once per distinct problem.
			if err.Error() != failing {
				r.log.Error("tls certificate not reloaded; serving the previous one", "err", err)
				failing = err.Error()
			}
		case changed:
			failing = ""
			r.log.Info("tls certificate reloaded", "cert", r.certFile, "not_after", r.cert.Load().Leaf.NotAfter)
		}
	}
}

// Config is the server side of TLS with the current certificate.
func (r *CertReloader) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return r.cert.Load(), nil
		},
		// HTTP/1.1 only: fasthttp does not speak HTTP/2.
		NextProtos: []string{"http/1.1"},
	}
}
