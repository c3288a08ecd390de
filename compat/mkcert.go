//go:build ignore

// mkcert makes the certificates compat/tls.sh serves with, at test time: a CA (kept in
// the folder, so that a later run can issue a rotated leaf from it) and a leaf for
// 127.0.0.1 and localhost with the given serial number.
//
//	go run compat/mkcert.go -dir DIR -serial N
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

func main() {
	dir := flag.String("dir", "", "folder for ca.pem, ca-key.pem, cert.pem and key.pem")
	serial := flag.Int64("serial", 1, "the leaf's serial number")
	flag.Parse()
	if err := run(*dir, *serial); err != nil {
		fmt.Fprintln(os.Stderr, "mkcert:", err)
		os.Exit(1)
	}
}

func run(dir string, serial int64) error {
	if dir == "" {
		return errors.New("-dir is required")
	}
	ca, caKey, err := loadOrMakeCA(dir)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	// Key first, then certificate, each renamed into place as rotation tools do.
	if err := writeAtomic(filepath.Join(dir, "key.pem"), "EC PRIVATE KEY", kb); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, "cert.pem"), "CERTIFICATE", der)
}

func loadOrMakeCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	if cb, err := os.ReadFile(filepath.Join(dir, "ca.pem")); err == nil {
		kb, err := os.ReadFile(filepath.Join(dir, "ca-key.pem"))
		if err != nil {
			return nil, nil, err
		}
		cblock, _ := pem.Decode(cb)
		kblock, _ := pem.Decode(kb)
		if cblock == nil || kblock == nil {
			return nil, nil, errors.New("ca.pem or ca-key.pem is not PEM")
		}
		ca, err := x509.ParseCertificate(cblock.Bytes)
		if err != nil {
			return nil, nil, err
		}
		key, err := x509.ParseECPrivateKey(kblock.Bytes)
		return ca, key, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "arbiter compat test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	if err := writeAtomic(filepath.Join(dir, "ca-key.pem"), "EC PRIVATE KEY", kb); err != nil {
		return nil, nil, err
	}
	if err := writeAtomic(filepath.Join(dir, "ca.pem"), "CERTIFICATE", der); err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

func writeAtomic(path, kind string, der []byte) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
