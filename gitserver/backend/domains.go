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
// certificates for, every name under it.
func (b *Backend) AddDomain(ctx context.Context, u *User, name, domain string) (string, error) {
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
	if wildcard && !u.Admin {
		return "", Errorf(Forbidden, "wildcard domains are for admins: ask one to add %s, or add the names you need one by one", d)
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
