package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// TestLocalBasesServeHerokuStyleAppsWithoutDockerfile pushes apps as they come from
// Heroku, with no Dockerfile, with the real git over ssh to `bex up --local-bases`,
// and fetches each through the edge: a Procfile-only Python app (`web: python3 -u
// web.py`) on the stack base, and a Rails app with its gems in vendor/cache
// (RubyGems is not reachable here; Rails is the image's) whose app.json asks for a
// generated SECRET_KEY_BASE, which the first push sets. The trees are the plan's
// fixtures (builder/plan/testdata/*/src); builder/plan's
// TestStackRubyAndPHPPlansBuildAndServe builds and serves the others (a Rack app,
// PHP with and without composer.json) and these two again, so that this test is
// the path through bex, not every stack a second time.
func TestLocalBasesServeHerokuStyleAppsWithoutDockerfile(t *testing.T) {
	p, cfg := startLocalBases(t)

	for _, tc := range []struct {
		fixture, from string
		want          *regexp.Regexp
		check         func(t *testing.T, app, body string)
	}{
		{fixture: "procfile-python", from: cfg.Names.Stack, want: regexp.MustCompile(`hello from python 3\.11 on the stack`)},
		// Rails needs SECRET_KEY_BASE, which the image does not hold: the
		// fixture's app.json asks for it with generator: "secret", as Heroku's
		// Rails apps do, and the first push sets it.
		{fixture: "ruby-rails", from: cfg.Names.Ruby,
			want: regexp.MustCompile(`hello from rails 6\.1\.[\d.]+ in production, stylesheet /assets/application-[0-9a-f]{64}\.css`),
			check: func(t *testing.T, app, body string) {
				css := regexp.MustCompile(`/assets/application-[0-9a-f]{64}\.css`).FindString(body)
				if code, got, err := p.https(app, css); err != nil || code != http.StatusOK || !strings.Contains(got, "font-family") {
					t.Errorf("%s: %d %q %v, want the compiled stylesheet", css, code, got, err)
				}
			}},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			app := tc.fixture
			r := p.newRepoFrom(t, filepath.Join("builder", "plan", "testdata", tc.fixture, "src"), app)
			began := time.Now()
			out, err := r.push()
			if err != nil {
				t.Fatalf("push: %v\n%s", err, out)
			}
			t.Logf("push (%s):\n%s", time.Since(began).Round(time.Millisecond), out)
			if !strings.Contains(out, "FROM "+tc.from) {
				t.Errorf("push output lacks FROM %s", tc.from)
			}
			var body string
			testenv.Eventually(t, time.Minute, app+" answers", func() error {
				code, b, err := p.https(app, "/")
				if err == nil && (code != http.StatusOK || !tc.want.MatchString(b)) {
					return fmt.Errorf("%d %.300q, want 200 with %s", code, b, tc.want)
				}
				body = b
				return err
			})
			if tc.check != nil {
				tc.check(t, app, body)
			}
		})
	}
}
