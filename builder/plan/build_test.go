package plan_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bkclient "github.com/moby/buildkit/client"
	gateway "github.com/moby/buildkit/frontend/gateway/client"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/tonistiigi/fsutil"

	"bex.co/bex/builder/plan"
	"bex.co/bex/internal/testenv"
)

// The tests below build generated Dockerfiles on a real BuildKit (a buildkitd with
// a containerd worker) and run the images in that containerd. They need root and the
// daemons from `make tools`; a missing one fails the test with the fix, never a skip.
//
// The static and the Procfile-only plans are built here on busybox, which the
// harness imports locally. The Go, Node and Python plans are built in run_test.go on
// the Debian stand-ins for their official bases (internal/machine/baseimage), which cannot
// be pulled here (no registry).
func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// localConfig is the production config with busybox, imported by the harness, as the
// base of the plans that these tests build.
func localConfig() plan.Config {
	cfg := plan.DefaultConfig()
	cfg.Images.Static = "busybox"
	cfg.Images.Stack = "busybox"
	return cfg
}

// buildPlan detects the tree src, builds its Dockerfile with the real BuildKit into
// containerd as image name, and returns the plan and the build's output.
func buildPlan(t *testing.T, bk *testenv.Buildkitd, src, name string) (*plan.Plan, string) {
	t.Helper()
	p, err := plan.Detect(os.DirFS(src), localConfig())
	if err != nil {
		t.Fatal(err)
	}
	// The Dockerfile goes in a directory of its own: the context is the app's tree,
	// untouched, as the builder gives it.
	dfDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dfDir, "Dockerfile"), []byte(p.Dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, log, err := bk.BuildImage(ctx, src, dfDir, name)
	if err != nil {
		t.Fatalf("%v\n%s\nDockerfile:\n%s", err, log, p.Dockerfile)
	}
	return p, log
}

// imageConfig reads the OCI config (user, env, command) of image name in containerd.
func imageConfig(t *testing.T, bk *testenv.Buildkitd, name string) ocispec.ImageConfig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := bk.Containerd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	img, err := cl.GetImage(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := img.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return spec.Config
}

// run runs argv in image name to completion and returns its output; a failure or a
// non-zero exit fails the test.
func run(t *testing.T, bk *testenv.Buildkitd, name string, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, code, err := bk.Containerd.Run(ctx, name, argv...)
	if err != nil || code != 0 {
		t.Fatalf("run %s %q: exit %d, err %v, output:\n%s", name, argv, code, err, out)
	}
	return out
}

func TestStaticPlanServesTheSite(t *testing.T) {
	bk := testenv.SharedBuildkitd(t)
	testenv.SharedBusybox(t)
	const name = "docker.io/library/plan-static:test"
	// The site of testdata/static, and what a pushed tree may hold that must not be
	// served: dotfiles at any depth, bex's own files, links out of the site.
	src := t.TempDir()
	if err := os.CopyFS(src, os.DirFS(filepath.Join("testdata", "static", "src"))); err != nil {
		t.Fatal(err)
	}
	for file, content := range map[string]string{
		".env":                          "SECRET_KEY=hunter2\n",
		".git/config":                   "[core]\n",
		".git/HEAD":                     "ref: refs/heads/main\n",
		"sub/.secret":                   "token\n",
		"sub/page.html":                 "<p>a page</p>\n",
		".well-known/security.txt":      "Contact: mailto:security@example.com\n",
		".well-known/acme-challenge/t1": "t1.key\n",
		".well-known/.hidden":           "hidden\n",
		"Procfile":                      "worker: sleep 1\n",
		"app.json":                      `{"name": "site"}` + "\n",
	} {
		path := filepath.Join(src, file)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"passwd":        "/etc/passwd",
		"environ":       "/proc/self/environ",
		"sub/up":        "../../etc/passwd",
		"inside.html":   "sub/page.html",
		"env.txt":       ".env",
		"sub/hostfiles": "/etc",
	} {
		if err := os.Symlink(target, filepath.Join(src, link)); err != nil {
			t.Fatal(err)
		}
	}
	p, log := buildPlan(t, bk, src, name)
	if p.Stack != plan.StackStatic {
		t.Fatalf("stack %q, want static", p.Stack)
	}
	for _, l := range []string{"passwd is a link to /etc/passwd", "environ is a link to /proc/self/environ", "sub/up is a link to ../../etc/passwd", "sub/hostfiles is a link to /etc"} {
		if !strings.Contains(log, "not served: "+l+", outside the site") {
			t.Errorf("the build does not say that %s is not served:\n%s", l, log)
		}
	}

	cfg := imageConfig(t, bk, name)
	if cfg.User != "65534:65534" {
		t.Errorf("image user %q, want 65534:65534", cfg.User)
	}
	if !contains(cfg.Env, "PORT=8080") {
		t.Errorf("image env %q has no PORT=8080", cfg.Env)
	}
	if len(cfg.Cmd) == 0 {
		t.Fatal("the image has no CMD")
	}

	// The image's own command serves forever (httpd -f), so a script runs it in the
	// background on a free port (the container shares the host's network), fetches
	// the page, asks for each path with nc (httpd answers HTTP/1.0 and closes) and
	// prints the status line, stops it, and prints what it saw. httpd's request log
	// (-v) goes to stdout too, and the shell may say "Terminated" on its stderr:
	// stdout and stderr reach the test through two FIFOs, in no fixed order between
	// them, so the test looks for each line anywhere in the output. Then, as the
	// image's user, it writes into the site, as a one-off may.
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{
		"/index.html":                    "200 OK",
		"/sub/page.html":                 "200 OK",
		"/inside.html":                   "200 OK",
		"/.well-known/security.txt":      "200 OK",
		"/.well-known/acme-challenge/t1": "200 OK",
		"/.well-known/.hidden":           "404 Not Found",
		"/.env":                          "404 Not Found",
		"/env.txt":                       "404 Not Found",
		"/.git/config":                   "404 Not Found",
		"/.git/HEAD":                     "404 Not Found",
		"/sub/.secret":                   "404 Not Found",
		"/sub/../.env":                   "404 Not Found",
		"/Procfile":                      "404 Not Found",
		"/app.json":                      "404 Not Found",
		"/passwd":                        "404 Not Found",
		"/environ":                       "404 Not Found",
		"/sub/up":                        "404 Not Found",
		"/sub/hostfiles/passwd":          "404 Not Found",
		"/../etc/passwd":                 "400 Bad Request",
	}
	var paths []string
	for p := range status {
		paths = append(paths, p)
	}
	script := `export PORT=` + fmt.Sprint(port) + `
"$@" 2>&1 &
server=$!
for i in $(seq 50); do
	if body=$(wget -qO- "http://127.0.0.1:$PORT/" 2>/dev/null); then break; fi
	sleep 0.1
done
css=$(wget -qO- "http://127.0.0.1:$PORT/css/site.css")
for p in ` + strings.Join(paths, " ") + `; do
	echo "status $p $(printf 'GET %s HTTP/1.0\r\n\r\n' "$p" | nc 127.0.0.1 "$PORT" | head -n 1 | tr -d '\r')"
done
kill $server
wait $server
echo "uid=$(id -u)"
echo "css=$css"
echo "body=$body"
cd /srv && touch new.html && echo "/* more */" >> css/site.css && mkdir tmp && echo "wrote into /srv"`
	out := run(t, bk, name, append([]string{"sh", "-c", script, "sh"}, cfg.Cmd...)...)
	t.Logf("CMD %q on port %d:\n%s", cfg.Cmd, port, out)
	want, err := os.ReadFile(filepath.Join(src, "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "body="+strings.TrimRight(string(want), "\n")) {
		t.Errorf("the page was not served: output\n%s", out)
	}
	if !strings.Contains(out, "css=h1 { font-family: sans-serif; }") {
		t.Errorf("css/site.css was not served: output\n%s", out)
	}
	for _, p := range paths {
		if !strings.Contains(out, "status "+p+" HTTP/1.1 "+status[p]+"\n") {
			t.Errorf("GET %s does not answer %s: output\n%s", p, status[p], out)
		}
	}
	if !strings.Contains(out, "uid=65534\n") {
		t.Errorf("the image does not run as 65534: output\n%s", out)
	}
	if !strings.Contains(out, "wrote into /srv") {
		t.Errorf("the image's user could not write into /srv: output\n%s", out)
	}
}

func TestProcfilePlanRunsTheWebProcess(t *testing.T) {
	bk := testenv.SharedBuildkitd(t)
	testenv.SharedBusybox(t)
	const name = "docker.io/library/plan-procfile:test"
	p, _ := buildPlan(t, bk, filepath.Join("testdata", "procfile-only", "src"), name)
	if p.Stack != plan.StackProcfile {
		t.Fatalf("stack %q, want procfile", p.Stack)
	}

	// The app's user writes into its tree, and HOME is the app's directory. What it
	// wrote stays in that container: the runs below see greeting.txt as built.
	if got := writesItsTree(t, bk, name, "greeting.txt"); got != "uid=65534 dir=/app home=/app" {
		t.Errorf("writing into the tree ended with %q", got)
	}

	// The image's own command is the web process, with the default PORT.
	if out := run(t, bk, name); out != "hello from 8080 as 65534, pid 1: made by bex" {
		t.Errorf("default command printed %q", out)
	}

	// With PORT set, as bex sets it, through the image's CMD as it is.
	cfg := imageConfig(t, bk, name)
	out := run(t, bk, name, append([]string{"sh", "-c", `PORT=5000 exec "$@"`, "sh"}, cfg.Cmd...)...)
	if out != "hello from 5000 as 65534, pid 1: made by bex" {
		t.Errorf("CMD %q with PORT=5000 printed %q", cfg.Cmd, out)
	}

	// Another process type runs from its Command in the same image.
	argv, err := p.Command("worker")
	if err != nil {
		t.Fatal(err)
	}
	// $$( is Kubernetes' escape of $(: undo it as the runtime's expansion would.
	for i, a := range argv {
		argv[i] = strings.ReplaceAll(a, "$$", "$")
	}
	out = run(t, bk, name, argv...)
	t.Logf("worker %q: %s", argv, out)
	if !strings.HasPrefix(out, "worker in /app\ndone: ") {
		t.Errorf("worker %q printed %q", argv, out)
	}
}

// writesItsTree runs a script in image name as the image's user, from its working
// directory, that does what a release command or a process of a Heroku app does
// there: create a file, tmp/ and log/, and append to existing, a file of the tree.
// It checks that each step worked and returns the script's last line, "uid=N
// dir=DIR home=HOME".
func writesItsTree(t *testing.T, bk *testenv.Buildkitd, name, existing string, more ...string) string {
	t.Helper()
	script := `set -e
touch released
mkdir -p tmp/cache log
echo "one more line" >> "$1"
` + strings.Join(more, "\n") + `
test -w . -a -w "$1" -a -w tmp/cache
echo "uid=$(id -u) dir=$PWD home=$HOME"`
	out := strings.TrimSpace(run(t, bk, name, "sh", "-c", script, "sh", existing))
	return out[strings.LastIndexByte(out, '\n')+1:]
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestGeneratedDockerfilesPassBuildKitChecks runs BuildKit's own checks (what
// `docker build --check` runs: the Dockerfile frontend's parser and linter) on the plan
// of every golden case. The Go, Node and Python bases cannot be pulled here, so every
// image is busybox: the checks read the Dockerfile, they do not run its steps.
func TestGeneratedDockerfilesPassBuildKitChecks(t *testing.T) {
	bk := testenv.SharedBuildkitd(t)
	testenv.SharedBusybox(t)
	cfg := plan.Config{Images: plan.Images{
		Go: "busybox", Node: "busybox", Python: "busybox", Static: "busybox", Runtime: "busybox", Stack: "busybox", Ruby: "busybox", PHP: "busybox", Composer: "busybox",
	}}
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := bk.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	checked := 0
	for _, e := range entries {
		src := filepath.Join("testdata", e.Name(), "src")
		if _, err := os.Stat(filepath.Join("testdata", e.Name(), "error.golden")); err == nil {
			continue
		}
		p, err := plan.Detect(os.DirFS(src), cfg)
		if err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		dfDir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dfDir, "Dockerfile"), []byte(p.Dockerfile), 0o644); err != nil {
			t.Fatal(err)
		}
		contextFS, err := fsutil.NewFS(src)
		if err != nil {
			t.Fatal(err)
		}
		dockerfileFS, err := fsutil.NewFS(dfDir)
		if err != nil {
			t.Fatal(err)
		}
		var result []byte
		_, err = c.Build(ctx, bkclient.SolveOpt{
			LocalMounts: map[string]fsutil.FS{"context": contextFS, "dockerfile": dockerfileFS},
		}, "", func(ctx context.Context, gc gateway.Client) (*gateway.Result, error) {
			res, err := gc.Solve(ctx, gateway.SolveRequest{
				Frontend: "dockerfile.v0",
				FrontendOpt: map[string]string{
					"requestid":          "frontend.lint",
					"filename":           "Dockerfile",
					"image-resolve-mode": "local",
				},
			})
			if err != nil {
				return nil, err
			}
			result = res.Metadata["result.json"]
			return res, nil
		}, nil)
		if err != nil {
			t.Fatalf("%s: check: %v", e.Name(), err)
		}
		var lint struct {
			Warnings []struct {
				RuleName, Detail string
			} `json:"warnings"`
			BuildError *struct{ Message string } `json:"buildError"`
		}
		if err := json.Unmarshal(result, &lint); err != nil {
			t.Fatalf("%s: check result %q: %v", e.Name(), result, err)
		}
		if lint.BuildError != nil {
			t.Errorf("%s: the Dockerfile does not parse: %s\n%s", e.Name(), lint.BuildError.Message, p.Dockerfile)
		}
		for _, w := range lint.Warnings {
			t.Errorf("%s: BuildKit check %s: %s\n%s", e.Name(), w.RuleName, w.Detail, p.Dockerfile)
		}
		checked++
	}
	if checked < 10 {
		t.Fatalf("checked %d plans, want every golden case", checked)
	}
}
