package sshcmd_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"bex.co/bex/gitserver/backend"
)

// imageBackend is the pipeline's DeployImage and the importer's CheckLogin.
type imageBackend struct{ pulled []string }

func (i *imageBackend) DeployImage(_ context.Context, req backend.ImageRequest) (*backend.DeployResult, error) {
	i.pulled = append(i.pulled, req.Image)
	fmt.Fprintf(req.Progress, "-----> Pulling %s\n", req.Image)
	return &backend.DeployResult{Release: 2, URL: "https://" + req.App + ".bex.test"}, nil
}

func (i *imageBackend) CheckLogin(_ context.Context, host, user, password string) error {
	if password != "tok" {
		return backend.Errorf(backend.Invalid, "%s refused the password of %s: check them and log in again", host, user)
	}
	return nil
}

// TestImageCommands: deploy:image prints progress on stderr and the URL on
// stdout; registry:login reads the password from stdin only, never echoes it,
// and is for admins.
func TestImageCommands(t *testing.T) {
	ib := &imageBackend{}
	f := newFixtureWith(t, func(c *backend.Config) { c.Images, c.Registries = ib, ib }, deployed(app("shop", "bob")))

	out, errOut, code := f.run(bob, "", "deploy:image", "shop", "ghcr.io/org/shop:v1")
	if code != 0 || out != "v2 serves at https://shop.bex.test\n" || !strings.Contains(errOut, "-----> Pulling ghcr.io/org/shop:v1") {
		t.Fatalf("deploy:image: %d %q %q", code, out, errOut)
	}
	if _, errOut, code := f.run(bob, "", "deploy:image", "shop"); code != 1 || !strings.Contains(errOut, "usage: deploy:image APP IMAGE") {
		t.Errorf("deploy:image without an image: %d %q", code, errOut)
	}
	if _, errOut, code := f.run(carol, "", "deploy:image", "shop", "ghcr.io/org/shop:v1"); code != 1 || !strings.Contains(errOut, "shop") {
		t.Errorf("deploy:image by a stranger: %d %q", code, errOut)
	}

	if _, errOut, code := f.run(ana, "tok\n", "registry:login", "ghcr.io", "ci"); code != 1 || !strings.Contains(errOut, "--password-stdin") {
		t.Errorf("registry:login without --password-stdin: %d %q", code, errOut)
	}
	if _, errOut, code := f.run(bob, "tok\n", "registry:login", "ghcr.io", "ci", "--password-stdin"); code != 1 || !strings.Contains(errOut, "for admins") {
		t.Errorf("a member's registry:login: %d %q", code, errOut)
	}
	if out, errOut, code := f.run(ana, "nope\n", "registry:login", "ghcr.io", "ci", "--password-stdin"); code != 1 ||
		!strings.Contains(errOut, "ghcr.io refused the password of ci") || strings.Contains(out+errOut, "nope") {
		t.Errorf("a refused password: %d %q %q", code, out, errOut)
	}
	out, errOut, code = f.run(ana, "tok\n", "registry:login", "ghcr.io", "ci", "--password-stdin")
	if code != 0 || !strings.Contains(out, "Logged in to ghcr.io as ci") || strings.Contains(out+errOut, "tok\n") {
		t.Fatalf("registry:login: %d %q %q", code, out, errOut)
	}
	if out, _, code := f.run(ana, "", "registry"); code != 0 || !strings.Contains(out, "ghcr.io") || !strings.Contains(out, "ci") || strings.Contains(out, "tok") {
		t.Errorf("registry: %d %q", code, out)
	}
	if out, _, code := f.run(ana, "", "registry:logout", "ghcr.io"); code != 0 || !strings.Contains(out, "Logged out of ghcr.io") {
		t.Errorf("registry:logout: %d %q", code, out)
	}
	if _, errOut, code := f.run(ana, "", "registry:logout", "ghcr.io"); code != 1 || !strings.Contains(errOut, "no login is kept for ghcr.io") {
		t.Errorf("registry:logout twice: %d %q", code, errOut)
	}
}
