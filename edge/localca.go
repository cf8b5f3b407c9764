package edge

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/caddyserver/certmagic"

	"bex.co/bex/internal/pki"
)

// LocalCA issues certificates for development domains (such as *.localhost) that no
// public CA will sign. It is created once in its directory and kept, so browsers and
// `curl --cacert DIR/ca.pem` that trust it once keep trusting it.
type LocalCA struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
}

// UsesLocalCA is the rule that picks the local CA over ACME: no ACME CA and no
// account email were given, or the base domain is localhost (no public CA signs
// for it). bex edge follows it, and bex up to tell users what to trust.
func UsesLocalCA(acmeCA, acmeEmail, baseDomain string) bool {
	return (acmeCA == "" && acmeEmail == "") || baseDomain == "localhost"
}

// CertLifetime is how long a certificate of the local CA is valid; certmagic renews
// it well before.
const CertLifetime = 30 * 24 * time.Hour

// LoadOrCreateLocalCA reads the CA in dir (ca.pem, ca-key.pem), creating it on first
// use.
func LoadOrCreateLocalCA(dir string) (*LocalCA, error) {
	certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	if _, err := os.Stat(certPath); errors.Is(err, os.ErrNotExist) {
		if err := createLocalCA(dir, certPath, keyPath); err != nil {
			return nil, fmt.Errorf("create the local CA in %s: %w", dir, err)
		}
	}
	cert, key, certPEM, err := pki.Load(certPath, keyPath)
	if errors.Is(err, pki.ErrNotPEM) {
		return nil, fmt.Errorf("the local CA in %s is damaged: remove ca.pem and ca-key.pem to make a new one (clients must trust the new ca.pem)", dir)
	}
	if err != nil {
		return nil, err
	}
	return &LocalCA{cert: cert, key: key, certPEM: certPEM}, nil
}

func createLocalCA(dir, certPath, keyPath string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	_, key, der, err := pki.NewCA(&x509.Certificate{
		Subject:        pkix.Name{CommonName: "bex local CA", Organization: []string{"bex"}},
		NotBefore:      time.Now().Add(-time.Hour),
		NotAfter:       time.Now().AddDate(10, 0, 0),
		KeyUsage:       x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		MaxPathLenZero: true,
	})
	if err != nil {
		return err
	}
	// The key is written first: a ca.pem without its key is never left behind.
	if err := pki.WriteKey(keyPath, key); err != nil {
		return err
	}
	return pki.WriteCert(certPath, der, 0o644)
}

// CertPEM is the CA's certificate, for clients to trust.
func (ca *LocalCA) CertPEM() []byte { return ca.certPEM }

// Issue signs the CSR's names; it implements certmagic.Issuer.
func (ca *LocalCA) Issue(_ context.Context, csr *x509.CertificateRequest) (*certmagic.IssuedCertificate, error) {
	if err := csr.CheckSignature(); err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: firstName(csr)},
		DNSNames:    csr.DNSNames,
		IPAddresses: csr.IPAddresses,
		NotBefore:   time.Now().Add(-5 * time.Minute),
		NotAfter:    time.Now().Add(CertLifetime),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := pki.Sign(tmpl, ca.cert, csr.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	chain := append(pki.EncodeCert(der), ca.certPEM...)
	return &certmagic.IssuedCertificate{Certificate: chain}, nil
}

// IssuerKey tells certmagic's storage apart per CA.
func (ca *LocalCA) IssuerKey() string {
	sum := sha256.Sum256(ca.cert.Raw)
	return "bex-local-ca-" + hex.EncodeToString(sum[:8])
}

func firstName(csr *x509.CertificateRequest) string {
	if len(csr.DNSNames) > 0 {
		return csr.DNSNames[0]
	}
	return csr.Subject.CommonName
}
