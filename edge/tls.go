package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
)

// ErrNotRouted is the on-demand TLS answer for a name that no app serves: no
// certificate is ever requested for it. This is what keeps a public edge from
// spending a CA's rate limits on names that scanners invent.
var ErrNotRouted = errors.New("no app is routed at this name")

// TLSConfig returns the HTTPS listener's TLS configuration: certificates from
// issuer, stored under storageDir, obtained on demand during the handshake for the
// names the table routes — the decision is a map read of the table — and for no
// other name.
func TLSConfig(table *Table, storageDir string, issuer certmagic.Issuer) *tls.Config {
	var magic *certmagic.Config
	cache := certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert: func(certmagic.Certificate) (*certmagic.Config, error) { return magic, nil },
		Logger:           zap.NewNop(),
	})
	magic = certmagic.New(cache, certmagic.Config{
		Storage: &certmagic.FileStorage{Path: storageDir},
		Issuers: []certmagic.Issuer{issuer},
		OnDemand: &certmagic.OnDemandConfig{DecisionFunc: func(_ context.Context, name string) error {
			if table.Known(name) {
				return nil
			}
			return fmt.Errorf("%w: %s", ErrNotRouted, name)
		}},
		Logger: zap.NewNop(),
	})
	tc := magic.TLSConfig()
	tc.NextProtos = append([]string{"h2", "http/1.1"}, tc.NextProtos...)
	tc.MinVersion = tls.VersionTLS12
	return tc
}
