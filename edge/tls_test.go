package edge

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"bex.co/bex/edge/secretstore"
)

func TestLocalCAIsCreatedOnceAndKept(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadOrCreateLocalCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadOrCreateLocalCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.CertPEM(), b.CertPEM()) || a.IssuerKey() != b.IssuerKey() {
		t.Fatal("the local CA changed between two loads")
	}
	if fi, err := os.Stat(filepath.Join(dir, "ca-key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("CA key file: %v %v", fi, err)
	}
	os.WriteFile(filepath.Join(dir, "ca.pem"), []byte("garbage"), 0o644)
	if _, err := LoadOrCreateLocalCA(dir); err == nil || !strings.Contains(err.Error(), "remove ca.pem and ca-key.pem") {
		t.Fatalf("damaged CA: %v", err)
	}
}

// TestHTTPSWithTheLocalCA serves the proxy over TLS with certificates of the local
// CA obtained on demand: a routed name gets one that a client trusting ca.pem
// accepts (as `curl --cacert ca.pem` would); a name no app serves gets none, and
// nothing is issued for it.
func TestHTTPSWithTheLocalCA(t *testing.T) {
	t.Run("file storage", func(t *testing.T) { testHTTPSWithTheLocalCA(t, false) })
	t.Run("secret storage", func(t *testing.T) { testHTTPSWithTheLocalCA(t, true) })
}

func testHTTPSWithTheLocalCA(t *testing.T, secrets bool) {
	e := newEnv(t, Config{})
	e.createApp("web", nil)
	_, p := backend(t, "hello over https")
	e.createSlice("web", "web-1", nil, p)
	e.waitBackends("web.localhost", 1)

	ca, err := LoadOrCreateLocalCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	storage := t.TempDir()
	store := FileStorage(storage)
	if secrets {
		if store, err = secretstore.New(secretstore.Config{Namespace: e.ns}, e.kube); err != nil {
			t.Fatal(err)
		}
	}
	certs, err := NewCertificates(e.table, store, ca, nil, slog.New(slog.NewTextHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug})), e.reg)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, e.proxy, certs.TLSConfig())

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	client := clientTo(addr, roots)
	resp, err := client.Get("https://web.localhost/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "hello over https" {
		t.Fatalf("GET https://web.localhost/ = %s %q", resp.Status, body)
	}
	if resp.Proto != "HTTP/2.0" {
		t.Errorf("protocol %s, want HTTP/2.0", resp.Proto)
	}

	if _, err := client.Get("https://nobody.localhost/"); err == nil {
		t.Fatal("a name no app serves got a certificate")
	}
	if !strings.Contains(e.log.String(), "no certificate for an unrouted name") || !strings.Contains(e.log.String(), "host=nobody.localhost") {
		t.Fatalf("the log does not say why nobody.localhost got no certificate:\n%s", e.log.String())
	}
	if issued := storedCertificates(store); len(issued) != 1 || issued[0] != "web.localhost.crt" {
		t.Fatalf("certificates issued: %v, want only web.localhost.crt", issued)
	}
	if got := e.metric("bex_edge_certificates_total", ca.IssuerKey(), "obtained"); got != 1 {
		t.Errorf("bex_edge_certificates_total{issuer=%s,outcome=obtained} = %v, want 1", ca.IssuerKey(), got)
	}
}

// clientTo is an HTTPS client that trusts roots and sends every request to addr,
// whatever host the URL names (SNI and Host stay the URL's).
func clientTo(addr string, roots *x509.CertPool) *http.Client {
	return &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		ForceAttemptHTTP2: true,
	}}
}

// storedCertificates lists the certificate files in a certmagic storage.
func storedCertificates(store certmagic.Storage) []string {
	var crts []string
	keys, _ := store.List(context.Background(), "", true)
	for _, k := range keys {
		if strings.HasSuffix(k, ".crt") {
			crts = append(crts, path.Base(k))
		}
	}
	return crts
}
