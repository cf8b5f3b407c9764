package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"bex.co/bex/internal/testenv"
	"bex.co/bex/internal/volumearchive/archivetest"
)

// volumeSize is the size of each of the node's local volumes
// (hack/clusterlocal/storage.go): a claim of this size gets a file system of
// exactly it, so ENOSPC comes where the app's size says.
const volumeSize = "256Mi"

// TestVolumesOnTheCluster: a volume of an app on the cluster is a
// PersistentVolumeClaim the node's local volume binds to, mounted in the web
// pods and in one-off pods. A file the app writes there is served after a
// redeploy (stop-then-start: never an old and a new web pod at once, and the
// push says it is a short downtime), a rollback, a suspend/resume, a restart
// of the deployer and of the app's pod; writes past its size fail with ENOSPC
// inside the app, which keeps serving; another app sees nothing of it; its
// deletion takes the claim.
func TestVolumesOnTheCluster(t *testing.T) {
	const app = "volly"
	r := newHostRepo(t, app) // stops on SIGTERM: each stop of a Recreate rollout would take the 30 s grace
	mustPush(t, r)
	waitBody(t, app, "/", "hello from bex", time.Minute)

	// A claim of the same name left by an earlier run (BEX_TEST_CLUSTER_ENV)
	// goes once its pods have: volumes:create says to try again meanwhile.
	var out string
	testenv.Eventually(t, 2*time.Minute, "volumes:create", func() error {
		o, e, err := bex("volumes:create", app, "data", "--path", "/www/data", "--size", volumeSize)
		if err != nil && strings.Contains(e, "try again in a moment") {
			return fmt.Errorf("%s", e)
		}
		if err != nil {
			t.Fatalf("volumes:create: %v\n%s", err, e)
		}
		out = o
		return nil
	})
	if !strings.Contains(out, "Created the volume data ("+volumeSize+") of "+app+", mounted at /www/data.") {
		t.Errorf("volumes:create printed %q", out)
	}
	claim := app + "-vol-data"
	if phase := kubectl(t, "get", "pvc", claim, "-o", "jsonpath={.status.phase} {.spec.storageClassName} {.spec.volumeName}"); !strings.HasPrefix(phase, "Bound bex-local bex-local-app-") {
		t.Fatalf("the claim %s: %q, want Bound to a local volume", claim, phase)
	}
	if s := kubectl(t, "get", "deployment", app+"-web", "-o", "jsonpath={.spec.strategy.type}"); s != "Recreate" {
		t.Errorf("the web Deployment's strategy is %q with a volume, want Recreate", s)
	}
	if out := bexOK(t, "run", app, "--", "sh", "-c", shellQuote("echo kept > /www/data/f && df -k /www/data | tail -n 1")); !strings.Contains(out, "/www/data") {
		t.Fatalf("run writes into the volume: %q", out)
	}
	kept := func(what string) {
		t.Helper()
		waitBody(t, app, "/data/f", "kept", 2*time.Minute)
		t.Logf("%s: the volume's file is served", what)
	}
	kept("created")

	// A redeploy: the old web pod is gone before the new one is made.
	overlap := watchWebPods(t, app)
	down := measureDowntime(t, app)
	r.commit(t, "a change", map[string]string{"CHANGED": "yes\n"})
	out = mustPush(t, r)
	t.Logf("the redeploy's downtime: %s", down())
	if !strings.Contains(out, "short downtime") {
		t.Errorf("the push does not say the rollout is a short downtime:\n%s", out)
	}
	if o := overlap(); o != "" {
		t.Errorf("an old and a new web pod ran at once: %s", o)
	}
	kept("after a redeploy")

	bexOK(t, "rollback", app)
	kept("after a rollback")
	bexOK(t, "suspend", app)
	testenv.Eventually(t, 2*time.Minute, "suspended: no pod", func() error {
		if p := names(t, "pods", app); len(p) != 0 {
			return fmt.Errorf("pods %v", p)
		}
		return nil
	})
	bexOK(t, "resume", app)
	kept("after suspend and resume")

	kubectl(t, "-n", "bex-system", "rollout", "restart", "deployment/bex-deployer")
	kubectl(t, "-n", "bex-system", "rollout", "status", "deployment/bex-deployer", "--timeout=3m")
	kubectl(t, "delete", "pods", "-l", "app.bex.co/app="+app+",app.bex.co/process=web", "--wait=true")
	kept("after a restart of the deployer and of the web pod")

	// Full: ENOSPC inside the app; it keeps serving.
	out, _, _ = bex("run", app, "--", "sh", "-c", shellQuote("dd if=/dev/zero of=/www/data/big bs=1M count=320 2>&1; echo exit=$?"))
	if !strings.Contains(out, "No space left on device") || strings.Contains(out, "exit=0") {
		t.Fatalf("320 MiB into %s: %q", volumeSize, out)
	}
	kept("with the volume full")
	bexOK(t, "run", app, "--", "rm", "/www/data/big")

	var list []struct {
		Name      string `json:"name"`
		Path      string `json:"path"`
		SizeBytes int64  `json:"sizeBytes"`
		Ready     bool   `json:"ready"`
	}
	if err := json.Unmarshal([]byte(bexOK(t, "volumes", app, "--json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != "data" || list[0].Path != "/www/data" || list[0].SizeBytes != 256<<20 || !list[0].Ready {
		t.Errorf("volumes --json: %+v", list)
	}

	// A running app's copy: nothing pauses it on a cluster, so it is refused
	// unless asked for with --live; a suspended app's is still.
	if _, errOut, err := bexIO(nil, "volumes:backup", app, "data"); err == nil || !strings.Contains(errOut, "`suspend "+app+"` first for a still copy") ||
		!strings.Contains(errOut, "volumes:backup "+app+" data --live") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("volumes:backup of a running app: %v %q", err, errOut)
	}
	live, errOut, err := bexIO(nil, "volumes:backup", app, "data", "--live")
	if err != nil || !strings.Contains(errOut, "can miss writes in flight") {
		t.Fatalf("volumes:backup --live: %v %q", err, errOut)
	}

	// suspend → backup → destroy → create → restore → resume: the same bytes,
	// through the helper pod that mounts the claim.
	bexOK(t, "suspend", app)
	backup, errOut, err := bexIO(nil, "volumes:backup", app, "data")
	if err != nil || len(backup) == 0 || errOut != "" {
		t.Fatalf("volumes:backup of the suspended app: %v %q", err, errOut)
	}
	if names := archivetest.Names(backup); strings.Join(names, " ") != "f" {
		t.Fatalf("the backup holds %q", names)
	}
	if !bytes.Equal(live, backup) {
		t.Errorf("the live copy and the still one differ (%d and %d bytes), with nothing written between", len(live), len(backup))
	}
	bexOK(t, "volumes:destroy", app, "data", "--confirm", "data")
	testenv.Eventually(t, 2*time.Minute, "volumes:create again", func() error {
		_, e, err := bex("volumes:create", app, "data", "--path", "/www/data", "--size", volumeSize)
		if err != nil && strings.Contains(e, "try again in a moment") {
			return fmt.Errorf("%s", e)
		}
		if err != nil {
			t.Fatalf("volumes:create again: %v\n%s", err, e)
		}
		return nil
	})
	if _, errOut, err := bexIO(backup, "volumes:restore", app, "data"); err != nil {
		t.Fatalf("volumes:restore: %v %q", err, errOut)
	}
	bexOK(t, "resume", app)
	kept("after the restore")
	if again, _, err := bexIO(nil, "volumes:backup", app, "data", "--live"); err != nil || !bytes.Equal(again, backup) {
		t.Fatalf("the backup after the restore differs (%d and %d bytes, %v)", len(again), len(backup), err)
	}
	for what, archive := range map[string][]byte{
		"../x":          archivetest.FineThen(t, "../x"),
		"absolute path": archivetest.FineThen(t, "/tmp/bex-cluster-escaped"),
		"garbage":       []byte(strings.Repeat("not a tar ", 100)),
	} {
		_, errOut, err := bexIO(archive, "volumes:restore", app, "data", "--live")
		if err == nil || !strings.Contains(errOut, "refused the archive") {
			t.Errorf("%s: volumes:restore %v %q", what, err, errOut)
		}
		if again, _, _ := bexIO(nil, "volumes:backup", app, "data", "--live"); !bytes.Equal(again, backup) {
			t.Errorf("%s: the volume changed", what)
		}
	}

	// Another app: nothing of volly's volume.
	other := newRepo(t, "hello-shell", app+"-other")
	mustPush(t, other)
	out, _, _ = bex("run", app+"-other", "--", "sh", "-c", shellQuote("ls -A /www/data; cat /www/data/f; echo end"))
	// Its stdout and stderr reach us in either order: only what they say counts.
	if strings.Contains(out, "kept") || !strings.Contains(out, "end\n") {
		t.Errorf("%s-other's view: %q", app, out)
	}
	bexOK(t, "apps:destroy", app+"-other", "--confirm", app+"-other")

	// The app's deletion takes its claim.
	bexOK(t, "apps:destroy", app, "--confirm", app)
	testenv.Eventually(t, 2*time.Minute, "the claim is gone with the app", func() error {
		if out := kubectl(t, "get", "pvc", "--ignore-not-found", claim, "-o", "name"); out != "" {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	})
}

// watchWebPods watches the app's web pods until the returned function is
// called, which says when pods of two releases were there at once (neither
// ended), or "".
func watchWebPods(t *testing.T, app string) func() string {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", env["KUBECONFIG"])
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(rc)
	ctx, cancel := context.WithCancel(context.Background())
	w, err := cs.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{LabelSelector: "app.bex.co/app=" + app + ",app.bex.co/process=web"})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var mu sync.Mutex
	var overlap string
	done := make(chan struct{})
	go func() {
		defer close(done)
		live := map[string]string{} // pod: release
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			// A pod whose containers ended (the kubelet marks a deleted
			// pod's phase terminal before the object goes) holds nothing.
			if ev.Type == watch.Deleted || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				delete(live, p.Name)
				continue
			}
			live[p.Name] = p.Labels["app.bex.co/release"] + " " + string(p.Status.Phase)
			releases := map[string]bool{}
			for _, rel := range live {
				releases[strings.Fields(rel)[0]] = true
			}
			if len(releases) > 1 {
				mu.Lock()
				if overlap == "" {
					overlap = fmt.Sprintf("at %s: %v", time.Now().Format("15:04:05.000"), live)
				}
				mu.Unlock()
			}
		}
	}()
	return func() string {
		cancel()
		w.Stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return overlap
	}
}

// shellQuote quotes s as one word for the remote command line (ssh joins its
// arguments with spaces and the gitserver splits them as a shell does).
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// measureDowntime requests the app's / every 100 ms until the returned
// function is called, which says from when to when requests failed.
func measureDowntime(t *testing.T, app string) func() string {
	hc := httpsClient(t)
	stop := make(chan struct{})
	done := make(chan string)
	go func() {
		var first, last time.Time
		failed, sent := 0, 0
		for {
			select {
			case <-stop:
				if failed == 0 {
					done <- fmt.Sprintf("none (%d requests)", sent)
				} else {
					done <- fmt.Sprintf("%d of %d requests failed, over %.1f s", failed, sent, last.Sub(first).Seconds())
				}
				return
			case <-time.After(100 * time.Millisecond): // the request rate, not a wait for an event
			}
			sent++
			if code, _, err := get(hc, app, "/"); err != nil || code != 200 {
				if failed == 0 {
					first = time.Now()
				}
				failed++
				last = time.Now()
			}
		}
	}()
	return func() string {
		close(stop)
		return <-done
	}
}

// bexIO runs a bex command over ssh as the admin with stdin, for binary
// streams: stdout, stderr and the exit error.
func bexIO(stdin []byte, args ...string) ([]byte, string, error) {
	h, p := sshHostPort()
	fields := strings.Fields(sshCommand())
	cmd := exec.Command(fields[0], append(append(fields[1:], "-p", p, "git@"+h), args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.Bytes(), stderr.String(), err
}
