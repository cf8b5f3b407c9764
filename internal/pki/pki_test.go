package pki

import (
	"crypto/ecdsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestACASignsALeafThatVerifies: a CA and a serving certificate written and read
// back verify for the leaf's name, with P-256 keys and random serials.
func TestACASignsALeafThatVerifies(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ca, caKey, caDER, err := NewCA(&x509.Certificate{
		Subject:   pkix.Name{CommonName: "test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !ca.IsCA || ca.SerialNumber.Sign() <= 0 {
		t.Fatalf("the CA: IsCA %v, serial %v", ca.IsCA, ca.SerialNumber)
	}
	if err := WriteCert(filepath.Join(dir, "ca.crt"), caDER, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteKey(filepath.Join(dir, "ca.key"), caKey); err != nil {
		t.Fatal(err)
	}
	ca2, caKey2, caPEM, err := Load(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil || !ca2.Equal(ca) || !caKey2.Equal(caKey) || len(caPEM) == 0 {
		t.Fatalf("Load: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "ca.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the key's mode: %v %v", fi.Mode(), err)
	}
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	der, err := Sign(&x509.Certificate{
		Subject:   pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca2, key.Public(), caKey2)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "localhost"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok {
		t.Fatalf("the leaf's key is %T", leaf.PublicKey)
	}
}

func TestLoadRefusesWhatIsNotPEM(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"a", "b"} {
		if err := WriteFile(filepath.Join(dir, f), []byte("not pem"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, _, err := Load(filepath.Join(dir, "a"), filepath.Join(dir, "b")); !errors.Is(err, ErrNotPEM) {
		t.Fatalf("got %v, want ErrNotPEM", err)
	}
}
