package builder_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"bex.co/bex/builder"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// newBuilder returns a Builder on the harness's buildkitd, resolving base images
// locally (nothing can be pulled here) with busybox as the base of generated plans.
func newBuilder(t testing.TB, tweak ...func(*builder.Config)) (*builder.Builder, *testenv.Buildkitd) {
	t.Helper()
	bk := testenv.SharedBuildkitd(t)
	testenv.SharedBusybox(t)
	cfg := builder.DefaultConfig()
	cfg.StateDir = t.TempDir()
	cfg.Address = bk.Address
	cfg.ImageResolveMode = "local"
	cfg.Plan.Images.Static = "busybox"
	cfg.Plan.Images.Stack = "busybox"
	for _, f := range tweak {
		f(&cfg)
	}
	b, err := builder.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b, bk
}

// repo is a git repository whose commits the tests build.
type repo struct {
	t   testing.TB
	dir string
}

func newRepo(t testing.TB, files map[string]string) *repo {
	t.Helper()
	r := &repo{t: t, dir: t.TempDir()}
	r.git("init", "-q", "-b", "main")
	r.commit(files)
	return r
}

func (r *repo) git(args ...string) string {
	r.t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = r.dir
	cmd.Env = append(os.Environ(), "HOME="+r.dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@bex.co", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@bex.co")
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// commit writes files (content "" deletes) and returns the new commit.
func (r *repo) commit(files map[string]string) string {
	r.t.Helper()
	for name, content := range files {
		p := filepath.Join(r.dir, name)
		if content == "" {
			os.Remove(p)
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			r.t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") || filepath.Base(name) == "server" {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			r.t.Fatal(err)
		}
	}
	r.git("add", "-A")
	r.git("commit", "-q", "--allow-empty", "-m", "change")
	return r.git("rev-parse", "HEAD")
}

func (r *repo) request(app string) builder.Request {
	return builder.Request{App: app, AppUID: testUID(r.t, app), RepoDir: filepath.Join(r.dir, ".git"), Commit: r.git("rev-parse", "HEAD")}
}

func build(t testing.TB, b *builder.Builder, req builder.Request) (*builder.Result, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := b.Build(ctx, req, &out)
	return res, out.String(), err
}

func mustBuild(t testing.TB, b *builder.Builder, req builder.Request) (*builder.Result, string) {
	t.Helper()
	res, out, err := build(t, b, req)
	if err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return res, out
}

// localName is the tag the builder gave the image in containerd.
func localName(req builder.Request) string {
	return "bex.local/" + req.App + ":" + req.Commit[:12]
}

// staticServer is a Go HTTP server built static, for FROM scratch images: it
// answers one request on -port and exits.
const staticServer = `package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
)

func main() {
	port := flag.String("port", os.Getenv("PORT"), "port")
	flag.Parse()
	l, err := net.Listen("tcp", "127.0.0.1:"+*port)
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello from scratch")
		close(done)
	}))
	<-done
}
`

func TestScratchGoAppBuildsAndServesHTTP(t *testing.T) {
	b, bk := newBuilder(t)
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "main.go"), []byte(staticServer), 0o644)
	os.WriteFile(filepath.Join(src, "go.mod"), []byte("module hello\n\ngo 1.22\n"), 0o644)
	cmd := exec.Command("go", "build", "-o", "server", ".")
	cmd.Dir, cmd.Env = src, append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	bin, _ := os.ReadFile(filepath.Join(src, "server"))
	r := newRepo(t, map[string]string{
		"Dockerfile": "FROM scratch\nCOPY server /server\nUSER 65534\nCMD [\"/server\"]\n",
		"server":     string(bin),
		"Procfile":   "web: /server\n",
	})
	req := r.request("scratch")
	res, out := mustBuild(t, b, req)
	if res.Stack != "dockerfile" || !strings.HasPrefix(res.Image, "bex.local/scratch@sha256:") || strings.Join(res.Processes["web"], " ") != "sh -c exec /server" {
		t.Fatalf("result %+v", res)
	}
	for _, want := range []string{"-----> [1/1] COPY server /server", "-----> Built " + res.Image + " (", " MiB)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	assertServes(t, bk, localName(req), "hello from scratch", "/server", "-port")
}

// assertServes runs image with args plus a free port, GETs / and checks the body.
// A container that ends before it answers is started again on another port, so
// that a port another test's process took between FreePort and the server's
// listen (the whole suite runs at once) is not taken for the image's failure;
// one that never answers fails with what it printed.
func assertServes(t *testing.T, bk *testenv.Buildkitd, image, want string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		out  string
		code uint32
		err  error
	}
	var (
		port int
		done chan result
	)
	start := func() {
		p, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		port, done = p, make(chan result, 1)
		go func(done chan result) {
			out, code, err := bk.Containerd.Run(ctx, image, append(args, fmt.Sprint(p))...)
			done <- result{out, code, err}
		}(done)
	}
	start()
	var body string
	testenv.Eventually(t, 30*time.Second, image+" answers", func() error {
		select {
		case res := <-done:
			start()
			return fmt.Errorf("the container ended before it answered (exit %d, %v): %s; started again on port %d", res.code, res.err, res.out, port)
		default:
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err != nil {
			return err
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(data)
		return nil
	})
	if !strings.Contains(body, want) {
		t.Fatalf("GET / = %q, want %q", body, want)
	}
	if res := <-done; res.err != nil || res.code != 0 {
		t.Fatalf("container: exit %d, %v: %s", res.code, res.err, res.out)
	}
}

func TestBusyboxAppWithRunStepsServesHTTP(t *testing.T) {
	b, bk := newBuilder(t)
	r := newRepo(t, map[string]string{
		"Dockerfile": "FROM busybox\nRUN mkdir /www && echo 'hello from busybox' > /www/index.html\nCOPY serve.sh /serve.sh\nCMD [\"/serve.sh\"]\n",
		// httpd daemonises; serve one request's worth of time, then stop.
		"serve.sh": "#!/bin/sh\nhttpd -p 127.0.0.1:$1 -h /www && sleep 2\n",
	})
	req := r.request("busy")
	_, out := mustBuild(t, b, req)
	if !strings.Contains(out, "-----> [2/3] RUN mkdir /www") {
		t.Errorf("output lacks the RUN step:\n%s", out)
	}
	assertServes(t, bk, localName(req), "hello from busybox", "/serve.sh")
}

func TestDockerignoreIsHonoured(t *testing.T) {
	b, bk := newBuilder(t)
	r := newRepo(t, map[string]string{
		".dockerignore": "secret.txt\n*.log\n",
		"Dockerfile":    "FROM busybox\nCOPY . /app\n",
		"app.txt":       "code\n",
		"secret.txt":    "do not ship\n",
		"debug.log":     "noise\n",
	})
	req := r.request("ignore")
	mustBuild(t, b, req)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, code, err := bk.Containerd.Run(ctx, localName(req), "ls", "/app")
	if err != nil || code != 0 {
		t.Fatalf("ls: %v %d", err, code)
	}
	if files := strings.Fields(out); strings.Join(files, " ") != ".dockerignore Dockerfile app.txt" && strings.Join(files, " ") != "Dockerfile app.txt" {
		t.Fatalf("the image holds %q; .dockerignore should have kept secret.txt and debug.log out", files)
	}
}

func TestRebuildsUseTheCache(t *testing.T) {
	b, _ := newBuilder(t)
	r := newRepo(t, map[string]string{
		"Dockerfile": "FROM busybox\nCOPY deps.txt /deps.txt\nRUN sleep 0.2 && cp /deps.txt /installed\nCOPY app.txt /app.txt\n",
		"deps.txt":   "dependency list\n",
		"app.txt":    "version 1\n",
	})
	mustBuild(t, b, r.request("cache"))

	// The same commit again: every step cached (FROM only looks the base image up).
	_, out := mustBuild(t, b, r.request("cache"))
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "-----> [") && !strings.Contains(line, "] FROM ") && !strings.HasSuffix(line, "CACHED") {
			t.Errorf("rebuild of the same commit ran %q:\n%s", line, out)
		}
	}

	// A change to the app's code only: the dependency layers are reused. The
	// content is new for each run (go test -count=N shares the buildkitd's cache).
	r.commit(map[string]string{"app.txt": fmt.Sprintf("version 2 at %d\n", time.Now().UnixNano())})
	_, out = mustBuild(t, b, r.request("cache"))
	if !strings.Contains(out, "RUN sleep 0.2 && cp /deps.txt /installed CACHED") {
		t.Errorf("the dependency step was rebuilt after a code change:\n%s", out)
	}
	if !strings.Contains(out, "-----> [4/4] COPY app.txt /app.txt\n") {
		t.Errorf("the code step was not rebuilt:\n%s", out)
	}

	// no-cache rebuilds everything.
	req := r.request("cache")
	req.NoCache = true
	_, out = mustBuild(t, b, req)
	if strings.Contains(out, "RUN sleep 0.2 && cp /deps.txt /installed CACHED") {
		t.Errorf("no-cache used the cache:\n%s", out)
	}
}

func TestErrorsSayWhatFailed(t *testing.T) {
	b, _ := newBuilder(t)
	cases := []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{"dockerfile syntax", map[string]string{"Dockerfile": "FROM busybox\nFORM busybox\n"},
			[]string{"Dockerfile line 2: unknown instruction: FORM"}},
		{"failing RUN", map[string]string{"Dockerfile": "FROM busybox\nRUN echo about to fail && exit 3\n"},
			[]string{"step [2/2] RUN echo about to fail && exit 3 failed with exit code 3; its last output:", "    about to fail"}},
		{"missing base image", map[string]string{"Dockerfile": "FROM no-such-base:1\n"},
			[]string{"base image", "no-such-base:1 not found"}},
		{"nothing to build", map[string]string{"README.md": "hi\n"},
			[]string{"no Dockerfile and no known stack"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRepo(t, tc.files)
			_, out, err := build(t, b, r.request("errors"))
			if err == nil {
				t.Fatalf("the build succeeded:\n%s", out)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
				if !strings.Contains(out, want) {
					t.Errorf("the pusher's output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

func TestUnreachableBuildkitd(t *testing.T) {
	cfg := builder.DefaultConfig()
	cfg.StateDir = t.TempDir()
	cfg.Address = "unix://" + filepath.Join(t.TempDir(), "nothing.sock")
	b, err := builder.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = b.Preflight(ctx)
	if !errors.Is(err, builder.ErrUnavailable) || !strings.Contains(err.Error(), "builder unavailable: cannot reach buildkitd at "+cfg.Address) {
		t.Fatalf("Preflight = %v", err)
	}
	r := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\n"})
	if _, out, err := build(t, b, r.request("x")); !errors.Is(err, builder.ErrUnavailable) {
		t.Fatalf("Build = %v\n%s", err, out)
	}
}

func TestContextSizeLimit(t *testing.T) {
	b, _ := newBuilder(t, func(c *builder.Config) { c.MaxContextBytes = 1000 })
	r := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\n", "big.bin": strings.Repeat("x", 5000)})
	_, _, err := build(t, b, r.request("big"))
	if !errors.Is(err, builder.ErrContextTooLarge) {
		t.Fatalf("want the context size error, got %v", err)
	}
}

func TestMonorepoBuildDirArgsAndTarget(t *testing.T) {
	b, bk := newBuilder(t)
	r := newRepo(t, map[string]string{
		"README.md": "monorepo\n",
		"services/web/Dockerfile": "FROM busybox AS base\nARG GREETING=unset\nRUN echo \"$GREETING\" > /greeting\n" +
			"FROM base AS debug\nRUN echo debug > /stage\nFROM base AS release\nRUN echo release > /stage\n",
	})
	req := r.request("mono")
	req.Dir = "services/web"
	req.Target = "release"
	req.Args = map[string]string{"GREETING": "hi from args"}
	mustBuild(t, b, req)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, code, err := bk.Containerd.Run(ctx, localName(req), "sh", "-c", "cat /greeting /stage")
	if err != nil || code != 0 || out != "hi from args\nrelease" {
		t.Fatalf("run: %q %d %v", out, code, err)
	}
	req.Dir = "../outside"
	if _, _, err := build(t, b, req); err == nil || !strings.Contains(err.Error(), "leaves the repository") {
		t.Fatalf("build dir outside the repository: %v", err)
	}
}

func TestPlanBuildsAStaticSiteWithoutADockerfile(t *testing.T) {
	b, _ := newBuilder(t)
	r := newRepo(t, map[string]string{"index.html": "<h1>static</h1>\n"})
	res, out := mustBuild(t, b, r.request("site"))
	if res.Stack != "static" || !strings.Contains(out, "-----> No Dockerfile: building it as a static app") {
		t.Fatalf("stack %q:\n%s", res.Stack, out)
	}
}

func TestCancellingStopsTheBuildAndFreesTheSlot(t *testing.T) {
	b, _ := newBuilder(t, func(c *builder.Config) { c.MaxConcurrent = 1 })
	r := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\nRUN echo started && sleep 120\n"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := b.Build(ctx, r.request("slow"), pw)
		pw.Close()
		errc <- err
	}()
	var seen strings.Builder
	buf := make([]byte, 4096)
	for !strings.Contains(seen.String(), "started") {
		n, err := pr.Read(buf)
		if err != nil {
			t.Fatalf("the build ended before its RUN step started: %v\n%s", err, seen.String())
		}
		seen.Write(buf[:n])
	}
	go io.Copy(io.Discard, pr)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled build returned %v", err)
	}
	if took := time.Since(start); took > 60*time.Second {
		t.Fatalf("cancelling took until %s", took)
	}
	// The slot is free at once: the next build does not wait.
	r2 := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\n"})
	_, out := mustBuild(t, b, r2.request("next"))
	if strings.Contains(out, "Waiting for a build slot") {
		t.Fatalf("the cancelled build kept its slot:\n%s", out)
	}
}

func TestTimeout(t *testing.T) {
	b, _ := newBuilder(t, func(c *builder.Config) { c.Timeout = 2 * time.Second })
	r := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\nRUN sleep 60\n"})
	_, out, err := build(t, b, r.request("timeout"))
	if !errors.Is(err, builder.ErrTimeout) || !strings.Contains(out, "build timed out after 2s") {
		t.Fatalf("want a timeout, got %v\n%s", err, out)
	}
	// A build that took too long failed; it was not canceled.
	logs, err := b.Logs("timeout")
	if want := "build timed out after 2s: make the build faster, or cache more of it"; err != nil || len(logs) != 1 ||
		logs[0].Outcome != builder.OutcomeFailed || logs[0].Error != want {
		t.Fatalf("record = %+v, %v; want failed with %q", logs, err, want)
	}
}

func TestConcurrentBuildsWaitForASlot(t *testing.T) {
	b, _ := newBuilder(t, func(c *builder.Config) { c.MaxConcurrent = 1 })
	var wg sync.WaitGroup
	outs := make([]string, 2)
	for i := range outs {
		r := newRepo(t, map[string]string{"Dockerfile": fmt.Sprintf("FROM busybox\nRUN sleep 1 && echo %d\n", i)})
		wg.Go(func() {
			_, out, err := build(t, b, r.request(fmt.Sprintf("slot%d", i)))
			if err != nil {
				t.Errorf("build %d: %v", i, err)
			}
			outs[i] = out
		})
	}
	wg.Wait()
	if !strings.Contains(outs[0]+outs[1], "-----> Waiting for a build slot (1 builds are running)") {
		t.Fatalf("neither build waited for the single slot:\n%s\n---\n%s", outs[0], outs[1])
	}
}

func TestBuildLogsAreKeptAndBounded(t *testing.T) {
	b, _ := newBuilder(t, func(c *builder.Config) { c.KeepLogs = 2 })
	r := newRepo(t, map[string]string{"Dockerfile": "FROM busybox\nRUN echo logged line\n"})
	for i := 0; i < 3; i++ {
		r.commit(map[string]string{"n.txt": fmt.Sprint(i)})
		mustBuild(t, b, r.request("logs"))
	}
	logs, err := b.Logs("logs")
	if err != nil || len(logs) != 2 {
		t.Fatalf("logs = %v, %v; want the last 2", logs, err)
	}
	if logs[0].Commit != r.git("rev-parse", "HEAD") {
		t.Fatalf("newest log is of %s", logs[0].Commit)
	}
	data, err := os.ReadFile(b.LogPath("logs", logs[0].ID))
	if err != nil || !strings.Contains(string(data), "-----> Built bex.local/logs@sha256:") {
		t.Fatalf("log content: %v\n%s", err, data)
	}
}
