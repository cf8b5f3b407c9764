package builder

import "testing"

// A cache record is an app's only when its description names the app's image
// or a cache mount id under <ImageRepo>/<app>/; the rest (layers, build
// contexts, base images) is nobody's, and a longer name that begins with an
// app's is not that app's.
func TestAppOfRecord(t *testing.T) {
	b := &Builder{cfg: Config{ImageRepo: "bex.local"}}
	for desc, want := range map[string]string{
		"local source for context":                                                     "",
		"mount / from exec /bin/sh -c echo built > /built":                             "",
		"pulled from docker.io/library/busybox:latest":                                 "",
		"exporting to image bex.local/shop:0123456789ab":                               "shop",
		"cached mount /root/.cache from exec go build with id \"bex.local/shop-2/go\"": "shop-2",
		"cached mount /root/.cache/go-build from exec go build with id \"bex.local/shop/2f0e4b0a-1c2d-4e5f-8a9b-0c1d2e3f4a5b//root/.cache/go-build\"": "shop",
		"bex.local/Shop:x":                       "",
		"other.registry/bex.local/blog@sha256:…": "",
		"an image bex.local/blog@sha256:…":       "blog",
		"bex.localx/shop:1":                      "",
	} {
		if got := b.appOfRecord(desc); got != want {
			t.Errorf("appOfRecord(%q) = %q, want %q", desc, got, want)
		}
	}
}
