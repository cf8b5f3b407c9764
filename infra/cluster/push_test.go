package cluster

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// TestPushServesOverHTTPS is the path of a push on the cluster: the gitserver pod
// receives it, the in-cluster buildkitd builds it and pushes the image to the
// in-cluster registry, the deployer rolls a Deployment whose pod the kubelet pulls
// from that registry, and the edge DaemonSet serves it over HTTPS. Then a second
// push under a request loop (no request fails), and a push whose pods never get
// healthy (rejected; the old pods serve, the ref stays).
func TestPushServesOverHTTPS(t *testing.T) {
	r := newRepo(t, "hello-shell", "hello")
	out, err := r.push()
	if err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	t.Logf("first push:\n%s", out)
	url := "https://hello." + env["BASE_DOMAIN"]
	if !strings.Contains(out, url) {
		t.Errorf("the push output does not name %s", url)
	}
	testenv.Eventually(t, 30*time.Second, "curl "+url, func() error {
		body, err := curl("hello", "/")
		if err == nil && !strings.Contains(body, "hello from bex") {
			err = fmt.Errorf("body %q", body)
		}
		return err
	})
	image := kubectl(t, "get", "deployment", "hello-web", "-o", "jsonpath={.spec.template.spec.containers[0].image}")
	if !strings.HasPrefix(image, "bex-registry.bex-system.svc.cluster.local:5000/apps/hello@sha256:") {
		t.Errorf("the Deployment runs %q, want an image of the in-cluster registry by digest", image)
	}

	t.Run("a second push loses no request", func(t *testing.T) {
		hc := httpsClient(t)
		var sent, failed atomic.Int64
		var mu sync.Mutex
		var failures []string
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				sent.Add(1)
				code, body, err := get(hc, "hello", "/")
				if err != nil || code != 200 {
					failed.Add(1)
					mu.Lock()
					if len(failures) < 5 {
						failures = append(failures, fmt.Sprintf("%d %v %.80q", code, err, body))
					}
					mu.Unlock()
				}
				time.Sleep(20 * time.Millisecond) // a bounded request rate, not a wait for an event
			}
		}()
		r.commit(t, "second", map[string]string{"index2.html": "two\n"})
		out, err := r.push()
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatalf("second push: %v\n%s", err, out)
		}
		if sent.Load() < 20 {
			t.Errorf("only %d requests were sent during the push", sent.Load())
		}
		if failed.Load() != 0 {
			t.Errorf("%d of %d requests failed during the rollout: %v", failed.Load(), sent.Load(), failures)
		}
		t.Logf("%d requests during the second push, %d failed", sent.Load(), failed.Load())
	})

	t.Run("pods that never get ready are rejected and the old ones serve", func(t *testing.T) {
		before := strings.TrimSpace(kubectl(t, "get", "deployment", "hello-web", "-o", "jsonpath={.spec.template.metadata.labels.app\\.bex\\.co/release}"))
		r.commit(t, "never listens", map[string]string{"Dockerfile": "FROM busybox\nCMD [\"sleep\", \"3600\"]\n"})
		out, err := r.push()
		if err == nil {
			t.Fatalf("a push whose pods never listen was accepted:\n%s", out)
		}
		if !strings.Contains(out, "[remote rejected]") {
			t.Errorf("want git's remote rejected line:\n%s", out)
		}
		t.Logf("rejected push:\n%s", out)
		body, err := curl("hello", "/")
		if err != nil || !strings.Contains(body, "hello from bex") {
			t.Errorf("after the rejected push the app answers %q, %v", body, err)
		}
		if ref := strings.TrimSpace(r.git(t, "ls-remote", "bex", "main")); strings.HasPrefix(ref, strings.TrimSpace(r.git(t, "rev-parse", "HEAD"))) {
			t.Errorf("the rejected push moved main on the gitserver: %s", ref)
		}
		testenv.Eventually(t, 30*time.Second, "apps:info says v"+before+" serves", func() error {
			info, stderr, err := bex("apps:info", "hello")
			if err != nil {
				return fmt.Errorf("%v: %s", err, stderr)
			}
			if !strings.Contains(info, "Phase:          Running") || !strings.Contains(info, "(serving: v"+before+")") {
				return fmt.Errorf("apps:info hello:\n%s", info)
			}
			if after := strings.TrimSpace(kubectl(t, "get", "deployment", "hello-web", "-o", "jsonpath={.spec.template.metadata.labels.app\\.bex\\.co/release}")); after != before {
				return fmt.Errorf("the web Deployment's template is release %s, want %s again", after, before)
			}
			return nil
		})
	})
}
