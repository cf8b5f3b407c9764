package cluster

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// hostSample is hello-shell with a CGI that names the pod that answered (the
// kubelet sets HOSTNAME to the pod's name) and a start line on stdout, so that
// tests can tell instances apart and find a line the app printed in its log. Its
// shell stops on SIGTERM (httpd as PID 1 ignores it, and each stopping pod would
// take the whole 30 s grace period).
var hostSample = map[string]string{
	"Dockerfile": `FROM busybox
RUN mkdir -p /www/cgi-bin && echo 'hello from bex' > /www/index.html
COPY greet.sh /www/cgi-bin/greet
COPY host.sh /www/cgi-bin/host
RUN chmod 755 /www/cgi-bin/greet /www/cgi-bin/host
CMD ["sh", "-c", "echo \"started $HOSTNAME ${MARKER:-}\"; trap 'exit 0' TERM; httpd -f -p \"$PORT\" -h /www & wait"]
`,
	"host.sh": "#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n'\necho \"$HOSTNAME\"\n",
}

// newHostRepo is a repository of hostSample for app, one commit, not pushed.
// An app of that name left by an earlier run on the same cluster
// (BEX_TEST_CLUSTER_ENV) is destroyed first.
func newHostRepo(t *testing.T, app string) *repo {
	t.Helper()
	if _, _, err := bex("apps:info", app); err == nil {
		bexOK(t, "apps:destroy", app, "--confirm", app)
		testenv.Eventually(t, 60*time.Second, "app "+app+" of an earlier run is gone", func() error {
			if out := kubectl(t, "get", "apps.app.bex.co", "--ignore-not-found", app, "-o", "name"); out != "" {
				return fmt.Errorf("still there: %s", out)
			}
			if left := names(t, "pods", app); len(left) != 0 {
				return fmt.Errorf("pods left: %v", left)
			}
			return nil
		})
	}
	r := newRepo(t, "hello-shell", app)
	r.commit(t, "names its host", hostSample)
	return r
}

// mustPush pushes and fails the test when the push is refused.
func mustPush(t *testing.T, r *repo) string {
	t.Helper()
	start := time.Now()
	out, err := r.push()
	if err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	t.Logf("push in %.1f s", time.Since(start).Seconds())
	return out
}

// bexOK runs a bex command and fails the test when it fails.
func bexOK(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := bex(args...)
	if err != nil {
		t.Fatalf("bex %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// waitBody waits until the app answers path with a body containing want.
func waitBody(t *testing.T, app, path, want string, within time.Duration) {
	t.Helper()
	testenv.Eventually(t, within, fmt.Sprintf("https://%s%s answers %q", app, path, want), func() error {
		body, err := curl(app, path)
		if err == nil && !strings.Contains(body, want) {
			err = fmt.Errorf("body %q", body)
		}
		return err
	})
}

// condition is one of an App's status conditions, as kubectl shows it.
type condition struct {
	Type, Status, Reason, Message string
}

// appConditions reads the App's status conditions with kubectl.
func appConditions(t *testing.T, app string) map[string]condition {
	t.Helper()
	var a struct {
		Status struct {
			Conditions []condition `json:"conditions"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(kubectl(t, "get", "app", app, "-o", "json")), &a); err != nil {
		t.Fatalf("app %s: %v", app, err)
	}
	out := map[string]condition{}
	for _, c := range a.Status.Conditions {
		out[c.Type] = c
	}
	return out
}

// info is apps:info APP --json, the fields the tests read.
type info struct {
	Phase          string `json:"phase"`
	Release        int64  `json:"release"`
	Revision       int64  `json:"revision"`
	Image          string `json:"image"`
	Suspended      bool   `json:"suspended"`
	Trouble        string `json:"trouble"`
	TroubleMessage string `json:"troubleMessage"`
	Conditions     []condition
	Processes      []struct {
		Type     string `json:"type"`
		Replicas int32  `json:"replicas"`
	} `json:"processes"`
	LastRelease *struct {
		Number int64  `json:"number"`
		Failed string `json:"failed"`
	} `json:"lastRelease"`
}

func appInfo(t *testing.T, app string) info {
	t.Helper()
	var in info
	out := bexOK(t, "apps:info", app, "--json")
	if err := json.Unmarshal([]byte(out), &in); err != nil {
		t.Fatalf("apps:info %s --json: %v\n%s", app, err, out)
	}
	return in
}

// names lists the names of the kinds (comma-separated, kubectl's way) labelled
// with the app.
func names(t *testing.T, kinds, app string) []string {
	t.Helper()
	out := kubectl(t, "get", kinds, "-l", "app.bex.co/app="+app, "-o", "name")
	return strings.Fields(out)
}

// readyPods are the names of the app's pods that are Ready and not going away.
func readyPods(t *testing.T, app string) []string {
	t.Helper()
	var list struct {
		Items []struct {
			Metadata struct {
				Name              string  `json:"name"`
				DeletionTimestamp *string `json:"deletionTimestamp"`
			} `json:"metadata"`
			Status struct {
				Conditions []condition `json:"conditions"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(kubectl(t, "get", "pods", "-l", "app.bex.co/app="+app, "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range list.Items {
		if p.Metadata.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == "Ready" && c.Status == "True" {
				out = append(out, p.Metadata.Name)
			}
		}
	}
	return out
}

// loop sends requests to the app through the edge until stopped, at a bounded
// rate, counting the ones that fail.
type loop struct {
	sent, failed atomic.Int64
	mu           sync.Mutex
	failures     []string
	stop         chan struct{}
	wg           sync.WaitGroup
}

func startLoop(t *testing.T, app, path string) *loop {
	hc := httpsClient(t)
	l := &loop{stop: make(chan struct{})}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			l.sent.Add(1)
			code, body, err := get(hc, app, path)
			if err != nil || code != 200 {
				l.failed.Add(1)
				l.mu.Lock()
				if len(l.failures) < 5 {
					l.failures = append(l.failures, fmt.Sprintf("%s %d %v %.80q", time.Now().Format("15:04:05.000"), code, err, body))
				}
				l.mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond) // a bounded request rate, not a wait for an event
		}
	}()
	return l
}

// end stops the loop and fails the test if any request failed.
func (l *loop) end(t *testing.T, during string) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	if l.sent.Load() < 10 {
		t.Errorf("only %d requests were sent during %s", l.sent.Load(), during)
	}
	if l.failed.Load() != 0 {
		t.Errorf("%d of %d requests failed during %s: %v", l.failed.Load(), l.sent.Load(), during, l.failures)
	}
	t.Logf("%d requests during %s, %d failed", l.sent.Load(), during, l.failed.Load())
}
