package builder

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/moby/buildkit/solver/pb"
	"github.com/moby/buildkit/sourcepolicy"
	spb "github.com/moby/buildkit/sourcepolicy/pb"
)

// The policy as buildkitd's own engine evaluates it, on identifiers as buildkitd
// normalises them. The builds of tenant_test.go show it in buildkitd.
func TestTheSourcePolicyAllowsBaseImagesAndTheAppsOwn(t *testing.T) {
	const digest = "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		repo  string
		id    string
		allow bool
	}{
		{"bex.local", "docker-image://docker.io/library/busybox:latest", true},
		{"bex.local", "docker-image://docker.io/library/golang:1.26-bookworm" + digest, true},
		{"bex.local", "docker-image://bex.local/web:0123456789ab", true},
		{"bex.local", "docker-image://bex.local/web:image-sha256-abc", true},
		{"bex.local", "docker-image://bex.local/web" + digest, true},
		{"bex.local", "docker-image://bex.local/web:0123456789ab" + digest, true},
		{"bex.local", "docker-image://bex.local/other:0123456789ab", false},
		{"bex.local", "docker-image://bex.local/other" + digest, false},
		// A name that starts with the app's is another app's.
		{"bex.local", "docker-image://bex.local/web-api:0123456789ab", false},
		{"bex.local", "docker-image://bex.local/web/x:1", false},
		{"bex.local", "docker-image://BEX.LOCAL/other:1", false},
		{"bex.local", "docker-image+blob://bex.local/other" + digest, false},
		// A registry's repository, as a cluster's image-repo is.
		{"registry.example:5000/apps", "docker-image://registry.example:5000/apps/web:1", true},
		{"registry.example:5000/apps", "docker-image://registry.example:5000/apps/other:1", false},
		{"registry.example:5000/apps", "docker-image://registry.example:5000/appsx/other:1", true},
		// A repository without a host is Docker Hub's, as buildkitd spells it.
		{"acme", "docker-image://docker.io/acme/other:1", false},
		{"acme", "docker-image://docker.io/acme/web:1", true},
	} {
		pol, err := sourcePolicy(tc.repo, "web")
		if err != nil {
			t.Fatal(err)
		}
		_, err = sourcepolicy.NewEngine([]*spb.Policy{pol}).Evaluate(context.Background(), &pb.SourceOp{Identifier: tc.id})
		if allowed := err == nil; allowed != tc.allow {
			t.Errorf("%s in %s: allowed %v (%v), want %v", tc.id, tc.repo, allowed, err, tc.allow)
		}
		if err != nil && !errors.Is(err, sourcepolicy.ErrSourceDenied) {
			t.Errorf("%s: %v", tc.id, err)
		}
		if err != nil {
			line, ok := deniedSource(err, "failed to solve: could not resolve image due to policy: "+err.Error())
			if !ok || !strings.HasSuffix(line.Error(), " is another app's image: a build starts from base images or this app's own (FROM, COPY --from, RUN --mount from=)") {
				t.Errorf("%s: the denial reads %v", tc.id, line)
			}
		}
	}
}

func TestTheAppsBuildArgumentsCannotSetBexsOwn(t *testing.T) {
	attrs := map[string]string{
		"build-arg:" + argCacheNS:  "victim",
		"build-arg:" + argHostname: "x",
		"build-arg:" + argSyntax:   "docker/dockerfile:1",
		"build-arg:PLAIN":          "kept",
	}
	var out bytes.Buffer
	tenantAttrs(attrs, "bex.local", "web", "2f0e4b0a-1c2d-4e5f-8a9b-0c1d2e3f4a5b", &out)
	want := map[string]string{
		"build-arg:" + argCacheNS:  "bex.local/web/2f0e4b0a-1c2d-4e5f-8a9b-0c1d2e3f4a5b",
		"build-arg:" + argHostname: "app-2f0e4b0a-1c2d-4e5f-8a9b-0c1d2e3f4a5b",
		"build-arg:PLAIN":          "kept",
		"cmdline":                  "dockerfile.v0",
	}
	if len(attrs) != len(want) {
		t.Errorf("attrs %v, want %v", attrs, want)
	}
	for k, v := range want {
		if attrs[k] != v {
			t.Errorf("%s = %q, want %q", k, attrs[k], v)
		}
	}
	for _, k := range []string{argCacheNS, argHostname, argSyntax} {
		if !strings.Contains(out.String(), "-----> The build argument "+k+" is bex's own: the app's value is ignored\n") {
			t.Errorf("no line for %s:\n%s", k, out.String())
		}
	}
}
