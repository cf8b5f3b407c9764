package clusterapi

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"bex.co/bex/internal/pki"
)

// WebhookServingCert makes a CA and a serving certificate for 127.0.0.1, valid for
// validFor, writes the certificate and key as tls.crt and tls.key into
// dir/webhook-certs, which every manager serves its webhooks with
// (Manager.Args), and returns the CA (PEM: the caBundle of the CRDs and webhook
// configurations) and that directory.
func WebhookServingCert(dir, caName string, validFor time.Duration) (caPEM []byte, certDir string, err error) {
	notBefore, notAfter := time.Now().Add(-time.Hour), time.Now().Add(validFor)
	ca, caKey, caDER, err := pki.NewCA(&x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: caName},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature})
	if err != nil {
		return nil, "", err
	}
	key, err := pki.NewKey()
	if err != nil {
		return nil, "", err
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: notBefore, NotAfter: notAfter, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := pki.Sign(leaf, ca, key.Public(), caKey)
	if err != nil {
		return nil, "", err
	}
	certDir = filepath.Join(dir, "webhook-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, "", err
	}
	if err := pki.WriteCert(filepath.Join(certDir, "tls.crt"), der, 0o600); err != nil {
		return nil, "", err
	}
	if err := pki.WriteKey(filepath.Join(certDir, "tls.key"), key); err != nil {
		return nil, "", err
	}
	return pki.EncodeCert(caDER), certDir, nil
}
