package backend

import (
	"context"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/net/publicsuffix"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

var domainRE = regexp.MustCompile(`^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// normalDomain is d as the edge matches it: lower case, no trailing dot.
func normalDomain(d string) string { return strings.TrimSuffix(strings.ToLower(d), ".") }

// Domains is an app's custom domains.
func (b *Backend) Domains(ctx context.Context, u *User, name string) (*DomainList, error) {
	a, err := b.app(ctx, u, name)
	if err != nil {
		return nil, err
	}
	return &DomainList{App: a.Name, URL: a.Status.URL, Domains: nonNil(a.Spec.Domains)}, nil
}

// publicSuffix reports whether d is a public suffix: a name under which
// anyone may register their own (com, co.uk), whether the list has it from
// ICANN or from a private registry (github.io, pages.dev). An app that claimed
// one would take every site under it, and its wildcard every certificate.
// Names the list does not know (shop.example) have their last label as the
// suffix, so a bare unknown TLD is refused and names under it are not.
func publicSuffix(d string) bool {
	suffix, _ := publicsuffix.PublicSuffix(d) // either kind of entry: both are others' names
	return suffix == d
}

// AddDomain serves an app on a domain too; it returns the domain as stored.
// A public suffix, or a wildcard over one, is Invalid; a wildcard domain is for
// admins only (Forbidden for members): it routes, and on-demand TLS orders
// certificates for, every name under it. Members are also refused (Forbidden)
// the platform's names (platformName) and names under a domain of an app they
// are not a member of (underOthers); admins may add those.
func (b *Backend) AddDomain(ctx context.Context, u *User, name, domain string) (string, error) {
	if err := u.mayChange("domains:add"); err != nil {
		return "", err
	}
	d := normalDomain(domain)
	if len(d) > 253 || !domainRE.MatchString(d) || !strings.Contains(d, ".") {
		return "", Errorf(Invalid, "%q is not a domain name: use a name like www.example.com (or *.example.com)", domain)
	}
	base, wildcard := strings.CutPrefix(d, "*.")
	if publicSuffix(base) {
		if wildcard {
			return "", Errorf(Invalid, "%s is a wildcard over the public suffix %s, where anyone registers their own domains: use a domain of yours, such as *.shop.%s", d, base, base)
		}
		return "", Errorf(Invalid, "%s is a public suffix, where anyone registers their own domains: use a domain of yours, such as www.shop.%s", d, d)
	}
	if _, err := b.app(ctx, u, name); err != nil {
		return "", err
	}
	if wildcard && !u.wideAdmin() {
		return "", Errorf(Forbidden, "wildcard domains are for admins: ask one to add %s, or add the names you need one by one", d)
	}
	if !u.wideAdmin() {
		if err := b.platformName(d); err != nil {
			return "", err
		}
	}
	// A domain routes to one app: refuse one another app has, without naming
	// an app the user may not know of.
	var apps appv1.AppList
	if err := b.cfg.Reader.List(ctx, &apps, client.InNamespace(b.cfg.Namespace)); err != nil {
		return "", err
	}
	for _, other := range apps.Items {
		if other.Name != name && slices.Contains(other.Spec.Domains, d) {
			return "", Errorf(Conflict, "%s is served by another app already: remove it there first", d)
		}
	}
	if !u.wideAdmin() {
		if err := underOthers(u, name, d, apps.Items); err != nil {
			return "", err
		}
	}
	if _, err := b.update(ctx, u, name, func(app *appv1.App) error {
		if slices.Contains(app.Spec.Domains, d) {
			return Errorf(Conflict, "%s serves %s already", app.Name, d)
		}
		app.Spec.Domains = append(app.Spec.Domains, d)
		return nil
	}); err != nil {
		return "", err
	}
	b.audit(u, "domains:add", name, "domain", d)
	return d, nil
}

// RemoveDomain stops serving an app on a domain; it returns the domain as it
// was stored.
func (b *Backend) RemoveDomain(ctx context.Context, u *User, name, domain string) (string, error) {
	if err := u.mayChange("domains:remove"); err != nil {
		return "", err
	}
	d := normalDomain(domain)
	if _, err := b.update(ctx, u, name, func(app *appv1.App) error {
		if !slices.Contains(app.Spec.Domains, d) {
			return Errorf(NotFound, "%s does not serve %q (domains %s lists its domains)", app.Name, domain, app.Name)
		}
		app.Spec.Domains = slices.DeleteFunc(app.Spec.Domains, func(x string) bool { return x == d })
		return nil
	}); err != nil {
		return "", err
	}
	b.audit(u, "domains:remove", name, "domain", d)
	return d, nil
}

// platformName refuses a member a name of the platform's: the base domain,
// any name under it (<app>.<base> is an app's own host, login.<app>.<base>
// would phish its users, and the wildcard DNS record of the base domain makes
// every such name resolve to the edge, which gets it a valid certificate), and
// any other name of the base domain's registered domain (from www.example.com
// a page sets cookies for example.com, which every app under apps.example.com
// then receives). As on Heroku and Render, an app's name under the base
// domain is the one it is given; admins may add others.
func (b *Backend) platformName(d string) error {
	base := normalDomain(b.cfg.BaseDomain)
	if base == "" {
		return nil
	}
	name := strings.TrimPrefix(d, "*.")
	if name == base || strings.HasSuffix(name, "."+base) {
		return Errorf(Forbidden, "%s is the platform's name (apps answer at APP.%s on their own): add a domain of yours, such as www.example.com, or ask an admin", d, base)
	}
	if reg := registeredDomain(base); reg != base && (name == reg || strings.HasSuffix(name, "."+reg)) {
		return Errorf(Forbidden, "%s shares %s with the platform's names (its pages could set cookies every app receives): add a domain of yours, such as www.example.com, or ask an admin", d, reg)
	}
	return nil
}

// underOthers refuses u a name under a domain of an app u is not a member of
// (login.shop.example.com when another tenant serves shop.example.com or
// *.shop.example.com): a wildcard DNS record for that domain would make the
// edge serve it, with a certificate, as a page of theirs.
func underOthers(u *User, app, d string, apps []appv1.App) error {
	name := strings.TrimPrefix(d, "*.")
	for _, other := range apps {
		if other.Name == app || u.MayUseApp(other.Name, other.Spec.Members) {
			continue
		}
		for _, od := range other.Spec.Domains {
			parent := strings.TrimPrefix(od, "*.")
			if strings.HasSuffix(name, "."+parent) {
				return Errorf(Forbidden, "%s is under %s, a domain of another app: only its members (or an admin) may add names under it", d, parent)
			}
		}
	}
	return nil
}

// registeredDomain is the domain d was registered as (example.com for
// apps.example.com), or d itself when the public suffix list cannot say
// (localhost).
func registeredDomain(d string) string {
	if r, err := publicsuffix.EffectiveTLDPlusOne(d); err == nil {
		return r
	}
	return d
}
