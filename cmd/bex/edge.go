package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"bex.co/bex/edge"
	"bex.co/bex/edge/secretstore"
	"bex.co/bex/internal/clientaddr"
)

// edgeCmd serves every app from the routing table: over HTTPS with certificates
// from an ACME CA or a local CA, HTTP answering ACME challenges and redirecting to
// HTTPS; or over HTTP alone when HTTPS is off.
type edgeCmd struct {
	errOut io.Writer
	log    *slog.Logger

	apiFlags
	namespace  string
	baseDomain string
	httpAddr   string
	httpsAddr  string
	acmeCA     string
	acmeEmail  string
	certStore  string
	certNS     string

	// Limits, bound into edge.Config.
	dialTimeout       time.Duration
	backendTimeout    time.Duration
	readHeaderTimeout time.Duration
	idleTimeout       time.Duration
	maxHeaderBytes    int
	shutdownTimeout   time.Duration
	platformBackend   string
	platformHost      string
	platformSecret    string
	trustedProxies    string
	statsAddr         string

	// ready, when set, receives the listen address once the edge accepts.
	ready chan<- string
	// reg is where the metrics go; nil means prometheus.DefaultRegisterer. Tests
	// that run several edges in one process give each its own.
	reg prometheus.Registerer
}

func (c *edgeCmd) command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "edge",
		Short: "Route requests for <app>.<base-domain> and custom domains to the apps' instances",
		Long: "edge serves every app over HTTP, routing by Host from the Apps and the EndpointSlices\n" +
			"the deployer publishes. Every flag can also be set as BEX_<FLAG>, e.g. BEX_HTTP_ADDR.",
		Args:    cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error { return bindEnv(cmd) },
	}
	f := cmd.Flags()
	c.apiFlags.bind(f, "state directory (for the default kubeconfig)")
	f.StringVar(&c.namespace, "namespace", edge.DefaultNamespace, "namespace of the Apps")
	f.StringVar(&c.baseDomain, "base-domain", edge.DefaultBaseDomain, "apps answer at <app>.<base-domain>")
	f.StringVar(&c.httpAddr, "http-addr", edge.DefaultHTTPAddr, "HTTP listen address: redirects to HTTPS, or serves the apps when HTTPS is off")
	f.StringVar(&c.httpsAddr, "https-addr", edge.DefaultHTTPSAddr, "HTTPS listen address (empty: no HTTPS)")
	f.StringVar(&c.acmeCA, "acme-ca", "", "ACME directory URL (default: Let's Encrypt when --acme-email is given)")
	f.StringVar(&c.certStore, "certificate-storage", "file", "where certificates are kept: file (STATE_DIR/edge/certificates, one edge) or secrets (Kubernetes Secrets in --namespace, shared by several edges)")
	f.StringVar(&c.certNS, "certificate-namespace", "", "namespace of the certificate Secrets and Leases with --certificate-storage secrets (default: --namespace)")
	f.StringVar(&c.acmeEmail, "acme-email", "", "ACME account email; without it and --acme-ca, or for the base domain localhost, a local CA in STATE_DIR/edge/ca issues certificates")
	f.DurationVar(&c.dialTimeout, "dial-timeout", edge.DefaultDialTimeout, "bound on connecting to an app's instance (502 past it)")
	f.DurationVar(&c.backendTimeout, "backend-timeout", edge.DefaultResponseHeaderTimeout, "bound on the wait for an app's response headers (504 past it); streams are unaffected once headers arrive")
	f.DurationVar(&c.readHeaderTimeout, "read-header-timeout", edge.DefaultReadHeaderTimeout, "bound on reading a client's request headers")
	f.DurationVar(&c.idleTimeout, "idle-timeout", edge.DefaultClientIdleTimeout, "how long an idle kept-alive client connection stays open")
	f.IntVar(&c.maxHeaderBytes, "max-header-bytes", edge.DefaultMaxHeaderBytes, "bound on a request's headers (431 past it) and on an app's response headers (502)")
	f.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long requests in flight may take to finish before their connections are closed")
	f.StringVar(&c.platformBackend, "platform-backend", "", "host:port of bex's webhooks and MCP endpoint (bex gitserver --hooks-addr), served at https://PLATFORM-HOST/hooks/ and /mcp (empty: not served)")
	f.StringVar(&c.platformHost, "platform-host", "", "host of bex's own endpoints (default: the base domain itself)")
	f.StringVar(&c.platformSecret, "platform-secret-file", "", "file holding the secret (16 or more printable ASCII bytes, e.g. from openssl rand -hex 32) sent in the X-Bex-Edge-Secret header of every request to --platform-backend and no other, so that the gitserver (--hooks-proxy-secret-file, the same secret) believes the client this edge names for its limits on failed tokens and signatures where the edge's address cannot say it is the edge (a cluster); empty: none sent")
	f.StringVar(&c.trustedProxies, "trusted-proxies", "", "CIDR,... of load balancers in front of the edge: from them, the PROXY protocol (v1/v2) is read and X-Forwarded-For's last untrusted hop names the client (empty: the client is the connection's peer)")
	f.StringVar(&c.statsAddr, "stats-addr", "0", "where the apps' request figures of the last hour and their hosts' certificate state are served (GET /v1/apps/APP/traffic?window=5m and /v1/apps/APP/certificates, for the gitserver's --edge-stats): unix:PATH for a socket only root reaches (mode 0600), or host:port, loopback, for every local process; 0 turns it off. Never where tenants reach it: it names every app's traffic")
	return cmd
}

func (c *edgeCmd) run(ctx context.Context) error {
	// The flags' problems, all at once and by their names, before edge.Config's.
	var bad []error
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"dial-timeout", c.dialTimeout}, {"backend-timeout", c.backendTimeout}, {"read-header-timeout", c.readHeaderTimeout},
		{"idle-timeout", c.idleTimeout}, {"shutdown-timeout", c.shutdownTimeout},
	} {
		if d.v <= 0 {
			bad = append(bad, fmt.Errorf("--%s %s: give a positive duration, such as 30s", d.flag, d.v))
		}
	}
	if c.maxHeaderBytes < 4096 {
		bad = append(bad, fmt.Errorf("--max-header-bytes %d: give at least 4096 (browsers send several KiB of cookies)", c.maxHeaderBytes))
	}
	trusted, err := clientaddr.Parse(c.trustedProxies)
	if err != nil {
		bad = append(bad, fmt.Errorf("--trusted-proxies: %w", err))
	}
	var platformSecret []byte
	if c.platformSecret != "" {
		if c.platformBackend == "" {
			bad = append(bad, errors.New("--platform-secret-file: give --platform-backend too (the secret is sent only there)"))
		} else if platformSecret, err = clientaddr.ReadSecret(c.platformSecret); err != nil {
			bad = append(bad, fmt.Errorf("--platform-secret-file: %w", err))
		}
	}
	if err := errors.Join(bad...); err != nil {
		return err
	}
	restCfg, s, err := c.connect()
	if err != nil {
		return err
	}
	cfg := edge.DefaultConfig()
	cfg.BaseDomain, cfg.Namespace = c.baseDomain, c.namespace
	cfg.DialTimeout, cfg.ResponseHeaderTimeout = c.dialTimeout, c.backendTimeout
	cfg.ReadHeaderTimeout, cfg.ClientIdleTimeout, cfg.MaxHeaderBytes = c.readHeaderTimeout, c.idleTimeout, c.maxHeaderBytes
	// PlatformHost empty is derived from BaseDomain when PlatformBackend is set.
	cfg.PlatformBackend, cfg.PlatformHost, cfg.PlatformSecret = c.platformBackend, c.platformHost, platformSecret
	cfg.TrustedProxies = trusted
	if err := cfg.Validate(); err != nil {
		return err
	}
	informers, err := cache.New(restCfg, cache.Options{Scheme: s, DefaultNamespaces: map[string]cache.Config{c.namespace: {}},
		// managedFields are read by no one here; dropped, the cache holds less.
		DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return err
	}
	table, err := edge.NewTable(ctx, cfg, informers, c.log)
	if err != nil {
		return err
	}
	go func() {
		if err := informers.Start(ctx); err != nil {
			c.log.Error("API cache stopped", "err", err)
		}
	}()
	reg := c.reg
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	proxy, err := edge.NewProxy(cfg, table, c.log, reg)
	if err != nil {
		return err
	}
	// server is an http.Server or an edge.Server (the proxy's fast lane in
	// front of an http.Server).
	type server interface {
		Serve(net.Listener) error
		Shutdown(context.Context) error
		Close() error
	}
	var servers []server
	errc := make(chan error, 3)
	serve := func(srv server, l net.Listener) {
		servers = append(servers, srv)
		go func() { errc <- srv.Serve(l) }()
	}

	var httpHandler http.Handler // with HTTPS: ACME challenges and redirects
	var certs *edge.Certificates // nil without HTTPS: the stats answer no certificate
	if c.httpsAddr != "" {
		var ca *edge.LocalCA
		var acme *edge.ACME
		trust := "a certificate from " + c.acmeCA
		if edge.UsesLocalCA(c.acmeCA, c.acmeEmail, c.baseDomain) {
			if ca, err = edge.LoadOrCreateLocalCA(filepath.Join(c.stateDir, "edge", "ca")); err != nil {
				return err
			}
			trust = "trust " + filepath.Join(c.stateDir, "edge", "ca", "ca.pem")
		} else {
			acme = &edge.ACME{DirectoryURL: c.acmeCA, Email: c.acmeEmail}
			if c.acmeCA == "" {
				trust = "certificates from Let's Encrypt"
			}
		}
		storage, err := c.certificateStorage(restCfg)
		if err != nil {
			return err
		}
		if certs, err = edge.NewCertificates(table, storage, ca, acme, c.log, reg); err != nil {
			return err
		}
		go certs.ManageKnownHosts(ctx)
		tl, err := net.Listen("tcp", c.httpsAddr)
		if err != nil {
			return err
		}
		tlsConfig := certs.TLSConfig()
		// The PROXY header, from a trusted load balancer, comes before the TLS
		// handshake.
		serve(proxy.NewServer(tlsConfig), tls.NewListener(proxy.ProxyProtocol(tl), tlsConfig))
		_, httpsPort, _ := net.SplitHostPort(tl.Addr().String())
		httpHandler = certs.HTTPHandler(redirectToHTTPS(httpsPort))
		say(c.errOut, c.log, "bex edge: serving https://<app>.%s on %s (%s)", c.baseDomain, tl.Addr(), trust)
	}
	// After the certificates, which the stats report on too.
	if c.statsAddr != "0" && c.statsAddr != "" {
		l, err := listenStats(c.statsAddr)
		if err != nil {
			return fmt.Errorf("--stats-addr: %w", err)
		}
		serve(&http.Server{Handler: edge.StatsHandler(proxy, certs), ReadHeaderTimeout: 5 * time.Second}, l)
		say(c.errOut, c.log, "bex edge: the apps' request figures and certificates on %s", c.statsAddr)
	}
	l, err := net.Listen("tcp", c.httpAddr)
	if err != nil {
		return err
	}
	if c.httpsAddr == "" {
		serve(proxy.NewServer(nil), proxy.ProxyProtocol(l)) // the apps, on plain HTTP
	} else {
		srv := &http.Server{Handler: httpHandler}
		proxy.ConfigureServer(srv)
		serve(srv, proxy.ProxyProtocol(l))
	}
	say(c.errOut, c.log, "bex edge: HTTP on %s", l.Addr())
	if c.ready != nil {
		c.ready <- l.Addr().String()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Draining: the listeners close at once, idle connections too; requests in
	// flight finish (within --shutdown-timeout) and their connections close after
	// them. The routing table keeps its last snapshot meanwhile.
	c.log.Info("edge: shutting down, draining requests in flight", "timeout", c.shutdownTimeout)
	shutdown, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(servers))
	for i, srv := range servers {
		wg.Go(func() { errs[i] = srv.Shutdown(shutdown) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			c.log.Warn("edge: requests still in flight after --shutdown-timeout were cut", "timeout", c.shutdownTimeout)
			for _, srv := range servers {
				srv.Close()
			}
			return nil
		}
		return err
	}
	return nil
}

// listenStats listens on --stats-addr: unix:PATH (a socket of mode 0600; one
// left by a killed edge is replaced) or host:port.
func listenStats(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		return net.Listen("tcp", addr)
	}
	if path == "" {
		return nil, errors.New("unix: give the socket's path")
	}
	// Bound at PATH itself, so that the socket is listed under its name
	// (/proc/net/unix, what bex up's listeners test reads), then made 0600,
	// as the deployer's health socket: under bex up its directory is 0700,
	// and a socket made under the usual umask is not writable, so not
	// connectable, by others before the chmod either. Closing removes it.
	_ = os.Remove(path) // a socket left by a killed edge
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func (c *edgeCmd) certificateStorage(restCfg *rest.Config) (certmagic.Storage, error) {
	switch c.certStore {
	case "file":
		return edge.FileStorage(filepath.Join(c.stateDir, "edge", "certificates")), nil
	case "secrets":
		s, err := scheme()
		if err != nil {
			return nil, err
		}
		kc, err := client.New(restCfg, client.Options{Scheme: s})
		if err != nil {
			return nil, err
		}
		ns := c.certNS
		if ns == "" {
			ns = c.namespace
		}
		return secretstore.New(secretstore.Config{Namespace: ns}, kc)
	}
	return nil, fmt.Errorf("certificate storage %q: choose file or secrets", c.certStore)
}

// redirectToHTTPS sends every HTTP request to the same URL over HTTPS.
func redirectToHTTPS(httpsPort string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if httpsPort != "443" {
			host = net.JoinHostPort(host, httpsPort)
		}
		http.Redirect(w, r, "https://"+host+r.URL.RequestURI(), http.StatusPermanentRedirect)
	})
}

func (c *edgeCmd) close() error { return nil }
