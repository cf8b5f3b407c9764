package builder_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bex.co/bex/builder"
	"bex.co/bex/internal/pki"
	"bex.co/bex/internal/testenv"
)

// TestMutualTLS: a buildkitd whose TCP listener (on loopback) takes only clients
// with a certificate of its CA, as on a cluster, where any pod may reach it and a
// build step runs as root on its node. A client without TLS, one with TLS but no
// certificate, one with a certificate of another CA, and one that does not check
// the server's name against its certificate are all refused before any build;
// the gitserver's client, with its certificate, builds.
func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	serverCert, serverKey := ca.issue(t, "buildkitd", x509.ExtKeyUsageServerAuth,
		[]string{"bex-buildkitd.bex-system.svc.cluster.local"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	clientCert, clientKey := ca.issue(t, "gitserver", x509.ExtKeyUsageClientAuth, nil, nil)
	stranger := newTestCA(t, dir, "stranger")
	strangerCert, strangerKey := stranger.issue(t, "tenant", x509.ExtKeyUsageClientAuth, nil, nil)
	addr := freeLoopbackPort(t)

	bk, err := testenv.StartBuildkitd(filepath.Join(dir, "bk"), testenv.SharedContainerd(t),
		testenv.WithTCPTLS(testenv.BuildkitdTLS{Addr: addr, CA: ca.certFile, Cert: serverCert, Key: serverKey}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bk.Stop() })
	testenv.SharedBusybox(t)

	newTLSBuilder := func(t *testing.T, tls builder.TLSConfig) *builder.Builder {
		cfg := builder.DefaultConfig()
		cfg.StateDir = t.TempDir()
		cfg.Address = "tcp://" + addr
		cfg.TLS = tls
		cfg.ImageResolveMode = "local"
		b, err := builder.New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	r := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\nRUN echo built over mutual TLS > /proof\n"})
	refusedClient := []string{"certificate required", "bad certificate", "unknown certificate authority", "unsupported certificate", "broken pipe", "connection reset"}

	for _, c := range []struct {
		name string
		tls  builder.TLSConfig
		// want is what the refusal says, from the TLS stack of either side. With
		// TLS 1.3 the client's handshake ends before the server checks its
		// certificate: the server's alert, or its closing the connection first
		// (broken pipe, reset), is what the client sees.
		want []string
	}{
		{"no TLS", builder.TLSConfig{}, nil},
		{"TLS without a certificate", builder.TLSConfig{CA: ca.certFile}, refusedClient},
		// Go's client sends no certificate the server's request names no CA of.
		{"a certificate of another CA", builder.TLSConfig{CA: ca.certFile, Cert: strangerCert, Key: strangerKey}, refusedClient},
		// The CA's, but for servers only: a stolen server key is no client's.
		{"buildkitd's own server certificate", builder.TLSConfig{CA: ca.certFile, Cert: serverCert, Key: serverKey}, refusedClient},
		{"a server name its certificate lacks", builder.TLSConfig{CA: ca.certFile, Cert: clientCert, Key: clientKey, ServerName: "evil.example"}, []string{"evil.example"}},
		{"another CA's server", builder.TLSConfig{CA: stranger.certFile, Cert: clientCert, Key: clientKey}, []string{"unknown authority"}},
	} {
		t.Run("refused: "+c.name, func(t *testing.T) {
			b := newTLSBuilder(t, c.tls)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := b.Preflight(ctx)
			if !errors.Is(err, builder.ErrUnavailable) {
				t.Fatalf("Preflight = %v, want %v", err, builder.ErrUnavailable)
			}
			if len(c.want) > 0 && !containsAny(err.Error(), c.want) {
				t.Errorf("Preflight = %v, want it to say one of %q", err, c.want)
			}
			t.Logf("refused: %v", err)
			if res, out, err := build(t, b, r.request("refused")); err == nil {
				t.Fatalf("Build succeeded (%s) for a client that should be refused\n%s", res.Image, out)
			}
		})
	}

	t.Run("the gitserver's certificate builds", func(t *testing.T) {
		for _, name := range []string{"", "bex-buildkitd.bex-system.svc.cluster.local"} {
			b := newTLSBuilder(t, builder.TLSConfig{CA: ca.certFile, Cert: clientCert, Key: clientKey, ServerName: name})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err := b.Preflight(ctx)
			cancel()
			if err != nil {
				t.Fatalf("Preflight with server name %q: %v", name, err)
			}
			res, out := mustBuild(t, b, r.request("mtls"))
			if !strings.HasPrefix(res.Image, "bex.local/mtls@sha256:") {
				t.Errorf("image %q", res.Image)
			}
			if !strings.Contains(out, "RUN echo built over mutual TLS") {
				t.Errorf("the build's progress does not show its step:\n%s", out)
			}
		}
	})
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// freeLoopbackPort returns 127.0.0.1:PORT with a port nothing listened on a
// moment ago.
func freeLoopbackPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// testCA is a CA of the test's, whose certificate is in certFile.
type testCA struct {
	dir      string
	name     string
	cert     *x509.Certificate
	key      *ecdsa.PrivateKey
	certFile string
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	cert, key, der, err := pki.NewCA(&x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: name + " CA"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageCertSign,
	})
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{dir: dir, name: name, cert: cert, key: key, certFile: filepath.Join(dir, name+"-ca.pem")}
	writePEM(t, ca.certFile, "CERTIFICATE", der)
	return ca
}

// issue makes a leaf certificate for one use and returns its certificate and key
// files.
func (ca *testCA) issue(t *testing.T, cn string, use x509.ExtKeyUsage, dns []string, ips []net.IP) (certFile, keyFile string) {
	t.Helper()
	key, err := pki.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		NotBefore:   time.Now().Add(-time.Hour),
		NotAfter:    time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{use},
		DNSNames:    dns,
		IPAddresses: ips,
	}
	der, err := pki.Sign(tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(ca.dir, ca.name+"-"+cn)
	writePEM(t, base+".pem", "CERTIFICATE", der)
	writePEM(t, base+"-key.pem", "EC PRIVATE KEY", keyDER)
	return base + ".pem", base + "-key.pem"
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := pki.WritePEM(path, typ, der, 0o600); err != nil {
		t.Fatal(err)
	}
}
