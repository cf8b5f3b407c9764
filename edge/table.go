package edge

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	discoveryv1 "k8s.io/api/discovery/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// Route is what the edge knows about the app answering at one host.
type Route struct {
	// App is the app's name.
	App string
	// Suspended is spec.suspended: the edge answers 503 and proxies nothing.
	Suspended bool
	// Backends are host:port addresses of the app's ready web instances, sorted.
	// Shared with the snapshot: do not modify.
	Backends []string
	// Platform marks the route of bex's own endpoints (Config.PlatformBackend): only
	// PlatformPaths are proxied on it.
	Platform bool

	// next is the round-robin cursor, shared by every host of the app in one
	// snapshot. A rebuild starts it again at zero, which costs nothing but a
	// momentary skew.
	next *atomic.Uint64
}

// PlatformApp names the platform's route in logs and metrics. It is not a valid app
// name, so it is never an app's.
const PlatformApp = "(bex)"

// snapshot is one immutable routing table.
type snapshot struct {
	exact    map[string]Route // lower-case host -> route
	wildcard map[string]Route // "example.com" for "*.example.com"
}

// Table is the routing table: a snapshot replaced as a whole on informer events.
type Table struct {
	cfg  Config
	c    cache.Cache
	log  *slog.Logger
	cur  atomic.Pointer[snapshot]
	kick chan struct{}

	mu      sync.Mutex
	changed chan struct{} // closed when the next snapshot is stored
}

// NewTable registers the App and EndpointSlice informers of c and their event
// handlers, and starts the goroutine that rebuilds the table until ctx ends. Call it
// before c is started (see the package doc for the order). Until c has synced, the
// table is not Ready and knows no host.
func NewTable(ctx context.Context, cfg Config, c cache.Cache, log *slog.Logger) (*Table, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	t := &Table{cfg: cfg, c: c, log: log, kick: make(chan struct{}, 1), changed: make(chan struct{})}
	// Every event only kicks the rebuilder: the rebuild lists the whole namespace
	// from the cache, which the informer updates before it calls handlers, so the
	// rebuild that follows a kick sees at least that event.
	h := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { t.poke() },
		UpdateFunc: func(any, any) { t.poke() },
		DeleteFunc: func(any) { t.poke() },
	}
	for _, obj := range []client.Object{&appv1.App{}, &discoveryv1.EndpointSlice{}} {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return nil, fmt.Errorf("informer for %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return nil, fmt.Errorf("event handler for %T: %w", obj, err)
		}
	}
	go t.run(ctx)
	return t, nil
}

func (t *Table) poke() {
	select {
	case t.kick <- struct{}{}:
	default: // a rebuild is already pending; it will see this event too
	}
}

func (t *Table) run(ctx context.Context) {
	if !t.c.WaitForCacheSync(ctx) {
		return
	}
	t.poke()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.kick:
		}
		if err := t.rebuild(ctx); err != nil {
			// Keep serving the last good table; the next event tries again.
			t.log.Error("edge: rebuild routing table", "err", err)
		}
	}
}

func (t *Table) rebuild(ctx context.Context) error {
	var apps appv1.AppList
	if err := t.c.List(ctx, &apps, client.InNamespace(t.cfg.Namespace)); err != nil {
		return fmt.Errorf("list apps: %w", err)
	}
	var eps discoveryv1.EndpointSliceList
	if err := t.c.List(ctx, &eps, client.InNamespace(t.cfg.Namespace),
		client.HasLabels{discoveryv1.LabelServiceName}); err != nil {
		return fmt.Errorf("list endpointslices: %w", err)
	}
	s, conflicts := build(t.cfg.BaseDomain, apps.Items, eps.Items)
	if t.cfg.PlatformBackend != "" {
		host := strings.ToLower(t.cfg.PlatformHost)
		if r, taken := s.exact[host]; taken {
			conflicts = append(conflicts, conflict{host: host, winner: PlatformApp, loser: r.App})
		}
		s.exact[host] = Route{App: PlatformApp, Platform: true, Backends: []string{t.cfg.PlatformBackend}, next: new(atomic.Uint64)}
	}
	for _, c := range conflicts {
		t.log.Warn("edge: domain claimed twice", "host", c.host, "serving", c.winner, "ignored", c.loser)
	}
	t.store(s)
	return nil
}

func (t *Table) store(s *snapshot) {
	t.cur.Store(s)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.changed != nil {
		close(t.changed)
	}
	t.changed = make(chan struct{})
}

// Changed returns a channel that is closed when the table is next rebuilt. Take it
// before reading the table, so that no rebuild goes unnoticed.
func (t *Table) Changed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changed
}

// Hosts returns the exact host names the table routes, sorted: the names whose
// certificates can be obtained ahead of the first visitor. Wildcard domains are
// not in it (their names are only known when a client asks).
func (t *Table) Hosts() []string {
	s := t.cur.Load()
	if s == nil {
		return nil
	}
	hosts := make([]string, 0, len(s.exact))
	for h := range s.exact {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	return hosts
}

// Ready reports whether the table has been built from a synced cache.
func (t *Table) Ready() bool { return t.cur.Load() != nil }

// Lookup returns the route of host (without a port; any case; a trailing dot is
// ignored): an exact host first, then a "*.parent" entry matching one label.
func (t *Table) Lookup(host string) (Route, bool) {
	s := t.cur.Load()
	if s == nil {
		return Route{}, false
	}
	return s.lookup(host)
}

// Known reports whether some app answers at host. It is the question an on-demand
// TLS issuer asks before getting a certificate, so that a stranger's host names
// cannot make the edge request certificates.
func (t *Table) Known(host string) bool {
	_, ok := t.Lookup(host)
	return ok
}

func (s *snapshot) lookup(host string) (Route, bool) {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if r, ok := s.exact[host]; ok {
		return r, true
	}
	if i := strings.IndexByte(host, '.'); i > 0 {
		if r, ok := s.wildcard[host[i+1:]]; ok {
			return r, true
		}
	}
	return Route{}, false
}

type conflict struct{ host, winner, loser string }

// build makes a snapshot from the Apps and EndpointSlices of one namespace. It is
// a pure function so that its rules are tested without an API server.
//
// Rules: an app's default host <app>.<base> is always its own (app names are unique,
// so no custom domain may take it); a custom domain claimed by two apps goes to the
// first by name, deterministically, and the other claim is reported. Apps being
// deleted are still routed: their instances drain like any other.
func build(baseDomain string, apps []appv1.App, eps []discoveryv1.EndpointSlice) (*snapshot, []conflict) {
	baseDomain = strings.ToLower(strings.TrimSuffix(baseDomain, "."))
	backends := map[string]map[string]bool{}
	for i := range eps {
		app := eps[i].Labels[discoveryv1.LabelServiceName]
		if app == "" {
			continue
		}
		for _, b := range sliceBackends(&eps[i]) {
			if backends[app] == nil {
				backends[app] = map[string]bool{}
			}
			backends[app][b] = true
		}
	}
	sorted := slices.Clone(apps)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })

	s := &snapshot{exact: map[string]Route{}, wildcard: map[string]Route{}}
	routes := make([]Route, len(sorted))
	for i, a := range sorted {
		r := Route{App: a.Name, Suspended: a.Spec.Suspended, next: new(atomic.Uint64)}
		for b := range backends[a.Name] {
			r.Backends = append(r.Backends, b)
		}
		sort.Strings(r.Backends)
		routes[i] = r
		s.exact[a.Name+"."+baseDomain] = r
	}
	var conflicts []conflict
	for i, a := range sorted {
		for _, d := range a.Spec.Domains {
			d = strings.ToLower(strings.TrimSuffix(d, "."))
			m, key := s.exact, d
			if rest, ok := strings.CutPrefix(d, "*."); ok {
				m, key = s.wildcard, rest
			}
			if have, ok := m[key]; ok {
				if have.App != a.Name {
					conflicts = append(conflicts, conflict{d, have.App, a.Name})
				}
				continue
			}
			m[key] = routes[i]
		}
	}
	return s, conflicts
}

// sliceBackends returns host:port for each ready endpoint address of s.
func sliceBackends(s *discoveryv1.EndpointSlice) []string {
	switch s.AddressType {
	case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN:
	default:
		return nil
	}
	port, ok := slicePort(s)
	if !ok {
		return nil
	}
	var out []string
	for _, ep := range s.Endpoints {
		// Ready nil means "unknown", which the EndpointSlice API says to treat as ready.
		if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
			continue
		}
		for _, addr := range ep.Addresses {
			out = append(out, net.JoinHostPort(addr, strconv.Itoa(int(port))))
		}
	}
	return out
}

// slicePort picks the slice's port: the only one, or the one named "http".
func slicePort(s *discoveryv1.EndpointSlice) (int32, bool) {
	var ports []discoveryv1.EndpointPort
	for _, p := range s.Ports {
		if p.Port != nil && *p.Port > 0 && (p.Protocol == nil || *p.Protocol == "TCP") {
			ports = append(ports, p)
		}
	}
	if len(ports) == 1 {
		return *ports[0].Port, true
	}
	for _, p := range ports {
		if p.Name != nil && *p.Name == "http" {
			return *p.Port, true
		}
	}
	return 0, false
}
