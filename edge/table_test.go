package edge

import (
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

func ptr[T any](v T) *T { return &v }

func app(name string, domains ...string) appv1.App {
	return appv1.App{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: appv1.AppSpec{Domains: domains}}
}

func slice(app string, at discoveryv1.AddressType, port int32, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
	return discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: app + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: app}},
		AddressType: at,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(port)}},
	}
}

func ep(ready *bool, addrs ...string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: addrs, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
}

// staticTable is a Table that never changes, for tests and benchmarks of the proxy
// alone.
func staticTable(base string, apps []appv1.App, eps []discoveryv1.EndpointSlice) *Table {
	s, _ := build(base, apps, eps)
	t := &Table{}
	t.cur.Store(s)
	return t
}

func TestBuild(t *testing.T) {
	suspended := app("zzz")
	suspended.Spec.Suspended = true
	multi := slice("multi", discoveryv1.AddressTypeIPv4, 0, ep(nil, "10.0.0.9"))
	multi.Ports = []discoveryv1.EndpointPort{
		{Name: ptr("metrics"), Port: ptr(int32(9090))},
		{Name: ptr("http"), Port: ptr(int32(8080))},
	}
	apps := []appv1.App{
		app("web", "www.example.com", "*.apps.example.com", "Shop.Example.COM"),
		app("aaa", "www.example.com"), // claims web's domain first by name: wins
		app("other", "web.localhost"), // may not take web's default host
		app("multi"), suspended,
	}
	eps := []discoveryv1.EndpointSlice{
		slice("web", discoveryv1.AddressTypeIPv4, 8000,
			ep(ptr(true), "10.0.0.1"), ep(nil, "10.0.0.2"), ep(ptr(false), "10.0.0.3")),
		slice("web", discoveryv1.AddressTypeIPv6, 8001, ep(nil, "fd00::1")),
		slice("web", discoveryv1.AddressTypeFQDN, 8002, ep(ptr(true), "127.0.0.1")),
		slice("web", "Other", 8003, ep(nil, "x")),
		slice("ghost", discoveryv1.AddressTypeIPv4, 80, ep(nil, "10.0.0.5")), // no App: ignored
		multi,
	}
	s, conflicts := build("LocalHost.", apps, eps)

	r, ok := s.lookup("web.localhost")
	if !ok || r.App != "web" {
		t.Fatalf("web.localhost: %+v %v", r, ok)
	}
	want := []string{"10.0.0.1:8000", "10.0.0.2:8000", "127.0.0.1:8002", "[fd00::1]:8001"}
	if !slices.Equal(r.Backends, want) {
		t.Errorf("backends = %v, want %v", r.Backends, want)
	}
	for host, want := range map[string]string{
		"WEB.localhost.":          "web",
		"a.apps.example.com":      "web",
		"shop.example.com":        "web",
		"www.example.com":         "aaa",
		"other.localhost":         "other",
		"multi.localhost":         "multi",
		"zzz.localhost":           "zzz",
		"a.b.apps.example.com":    "",
		"apps.example.com":        "",
		"ghost.localhost":         "",
		"web.localhost.evil.test": "",
	} {
		r, ok := s.lookup(host)
		if ok != (want != "") || r.App != want {
			t.Errorf("lookup(%q) = %q, %v; want %q", host, r.App, ok, want)
		}
	}
	if r, _ := s.lookup("multi.localhost"); !slices.Equal(r.Backends, []string{"10.0.0.9:8080"}) {
		t.Errorf("multi backends = %v, want the port named http", r.Backends)
	}
	if r, _ := s.lookup("zzz.localhost"); !r.Suspended {
		t.Error("zzz not suspended")
	}
	if len(conflicts) != 2 {
		t.Errorf("conflicts = %+v, want www.example.com and web.localhost", conflicts)
	}
}

func TestConfig(t *testing.T) {
	c := DefaultConfig()
	if c.BaseDomain != "localhost" || c.Namespace != "default" || c.DialTimeout != 5*time.Second ||
		c.ResponseHeaderTimeout != time.Minute || c.MaxHeaderBytes != 1<<20 {
		t.Errorf("defaults: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
	bad := c
	bad.BaseDomain, bad.Namespace, bad.DialTimeout, bad.MaxHeaderBytes = "Bad_Domain", "Bad NS", -1, 10
	err := bad.Validate()
	for _, want := range []string{"Config.BaseDomain", "Config.Namespace", "Config.DialTimeout", "Config.MaxHeaderBytes"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
}

func TestRequestID(t *testing.T) {
	if got := requestID("abc-123"); got != "abc-123" {
		t.Errorf("kept id = %q", got)
	}
	for _, in := range []string{"", "has space", strings.Repeat("x", 200), "nl\n"} {
		got := requestID(in)
		if len(got) != 32 || strings.Trim(got, "0123456789abcdef") != "" {
			t.Errorf("requestID(%q) = %q, want 32 hex", in, got)
		}
	}
}

func TestNotReady(t *testing.T) {
	p, err := NewProxy(Config{}, &Table{}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	p.ServeHTTP(w, httptest.NewRequest("GET", "http://web.localhost/", nil))
	if w.Code != 503 || !strings.Contains(w.Body.String(), "starting") {
		t.Errorf("before the first sync: %d %q", w.Code, w.Body)
	}
}
