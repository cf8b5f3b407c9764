package edge

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

// TestACMECertificatesFromPebble obtains real ACME certificates from Pebble on
// loopback, once through HTTP-01 (Pebble fetches the token from the edge's HTTP
// listener) and once through TLS-ALPN-01 (Pebble handshakes with the edge's HTTPS
// listener), and serves them to a client that trusts Pebble's root. Pebble's DNS
// answers 127.0.0.1 for every name.
func TestACMECertificatesFromPebble(t *testing.T) {
	pebble := testenv.SharedPebble(t)
	roots, err := pebble.Roots(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, challenge := range []string{"http-01", "tls-alpn-01"} {
		t.Run(challenge, func(t *testing.T) {
			e := newEnv(t, Config{BaseDomain: "bex.example"})
			e.createApp("web", nil)
			_, p := backend(t, "hello from acme")
			e.createSlice("web", "web-1", nil, p)
			e.waitBackends("web.bex.example", 1)

			storage := t.TempDir()
			certs, err := NewCertificates(e.table, FileStorage(storage), nil, &ACME{
				DirectoryURL: pebble.DirectoryURL, Email: "ops@bex.example", TrustedRoots: pebble.TLSConfig.RootCAs,
				DisableHTTPChallenge: challenge != "http-01", DisableTLSALPNChallenge: challenge != "tls-alpn-01",
			}, slog.New(slog.NewTextHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug})), e.reg)
			if err != nil {
				t.Fatal(err)
			}
			// The listeners sit where Pebble's validator connects.
			httpLn, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", pebble.HTTPPort))
			if err != nil {
				t.Fatal(err)
			}
			tlsLn, err := tls.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", pebble.TLSPort), certs.TLSConfig())
			if err != nil {
				t.Fatal(err)
			}
			httpSrv := &http.Server{Handler: certs.HTTPHandler(http.NotFoundHandler())}
			tlsSrv := e.proxy.NewServer(certs.TLSConfig())
			go httpSrv.Serve(httpLn)
			go tlsSrv.Serve(tlsLn)
			t.Cleanup(func() { httpSrv.Close(); tlsSrv.Close() })

			client := clientTo(tlsLn.Addr().String(), roots)
			resp, err := client.Get("https://web.bex.example/")
			if err != nil {
				t.Fatalf("GET over a certificate from Pebble (%s): %v", challenge, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(body) != "hello from acme" {
				t.Fatalf("GET = %s %q", resp.Status, body)
			}
			if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 || !strings.Contains(resp.TLS.PeerCertificates[0].Issuer.CommonName, "Pebble") {
				t.Fatalf("the certificate was not issued by Pebble: %+v", resp.TLS)
			}

			// A name no app serves: no order, no certificate.
			if _, err := client.Get("https://nobody.bex.example/"); err == nil {
				t.Fatal("a name no app serves got a certificate")
			}
			if issued := storedCertificates(FileStorage(storage)); len(issued) != 1 || issued[0] != "web.bex.example.crt" {
				t.Fatalf("certificates stored: %v, want only web.bex.example.crt", issued)
			}
		})
	}
}

// TestCertificatesAheadOfTime: the certificates of the hosts the table routes are
// obtained from Pebble (HTTP-01) as soon as the table has them, with no HTTPS
// listener at all, so no client handshake: an app's default host and its custom
// domain at once, an app created later when it appears. Wildcard domains and
// names no app serves get nothing. Each issuance is counted in the metrics.
func TestCertificatesAheadOfTime(t *testing.T) {
	pebble := testenv.SharedPebble(t)
	e := newEnv(t, Config{BaseDomain: "bex.example"})
	e.createApp("early", func(a *appv1.App) { a.Spec.Domains = []string{"www.early.example", "*.shops.early.example"} })
	testenv.Eventually(t, 10*time.Second, "early in the table", e.known("www.early.example"))

	storage := FileStorage(t.TempDir())
	certs, err := NewCertificates(e.table, storage, nil, &ACME{
		DirectoryURL: pebble.DirectoryURL, Email: "ops@bex.example", TrustedRoots: pebble.TLSConfig.RootCAs,
		DisableTLSALPNChallenge: true,
	}, slog.New(slog.NewTextHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug})), e.reg)
	if err != nil {
		t.Fatal(err)
	}
	httpLn, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", pebble.HTTPPort))
	if err != nil {
		t.Fatal(err)
	}
	httpSrv := &http.Server{Handler: certs.HTTPHandler(http.NotFoundHandler())}
	go httpSrv.Serve(httpLn)
	t.Cleanup(func() { httpSrv.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go certs.ManageKnownHosts(ctx)

	waitStored := func(want ...string) {
		t.Helper()
		testenv.Eventually(t, 60*time.Second, "certificates stored", func() error {
			got := storedCertificates(storage)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				return fmt.Errorf("stored %v, want %v; log:\n%s", got, want, e.log.String())
			}
			return nil
		})
	}
	waitStored("early.bex.example.crt", "www.early.example.crt")

	e.createApp("later", nil)
	waitStored("early.bex.example.crt", "later.bex.example.crt", "www.early.example.crt")

	issuer := certs.acme.IssuerKey()
	testenv.Eventually(t, 10*time.Second, "three issuances counted", func() error {
		if n := e.metric("bex_edge_certificates_total", issuer, "obtained"); n != 3 {
			return fmt.Errorf("%v counted", n)
		}
		return nil
	})
	if failed := e.metric("bex_edge_certificates_total", issuer, "obtain_failed"); failed != 0 {
		t.Errorf("%v failed issuances counted", failed)
	}
}
