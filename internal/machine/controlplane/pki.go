package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"bex.co/bex/internal/pki"
)

// pkiDir is the control plane's key material, as files under dir.
type pkiDir struct{ dir string }

func (p pkiDir) path(name string) string { return filepath.Join(p.dir, name) }

// The files of the PKI.
const (
	caCert        = "ca.crt"
	caKey         = "ca.key"
	servingCert   = "apiserver.crt"
	servingKey    = "apiserver.key"
	adminCert     = "admin.crt"
	adminKey      = "admin.key"
	serviceAcctKy = "service-account.key"

	// etcd has a CA of its own, as kubeadm gives it: a certificate for etcd's
	// clients is then never a user of the API, and the admin's (which the
	// kubeconfig carries around) never a client of etcd.
	etcdCACert     = "etcd/ca.crt"
	etcdCAKey      = "etcd/ca.key"
	etcdServerCert = "etcd/server.crt"
	etcdServerKey  = "etcd/server.key"
	etcdClientCert = "apiserver-etcd-client.crt"
	etcdClientKey  = "apiserver-etcd-client.key"
)

// validity of every certificate: long, because nothing renews them on one machine;
// a new state dir makes new ones.
const validity = 10 * 365 * 24 * time.Hour

// ensure creates whatever is missing. Existing files are kept, so the kubeconfig
// made from them stays valid; a state dir made by an older bex (without etcd's
// certificates) gets the missing ones and keeps the rest.
func (p pkiDir) ensure() error {
	for _, dir := range []string{p.dir, p.path("etcd")} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		// An older bex made pki/ 0700 too; make sure of it, it holds private keys.
		if err := os.Chmod(dir, 0o700); err != nil {
			return err
		}
	}
	if err := p.ensureCA(caCert, caKey, "bex control plane CA", servingCert, adminCert); err != nil {
		return err
	}
	if err := p.ensureCA(etcdCACert, etcdCAKey, "bex etcd CA", etcdServerCert, etcdClientCert); err != nil {
		return err
	}
	loopback := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	leaves := []struct {
		ca, caKey, cert, key string
		tmpl                 *x509.Certificate
	}{
		{caCert, caKey, servingCert, servingKey, &x509.Certificate{
			Subject:     pkix.Name{CommonName: "kube-apiserver"},
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
			IPAddresses: append(loopback, net.IPv4(10, 96, 0, 1)),
		}},
		{caCert, caKey, adminCert, adminKey, &x509.Certificate{
			Subject:     pkix.Name{CommonName: "bex-admin", Organization: []string{"system:masters"}},
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}},
		{etcdCACert, etcdCAKey, etcdServerCert, etcdServerKey, &x509.Certificate{
			Subject:  pkix.Name{CommonName: "etcd"},
			KeyUsage: x509.KeyUsageDigitalSignature,
			// Client too: etcd's JSON gateway dials etcd's gRPC with this certificate.
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			DNSNames:    []string{"localhost"},
			IPAddresses: loopback,
		}},
		{etcdCACert, etcdCAKey, etcdClientCert, etcdClientKey, &x509.Certificate{
			Subject:     pkix.Name{CommonName: "kube-apiserver-etcd-client"},
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}},
	}
	for _, l := range leaves {
		if exists(p.path(l.cert)) && exists(p.path(l.key)) {
			continue
		}
		ca, caPriv, err := p.load(l.ca, l.caKey)
		if err != nil {
			return err
		}
		key, err := pki.NewKey()
		if err != nil {
			return err
		}
		if err := p.issue(l.key, l.cert, key, l.tmpl, ca, caPriv); err != nil {
			return err
		}
	}
	if !exists(p.path(serviceAcctKy)) {
		key, err := pki.NewKey()
		if err != nil {
			return err
		}
		if err := pki.WriteKey(p.path(serviceAcctKy), key); err != nil {
			return err
		}
	}
	return nil
}

// ensureCA makes a self-signed CA when there is none. A new CA invalidates the
// certificates signed by an older one, so those (issued) are removed to be made
// again.
func (p pkiDir) ensureCA(certFile, keyFile, name string, issued ...string) error {
	if exists(p.path(certFile)) && exists(p.path(keyFile)) {
		return nil
	}
	for _, f := range issued {
		_ = os.Remove(p.path(f))
	}
	key, err := pki.NewKey()
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	return p.issue(keyFile, certFile, key, tmpl, nil, nil)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// issue signs tmpl with the parent (self-signed when parent is nil) and writes the
// key and certificate.
func (p pkiDir) issue(keyFile, certFile string, key *ecdsa.PrivateKey, tmpl, parent *x509.Certificate, parentKey crypto.Signer) error {
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(validity)
	if parent == nil {
		parentKey = key
	}
	der, err := pki.Sign(tmpl, parent, key.Public(), parentKey)
	if err != nil {
		return fmt.Errorf("issue %s: %w", certFile, err)
	}
	if err := pki.WriteKey(p.path(keyFile), key); err != nil {
		return err
	}
	// Certificates are public, but only root reads them here (the kubeconfig
	// carries its own inline): 0600 as the rest of the state dir.
	return pki.WriteCert(p.path(certFile), der, 0o600)
}

func (p pkiDir) load(certFile, keyFile string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cert, key, _, err := pki.Load(p.path(certFile), p.path(keyFile))
	if errors.Is(err, pki.ErrNotPEM) {
		return nil, nil, errors.New(p.dir + ": a certificate or key is not PEM; remove the directory to make new ones")
	}
	return cert, key, err
}
