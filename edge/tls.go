package edge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// ErrNotRouted is the on-demand TLS answer for a name that no app serves: no
// certificate is ever requested for it. This is what keeps a public edge from
// spending a CA's rate limits on names that scanners invent.
var ErrNotRouted = errors.New("no app is routed at this name")

// ACME configures certificates from an ACME CA (Let's Encrypt by default).
type ACME struct {
	// DirectoryURL is the CA's ACME directory; empty means Let's Encrypt.
	DirectoryURL string
	// Email is the account's contact, for the CA's expiry notices.
	Email string
	// TrustedRoots, when set, are the roots that the CA's own HTTPS endpoint chains
	// to (a private or test CA).
	TrustedRoots *x509.CertPool
	// DisableHTTPChallenge and DisableTLSALPNChallenge turn a challenge type off.
	DisableHTTPChallenge, DisableTLSALPNChallenge bool
}

// Certificates obtains and serves the edge's certificates, from a local CA or from
// an ACME CA, for the names the table routes and for no other name: ahead of time
// for the table's exact hosts (ManageKnownHosts), and on demand during the
// handshake for the rest (names under wildcard domains, or a host the edge has not
// got to yet) — the decision is a map read of the table.
type Certificates struct {
	magic  *certmagic.Config // on demand, serves every handshake
	ahead  *certmagic.Config // same cache, storage and issuers; obtains known hosts' certificates
	cache  *certmagic.Cache
	acme   *certmagic.ACMEIssuer
	table  *Table
	log    *slog.Logger
	m      *certMetrics
	orders *orderLimiter
	base   string // the base domain: its app hosts are ordered ahead of time without the limits
}

// decide is the on-demand decision, at every handshake for a name without a
// certificate in memory (before storage is looked at): map reads only. A name
// no app is routed at gets nothing, nor does a public suffix (a route there
// is one the gitserver no longer makes: see domains:add).
func (c *Certificates) decide(_ context.Context, name string) error {
	if !c.table.Known(name) {
		c.m.refused(RefusedNotRouted)
		// Said at debug level: scanners ask for names all day long.
		c.log.Debug("no certificate for an unrouted name", "host", name, "reason", ErrNotRouted)
		return fmt.Errorf("%w: %s", ErrNotRouted, name)
	}
	if isPublicSuffix(name) {
		c.m.refused(RefusedPublicSuffix)
		c.log.Warn("no certificate for a public suffix", "host", name)
		return fmt.Errorf("%s is a public suffix: no certificate", name)
	}
	return nil
}

// orderEvent is the OnEvent of both configs, on demand and ahead of time: the
// metrics, and the order limits. They are applied when an order is about to
// start (certmagic emits cert_obtaining after it has looked in storage, under
// the name's lock), not in decide: decide is also asked before a certificate
// already in storage is loaded (after a restart, or one another replica
// obtained), which costs no order and must not be refused. Custom domains
// ordered ahead of time count as on-demand ones do (aheadEvent): a member who
// adds domains would otherwise spend the platform's ACME account limits.
// ErrNoRetry: certmagic would otherwise retry
// the refused order in the background; a host refused ahead of time gets its
// certificate on demand, at a handshake once the limits have room.
func (c *Certificates) orderEvent(ctx context.Context, event string, data map[string]any) error {
	if event == "cert_obtaining" {
		if renewal, _ := data["renewal"].(bool); !renewal {
			name, _ := data["identifier"].(string)
			if reason, err := c.orders.allow(name, time.Now()); err != nil {
				c.m.refused(reason)
				c.log.Warn("no certificate order", "host", name, "reason", reason, "err", err)
				return certmagic.ErrNoRetry{Err: err}
			}
		}
	}
	return c.m.onEvent(ctx, event, data)
}

// aheadEvent is the OnEvent of the ahead-of-time config. An app's host under
// the base domain is the platform's own name, one per app, and who may create
// apps is decided by the gitserver: it is ordered without the limits, as it
// always was (10 a day under one registered domain would leave the eleventh
// app of a day without a certificate for hours). Every other name, a custom
// domain a member added, goes through orderEvent's limits.
func (c *Certificates) aheadEvent(ctx context.Context, event string, data map[string]any) error {
	if name, _ := data["identifier"].(string); event == "cert_obtaining" && underDomain(name, c.base) {
		return c.m.onEvent(ctx, event, data)
	}
	return c.orderEvent(ctx, event, data)
}

// underDomain reports whether name is a host below domain (not domain itself).
func underDomain(name, domain string) bool {
	name, domain = strings.ToLower(strings.TrimSuffix(name, ".")), strings.ToLower(strings.TrimSuffix(domain, "."))
	return domain != "" && strings.HasSuffix(name, "."+domain)
}

// FileStorage keeps certificates in a directory: one edge on one node.
func FileStorage(dir string) certmagic.Storage { return &certmagic.FileStorage{Path: dir} }

// NewCertificates keeps certificates and ACME accounts in storage: FileStorage on
// one node, edge/secretstore for several replicas. Exactly one of local and acme is
// set. Metrics are registered on reg unless it is nil.
func NewCertificates(table *Table, storage certmagic.Storage, local *LocalCA, acme *ACME, log *slog.Logger, reg prometheus.Registerer) (*Certificates, error) {
	if log == nil {
		log = slog.Default()
	}
	if (local == nil) == (acme == nil) {
		return nil, errors.New("edge: certificates come from either the local CA or an ACME CA")
	}
	cfg := table.cfg.withDefaults()
	c := &Certificates{table: table, log: log, m: newCertMetrics(reg), orders: newOrderLimiter(cfg.OrdersPerDomain, cfg.Orders), base: cfg.BaseDomain}
	c.cache = certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert: func(certmagic.Certificate) (*certmagic.Config, error) { return c.magic, nil },
		Logger:           zap.NewNop(),
	})
	c.magic = certmagic.New(c.cache, certmagic.Config{
		Storage:        storage,
		OnDemand:       &certmagic.OnDemandConfig{DecisionFunc: c.decide},
		OnEvent:        c.orderEvent,
		ShouldEmitFunc: c.m.wants,
		Logger:         zap.NewNop(),
	})
	// A config with OnDemand set only adds ManageAsync's names to an allowlist and
	// waits for a handshake; this one, without, obtains them at once.
	c.ahead = certmagic.New(c.cache, certmagic.Config{
		Storage: storage, OnEvent: c.aheadEvent, ShouldEmitFunc: c.m.wants, Logger: zap.NewNop(),
	})
	if local != nil {
		c.magic.Issuers = []certmagic.Issuer{local}
		c.ahead.Issuers = c.magic.Issuers
		return c, nil
	}
	ca := acme.DirectoryURL
	if ca == "" {
		ca = certmagic.LetsEncryptProductionCA
	}
	c.acme = certmagic.NewACMEIssuer(c.magic, certmagic.ACMEIssuer{
		CA: ca, Email: acme.Email, Agreed: true, TrustedRoots: acme.TrustedRoots,
		DisableHTTPChallenge: acme.DisableHTTPChallenge, DisableTLSALPNChallenge: acme.DisableTLSALPNChallenge,
		Logger: zap.NewNop(),
	})
	c.magic.Issuers = []certmagic.Issuer{c.acme}
	c.ahead.Issuers = c.magic.Issuers
	return c, nil
}

// ManageKnownHosts obtains, in the background, a certificate for every exact host
// the table routes as soon as the table has it, so that an app's first visitor
// does not wait for an ACME order; certmagic keeps them renewed. A host that
// leaves the table is no longer renewed. Names the table does not route are never
// asked for. Its orders are within the order limits (orderEvent): a host
// refused is left to on-demand issuance. It returns when ctx ends.
func (c *Certificates) ManageKnownHosts(ctx context.Context) {
	managed := map[string]bool{}
	for {
		changed := c.table.Changed()
		hosts := c.table.Hosts()
		var fresh []string
		seen := make(map[string]bool, len(hosts))
		for _, h := range hosts {
			seen[h] = true
			if !managed[h] {
				managed[h] = true
				fresh = append(fresh, h)
			}
		}
		var gone []certmagic.SubjectIssuer
		for h := range managed {
			if !seen[h] {
				delete(managed, h)
				gone = append(gone, certmagic.SubjectIssuer{Subject: h})
			}
		}
		if len(gone) > 0 {
			c.cache.RemoveManaged(gone)
		}
		if len(fresh) > 0 {
			c.log.Info("obtaining certificates ahead of time", "hosts", fresh)
			if err := c.ahead.ManageAsync(ctx, fresh); err != nil {
				c.log.Error("certificates ahead of time: on-demand issuance still covers these hosts", "hosts", fresh, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// TLSConfig is the HTTPS listener's configuration: HTTP/2, HTTP/1.1 and the
// TLS-ALPN-01 challenge.
func (c *Certificates) TLSConfig() *tls.Config {
	tc := c.magic.TLSConfig()
	tc.NextProtos = append([]string{"h2", "http/1.1"}, tc.NextProtos...)
	tc.MinVersion = tls.VersionTLS12
	return tc
}

// HTTPHandler answers ACME HTTP-01 challenges and passes everything else to next.
func (c *Certificates) HTTPHandler(next http.Handler) http.Handler {
	if c.acme == nil {
		return next
	}
	return c.acme.HTTPChallengeHandler(next)
}
