package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/machine/baseimage"
	"bex.co/bex/internal/testenv"
)

// npmAdded is npm's summary of an install, as `npm ci` prints it.
var npmAdded = regexp.MustCompile(`(?m)^remote: .*added [0-9]+ packages`)

// TestLocalBasesBuildANodeAppWithoutDockerfile is a new user on a machine that
// reaches no container registry: `bex up --local-bases` makes the Debian stand-ins
// for the official bases, and a push of an Express app with no Dockerfile
// (hack/samples/hello-node: package.json, package-lock.json with express from npm,
// server.js on $PORT) builds on the node stand-in, installs express from npm's real
// registry inside the build (on the builds' own network, internal/machine/tenantnet), and
// answers over HTTPS. The build's output, npm's included, comes back as remote:
// lines.
func TestLocalBasesBuildANodeAppWithoutDockerfile(t *testing.T) {
	p, cfg := startLocalBases(t)

	// Pushed at once: bex up imports the stand-ins after it is up, and a build
	// without a Dockerfile that arrives first waits for them.
	app := p.newRepo(t, "hello-node", "hello-node")
	out, err := app.push()
	if err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	t.Logf("push:\n%s", out)
	// Said by bex up once the stand-ins are in containerd, which the build waited for.
	testenv.Eventually(t, 30*time.Second, "bex up says the local bases are ready", func() error {
		for _, want := range []string{"local bases", cfg.Names.Node, "builds without a Dockerfile use them"} {
			if !strings.Contains(p.out.String(), want) {
				return fmt.Errorf("bex up --local-bases does not say %q:\n%s", want, p.out)
			}
		}
		return nil
	})
	t.Logf("bex up:\n%s", strings.Join(lines(p.out.String(), "bookworm"), "\n")+"\n"+strings.Join(lines(p.out.String(), "local bases"), "\n"))
	if strings.Contains(p.out.String(), " built\n") {
		t.Errorf("bex up built a stand-in the cache had:\n%s", p.out)
	}
	for _, want := range []string{"remote: ", "FROM " + cfg.Names.Node, "RUN --mount=type=cache,target=/root/.npm npm ci --omit=dev", "https://hello-node.localhost:" + p.port(p.httpsAddr)} {
		if !strings.Contains(out, want) {
			t.Errorf("push output lacks %q", want)
		}
	}
	// npm reached registry.npmjs.org from inside the build step and installed
	// express's tree: its own summary line, streamed to the pusher.
	if !npmAdded.MatchString(out) {
		t.Errorf("push output has no remote: line with npm's \"added N packages\"")
	}
	// Debian's Node (18) as the node user (uid 1000), with express from npm.
	testenv.Eventually(t, 30*time.Second, "https://hello-node.localhost answers", p.answers("hello-node", "/", "hello from node v18."))
	_, body, err := p.https("hello-node", "/")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, "express 4.") || !strings.Contains(body, "uid 1000") {
		t.Errorf("the app says %q, want express 4 run as uid 1000 (the node user)", body)
	}

	t.Run("a release command writes into /app, and the web process serves", func(t *testing.T) {
		// A Heroku app's Procfile as it is: its release command makes Rails' tmp/
		// and log/ and a file in /app, as the node user that runs it; `$$` and
		// `$(...)` reach sh as written. What it wrote stays in its own instance:
		// the web process does not find /app/released, and serves. The same
		// app's next commit: npm ci is cached, what is new is the Procfile.
		procfile := `release: mkdir -p tmp/cache log && touch /app/released tmp/cache/x log/release.log && test "$$" -gt 0 && echo "the release wrote $(ls released) in $(pwd) as uid $(id -u)"
web: test ! -e released && mkdir -p tmp && touch tmp/web && exec node server.js
`
		app.commit(t, "a Procfile with a release command", map[string]string{"Procfile": procfile})
		out, err := app.push()
		if err != nil {
			t.Fatalf("push: %v\n%s", err, out)
		}
		t.Logf("push:\n%s", out)
		if !strings.Contains(out, "the release wrote released in /app as uid 1000") {
			t.Errorf("the push does not show the release command's output")
		}
		testenv.Eventually(t, 30*time.Second, "https://hello-node.localhost answers", p.answers("hello-node", "/", "hello from node v18."))
	})
}

// startLocalBases is one bex up with --local-bases, shared by the tests that
// build on the stand-ins (as sharedPlatform is), started once the stand-ins are in
// the machine's cache (minutes the first time on a machine, seconds after), so
// that bex up's start is not timed on a cold mmdebstrap; bex up then finds them
// there. Build steps get 1Gi: npm ci and bundle need more than the 256Mi the other
// tests' steps get.
func startLocalBases(t *testing.T) (*platform, baseimage.Config) {
	t.Helper()
	cfg := testenv.StandInsConfig()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	began := time.Now()
	if _, err := baseimage.Build(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Logf("stand-ins ready in %s (%s)", time.Since(began).Round(time.Millisecond), cfg.CacheDir)
	p := sharedUp(t, "bex-up-local-bases", localBasesArgs(cfg)...)
	return p, cfg
}

// localBasesArgs are the flags of startLocalBases' bex up after the usual ones.
func localBasesArgs(cfg baseimage.Config) []string {
	return []string{"--local-bases", "--local-bases-cache", cfg.CacheDir, "--build-memory", "1Gi"}
}
