package cluster

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// pushProbe pushes the probe app (testdata/probe, a Go program on busybox) as
// app and returns a function that asks it path?q from inside its pod and decodes
// its JSON answer into v. The app is destroyed when the test ends.
func pushProbe(t *testing.T, app string) func(t *testing.T, path string, q url.Values, v any) {
	t.Helper()
	t.Cleanup(func() { _, _, _ = bex("apps:destroy", app, "--confirm", app) })
	r := probeRepo(t, app)
	r.commit(t, "probe", map[string]string{"Dockerfile": probeDockerfile})
	if out, err := r.push(); err != nil {
		t.Fatalf("push the probe: %v\n%s", err, out)
	}
	hc := httpsClient(t)
	return func(t *testing.T, path string, q url.Values, v any) {
		t.Helper()
		var body string
		testenv.Eventually(t, 30*time.Second, "the probe answers "+path, func() error {
			code, b, err := get(hc, app, path+"?"+q.Encode())
			if err == nil && code != 200 {
				err = fmt.Errorf("%d %.200s", code, b)
			}
			body = b
			return err
		})
		if err := json.Unmarshal([]byte(body), v); err != nil {
			t.Fatalf("%s: %v: %s", path, err, body)
		}
	}
}

// TestDeployerMetricsNeedToken: on a cluster any pod reaches the deployer's pod
// IP, and its metrics name every app. With --metrics-secure (infra/bex) they are
// HTTPS and answer only a bearer token the API server knows (TokenReview) whose
// holder may GET /metrics (SubjectAccessReview: the ClusterRole
// bex-metrics-reader). From an app's pod, on every replica (the one not leading
// serves metrics too): no token, a forged one, and a ServiceAccount's without
// the binding are refused; the control, a ServiceAccount bound to
// bex-metrics-reader, reads them along the same path.
func TestDeployerMetricsNeedToken(t *testing.T) {
	const app = "probe-metrics"
	ask := pushProbe(t, app)
	// A metric every replica has (client-go's requests: leader election and the
	// cache); controller_runtime_reconcile_total appears only on the leader.
	const metric = "rest_client_requests_total"
	type result struct {
		probeResult
		Found bool `json:"found"`
	}
	fetch := func(t *testing.T, u, bearer string) result {
		t.Helper()
		q := url.Values{"url": {u}, "find": {metric}}
		if bearer != "" {
			q.Set("bearer", bearer)
		}
		var res result
		ask(t, "/https", q, &res)
		t.Logf("%s: connected=%v status=%d err=%q found=%v body=%.120q", res.Target, res.Connected, res.Status, res.Err, res.Found, res.Body)
		return res
	}

	ips := strings.Fields(kubectl(t, "-n", "bex-system", "get", "pods", "-l", "app.kubernetes.io/name=bex-deployer",
		"--field-selector=status.phase=Running", "-o", "jsonpath={.items[*].status.podIP}"))
	if len(ips) == 0 {
		t.Fatal("no running deployer pod")
	}

	// Two ServiceAccounts of a namespace of this test: one bound to
	// bex-metrics-reader (as an operator binds their Prometheus), one not.
	ns := "bex-metrics-test"
	binding := "bex-metrics-test-scraper"
	cleanup := func() {
		kubectl(t, "delete", "clusterrolebinding", binding, "--ignore-not-found")
		kubectl(t, "delete", "namespace", ns, "--ignore-not-found", "--wait=false")
	}
	cleanup() // left by an earlier run on a kept cluster
	t.Cleanup(cleanup)
	testenv.Eventually(t, 2*time.Minute, "namespace "+ns+" created", func() error {
		bin, err := testenv.Binary("kubectl")
		if err != nil {
			return err
		}
		// A namespace still terminating from the last run refuses a new one.
		if out, err := exec.Command(bin, "--kubeconfig", env["KUBECONFIG"], "create", "namespace", ns).CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	kubectl(t, "-n", ns, "create", "serviceaccount", "scraper")
	kubectl(t, "-n", ns, "create", "serviceaccount", "stranger")
	kubectl(t, "create", "clusterrolebinding", binding, "--clusterrole=bex-metrics-reader", "--serviceaccount="+ns+":scraper")
	token := func(sa string) string {
		return strings.TrimSpace(kubectl(t, "-n", ns, "create", "token", sa, "--duration=10m"))
	}
	scraper, stranger := token("scraper"), token("stranger")

	for _, ip := range ips {
		u := "https://" + net.JoinHostPort(ip, "9091") + "/metrics"
		t.Run(ip, func(t *testing.T) {
			// A token the API server rejects is an authentication error to
			// controller-runtime's filter, which answers it with 500 (and
			// logs it); 401 would do as well.
			for _, c := range []struct {
				who, bearer string
				want        []int
			}{
				{"no token", "", []int{401}},
				{"a forged token", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06YWRtaW4ifQ.c2lnbmF0dXJl", []int{401, 500}},
				{"a ServiceAccount not bound to bex-metrics-reader", stranger, []int{403}},
			} {
				res := fetch(t, u, c.bearer)
				if res.Status == 200 || res.Found {
					t.Errorf("%s: the deployer's metrics answer an app's pod (%d, %.100q)", c.who, res.Status, res.Body)
				} else if !slices.Contains(c.want, res.Status) {
					t.Errorf("%s: %d %q %.100q, want %v", c.who, res.Status, res.Err, res.Body, c.want)
				}
			}
			// Plain HTTP, as before --metrics-secure: the TLS server refuses it.
			var plain result
			ask(t, "/http", url.Values{"url": {"http://" + net.JoinHostPort(ip, "9091") + "/metrics"}, "find": {metric}}, &plain)
			if plain.Status == 200 || plain.Found {
				t.Errorf("plain HTTP: the deployer's metrics answer an app's pod (%d, %.100q)", plain.Status, plain.Body)
			}

			// The control: the same request with the bound ServiceAccount's token.
			// The binding was made before any request, but RBAC reaches the API
			// server's authorizer through its informers: poll.
			testenv.Eventually(t, time.Minute, "the bound ServiceAccount reads "+u, func() error {
				res := fetch(t, u, scraper)
				if res.Status != 200 || !res.Found {
					return fmt.Errorf("%d %q %.100q, found %s: %v", res.Status, res.Err, res.Body, metric, res.Found)
				}
				return nil
			})
		})
	}
}
