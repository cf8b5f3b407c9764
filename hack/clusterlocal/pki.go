package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"os"
	"time"

	"bex.co/bex/internal/pki"
)

// certificate is one certificate the cluster's components present: to the API
// server as a client (the common name is the user, the organizations its groups),
// or as a server (the SANs).
type certificate struct {
	name   string
	cn     string
	orgs   []string
	ips    []net.IP
	dns    []string
	server bool
}

// certificates are the cluster's identities. The node's components use the
// identities the API server's default RBAC and its Node authorizer know, so no
// extra RBAC is needed for them.
func (l *layout) certificates() []certificate {
	nodeIP := net.IP(l.nodeIP.AsSlice())
	return []certificate{
		{name: "apiserver", cn: "kube-apiserver", server: true,
			ips: []net.IP{nodeIP, net.ParseIP(apiService), net.ParseIP("127.0.0.1")},
			dns: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc." + clusterDomain}},
		{name: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}},
		{name: "admin", cn: "bex-local-admin", orgs: []string{"system:masters"}},
		{name: "kubelet", cn: "system:node:" + nodeName, orgs: []string{"system:nodes"}, server: true,
			ips: []net.IP{nodeIP}, dns: []string{nodeName}},
		{name: "controller-manager", cn: "system:kube-controller-manager"},
		{name: "scheduler", cn: "system:kube-scheduler"},
		{name: "proxy", cn: "system:kube-proxy"},
	}
}

// writePKI makes the cluster's CA, the certificates and the service-account signing
// key under DIR/pki, unless the CA is there already (a cluster brought up again in
// the same DIR keeps its identities, and kubeconfigs written before stay valid).
func (l *layout) writePKI() error {
	if _, err := os.Stat(l.pki("ca.crt")); err == nil {
		return nil
	}
	if err := os.MkdirAll(l.path("pki"), 0o700); err != nil {
		return err
	}
	// etcd has a CA of its own: a certificate of the cluster's CA (a kubelet's, say)
	// must not open etcd, which only the API server talks to.
	etcdCA, etcdKey, etcdDER, err := newCA("bex-local-etcd-ca-" + l.id)
	if err != nil {
		return err
	}
	for _, c := range []certificate{
		{name: "etcd-server", cn: "etcd", server: true, ips: []net.IP{net.ParseIP("127.0.0.1")}},
		{name: "apiserver-etcd-client", cn: "kube-apiserver-etcd-client"},
	} {
		if err := issue(l.pki(c.name), c, etcdCA, etcdKey); err != nil {
			return err
		}
	}
	if err := pki.WriteKey(l.pki("etcd-ca.key"), etcdKey); err != nil {
		return err
	}
	if err := pki.WriteCert(l.pki("etcd-ca.crt"), etcdDER, 0o644); err != nil {
		return err
	}
	ca, caKey, caDER, err := newCA("bex-local-ca-" + l.id)
	if err != nil {
		return err
	}
	for _, c := range l.certificates() {
		if err := issue(l.pki(c.name), c, ca, caKey); err != nil {
			return err
		}
	}
	saKey, err := pki.NewKey()
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return err
	}
	if err := pki.WritePEM(l.pki("sa.pub"), "PUBLIC KEY", pub, 0o644); err != nil {
		return err
	}
	if err := pki.WriteKey(l.pki("sa.key"), saKey); err != nil {
		return err
	}
	// The CA last: its presence says the whole PKI is there.
	if err := pki.WriteKey(l.pki("ca.key"), caKey); err != nil {
		return err
	}
	return pki.WriteCert(l.pki("ca.crt"), caDER, 0o644)
}

// newCA makes a self-signed CA valid for ten years (a developer's cluster is not
// rotated; down and up in a new DIR makes a new one).
func newCA(cn string) (*x509.Certificate, *ecdsa.PrivateKey, []byte, error) {
	now := time.Now()
	return pki.NewCA(&x509.Certificate{
		Subject:   pkix.Name{CommonName: cn},
		NotBefore: now.Add(-time.Hour),
		NotAfter:  now.AddDate(10, 0, 0),
		KeyUsage:  x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	})
}

// issue writes base.crt and base.key: c, signed by ca.
func issue(base string, c certificate, ca *x509.Certificate, caKey crypto.Signer) error {
	key, err := pki.NewKey()
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: c.cn, Organization: c.orgs},
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.AddDate(10, 0, 0),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		IPAddresses: c.ips,
		DNSNames:    c.dns,
	}
	if c.server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	der, err := pki.Sign(tmpl, ca, key.Public(), caKey)
	if err != nil {
		return fmt.Errorf("certificate %s: %w", c.name, err)
	}
	if err := pki.WriteKey(base+".key", key); err != nil {
		return err
	}
	return pki.WriteCert(base+".crt", der, 0o644)
}
