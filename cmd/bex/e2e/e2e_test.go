package e2e

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// TestPlatform is the user's path through bex, on one `bex up`, step by step; each
// step needs the ones before it.
func TestPlatform(t *testing.T) {
	p := newPlatform(t)
	t.Cleanup(p.kill)
	p.start(t)
	if !strings.Contains(p.out.String(), "busybox base    docker.io/library/busybox:latest from") {
		t.Errorf("bex up --busybox-base did not say it made the base image:\n%s", p.out.String())
	}
	if !regexp.MustCompile(`runc +runc 1\.\d+\.\d+ at \S+/bin/runc runs every container`).MatchString(p.out.String()) {
		t.Errorf("bex up did not say it runs containers with bin/runc:\n%s", p.out.String())
	}
	shell := p.newRepo(t, "hello-shell", "hello-shell")
	var firstCommit string

	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"first push serves over HTTPS", func(t *testing.T) {
			out, err := shell.push()
			if err != nil {
				t.Fatalf("push: %v\n%s", err, out)
			}
			t.Logf("first push:\n%s", out)
			for _, want := range []string{"remote: ", "RUN mkdir -p /www/cgi-bin", "https://hello-shell.localhost:" + p.port(p.httpsAddr)} {
				if !strings.Contains(out, want) {
					t.Errorf("push output lacks %q", want)
				}
			}
			firstCommit = strings.TrimSpace(shell.git(t, "rev-parse", "HEAD"))
			// The real curl, trusting the CA bex up exported, as the instructions say.
			url := fmt.Sprintf("https://hello-shell.localhost:%s/", p.port(p.httpsAddr))
			served := false
			defer func() { // what the edge and the deployer saw, when curl never got the page
				if !served {
					t.Log(p.kubectl(t, "get", "endpointslices,services,apps", "-o", "yaml"))
					o, _ := exec.Command("sh", "-c", "tail -30 "+p.dir+"/logs/edge.log; tail -30 "+p.dir+"/logs/deployer.log; curl -sk https://127.0.0.1:"+p.port(p.httpsAddr)+" -H 'Host: hello-shell.localhost'").CombinedOutput()
					t.Log(string(o))
				}
			}()
			testenv.Eventually(t, 10*time.Second, "curl "+url, func() error {
				curl, err := exec.Command("curl", "-sS", "--fail", "--cacert", filepath.Join(p.dir, "ca.pem"),
					"--resolve", "hello-shell.localhost:"+p.port(p.httpsAddr)+":127.0.0.1", url).CombinedOutput()
				if err != nil || !strings.Contains(string(curl), "hello from bex") {
					return fmt.Errorf("%v\n%s", err, curl)
				}
				return nil
			})
			served = true
			testenv.Eventually(t, 10*time.Second, "the CGI page", p.answers("hello-shell", "/cgi-bin/greet", "hello from hello-shell"))
		}},
		{"a second bex up on the same state dir is refused", func(t *testing.T) {
			out := runUp(t, p.upCommand("--state-dir", p.dir, "--ssh-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--https-addr", "127.0.0.1:0", "--hooks-addr", "127.0.0.1:0"))
			if want := fmt.Sprintf("another bex up (pid %d) is running on %s", p.cmd.Process.Pid, p.dir); !strings.Contains(out, want) {
				t.Fatalf("want %q in: %s", want, out)
			}
		}},
		{"a failing build is rejected and changes nothing", func(t *testing.T) {
			shell.commit(t, "broken build", map[string]string{"Dockerfile": "FROM busybox\nRUN echo about to fail && false\n"})
			out, err := shell.push()
			if err == nil {
				t.Fatalf("a push whose build fails was accepted:\n%s", out)
			}
			if !strings.Contains(out, "false") {
				t.Errorf("the rejection does not show the failed step:\n%s", out)
			}
			if got := shell.remoteHead(t); got != firstCommit {
				t.Fatalf("main moved to %s after a failed build; want %s", got, firstCommit)
			}
			if err := p.answers("hello-shell", "/", "hello from bex")(); err != nil {
				t.Fatalf("the serving release stopped answering: %v", err)
			}
		}},
		{"a build step past --build-memory is rejected with the reason", func(t *testing.T) {
			shell.git(t, "reset", "-q", "--hard", firstCommit)
			shell.commit(t, "too much memory", map[string]string{"Dockerfile": "FROM busybox\nRUN dd if=/dev/zero of=/dev/null bs=400M count=1\n"})
			out, err := shell.push()
			if err == nil {
				t.Fatalf("a push whose step ran out of memory was accepted:\n%s", out)
			}
			if want := "build step ran out of memory (limit 256 MiB): [2/2] RUN dd if=/dev/zero of=/dev/null bs=400M count=1"; !strings.Contains(out, want) {
				t.Fatalf("the rejection lacks %q:\n%s", want, out)
			}
			if got := shell.remoteHead(t); got != firstCommit {
				t.Fatalf("main moved to %s after a failed build; want %s", got, firstCommit)
			}
			if err := p.answers("hello-shell", "/", "hello from bex")(); err != nil {
				t.Fatalf("the serving release stopped answering: %v", err)
			}
		}},
		{"a release that never becomes healthy is rejected and the old one serves", func(t *testing.T) {
			// A short boot timeout, so the test does not wait the default minute.
			p.kubectl(t, "patch", "app", "hello-shell", "--type", "merge", "-p", `{"spec":{"healthCheck":{"path":"/","bootTimeoutSeconds":8}}}`)
			shell.git(t, "reset", "-q", "--hard", firstCommit)
			shell.commit(t, "never listens", map[string]string{"Dockerfile": "FROM busybox\nCMD [\"sleep\", \"3600\"]\n"})
			out, err := shell.push()
			if err == nil {
				t.Fatalf("a push whose release never became healthy was accepted:\n%s", out)
			}
			t.Logf("rejected push:\n%s", out)
			if got := shell.remoteHead(t); got != firstCommit {
				t.Fatalf("main moved to %s after a failed rollout; want %s", got, firstCommit)
			}
			if err := p.answers("hello-shell", "/", "hello from bex")(); err != nil {
				t.Fatalf("the serving release stopped answering: %v", err)
			}
			shell.git(t, "reset", "-q", "--hard", firstCommit)
		}},
		{"config, rollback, scale, suspend and resume over ssh", func(t *testing.T) {
			run := func(args ...string) string {
				t.Helper()
				stdout, stderr, err := p.ssh(t, args...)
				if err != nil {
					t.Fatalf("ssh %s: %v\n%s%s", strings.Join(args, " "), err, stdout, stderr)
				}
				return stdout
			}
			// The value is data: quoted once for the remote word splitting.
			run("config:set", "hello-shell", "'GREETING=hi there; $(not run)'")
			if err := p.answers("hello-shell", "/cgi-bin/greet", "hi there; $(not run) from hello-shell")(); err != nil {
				t.Fatalf("after config:set: %v", err)
			}
			run("rollback", "hello-shell")
			if err := p.answers("hello-shell", "/cgi-bin/greet", "hello from hello-shell")(); err != nil {
				t.Fatalf("after rollback: %v", err)
			}
			run("ps:scale", "hello-shell", "web=2")
			testenv.Eventually(t, 30*time.Second, "two backends", func() error {
				out := p.kubectl(t, "get", "endpointslices", "-l", "kubernetes.io/service-name=hello-shell",
					"-o", `jsonpath={range .items[*]}{.endpoints[0].conditions.ready}{"\n"}{end}`)
				if n := strings.Count(out, "true"); n != 2 {
					return fmt.Errorf("%d ready backends:\n%s", n, out)
				}
				return nil
			})
			run("suspend", "hello-shell")
			testenv.Eventually(t, 30*time.Second, "503 while suspended", func() error {
				code, body, err := p.https("hello-shell", "/")
				if err != nil || code != 503 {
					return fmt.Errorf("%d %q %v", code, body, err)
				}
				return nil
			})
			run("resume", "hello-shell")
			testenv.Eventually(t, 30*time.Second, "200 after resume", p.answers("hello-shell", "/", "hello from bex"))
			run("ps:scale", "hello-shell", "web=1")
		}},
		{"a signed webhook redeploys", func(t *testing.T) {
			secret, stderr, err := p.ssh(t, "webhooks:secret", "hello-shell")
			if err != nil {
				t.Fatalf("webhooks:secret: %v\n%s", err, stderr)
			}
			before := p.kubectl(t, "get", "app", "hello-shell", "-o", "jsonpath={.spec.release}")
			mac := hmac.New(sha256.New, []byte(strings.TrimSpace(secret)))
			// As a git host does: over HTTPS, through the edge, on the base domain.
			hc, err := p.httpsClient()
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequest(http.MethodPost, "https://localhost:"+p.port(p.httpsAddr)+"/hooks/hello-shell", nil)
			req.Header.Set("X-Bex-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusAccepted {
				t.Fatalf("delivery: %s %s", resp.Status, body)
			}
			// A wrong signature is refused and builds nothing.
			req.Header.Set("X-Bex-Signature-256", "sha256="+strings.Repeat("0", 64))
			if resp, err := hc.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("a wrong signature: %v %v", resp, err)
			}
			testenv.Eventually(t, time.Minute, "a release caused by the webhook", func() error {
				out := p.kubectl(t, "get", "releases", "-l", "app.bex.co/app=hello-shell", "-o", `jsonpath={range .items[*]}{.spec.cause}{"\n"}{end}`)
				if !strings.Contains(out, "Webhook") {
					return fmt.Errorf("causes: %q (release was %s)", out, before)
				}
				return nil
			})
			testenv.Eventually(t, time.Minute, "serving after the webhook", p.answers("hello-shell", "/", "hello from bex"))
		}},
		{"two apps pushed at once both come up", func(t *testing.T) {
			procfile := p.newRepo(t, "hello-procfile", "hello-procfile")
			second := p.newRepo(t, "hello-shell", "hello-second")
			var wg sync.WaitGroup
			errs := make([]error, 2)
			outs := make([]string, 2)
			for i, r := range []*repo{procfile, second} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					outs[i], errs[i] = r.push()
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("push %d: %v\n%s", i, err, outs[i])
				}
			}
			testenv.Eventually(t, 10*time.Second, "hello-procfile", p.answers("hello-procfile", "/", "hello from a Procfile app"))
			testenv.Eventually(t, 10*time.Second, "hello-second", p.answers("hello-second", "/", "hello from bex"))
		}},
		{"kubectl shows the apps", func(t *testing.T) {
			// hello-shell shows Running once the containers of its failed release
			// have stopped (a `sleep` as PID 1 ignores SIGTERM: it takes the stop
			// timeout).
			testenv.Eventually(t, 30*time.Second, "kubectl get apps", func() error {
				out := p.kubectl(t, "get", "apps")
				for _, app := range []string{"hello-shell", "hello-procfile", "hello-second"} {
					row := lines(out, app)
					if len(row) != 1 || !strings.Contains(row[0], "Running") || !strings.Contains(row[0], "https://"+app+".localhost:"+p.port(p.httpsAddr)) {
						return fmt.Errorf("row of %s: %q in\n%s", app, row, out)
					}
				}
				return nil
			})
		}},
		{"a component that dies is restarted", func(t *testing.T) {
			edge := processesMentioning(bexBinary + "\x00edge\x00--state-dir\x00" + p.dir)
			if len(edge) != 1 {
				t.Fatalf("want one edge process, found %q", edge)
			}
			pid, _ := strconv.Atoi(strings.SplitN(edge[0], ":", 2)[0])
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 30*time.Second, "hello-shell through the restarted edge", p.answers("hello-shell", "/", "hello from bex"))
			if !strings.Contains(p.out.String(), "exited; restarting") || !strings.Contains(p.out.String(), "process=edge") {
				t.Errorf("bex up did not log the restart:\n%s", p.out)
			}
		}},
		{"a restart brings every app back without a rebuild", func(t *testing.T) {
			before := p.kubectl(t, "get", "apps", "-o", "custom-columns=NAME:.metadata.name,REVISION:.status.revision,IMAGE:.spec.image", "--no-headers")
			releases := p.kubectl(t, "get", "releases", "--no-headers")
			p.stop(t)
			p.start(t)
			for app, want := range map[string]string{"hello-shell": "hello from bex", "hello-procfile": "hello from a Procfile app", "hello-second": "hello from bex"} {
				testenv.Eventually(t, time.Minute, app+" after the restart", p.answers(app, "/", want))
			}
			after := p.kubectl(t, "get", "apps", "-o", "custom-columns=NAME:.metadata.name,REVISION:.status.revision,IMAGE:.spec.image", "--no-headers")
			if after != before {
				t.Errorf("apps changed across the restart:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			if got := p.kubectl(t, "get", "releases", "--no-headers"); len(strings.Split(got, "\n")) != len(strings.Split(releases, "\n")) {
				t.Errorf("releases changed across the restart:\nbefore:\n%s\nafter:\n%s", releases, got)
			}
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			t.Logf("bex up's output:\n%s", p.out)
			return
		}
	}
	p.stop(t)
}
