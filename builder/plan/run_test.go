package plan_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"bex.co/bex/builder/plan"
	"bex.co/bex/internal/testenv"
)

// The tests below build the Go, Node and Python plans on the Debian stand-ins for
// their official bases (internal/machine/baseimage, imported by testenv.SharedStandIns),
// as an operator without a registry would configure them (plan.Config.Images), with
// the package managers reaching their real registries from the builds' network
// where this machine reaches one, and run what they built.

// standInConfig points every plan at the stand-ins (and busybox for static sites).
func standInConfig(t *testing.T) plan.Config {
	t.Helper()
	testenv.SharedStandIns(t)
	testenv.SharedBusybox(t)
	n := testenv.StandInsConfig().Names
	return plan.Config{Images: plan.Images{
		Go: n.Go, Node: n.Node, Python: n.Python, Runtime: n.Runtime, Stack: n.Stack, Ruby: n.Ruby, PHP: n.PHP, Composer: n.PHP, Static: testenv.BusyboxRef,
	}}
}

// buildWith detects src with cfg and builds its Dockerfile into containerd as name;
// it returns the plan and the build's output.
func buildWith(t *testing.T, bk *testenv.Buildkitd, cfg plan.Config, src, name string) (*plan.Plan, string) {
	t.Helper()
	p, err := plan.Detect(os.DirFS(src), cfg)
	if err != nil {
		t.Fatal(err)
	}
	dfDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dfDir, "Dockerfile"), []byte(p.Dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_, log, err := bk.BuildImage(ctx, src, dfDir, name)
	if err != nil {
		t.Fatalf("%v\n%s\nDockerfile:\n%s", err, log, p.Dockerfile)
	}
	return p, log
}

// serve runs the image's own command with PORT set, as bex does, and fetches / with
// probe (a command of the image that GETs $URL and prints the body), printing the
// user the app runs as too.
func serve(t *testing.T, bk *testenv.Buildkitd, name, probe string) string {
	t.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg := imageConfig(t, bk, name)
	script := fmt.Sprintf(`export PORT=%d URL=http://127.0.0.1:%d/
"$@" >/tmp/app.log 2>&1 &
app=$!
for i in $(seq 100); do
	if body=$(%s 2>/dev/null); then break; fi
	sleep 0.2
done
echo "uid=$(id -u)"
echo "body=$body"
kill $app
cat /tmp/app.log`, port, port, probe)
	return run(t, bk, name, append([]string{"sh", "-c", script, "sh"}, cfg.Cmd...)...)
}

// nodeFetch GETs $URL with Node's own fetch: the node base has no curl nor wget.
const nodeFetch = `node -e 'fetch(process.env.URL).then(async r => { if (!r.ok) process.exit(1); process.stdout.write(await r.text()) }, () => process.exit(1))'`

var npmAdded = regexp.MustCompile(`added [0-9]+ packages?`)

func TestNodePlansBuildAndServe(t *testing.T) {
	bk := testenv.SharedBuildkitd(t)
	cfg := standInConfig(t)
	yarnFetched := regexp.MustCompile(`\[2/4\] Fetching packages`)
	for _, tc := range []struct {
		name, want string
		// installed is what the package manager says when it installed the
		// dependencies from its registry.
		installed *regexp.Regexp
	}{
		// express from npm's registry, installed by npm ci from the lockfile, and
		// server.js (no start script) on $PORT.
		{name: "node-express", want: "hello from node v18.", installed: npmAdded},
		// A build script: npm ci with devDependencies (typescript), npm run build,
		// and the start script on dist/server.js.
		{name: "node-build-tsc", want: "compiled by tsc, served by node v18.", installed: npmAdded},
		// The same express app with yarn.lock: yarn 1 (the stand-in's Debian
		// yarnpkg, as the official image's yarn 1) from registry.yarnpkg.com.
		{name: "node-yarn-express", want: "hello from node v18.", installed: yarnFetched},
	} {
		t.Run(tc.name, func(t *testing.T) {
			image := "docker.io/library/plan-" + tc.name + ":test"
			src := filepath.Join("testdata", tc.name, "src")
			began := time.Now()
			p, log := buildWith(t, bk, cfg, src, image)
			t.Logf("cold build: %s", time.Since(began).Round(time.Millisecond))
			if p.Stack != plan.StackNode {
				t.Fatalf("stack %q, want node", p.Stack)
			}
			// The package manager reached its registry from inside the build step.
			if !tc.installed.MatchString(log) {
				t.Errorf("the install did not say %q:\n%s", tc.installed, log)
			}
			if u := imageConfig(t, bk, image).User; u != "node" {
				t.Errorf("image user %q, want node", u)
			}
			out := serve(t, bk, image, nodeFetch)
			t.Logf("served:\n%s", out)
			if !strings.Contains(out, "uid=1000\n") {
				t.Errorf("the app does not run as the node user (1000):\n%s", out)
			}
			if !strings.Contains(out, "body="+tc.want) {
				t.Errorf("the app did not answer %q:\n%s", tc.want, out)
			}
			// The node user writes into the tree and into what the build wrote (dist/),
			// and node_modules takes a cache.
			if got := writesItsTree(t, bk, image, "package.json", "mkdir node_modules/.cache", "if [ -d dist ]; then touch dist/new.js; fi"); got != "uid=1000 dir=/app home=/home/node" {
				t.Errorf("writing into the tree ended with %q", got)
			}

			// The same tree again: every step from the cache, npm not run.
			began = time.Now()
			_, log = buildWith(t, bk, cfg, src, image)
			t.Logf("warm build: %s", time.Since(began).Round(time.Millisecond))
			if tc.installed.MatchString(log) {
				t.Errorf("the second build installed the dependencies again:\n%s", log)
			}
			allCached(t, log)
		})
	}
}

// getUntil GETs url until it answers 200 or the minute is up, and returns the body.
func getUntil(t *testing.T, url string) (string, error) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	var last error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		resp, err := hc.Get(url)
		if err != nil {
			last = err
			continue
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode == http.StatusOK {
			return string(body), nil
		}
		last = fmt.Errorf("%s: %s %q", url, resp.Status, body)
	}
	return "", last
}

func TestGoPlansBuildAndServe(t *testing.T) {
	bk := testenv.SharedBuildkitd(t)
	cfg := standInConfig(t)
	for _, tc := range []struct {
		name, want string
		// uuid: the answer ends with a fresh UUID from the module dependency.
		uuid bool
	}{
		// github.com/google/uuid through the Go module proxy (go mod download in the
		// build, on the builds' network), the binary alone on the runtime stand-in.
		{name: "go-module", want: "hello from go as uid 65534, request ", uuid: true},
		// The same dependency vendored: -mod=vendor, nothing downloaded.
		{name: "go-vendored", want: "hello from vendored go as uid 65534, request ", uuid: true},
		// No main package at the root: the plan builds ./cmd/server, which imports
		// the module's root package (the library).
		// The app writes a file into its working directory, its HOME (the plan's
		// /home/app, owned by nobody): the runtime base has no shell to test it from.
		{name: "go-cmd-layout", want: "welcome from cmd/server as uid 65534, wrote visits in /home/app, its HOME\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			image := "docker.io/library/plan-" + tc.name + ":test"
			src := filepath.Join("testdata", tc.name, "src")
			began := time.Now()
			p, _ := buildWith(t, bk, cfg, src, image)
			t.Logf("cold build: %s", time.Since(began).Round(time.Millisecond))
			if p.Stack != plan.StackGo {
				t.Fatalf("stack %q, want go", p.Stack)
			}
			if u := imageConfig(t, bk, image).User; u != "65534:65534" {
				t.Errorf("image user %q, want 65534:65534", u)
			}
			port, err := testenv.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// The runtime has no shell: the image's own command runs, and the test
			// fetches from outside (the container is on the host's network).
			stop, err := bk.Containerd.Start(ctx, image, fmt.Sprintf("PORT=%d", port))
			if err != nil {
				t.Fatal(err)
			}
			body, err := getUntil(t, fmt.Sprintf("http://127.0.0.1:%d/", port))
			out := stop()
			if err != nil {
				t.Fatalf("the app did not answer: %v\noutput:\n%s", err, out)
			}
			switch {
			case tc.uuid && (!strings.HasPrefix(body, tc.want) || len(strings.TrimPrefix(strings.TrimSpace(body), tc.want)) != 36):
				t.Errorf("the app answered %q, want %q and a UUID", body, tc.want)
			case !tc.uuid && body != tc.want:
				t.Errorf("the app answered %q, want %q", body, tc.want)
			}

			began = time.Now()
			_, log := buildWith(t, bk, cfg, src, image)
			t.Logf("warm build: %s", time.Since(began).Round(time.Millisecond))
			allCached(t, log)
		})
	}
}

// allCached checks that every RUN step of a build's output came from the cache.
func allCached(t *testing.T, log string) {
	t.Helper()
	runs := 0
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "] RUN ") {
			continue
		}
		runs++
		if !strings.HasPrefix(line, "CACHED ") {
			t.Errorf("the second build ran %q again", line)
		}
	}
	if runs == 0 {
		t.Errorf("the build's output names no RUN step:\n%s", log)
	}
}

// pythonFetch GETs $URL with Python's own urllib: the python base has no curl.
const pythonFetch = `python -c 'import os, sys, urllib.request; sys.stdout.write(urllib.request.urlopen(os.environ["URL"], timeout=2).read().decode())'`

func TestPythonPlansBuildAndServe(t *testing.T) {
	bk := testenv.SharedBuildkitd(t)
	cfg := standInConfig(t)
	for _, tc := range []struct {
		name, want string
		// installed is what pip says when it installed the app's package.
		installed string
	}{
		// PyPI is not reachable from this machine: the one dependency is a wheel
		// committed in wheels/, which requirements.txt names with --no-index
		// --find-links ./wheels.
		{name: "python-wheels", want: "hello from greeting 1.0 on python 3.11 as uid 65534", installed: "Successfully installed greeting-1.0"},
		// A pyproject.toml app, installed by the plan's `pip install .`. With PyPI
		// unreachable here, pip's build isolation could not fetch a build backend
		// (setuptools, hatchling) from the index: the backend is in the repository
		// (requires = [], backend-path = ["_backend"]). The package is under src/, so
		// main.py imports it from where pip installed it, not from the tree.
		{name: "python-pyproject-local", want: "hello from hello_app 1.0 on python 3.11 as uid 65534", installed: "Successfully installed hello-app-1.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			image := "docker.io/library/plan-" + tc.name + ":test"
			src := filepath.Join("testdata", tc.name, "src")
			began := time.Now()
			p, log := buildWith(t, bk, cfg, src, image)
			t.Logf("cold build: %s", time.Since(began).Round(time.Millisecond))
			if p.Stack != plan.StackPython {
				t.Fatalf("stack %q, want python", p.Stack)
			}
			if !strings.Contains(log, tc.installed) {
				t.Errorf("pip did not say %q:\n%s", tc.installed, log)
			}
			if u := imageConfig(t, bk, image).User; u != "65534:65534" {
				t.Errorf("image user %q, want 65534:65534", u)
			}
			out := serve(t, bk, image, pythonFetch)
			t.Logf("served:\n%s", out)
			if !strings.Contains(out, "body="+tc.want) {
				t.Errorf("the app did not answer %q:\n%s", tc.want, out)
			}
			if got := writesItsTree(t, bk, image, "main.py"); got != "uid=65534 dir=/app home=/app" {
				t.Errorf("writing into the tree ended with %q", got)
			}
			began = time.Now()
			_, log = buildWith(t, bk, cfg, src, image)
			t.Logf("warm build: %s", time.Since(began).Round(time.Millisecond))
			allCached(t, log)
		})
	}
}

// status GETs url once and returns its status code and body.
func status(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

var railsStylesheet = regexp.MustCompile(`stylesheet (/assets/application-[0-9a-f]{64}\.css)`)

// TestStackRubyAndPHPPlansBuildAndServe builds the Procfile-only, Ruby and PHP plans on
// their stand-ins, with no registry (RubyGems and Packagist are not reachable here:
// the gems are vendored in vendor/cache or are the image's), runs each image's own
// command with PORT set, as bex does, and fetches from outside.
func TestStackRubyAndPHPPlansBuildAndServe(t *testing.T) {
	bk := testenv.SharedBuildkitd(t)
	cfg := standInConfig(t)
	for _, tc := range []struct {
		name, stack string
		env         []string
		want        *regexp.Regexp
		// check looks further at the served app, at base (http://127.0.0.1:PORT).
		check func(t *testing.T, base, body string)
	}{
		// `web: python3 -u web.py` on the stack, which has python3 where
		// debian:bookworm-slim has none, and what else Heroku's stack offers.
		{name: "procfile-python", stack: plan.StackProcfile, want: regexp.MustCompile(`^hello from python 3\.11 on the stack\n$`),
			check: func(t *testing.T, _, _ string) {
				out := run(t, bk, "docker.io/library/plan-procfile-python:test", "sh", "-c",
					"perl -e 'print qq(perl $^V\n)'; ruby -e 'puts %(ruby #{RUBY_VERSION})'; curl --version | head -1; git --version; bash -c 'echo bash $BASH_VERSION'")
				for _, want := range []string{"perl v5.", "ruby 3.", "curl 7.", "git version 2.", "bash 5."} {
					if !strings.Contains(out, want) {
						t.Errorf("the stack lacks %q:\n%s", want, out)
					}
				}
			}},
		// rack and webrick from vendor/cache, Gemfile.lock frozen, rackup on
		// config.ru; the app writes into its own tree.
		{name: "ruby-rack", stack: plan.StackRuby, want: regexp.MustCompile(`^hello from rack 2\.2\.\d+ in production, wrote ok\n$`)},
		// Rails (the image's, Debian's 6.1) and greeting, the app's own gem from
		// vendor/cache; its stylesheet compiled by rake assets:precompile and served
		// from public/assets by Rails itself. SECRET_KEY_BASE as config:set (or
		// app.json's generator) gives it.
		{name: "ruby-rails", stack: plan.StackRuby, env: []string{"SECRET_KEY_BASE=" + strings.Repeat("5e", 64)},
			want: regexp.MustCompile(`^hello from rails 6\.1\.\d+(\.\d+)? in production, stylesheet /assets/application-[0-9a-f]{64}\.css\n$`),
			check: func(t *testing.T, base, body string) {
				css := railsStylesheet.FindStringSubmatch(body)
				if code, got := status(t, base+css[1]); code != http.StatusOK || !strings.Contains(got, "font-family") {
					t.Errorf("the compiled stylesheet %s: %d %q", css[1], code, got)
				}
			}},
		// Composer's autoloader (no dependency to download), public/ as the
		// document root.
		{name: "php-composer", stack: plan.StackPHP, want: regexp.MustCompile(`^hello from php 8\.2 with composer's autoloader as uid 65534\n$`),
			check: func(t *testing.T, base, _ string) {
				for _, path := range []string{"/.env", "/../.env", "/%2eenv"} {
					if code, got := status(t, base+path); strings.Contains(got, "do-not-serve") {
						t.Errorf("%s: %d %q, want the file not served", path, code, got)
					}
				}
			}},
		// No composer.json: the app's directory is the document root, its dotfiles
		// are not served, and it writes into its tree.
		{name: "php-plain", stack: plan.StackPHP, want: regexp.MustCompile(`^hello from plain php 8\.2, 1 visit\(s\)\n$`),
			check: func(t *testing.T, base, _ string) {
				for _, path := range []string{"/.env", "/%2Eenv", "/.git-like/config", "/visits.txt/../.env"} {
					if code, got := status(t, base+path); code != http.StatusNotFound || strings.Contains(got, "secret") || strings.Contains(got, "SECRET") {
						t.Errorf("%s: %d %q, want 404", path, code, got)
					}
				}
				if code, got := status(t, base+"/index.php"); code != http.StatusOK || !strings.Contains(got, "2 visit(s)") {
					t.Errorf("/index.php: %d %q, want the second visit", code, got)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			image := "docker.io/library/plan-" + tc.name + ":test"
			src := filepath.Join("testdata", tc.name, "src")
			began := time.Now()
			p, _ := buildWith(t, bk, cfg, src, image)
			t.Logf("cold build: %s", time.Since(began).Round(time.Millisecond))
			if p.Stack != tc.stack {
				t.Fatalf("stack %q, want %s", p.Stack, tc.stack)
			}
			if u := imageConfig(t, bk, image).User; u != "65534:65534" {
				t.Errorf("image user %q, want 65534:65534", u)
			}
			port, err := testenv.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			stop, err := bk.Containerd.Start(ctx, image, append([]string{fmt.Sprintf("PORT=%d", port)}, tc.env...)...)
			if err != nil {
				t.Fatal(err)
			}
			base := fmt.Sprintf("http://127.0.0.1:%d", port)
			body, err := getUntil(t, base+"/")
			if err != nil {
				t.Fatalf("the app did not answer: %v\noutput:\n%s", err, stop())
			}
			if !tc.want.MatchString(body) {
				t.Errorf("the app answered %q, want %s", body, tc.want)
			}
			if tc.check != nil && !t.Failed() {
				tc.check(t, base, body)
			}
			if out := stop(); t.Failed() {
				t.Logf("output:\n%s", out)
			}

			began = time.Now()
			_, log := buildWith(t, bk, cfg, src, image)
			t.Logf("warm build: %s", time.Since(began).Round(time.Millisecond))
			if strings.Contains(log, "] RUN ") {
				allCached(t, log)
			}
		})
	}
}
