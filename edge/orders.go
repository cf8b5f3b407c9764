package edge

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/publicsuffix"
	"golang.org/x/time/rate"
)

// Reasons an on-demand certificate is refused, the reason label of
// bex_edge_certificate_refusals_total.
const (
	RefusedNotRouted     = "not_routed"          // no app is routed at the name
	RefusedPublicSuffix  = "public_suffix"       // the name is a public suffix (co.uk, github.io)
	RefusedDomainLimited = "domain_rate_limited" // Config.OrdersPerDomain used up for its registered domain
	RefusedLimited       = "rate_limited"        // Config.Orders used up
)

// ErrOrderLimit is the refusal of a certificate order past Config.Orders or
// Config.OrdersPerDomain.
var ErrOrderLimit = errors.New("certificate orders are rate-limited")

// orderLimiter bounds the certificate orders a handshake may start: a token
// bucket per registered domain and one for all. Only names the table routes
// get here, so the buckets are as many as the routed registered domains; full
// ones (idle for a whole period) are dropped when there are many.
type orderLimiter struct {
	perDomain, all OrderRate
	mu             sync.Mutex
	total          *rate.Limiter
	domains        map[string]*rate.Limiter
}

func newOrderLimiter(perDomain, all OrderRate) *orderLimiter {
	return &orderLimiter{perDomain: perDomain, all: all, total: bucket(all), domains: map[string]*rate.Limiter{}}
}

func bucket(r OrderRate) *rate.Limiter {
	return rate.NewLimiter(rate.Every(r.Per/time.Duration(r.N)), r.N)
}

// registeredDomain is the domain name was registered as (shop.example.com for
// www.shop.example.com, shop.co.uk for a.shop.co.uk): the unit of a CA's
// per-domain limits.
func registeredDomain(name string) string {
	if d, err := publicsuffix.EffectiveTLDPlusOne(name); err == nil {
		return d
	}
	return name // a single label the list does not know (localhost), or a suffix decide refused
}

// isPublicSuffix reports whether name is on the public suffix list, from ICANN
// (com, co.uk) or a private registry (github.io). A single label the list does
// not know (localhost, the local base domain) is not.
func isPublicSuffix(name string) bool {
	suffix, icann := publicsuffix.PublicSuffix(name)
	return suffix == name && (icann || strings.Contains(name, "."))
}

// allow takes one order for name from its registered domain's bucket and the
// total, or from neither, and says which refused.
func (l *orderLimiter) allow(name string, now time.Time) (reason string, err error) {
	domain := registeredDomain(name)
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.domains[domain]
	if b == nil {
		if len(l.domains) >= 4096 {
			for d, old := range l.domains {
				if old.TokensAt(now) >= float64(l.perDomain.N) {
					delete(l.domains, d)
				}
			}
		}
		b = bucket(l.perDomain)
		l.domains[domain] = b
	}
	if b.TokensAt(now) < 1 {
		return RefusedDomainLimited, fmt.Errorf("%w: %s had %s for %s", ErrOrderLimit, domain, l.perDomain, name)
	}
	if l.total.TokensAt(now) < 1 {
		return RefusedLimited, fmt.Errorf("%w: the edge had %s, for %s", ErrOrderLimit, l.all, name)
	}
	b.AllowN(now, 1)
	l.total.AllowN(now, 1)
	return "", nil
}
