package cluster

import (
	"bytes"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// TestNeverReady: pods that never get ready fail the rollout on the real kubelet
// (its readiness probe, the Deployment's progress deadline), the old ReplicaSet
// keeps serving, and the App's status and apps:info say why.
func TestNeverReady(t *testing.T) {
	t.Parallel()
	const app = "never"
	r := newHostRepo(t, app)
	mustPush(t, r)
	waitBody(t, app, "/", "hello from bex", 30*time.Second)

	t.Run("a health check that answers 404", func(t *testing.T) {
		// healthCheck is set on the App (kubectl), as docs/architecture.md has it.
		kubectl(t, "patch", "app", app, "--type=merge", "-p", `{"spec":{"healthCheck":{"path":"/nope","bootTimeoutSeconds":10}}}`)
		testenv.Eventually(t, 60*time.Second, "RolledOut HealthCheckFailed", func() error {
			c := appConditions(t, app)["RolledOut"]
			if c.Status != "False" || c.Reason != "HealthCheckFailed" || !strings.Contains(c.Message, "GET /nope") {
				return fmt.Errorf("RolledOut %+v", c)
			}
			return nil
		})
		if rs := names(t, "replicasets", app); len(rs) != 2 {
			t.Errorf("want the old and the new ReplicaSet, have %v", rs)
		}
		if body, err := curl(app, "/"); err != nil || !strings.Contains(body, "hello from bex") {
			t.Errorf("the old ReplicaSet does not serve: %q, %v", body, err)
		}
		in := appInfo(t, app)
		if in.Trouble != "HealthCheckFailed" || !strings.Contains(in.TroubleMessage, "did not pass the health check (GET /nope") {
			t.Errorf("apps:info: trouble %q %q", in.Trouble, in.TroubleMessage)
		}
		text := bexOK(t, "apps:info", app)
		if !strings.Contains(text, "Rollout:") || !strings.Contains(text, "GET /nope") {
			t.Errorf("apps:info does not say why:\n%s", text)
		}
		// A path that answers: the rollout completes.
		kubectl(t, "patch", "app", app, "--type=merge", "-p", `{"spec":{"healthCheck":{"path":"/","bootTimeoutSeconds":10}}}`)
		testenv.Eventually(t, 60*time.Second, "RolledOut True", func() error {
			if c := appConditions(t, app)["RolledOut"]; c.Status != "True" {
				return fmt.Errorf("RolledOut %+v", c)
			}
			return nil
		})
	})

	t.Run("a process that never listens", func(t *testing.T) {
		before := appInfo(t, app).Revision
		seen, stop := watchRolledOut(t, app)
		r.commit(t, "never listens", map[string]string{"Dockerfile": "FROM busybox\nCMD [\"sleep\", \"3600\"]\n"})
		out, err := r.push()
		if err == nil {
			t.Fatalf("a push whose pods never listen was accepted:\n%s", out)
		}
		if !strings.Contains(out, "[remote rejected]") || !strings.Contains(out, "did not pass the health check (GET /") {
			t.Errorf("want git's remote rejected line and why:\n%s", out)
		}
		if body, err := curl(app, "/"); err != nil || !strings.Contains(body, "hello from bex") {
			t.Errorf("after the rejected push the app answers %q, %v", body, err)
		}
		// Back on the release that serves, which is reported as running: the
		// Deployment keeps the withdrawn ReplicaSet's timed-out condition for a
		// while, and that is not this release's failure.
		testenv.Eventually(t, 30*time.Second, "apps:info: Running", func() error {
			if in := appInfo(t, app); in.Phase != "Running" || in.Trouble != "" {
				return fmt.Errorf("phase %s, trouble %s %s", in.Phase, in.Trouble, in.TroubleMessage)
			}
			return nil
		})
		stop()
		if s := seen(); strings.Contains(s, fmt.Sprintf("of release %d did not", before)) {
			t.Errorf("the release that serves was reported as failed after the withdrawal:\n%s", s)
		}
		in := appInfo(t, app)
		if in.Revision != before || in.Release != before {
			t.Errorf("after the rejected push the app is on v%d serving v%d, want v%d", in.Release, in.Revision, before)
		}
		if in.LastRelease == nil || in.LastRelease.Number != before+1 || !strings.Contains(in.LastRelease.Failed, "health check") {
			t.Errorf("apps:info --json's last release: %+v", in.LastRelease)
		}
		text := bexOK(t, "apps:info", app)
		if !strings.Contains(text, fmt.Sprintf("Last release:  v%d failed:", before+1)) && !strings.Contains(text, fmt.Sprintf("v%d failed: ", before+1)) {
			t.Errorf("apps:info does not say why the last release failed:\n%s", text)
		}
	})
}

// watchRolledOut streams the App's phase and conditions (reasons, messages) with
// kubectl get --watch, every change: a push's failure is withdrawn within a
// second, and the watch is what sees it as it was.
func watchRolledOut(t *testing.T, app string) (func() string, func()) {
	t.Helper()
	bin, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	// No {range}: kubectl's watch prints a range template for the first object only.
	cmd := exec.Command(bin, "--kubeconfig", env["KUBECONFIG"], "get", "app", app, "--watch", "-o",
		`jsonpath={.status.phase}{" "}{.status.conditions[*].reason}{" "}{.status.conditions[*].message}{"\n"}`)
	var mu sync.Mutex
	var buf bytes.Buffer
	cmd.Stdout = writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	})
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	t.Cleanup(stop)
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}, stop
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestPodTrouble: a crash loop and an image that cannot be pulled are reported
// from the kubelet's pod status, with their reasons, in the App's conditions
// and apps:info, without waiting for the progress deadline.
func TestPodTrouble(t *testing.T) {
	t.Parallel()
	const app = "trouble"
	r := newHostRepo(t, app)
	mustPush(t, r)
	waitBody(t, app, "/", "hello from bex", 30*time.Second)
	good := appInfo(t, app)

	t.Run("a crash loop", func(t *testing.T) {
		seen, stop := watchRolledOut(t, app)
		r.commit(t, "crashes", map[string]string{"Dockerfile": "FROM busybox\nCMD [\"sh\", \"-c\", \"echo crashing; exit 3\"]\n"})
		start := time.Now()
		out, err := r.push()
		if err == nil {
			t.Fatalf("a push whose process exits at once was accepted:\n%s", out)
		}
		t.Logf("rejected in %.1f s:\n%s", time.Since(start).Seconds(), out)
		if !strings.Contains(out, "keeps exiting") || !strings.Contains(out, "exited with code 3") {
			t.Errorf("the push does not say the process crash-loops with its exit code:\n%s", out)
		}
		testenv.Eventually(t, 5*time.Second, "the watch saw CrashLoop", func() error {
			if s := seen(); !strings.Contains(s, "Failed CrashLoop ") || !strings.Contains(s, "exited with code 3") {
				return fmt.Errorf("RolledOut went through:\n%s", s)
			}
			return nil
		})
		stop()
		if body, err := curl(app, "/"); err != nil || !strings.Contains(body, "hello from bex") {
			t.Errorf("after the rejected push the app answers %q, %v", body, err)
		}
		text := bexOK(t, "apps:info", app)
		if !strings.Contains(text, "failed:") || !strings.Contains(text, "exited with code 3") {
			t.Errorf("apps:info does not say why the last release failed:\n%s", text)
		}
	})

	t.Run("an image that cannot be pulled", func(t *testing.T) {
		// The App's image set by hand (kubectl) to a digest the registry
		// never had, as a restore from a backup of another registry would.
		repo, _, _ := strings.Cut(good.Image, "@")
		missing := repo + "@sha256:" + strings.Repeat("0", 63) + "1"
		kubectl(t, "patch", "app", app, "--type=merge", "-p", `{"spec":{"image":"`+missing+`"}}`)
		testenv.Eventually(t, 90*time.Second, "RolledOut ImageNotFound", func() error {
			c := appConditions(t, app)["RolledOut"]
			if c.Status != "False" || c.Reason != "ImageNotFound" || !strings.Contains(c.Message, "cannot pull image "+missing) {
				return fmt.Errorf("RolledOut %+v", c)
			}
			return nil
		})
		in := appInfo(t, app)
		t.Logf("apps:info's trouble: %s: %s", in.Trouble, in.TroubleMessage)
		// The kubelet's own words follow the image.
		if in.Trouble != "ImageNotFound" || !strings.Contains(in.TroubleMessage, `failed to pull and unpack image "`+missing+`"`) {
			t.Errorf("apps:info: trouble %q %q", in.Trouble, in.TroubleMessage)
		}
		if text := bexOK(t, "apps:info", app); !strings.Contains(text, "Rollout:") || !strings.Contains(text, "cannot pull image") {
			t.Errorf("apps:info does not say why:\n%s", text)
		}
		if body, err := curl(app, "/"); err != nil || !strings.Contains(body, "hello from bex") {
			t.Errorf("the old pods do not serve: %q, %v", body, err)
		}
		kubectl(t, "patch", "app", app, "--type=merge", "-p", `{"spec":{"image":"`+good.Image+`"}}`)
		testenv.Eventually(t, 60*time.Second, "RolledOut True", func() error {
			if c := appConditions(t, app)["RolledOut"]; c.Status != "True" {
				return fmt.Errorf("RolledOut %+v", c)
			}
			return nil
		})
	})
}

// TestScaleSuspendRollback: ps:scale, suspend/resume and rollback on the real
// kubelet, as on one machine.
func TestScaleSuspendRollback(t *testing.T) {
	t.Parallel()
	const app = "ops"
	r := newHostRepo(t, app)
	mustPush(t, r)
	waitBody(t, app, "/", "hello from bex", 30*time.Second)

	t.Run("ps:scale", func(t *testing.T) {
		bexOK(t, "ps:scale", app, "web=3")
		testenv.Eventually(t, 60*time.Second, "3 pods ready", func() error {
			if p := readyPods(t, app); len(p) != 3 {
				return fmt.Errorf("ready: %v", p)
			}
			return nil
		})
		if in := appInfo(t, app); len(in.Processes) != 1 || in.Processes[0].Replicas != 3 {
			t.Errorf("apps:info's processes: %+v", in.Processes)
		}
		// The edge balances: each of the three pods answers, in time.
		hosts := map[string]bool{}
		testenv.Eventually(t, 30*time.Second, "each pod answers through the edge", func() error {
			body, err := curl(app, "/cgi-bin/host")
			if err != nil {
				return err
			}
			hosts[strings.TrimSpace(body)] = true
			if want := readyPods(t, app); len(hosts) < 3 {
				return fmt.Errorf("answered by %v of %v", hosts, want)
			}
			return nil
		})
		bexOK(t, "ps:scale", app, "web=1")
		testenv.Eventually(t, 60*time.Second, "1 pod", func() error {
			if p := names(t, "pods", app); len(p) != 1 {
				return fmt.Errorf("pods: %v", p)
			}
			return nil
		})
	})

	t.Run("suspend and resume", func(t *testing.T) {
		before := appInfo(t, app).Revision
		bexOK(t, "suspend", app)
		testenv.Eventually(t, 60*time.Second, "no pods, the edge answers 503", func() error {
			if p := names(t, "pods", app); len(p) != 0 {
				return fmt.Errorf("pods: %v", p)
			}
			code, body, err := get(httpsClient(t), app, "/")
			if err == nil && code != 503 {
				err = fmt.Errorf("%d %.80q", code, body)
			}
			return err
		})
		if in := appInfo(t, app); !in.Suspended || in.Phase != "Suspended" {
			t.Errorf("apps:info: suspended %v, phase %s", in.Suspended, in.Phase)
		}
		bexOK(t, "resume", app)
		waitBody(t, app, "/", "hello from bex", 60*time.Second)
		if in := appInfo(t, app); in.Suspended || in.Revision != before {
			t.Errorf("after resume: suspended %v, serving v%d, want v%d", in.Suspended, in.Revision, before)
		}
	})

	t.Run("rollback", func(t *testing.T) {
		old := appInfo(t, app)
		r.commit(t, "second", map[string]string{"Dockerfile": strings.Replace(hostSample["Dockerfile"], "hello from bex", "hello again", 1)})
		mustPush(t, r)
		waitBody(t, app, "/", "hello again", 30*time.Second)
		out := bexOK(t, "rollback", app)
		t.Logf("rollback: %s", out)
		waitBody(t, app, "/", "hello from bex", 60*time.Second)
		in := appInfo(t, app)
		if in.Image != old.Image || in.Revision != old.Revision+2 {
			t.Errorf("after rollback: v%d with %s, want v%d with %s", in.Revision, in.Image, old.Revision+2, old.Image)
		}
	})
}

// TestRestartAndLogs: logs -f streams through the API server's pod logs, and
// ps:restart replaces the pods without a failed request; the new pods' first line
// appears in the stream that was already following.
func TestRestartAndLogs(t *testing.T) {
	t.Parallel()
	const app = "logs"
	r := newHostRepo(t, app)
	mustPush(t, r)
	waitBody(t, app, "/", "hello from bex", 30*time.Second)
	old := readyPods(t, app)
	if len(old) != 1 {
		t.Fatalf("ready pods: %v", old)
	}

	h, p := sshHostPort()
	fields := strings.Fields(sshCommand())
	follow := exec.Command(fields[0], append(fields[1:], "-p", p, "git@"+h, "logs", app, "-f")...)
	var mu sync.Mutex
	var stream bytes.Buffer
	follow.Stdout = writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return stream.Write(b)
	})
	follow.Stderr = follow.Stdout
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = follow.Process.Kill()
		_ = follow.Wait()
	})
	streamed := func() string {
		mu.Lock()
		defer mu.Unlock()
		return stream.String()
	}
	testenv.Eventually(t, 20*time.Second, "logs -f prints the pod's start line", func() error {
		if s := streamed(); !strings.Contains(s, "started "+old[0]) {
			return fmt.Errorf("streamed %q", s)
		}
		return nil
	})

	l := startLoop(t, app, "/")
	bexOK(t, "ps:restart", app)
	var fresh []string
	testenv.Eventually(t, 60*time.Second, "a new pod replaced the old one", func() error {
		fresh = readyPods(t, app)
		all := names(t, "pods", app)
		if len(fresh) != 1 || slices.Contains(old, fresh[0]) || len(all) != 1 {
			return fmt.Errorf("ready %v, all %v, old %v", fresh, all, old)
		}
		return nil
	})
	l.end(t, "ps:restart")
	testenv.Eventually(t, 20*time.Second, "logs -f prints the new pod's start line", func() error {
		if s := streamed(); !strings.Contains(s, "started "+fresh[0]) {
			return fmt.Errorf("streamed %q", s)
		}
		return nil
	})
	t.Logf("logs -f:\n%s", streamed())

	// Without -f: the tail of each pod, and the command ends.
	out := bexOK(t, "logs", app, "-n", "5")
	if !strings.Contains(out, "started "+fresh[0]) || !strings.Contains(out, "web[r") {
		t.Errorf("logs %s:\n%s", app, out)
	}
}

// TestDestroy: apps:destroy removes the App, and what it owned (Deployments,
// ReplicaSets, pods, the Service) goes with it.
func TestDestroy(t *testing.T) {
	t.Parallel()
	const app = "gone"
	r := newHostRepo(t, app)
	mustPush(t, r)
	waitBody(t, app, "/", "hello from bex", 30*time.Second)
	const kinds = "deployments,replicasets,pods,services"
	owned := names(t, kinds, app)
	t.Logf("owned: %v", owned)
	if len(owned) < 4 {
		t.Fatalf("want a Deployment, a ReplicaSet, a pod and a Service, have %v", owned)
	}
	if o := kubectl(t, "get", "deployment", app+"-web", "-o", "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}"); o != "App/"+app {
		t.Errorf("the Deployment's owner is %q, want App/%s", o, app)
	}
	bexOK(t, "apps:destroy", app, "--confirm", app)
	destroyed := time.Now()
	testenv.Eventually(t, 90*time.Second, "everything the App owned is gone", func() error {
		if left := names(t, kinds, app); len(left) != 0 {
			return fmt.Errorf("left: %v", left)
		}
		if out := kubectl(t, "get", "apps.app.bex.co", "--ignore-not-found", app, "-o", "name"); out != "" {
			return fmt.Errorf("left: %s", out)
		}
		return nil
	})
	t.Logf("gone %.1f s after apps:destroy", time.Since(destroyed).Seconds())
	// The edge has no certificate for a host it does not serve: the handshake
	// fails (or, were one cached, the host is unknown: 404).
	testenv.Eventually(t, 30*time.Second, "the edge no longer serves it", func() error {
		code, _, err := get(httpsClient(t), app, "/")
		if err != nil && strings.Contains(err.Error(), "tls:") {
			return nil
		}
		if err == nil && code != 404 {
			err = fmt.Errorf("answers %d", code)
		}
		return err
	})
}
