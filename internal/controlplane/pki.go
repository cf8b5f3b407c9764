package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the control plane's key material, as files under dir.
type pki struct{ dir string }

func (p pki) path(name string) string { return filepath.Join(p.dir, name) }

// The files of the PKI.
const (
	caCert        = "ca.crt"
	caKey         = "ca.key"
	servingCert   = "apiserver.crt"
	servingKey    = "apiserver.key"
	adminCert     = "admin.crt"
	adminKey      = "admin.key"
	serviceAcctKy = "service-account.key"
)

// validity of every certificate: long, because nothing renews them on one machine;
// a new state dir makes new ones.
const validity = 10 * 365 * 24 * time.Hour

// ensure creates whatever is missing. Existing files are kept, so the kubeconfig
// made from them stays valid.
func (p pki) ensure() error {
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return err
	}
	if !exists(p.path(caCert)) {
		// A new CA invalidates certificates signed by an older one.
		for _, f := range []string{servingCert, servingKey, adminCert, adminKey} {
			_ = os.Remove(p.path(f))
		}
		key, err := newKey()
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			Subject:               pkix.Name{CommonName: "bex control plane CA"},
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
			BasicConstraintsValid: true,
			IsCA:                  true,
		}
		if err := p.issue(caKey, caCert, key, tmpl, nil, nil); err != nil {
			return err
		}
	}
	ca, caPriv, err := p.load(caCert, caKey)
	if err != nil {
		return err
	}
	if !exists(p.path(servingCert)) {
		key, err := newKey()
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			Subject:     pkix.Name{CommonName: "kube-apiserver"},
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 96, 0, 1)},
		}
		if err := p.issue(servingKey, servingCert, key, tmpl, ca, caPriv); err != nil {
			return err
		}
	}
	if !exists(p.path(adminCert)) {
		key, err := newKey()
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			Subject:     pkix.Name{CommonName: "bex-admin", Organization: []string{"system:masters"}},
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		if err := p.issue(adminKey, adminCert, key, tmpl, ca, caPriv); err != nil {
			return err
		}
	}
	if !exists(p.path(serviceAcctKy)) {
		key, err := newKey()
		if err != nil {
			return err
		}
		if err := writeKey(p.path(serviceAcctKy), key); err != nil {
			return err
		}
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

// issue signs tmpl with the parent (self-signed when parent is nil) and writes the
// key and certificate.
func (p pki) issue(keyFile, certFile string, key *ecdsa.PrivateKey, tmpl, parent *x509.Certificate, parentKey crypto.Signer) error {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(validity)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		return fmt.Errorf("issue %s: %w", certFile, err)
	}
	if err := writeKey(p.path(keyFile), key); err != nil {
		return err
	}
	return writeAtomic(p.path(certFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writeAtomic(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

// writeAtomic writes through a temporary file and a rename, so a crash never
// leaves half a certificate that the next start would trust.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (p pki) load(certFile, keyFile string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPEM, err := os.ReadFile(p.path(certFile))
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(p.path(keyFile))
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New(p.dir + ": a certificate or key is not PEM; remove the directory to make new ones")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}
