package edge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/pki"
)

// TestAppCertificates serves the proxy over TLS with the local CA and reads
// the apps' certificate state on the stats handler: none before any
// handshake; valid for the hosts a handshake got a certificate for, none for
// the one without; the state of certificates found in storage alone (another
// replica's) by their dates; and nothing obtained, written or cached to
// answer.
func TestAppCertificates(t *testing.T) {
	table := staticTable("localhost", []appv1.App{
		app("web", "www.example.com", "*.apps.example.com"),
		app("other", "taken.apps.example.com"), // an exact host under web's wildcard: other's
	}, nil)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ca, err := LoadOrCreateLocalCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store := FileStorage(t.TempDir())
	certs, err := NewCertificates(table, store, ca, nil, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewProxy(Config{}, table, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, p, certs.TLSConfig())
	stats := httptest.NewServer(StatsHandler(p, certs))
	t.Cleanup(stats.Close)

	none := func(host string) CertificateState { return CertificateState{Host: host, State: CertNone} }
	if got := getCertificates(t, stats.URL, "web"); !slices.Equal(got, []CertificateState{
		none("web.localhost"), none("www.example.com"), none("*.apps.example.com"),
	}) {
		t.Errorf("before any handshake: %+v, want every host none", got)
	}
	if got := getCertificates(t, stats.URL, "nobody"); len(got) != 0 {
		t.Errorf("an app without hosts: %+v, want none", got)
	}

	before := time.Now().Add(-time.Second)
	handshake(t, addr, "web.localhost", ca)
	handshake(t, addr, "a.apps.example.com", ca)
	after := time.Now().Add(time.Second)
	// Gone from storage, web.localhost's is still in the cache, and served.
	if err := store.Delete(context.Background(), certmagic.StorageKeys.SiteCert(ca.IssuerKey(), "web.localhost")); err != nil {
		t.Fatal(err)
	}

	// Certificates in storage alone, as another replica leaves them.
	now := time.Now()
	day := 24 * time.Hour
	old := storeCertificate(t, store, ca.IssuerKey(), "old.apps.example.com", now.Add(-40*day), now.Add(-time.Hour))
	soon := storeCertificate(t, store, ca.IssuerKey(), "soon.apps.example.com", now.Add(-25*day), now.Add(5*day)) // the last sixth of its life
	taken := storeCertificate(t, store, ca.IssuerKey(), "taken.apps.example.com", now.Add(-time.Hour), now.Add(60*day))
	storeCertificate(t, store, ca.IssuerKey(), "x.y.apps.example.com", now.Add(-time.Hour), now.Add(60*day)) // not one label under
	stored := storedCertificates(store)

	got := getCertificates(t, stats.URL, "web")
	hosts := make([]string, len(got))
	for i, s := range got {
		hosts[i] = s.Host
	}
	if want := []string{"web.localhost", "www.example.com", "*.apps.example.com", "a.apps.example.com", "old.apps.example.com", "soon.apps.example.com"}; !slices.Equal(hosts, want) {
		t.Fatalf("web's hosts: %v, want %v", hosts, want)
	}
	for _, i := range []int{0, 3} { // obtained at the handshakes, read from the cache
		s := got[i]
		notAfter, err := time.Parse(time.RFC3339, s.NotAfter)
		if s.State != CertValid || s.Issuer != ca.IssuerKey() || err != nil ||
			notAfter.Before(before.Add(CertLifetime).Truncate(time.Second)) || notAfter.After(after.Add(CertLifetime)) {
			t.Errorf("%s: %+v, want valid, issued by %s for %s", s.Host, s, ca.IssuerKey(), CertLifetime)
		}
	}
	for i, want := range map[int]CertificateState{
		1: none("www.example.com"), // no handshake asked for it
		2: none("*.apps.example.com"),
		4: {Host: "old.apps.example.com", State: CertExpired, NotAfter: old, Issuer: ca.IssuerKey()},
		5: {Host: "soon.apps.example.com", State: CertExpiring, NotAfter: soon, Issuer: ca.IssuerKey()},
	} {
		if got[i] != want {
			t.Errorf("%s: %+v, want %+v", want.Host, got[i], want)
		}
	}
	if got, want := getCertificates(t, stats.URL, "other"), []CertificateState{
		none("other.localhost"),
		{Host: "taken.apps.example.com", State: CertValid, NotAfter: taken, Issuer: ca.IssuerKey()},
	}; !slices.Equal(got, want) {
		t.Errorf("other: %+v, want %+v", got, want)
	}
	if after := storedCertificates(store); !slices.Equal(after, stored) {
		t.Errorf("certificates stored while answering: %v, before %v", after, stored)
	}
	for _, host := range []string{"www.example.com", "old.apps.example.com", "taken.apps.example.com"} {
		if c := certs.cache.AllMatchingCertificates(host); len(c) != 0 {
			t.Errorf("%s: %d certificates put in the cache to answer", host, len(c))
		}
	}

	// The traffic route, alongside.
	res, err := http.Get(stats.URL + "/v1/apps/web/traffic?window=5m")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), `[{"minutes":5,`) {
		t.Errorf("traffic: %s %s", res.Status, body)
	}
}

// TestAppCertificatesRefusals: a name that cannot be an app's, a table not
// built yet, a storage that fails, and an edge without HTTPS.
func TestAppCertificatesRefusals(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ca, err := LoadOrCreateLocalCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	table := staticTable("localhost", []appv1.App{app("web")}, nil)
	p, err := NewProxy(Config{}, table, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	certs, err := NewCertificates(table, FileStorage(t.TempDir()), ca, nil, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	starting, err := NewCertificates(&Table{}, FileStorage(t.TempDir()), ca, nil, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	broken, err := NewCertificates(table, failingStorage{FileStorage(t.TempDir())}, ca, nil, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		certs  *Certificates
		app    string
		status int
		body   string
	}{
		{"upper case", certs, "Web", 400, `app name "Web": only a-z, 0-9 and - are allowed`},
		{"too long", certs, strings.Repeat("a", 64), 400, "give 1 to 63 characters"},
		{"table not built", starting, "web", 503, ErrTableNotReady.Error()},
		{"storage fails", broken, "web", 500, "reading the certificate storage: the storage is down"},
		{"no HTTPS", nil, "web", 200, "[]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(StatsHandler(p, c.certs))
			defer srv.Close()
			res, err := http.Get(srv.URL + "/v1/apps/" + c.app + "/certificates")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != c.status || !strings.Contains(string(body), c.body) || strings.Count(string(body), "\n") != 1 {
				t.Errorf("%s: %s %q, want %d saying %q on one line", c.app, res.Status, body, c.status, c.body)
			}
		})
	}
}

// failingStorage is a certmagic storage whose reads fail.
type failingStorage struct{ certmagic.Storage }

func (failingStorage) Load(context.Context, string) ([]byte, error) {
	return nil, errors.New("the storage is down")
}

// handshake asks addr for host's certificate, as a client trusting ca does.
func handshake(t *testing.T, addr, host string, ca *LocalCA) {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr, &tls.Config{ServerName: host, RootCAs: roots})
	if err != nil {
		t.Fatalf("handshake for %s: %v", host, err)
	}
	conn.Close()
}

// storeCertificate puts a certificate of host valid from notBefore to
// notAfter in store, where certmagic keeps issuerKey's, and returns its
// NotAfter as the stats say it.
func storeCertificate(t *testing.T, store certmagic.Storage, issuerKey, host string, notBefore, notAfter time.Time) string {
	t.Helper()
	key, err := pki.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	der, err := pki.Sign(&x509.Certificate{
		Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: notBefore, NotAfter: notAfter,
	}, nil, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Store(context.Background(), certmagic.StorageKeys.SiteCert(issuerKey, host), pki.EncodeCert(der)); err != nil {
		t.Fatal(err)
	}
	return notAfter.UTC().Truncate(time.Second).Format(time.RFC3339)
}

// getCertificates reads app's certificate state on the stats server at url.
func getCertificates(t *testing.T, url, app string) []CertificateState {
	t.Helper()
	res, err := http.Get(url + "/v1/apps/" + app + "/certificates")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/json" {
		body, _ := io.ReadAll(res.Body)
		t.Fatalf("certificates of %s: %s %s", app, res.Status, body)
	}
	var out []CertificateState
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out == nil {
		t.Fatalf("certificates of %s: null, want a list", app)
	}
	return out
}
