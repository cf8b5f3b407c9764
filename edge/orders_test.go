package edge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	discoveryv1 "k8s.io/api/discovery/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

// TestOnDemandOrdersAreRateLimited: handshakes with names nobody registered,
// under a wildcard domain, start certificate orders. Past OrdersPerDomain for
// one registered domain they get no certificate, while another registered
// domain still gets its own; past Orders, no name does. Certificates already
// obtained are still served, and after a restart with no budget left those in
// storage load (no order): the limit counts orders, not handshakes. Every
// refusal is in bex_edge_certificate_refusals_total by reason.
func TestOnDemandOrdersAreRateLimited(t *testing.T) {
	table := staticTable("localhost", []appv1.App{app("web", "*.shop.example", "*.other.example", "co.uk")},
		[]discoveryv1.EndpointSlice{slice("web", discoveryv1.AddressTypeFQDN, 8080, ep(nil, "127.0.0.1"))})
	table.cfg = Config{OrdersPerDomain: OrderRate{N: 3, Per: time.Hour}, Orders: OrderRate{N: 5, Per: time.Hour}}
	dir := t.TempDir()
	ca, err := LoadOrCreateLocalCA(filepath.Join(dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	storage := FileStorage(filepath.Join(dir, "certificates"))
	start := func() (*Certificates, string) {
		certs, err := NewCertificates(table, storage, ca, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		p, err := NewProxy(Config{}, table, nil, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		return certs, serve(t, p, certs.TLSConfig())
	}
	certs, addr := start()
	handshake := func(name string) error {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr,
			&tls.Config{RootCAs: roots, ServerName: name, NextProtos: []string{"http/1.1"}})
		if err == nil {
			c.Close()
		}
		return err
	}
	var got, refused []string
	for _, name := range []string{"a1.shop.example", "a2.shop.example", "a3.shop.example", "a4.shop.example", "a5.shop.example",
		"b1.other.example", "b2.other.example", "b3.other.example", "nope.example", "co.uk"} {
		if err := handshake(name); err != nil {
			refused = append(refused, name)
		} else {
			got = append(got, name)
		}
	}
	wantGot := []string{"a1.shop.example", "a2.shop.example", "a3.shop.example", "b1.other.example", "b2.other.example"}
	if !slices.Equal(got, wantGot) {
		t.Errorf("certificates for %v, refused %v; want certificates for %v only", got, refused, wantGot)
	}
	for reason, want := range map[string]float64{RefusedDomainLimited: 2, RefusedLimited: 1, RefusedNotRouted: 1, RefusedPublicSuffix: 1} {
		if n := testutil.ToFloat64(certs.m.refusals.WithLabelValues(reason)); n != want {
			t.Errorf("bex_edge_certificate_refusals_total{reason=%q} = %v, want %v", reason, n, want)
		}
	}
	if n := len(storedCertificates(storage)); n != 5 {
		t.Errorf("%d certificates in storage, want the 5 ordered", n)
	}
	// Control: a name that has its certificate keeps it, over the limit.
	if err := handshake("a1.shop.example"); err != nil {
		t.Errorf("a1.shop.example, obtained before the limit: %v", err)
	}

	// A restart: a fresh limiter with a budget of one order in all; the five
	// certificates in storage load without an order, and the one order left goes
	// to a new name.
	table.cfg = Config{OrdersPerDomain: OrderRate{N: 1, Per: time.Hour}, Orders: OrderRate{N: 1, Per: time.Hour}}
	certs, addr = start()
	for _, name := range append(wantGot, "a6.shop.example") {
		if err := handshake(name); err != nil {
			t.Errorf("after a restart, %s: %v", name, err)
		}
	}
	if err := handshake("a7.shop.example"); err == nil {
		t.Error("after a restart, a second order went past a budget of one")
	}
	if n := testutil.ToFloat64(certs.m.refusals.WithLabelValues(RefusedDomainLimited)); n != 1 {
		t.Errorf("after a restart: %v refusals for the domain's limit, want 1 (a7)", n)
	}
}

// TestAheadOfTimeOrdersAreRateLimited: the orders that ManageKnownHosts makes
// for the table's exact hosts (an app's host under the base domain and its
// custom domains, as a member adds them) count against the same limits as
// on-demand ones: of six hosts, three under one registered domain, with a
// budget of two per registered domain and four in all, four certificates are
// ordered, never three under shop.example, and the two refusals are counted.
// The hosts within the budget are served with their certificates (the
// control); a refused one gets none at a handshake either while the budget
// has no room: on demand is the same limiter. From the local CA, and from
// Pebble (ACME, HTTP-01), where the orders are the CA account's.
func TestAheadOfTimeOrdersAreRateLimited(t *testing.T) {
	t.Run("local CA", func(t *testing.T) {
		dir := t.TempDir()
		ca, err := LoadOrCreateLocalCA(filepath.Join(dir, "ca"))
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(ca.CertPEM())
		aheadOfTimeLimited(t, roots, func(table *Table, storage certmagic.Storage) (*Certificates, error) {
			return NewCertificates(table, storage, ca, nil, nil, nil)
		})
	})
	t.Run("pebble", func(t *testing.T) {
		pebble := testenv.SharedPebble(t)
		roots, err := pebble.Roots(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		aheadOfTimeLimited(t, roots, func(table *Table, storage certmagic.Storage) (*Certificates, error) {
			certs, err := NewCertificates(table, storage, nil, &ACME{
				DirectoryURL: pebble.DirectoryURL, Email: "ops@bex.example", TrustedRoots: pebble.TLSConfig.RootCAs,
				DisableTLSALPNChallenge: true,
			}, nil, nil)
			if err != nil {
				return nil, err
			}
			// The HTTP-01 answers, where Pebble's validator connects.
			httpLn, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", pebble.HTTPPort))
			if err != nil {
				return nil, err
			}
			httpSrv := &http.Server{Handler: certs.HTTPHandler(http.NotFoundHandler())}
			go httpSrv.Serve(httpLn)
			t.Cleanup(func() { httpSrv.Close() })
			return certs, nil
		})
	})
}

func aheadOfTimeLimited(t *testing.T, roots *x509.CertPool, newCerts func(*Table, certmagic.Storage) (*Certificates, error)) {
	hosts := []string{"web.bex.example", "www.shop.example", "api.shop.example", "cdn.shop.example", "www.other.example", "www.third.example"}
	table := staticTable("bex.example", []appv1.App{app("web", hosts[1:]...)},
		[]discoveryv1.EndpointSlice{slice("web", discoveryv1.AddressTypeFQDN, 8080, ep(nil, "127.0.0.1"))})
	table.cfg = Config{OrdersPerDomain: OrderRate{N: 2, Per: time.Hour}, Orders: OrderRate{N: 4, Per: time.Hour}}
	if got := table.Hosts(); len(got) != len(hosts) {
		t.Fatalf("the table's hosts: %v", got)
	}
	storage := FileStorage(t.TempDir())
	certs, err := newCerts(table, storage)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go certs.ManageKnownHosts(ctx)

	refusals := func() float64 {
		return testutil.ToFloat64(certs.m.refusals.WithLabelValues(RefusedDomainLimited)) +
			testutil.ToFloat64(certs.m.refusals.WithLabelValues(RefusedLimited))
	}
	testenv.Eventually(t, 120*time.Second, "every host ordered or refused", func() error {
		if n, r := len(storedCertificates(storage)), refusals(); n != 4 || r != 2 {
			return fmt.Errorf("%d certificates stored (%v), %v refusals; want 4 and 2", n, storedCertificates(storage), r)
		}
		return nil
	})
	stored := map[string]bool{}
	shop := 0
	for _, crt := range storedCertificates(storage) {
		name := strings.TrimSuffix(crt, ".crt")
		stored[name] = true
		if strings.HasSuffix(name, ".shop.example") {
			shop++
		}
	}
	if shop > 2 {
		t.Errorf("%d certificates under shop.example, past its budget of 2: %v", shop, stored)
	}

	p, err := NewProxy(Config{}, table, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, p, certs.TLSConfig())
	for _, name := range hosts {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr,
			&tls.Config{RootCAs: roots, ServerName: name, NextProtos: []string{"http/1.1"}})
		if err == nil {
			c.Close()
		}
		switch {
		case stored[name] && err != nil:
			t.Errorf("%s, ordered ahead of time: %v", name, err)
		case !stored[name] && err == nil:
			t.Errorf("%s, refused ahead of time, got a certificate on demand past the budget", name)
		}
	}
}

// TestAheadOfTimeAppHostsAreNotLimited: the apps' own hosts under the base
// domain are ordered ahead of time whatever the limits (they were before the
// limits applied ahead of time, and a busy day of new apps must not leave one
// without a certificate for hours); a custom domain past the limits is refused.
func TestAheadOfTimeAppHostsAreNotLimited(t *testing.T) {
	ca, err := LoadOrCreateLocalCA(filepath.Join(t.TempDir(), "ca"))
	if err != nil {
		t.Fatal(err)
	}
	table := staticTable("apps.example.com", nil, nil)
	table.cfg = Config{BaseDomain: "apps.example.com", OrdersPerDomain: OrderRate{N: 1, Per: time.Hour}, Orders: OrderRate{N: 1, Per: time.Hour}}
	certs, err := NewCertificates(table, FileStorage(t.TempDir()), ca, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 5 {
		name := fmt.Sprintf("app%d.apps.example.com", i)
		if err := certs.aheadEvent(ctx, "cert_obtaining", map[string]any{"identifier": name}); err != nil {
			t.Fatalf("%s, an app's host: %v", name, err)
		}
	}
	if err := certs.aheadEvent(ctx, "cert_obtaining", map[string]any{"identifier": "www.shop.example"}); err != nil {
		t.Fatalf("the first custom domain: %v", err)
	}
	for _, name := range []string{"api.shop.example", "apps.example.com", "x.apps.example.com.evil.example"} {
		if err := certs.aheadEvent(ctx, "cert_obtaining", map[string]any{"identifier": name}); err == nil {
			t.Errorf("%s past the limits: ordered", name)
		}
	}
}
