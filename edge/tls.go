package edge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/caddyserver/certmagic"
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

// Certificates obtains and serves the edge's certificates: on demand during the
// handshake, for the names the table routes — the decision is a map read of the
// table — and for no other name; from a local CA or from an ACME CA.
type Certificates struct {
	magic *certmagic.Config
	acme  *certmagic.ACMEIssuer
}

// FileStorage keeps certificates in a directory: one edge on one node.
func FileStorage(dir string) certmagic.Storage { return &certmagic.FileStorage{Path: dir} }

// NewCertificates keeps certificates and ACME accounts in storage: FileStorage on
// one node, edge/secretstore for several replicas. Exactly one of local and acme is
// set.
func NewCertificates(table *Table, storage certmagic.Storage, local *LocalCA, acme *ACME, log *slog.Logger) (*Certificates, error) {
	if log == nil {
		log = slog.Default()
	}
	if (local == nil) == (acme == nil) {
		return nil, errors.New("edge: certificates come from either the local CA or an ACME CA")
	}
	c := &Certificates{}
	cache := certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert: func(certmagic.Certificate) (*certmagic.Config, error) { return c.magic, nil },
		Logger:           zap.NewNop(),
	})
	c.magic = certmagic.New(cache, certmagic.Config{
		Storage: storage,
		OnDemand: &certmagic.OnDemandConfig{DecisionFunc: func(_ context.Context, name string) error {
			if table.Known(name) {
				return nil
			}
			// Said at debug level: scanners ask for names all day long.
			log.Debug("no certificate for an unrouted name", "host", name, "reason", ErrNotRouted)
			return fmt.Errorf("%w: %s", ErrNotRouted, name)
		}},
		Logger: zap.NewNop(),
	})
	if local != nil {
		c.magic.Issuers = []certmagic.Issuer{local}
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
	return c, nil
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
