package edge

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"net/http"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/caddyserver/certmagic"
)

// The states of a host's certificate, as the stats endpoint names them.
const (
	// CertValid: a certificate covering the host is held and is not yet in
	// its renewal window.
	CertValid = "valid"
	// CertExpiring: the certificate is in certmagic's renewal window (the last
	// third of its lifetime, or earlier when the ACME CA's renewal information
	// says so): it is renewed soon. One that stays expiring is one whose
	// renewals fail.
	CertExpiring = "expiring"
	// CertExpired: the newest certificate held is past its NotAfter.
	CertExpired = "expired"
	// CertNone: no certificate yet. The edge obtains it at the host's first
	// HTTPS handshake (or ahead of time, soon after the host is routed).
	CertNone = "none"
)

// MaxWildcardHosts bounds the names listed under one wildcard domain of an
// app: every name under it gets a certificate of its own on demand, and
// scanners can ask for many. The first, in name order, are listed.
const MaxWildcardHosts = 50

// ErrTableNotReady is the answer while the routing table has not been built:
// the edge does not know yet which hosts an app answers on.
var ErrTableNotReady = errors.New("the edge is starting: its routing table is not built yet")

// CertificateState is the certificate of one host an app answers on.
type CertificateState struct {
	Host  string `json:"host"`
	State string `json:"state"`
	// NotAfter (RFC 3339, UTC) and Issuer (the issuer key, as certmagic files
	// the certificate under in storage) are empty with CertNone.
	NotAfter string `json:"not_after,omitempty"`
	Issuer   string `json:"issuer,omitempty"`
}

// appHosts returns the hosts the table routes to app: its exact hosts, the
// default one (<app>.<base domain>) first and the others sorted, and the
// parents of its wildcard domains ("example.com" for "*.example.com"),
// sorted. A custom domain another app won is not app's. ok is false until the
// table is built.
func (t *Table) appHosts(app string) (exact, wildcard []string, ok bool) {
	s := t.cur.Load()
	if s == nil {
		return nil, nil, false
	}
	for h, r := range s.exact {
		if r.App == app {
			exact = append(exact, h)
		}
	}
	for parent, r := range s.wildcard {
		if r.App == app {
			wildcard = append(wildcard, parent)
		}
	}
	def := app + "." + strings.ToLower(strings.TrimSuffix(t.cfg.withDefaults().BaseDomain, "."))
	sort.Slice(exact, func(i, j int) bool {
		if (exact[i] == def) != (exact[j] == def) {
			return exact[i] == def
		}
		return exact[i] < exact[j]
	})
	sort.Strings(wildcard)
	return exact, wildcard, true
}

// AppCertificates reports the certificate of each host app answers on: its
// exact hosts (the default one first), then each wildcard domain as itself
// ("*.example.com", which no certificate of this edge covers: names under it
// are certified one by one, on demand) followed by the names under it that
// have a certificate in storage, at most MaxWildcardHosts of them. It only
// reads: the certificate cache in memory first, then storage when the cache
// has none for a host or has one due for renewal (another replica may have
// renewed it already). It never obtains, loads into the cache, or writes
// anything. An app the table routes no host for has none; until the table is
// built, the error is ErrTableNotReady.
func (c *Certificates) AppCertificates(ctx context.Context, app string) ([]CertificateState, error) {
	exact, wildcards, ok := c.table.appHosts(app)
	if !ok {
		return nil, ErrTableNotReady
	}
	out := make([]CertificateState, 0, len(exact)+len(wildcards))
	seen := map[string]bool{}
	add := func(host string) error {
		if seen[host] {
			return nil
		}
		seen[host] = true
		st, err := c.hostState(ctx, host, time.Now())
		if err != nil {
			return err
		}
		out = append(out, st)
		return nil
	}
	for _, h := range exact {
		if err := add(h); err != nil {
			return nil, err
		}
	}
	for _, parent := range wildcards {
		if err := add("*." + parent); err != nil {
			return nil, err
		}
		names, err := c.storedNamesUnder(ctx, parent)
		if err != nil {
			return nil, err
		}
		n := 0
		for _, name := range names {
			// Routed exactly to another app, the name is not app's (exact
			// hosts win over wildcards); app's own exact hosts are seen.
			if r, ok := c.table.Lookup(name); !ok || r.App != app || seen[name] {
				continue
			}
			if n == MaxWildcardHosts {
				break
			}
			n++
			if err := add(name); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// hostState is the state of the newest certificate for host in the cache or,
// when the cache has none or one due for renewal, in storage.
func (c *Certificates) hostState(ctx context.Context, host string, now time.Time) (CertificateState, error) {
	var leaf *x509.Certificate
	var issuer string
	renew := false
	for _, cert := range c.cache.AllMatchingCertificates(host) {
		// A certificate made for a TLS-ALPN challenge has no leaf: not a
		// host's certificate.
		if cert.Leaf == nil {
			continue
		}
		if leaf == nil || cert.Leaf.NotAfter.After(leaf.NotAfter) {
			// certmagic's own renewal decision, ACME renewal information
			// included.
			leaf, renew = cert.Leaf, cert.NeedsRenewal(c.magic)
			issuer = c.cachedIssuer()
		}
	}
	if leaf == nil || renew {
		for _, iss := range c.magic.Issuers {
			key := iss.IssuerKey()
			stored, err := c.storedLeaf(ctx, key, host)
			if err != nil {
				return CertificateState{}, err
			}
			if stored != nil && (leaf == nil || stored.NotAfter.After(leaf.NotAfter)) {
				leaf, issuer, renew = stored, key, false
			}
		}
	}
	if leaf == nil {
		return CertificateState{Host: host, State: CertNone}, nil
	}
	return CertificateState{
		Host:     host,
		State:    certState(leaf, now, c.magic.RenewalWindowRatio, renew),
		NotAfter: leaf.NotAfter.UTC().Format(time.RFC3339),
		Issuer:   issuer,
	}, nil
}

// cachedIssuer is the issuer key of a certificate in the cache, which certmagic
// does not expose: the edge has exactly one issuer (the local CA or one ACME
// CA), and the cache is only filled from it.
func (c *Certificates) cachedIssuer() string {
	if len(c.magic.Issuers) != 1 {
		return ""
	}
	return c.magic.Issuers[0].IssuerKey()
}

// storedLeaf reads host's certificate from issuerKey's place in storage: nil
// when there is none. A file that holds no certificate is reported as none,
// as certmagic would obtain a new one in its place.
func (c *Certificates) storedLeaf(ctx context.Context, issuerKey, host string) (*x509.Certificate, error) {
	data, err := c.magic.Storage.Load(ctx, certmagic.StorageKeys.SiteCert(issuerKey, host))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			c.log.Warn("a stored certificate cannot be read", "host", host, "issuer", issuerKey)
			return nil, nil
		}
		if block.Type == "CERTIFICATE" {
			leaf, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				c.log.Warn("a stored certificate cannot be read", "host", host, "issuer", issuerKey, "err", err)
				return nil, nil
			}
			return leaf, nil
		}
	}
}

// storedNamesUnder lists the names one label under parent that have a
// certificate in storage, of any of the edge's issuers, sorted: the names of a
// wildcard domain that were asked for (certmagic files each site under its
// name, lower-cased).
func (c *Certificates) storedNamesUnder(ctx context.Context, parent string) ([]string, error) {
	set := map[string]bool{}
	for _, iss := range c.magic.Issuers {
		keys, err := c.magic.Storage.List(ctx, certmagic.StorageKeys.CertsPrefix(iss.IssuerKey()), false)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			name := path.Base(k)
			label, rest, ok := strings.Cut(name, ".")
			// "wildcard_" is how certmagic files "*": a wildcard
			// certificate, looked up as the wildcard domain itself.
			if ok && rest == parent && label != "" && !strings.Contains(label, "_") {
				set[name] = true
			}
		}
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// certState classifies leaf at now. renew is certmagic's own verdict on a
// cached certificate; one read from storage is judged by the renewal window
// alone (the last ratio of its lifetime, certmagic's default when 0).
func certState(leaf *x509.Certificate, now time.Time, ratio float64, renew bool) string {
	// As certmagic counts it: NotAfter's second is still valid.
	end := leaf.NotAfter.Truncate(time.Second).Add(time.Second)
	if !now.Before(end) {
		return CertExpired
	}
	if ratio <= 0 {
		ratio = certmagic.DefaultRenewalWindowRatio
	}
	window := time.Duration(float64(end.Sub(leaf.NotBefore)) * ratio)
	if renew || now.After(end.Add(-window)) {
		return CertExpiring
	}
	return CertValid
}

// StatsHandler is the edge's stats endpoint (bex edge --stats-addr):
// GET /v1/apps/{app}/traffic (Proxy.TrafficHandler) and
// GET /v1/apps/{app}/certificates, the app's CertificateStates as a JSON list.
// certs is nil on an edge without HTTPS, which holds no certificate and
// answers an empty list. A name that cannot be an app's is a 400 and, while
// the routing table is not built, the answer is a 503, each with a one-line
// reason.
func StatsHandler(p *Proxy, certs *Certificates) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /v1/apps/{app}/traffic", p.TrafficHandler())
	mux.HandleFunc("GET /v1/apps/{app}/certificates", func(w http.ResponseWriter, r *http.Request) {
		app := r.PathValue("app")
		if err := checkTrafficApp(app); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		states := []CertificateState{}
		if certs != nil {
			var err error
			if states, err = certs.AppCertificates(r.Context(), app); err != nil {
				status := http.StatusInternalServerError
				if errors.Is(err, ErrTableNotReady) {
					status = http.StatusServiceUnavailable
				} else {
					err = errors.New("reading the certificate storage: " + strings.ReplaceAll(err.Error(), "\n", " "))
				}
				http.Error(w, err.Error(), status)
				return
			}
		}
		writeStats(w, states)
	})
	return mux
}
