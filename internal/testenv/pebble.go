package testenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"bex.co/bex/internal/pki"
)

// Pebble is a running Pebble, Let's Encrypt's ACME test server, on loopback.
type Pebble struct {
	// DirectoryURL is the ACME directory, https://127.0.0.1:PORT/dir.
	DirectoryURL string
	// ManagementURL is Pebble's management API (for /roots/0, the root that issues
	// the test certificates).
	ManagementURL string
	// TLSConfig trusts the certificate of Pebble's own HTTPS listeners.
	TLSConfig *tls.Config
	// HTTPPort and TLSPort are where Pebble's validator connects for HTTP-01 and
	// TLS-ALPN-01 challenges: the edge under test listens there.
	HTTPPort, TLSPort int

	proc, dns *process
}

// StartPebble starts Pebble from bin/ with a fresh listener certificate, a config
// under dir, and free loopback ports. Validation skips Pebble's random sleeps.
func StartPebble(dir string) (*Pebble, error) {
	bin, err := Binary("pebble")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := selfSignedLoopbackCert()
	if err != nil {
		return nil, err
	}
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certPath, certPEM, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	var ports [5]int
	for i := range ports {
		if ports[i], err = FreePort(); err != nil {
			return nil, err
		}
	}
	p := &Pebble{
		DirectoryURL:  fmt.Sprintf("https://127.0.0.1:%d/dir", ports[0]),
		ManagementURL: fmt.Sprintf("https://127.0.0.1:%d", ports[1]),
		HTTPPort:      ports[2],
		TLSPort:       ports[3],
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	p.TLSConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}

	config := map[string]any{"pebble": map[string]any{
		"listenAddress":                  fmt.Sprintf("127.0.0.1:%d", ports[0]),
		"managementListenAddress":        fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"certificate":                    certPath,
		"privateKey":                     keyPath,
		"httpPort":                       p.HTTPPort,
		"tlsPort":                        p.TLSPort,
		"ocspResponderURL":               "",
		"externalAccountBindingRequired": false,
	}}
	data, _ := json.Marshal(config)
	configPath := filepath.Join(dir, "pebble.json")
	if err := os.WriteFile(configPath, data, 0o600); err != nil {
		return nil, err
	}
	// Pebble's validator resolves names through pebble-challtestsrv's DNS server,
	// which answers 127.0.0.1 for every name: any domain an edge test uses is
	// validated against the edge on loopback.
	dnsBin, err := Binary("pebble-challtestsrv")
	if err != nil {
		return nil, err
	}
	dnsAddr := fmt.Sprintf("127.0.0.1:%d", ports[4])
	p.dns, err = startProcess(dir, "pebble-challtestsrv", dnsBin, []string{
		"-dnsserver", dnsAddr, "-defaultIPv4", "127.0.0.1", "-defaultIPv6", "",
		"-http01", "", "-https01", "", "-doh", "", "-tlsalpn01", "", "-management", "",
	})
	if err != nil {
		return nil, err
	}
	p.proc, err = startProcess(dir, "pebble", bin, []string{"-config", configPath, "-dnsserver", dnsAddr},
		"PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0")
	if err != nil {
		_ = p.dns.stop(5 * time.Second)
		return nil, err
	}
	err = p.proc.waitReady(30*time.Second, func(ctx context.Context) error {
		_, err := p.Directory(ctx)
		return err
	})
	if err != nil {
		_ = p.Stop()
		return nil, err
	}
	return p, nil
}

// Client is an HTTP client that trusts Pebble's listeners.
func (p *Pebble) Client() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: p.TLSConfig}, Timeout: 10 * time.Second}
}

// get fetches url from Pebble and returns the body of a 200 answer.
func (p *Pebble) get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.Client().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return body, nil
}

// Directory fetches and decodes the ACME directory.
func (p *Pebble) Directory(ctx context.Context) (map[string]any, error) {
	body, err := p.get(ctx, p.DirectoryURL)
	if err != nil {
		return nil, err
	}
	dir := map[string]any{}
	if err := json.Unmarshal(body, &dir); err != nil {
		return nil, fmt.Errorf("ACME directory: %w", err)
	}
	return dir, nil
}

// Stop stops Pebble and its DNS server.
func (p *Pebble) Stop() error {
	return errors.Join(p.proc.stop(5*time.Second), p.dns.stop(5*time.Second))
}

// Roots fetches the root certificate that signs Pebble's certificates, for clients
// of what was issued to trust.
func (p *Pebble) Roots(ctx context.Context) (*x509.CertPool, error) {
	data, err := p.get(ctx, p.ManagementURL+"/roots/0")
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("GET /roots/0: no certificate in %q", data)
	}
	return pool, nil
}

// selfSignedLoopbackCert makes a certificate for 127.0.0.1, ::1 and localhost.
func selfSignedLoopbackCert() (certPEM, keyPEM []byte, err error) {
	key, err := pki.NewKey()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "bex testenv"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := pki.Sign(tmpl, nil, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = pki.EncodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pki.EncodeCert(der), keyPEM, nil
}

// SharedPebble returns the Pebble of this test binary, started on first use.
func SharedPebble(t testing.TB) *Pebble {
	t.Helper()
	return Shared(t, "pebble", func(dir string) (*Pebble, func() error, error) {
		p, err := StartPebble(dir)
		if err != nil {
			return nil, nil, err
		}
		return p, p.Stop, nil
	})
}
