package cluster

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// TestPlatformLimitsPerClient: the gitserver limits failed MCP tokens per
// client, and on a cluster the client is the one the edge names, not the
// edge's node address: one client past the limit leaves the others alone. The
// edge vouches for the address it names with the proxy secret; a tenant's pod
// that calls the gitserver's Service directly, forging X-Forwarded-For and
// guessing the secret, is counted under its peer address however it fills the
// header.
//
// The limited client is a probe app's pod (testdata/probe), which reaches the
// edge on the node's address and the Service bex-hooks directly (the bridge
// CNI enforces no NetworkPolicy); the other client is this host. The pod's
// address is spent, not the host's, so the tests after this one that call
// /mcp from the host are not refused.
func TestPlatformLimitsPerClient(t *testing.T) {
	const app = "limitprobe"
	_, _, _ = bex("apps:destroy", app, "--confirm", app)
	t.Cleanup(func() { _, _, _ = bex("apps:destroy", app, "--confirm", app) })
	r := probeRepo(t, app)
	r.commit(t, "probe", map[string]string{"Dockerfile": probeDockerfile})
	if out, err := r.push(); err != nil {
		t.Fatalf("push the probe: %v\n%s", err, out)
	}

	hc := httpsClient(t)
	// probe has the pod send one request and returns what it got.
	probe := func(t *testing.T, q url.Values) probeResult {
		t.Helper()
		var res probeResult
		testenv.Eventually(t, 30*time.Second, "the probe answers", func() error {
			code, body, err := get(hc, app, "/https?"+q.Encode())
			if err == nil && code != 200 {
				err = fmt.Errorf("%d %.200s", code, body)
			}
			if err == nil {
				err = json.Unmarshal([]byte(body), &res)
			}
			return err
		})
		if res.Err != "" {
			t.Fatalf("the probe's request %s: %s", res.Target, res.Err)
		}
		return res
	}
	nodeIP := strings.TrimSpace(kubectl(t, "get", "nodes", "-o", `jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}`))
	hooksIP := strings.TrimSpace(kubectl(t, "-n", "bex-system", "get", "service", "bex-hooks", "-o", "jsonpath={.spec.clusterIP}"))
	// A guessed token (malformed: refused without a read of the API), and
	// headers a tenant forges: another client's address, a guess at the secret.
	forged := func(i int) []string {
		return []string{"Authorization: Bearer bex_guess", fmt.Sprintf("X-Forwarded-For: 203.0.113.%d", i+1),
			"X-Bex-Edge-Secret: 0123456789abcdef0123456789abcdef"}
	}
	// viaEdge: the pod at https://BASE_DOMAIN/mcp, through the edge on the node.
	viaEdge := func(t *testing.T, i int) probeResult {
		return probe(t, url.Values{"method": {"POST"}, "url": {"https://" + nodeIP + "/mcp"}, "host": {env["BASE_DOMAIN"]}, "header": forged(i)})
	}
	// direct: the pod at the gitserver's Service, past the edge.
	direct := func(t *testing.T, i int) probeResult {
		return probe(t, url.Values{"method": {"POST"}, "url": {"http://" + hooksIP + "/mcp"}, "header": forged(i)})
	}
	limited := func(res probeResult) bool {
		return res.Status == http.StatusTooManyRequests && strings.Contains(res.Body, "too many refused tokens")
	}
	// The bucket (internal/sourcelimit) gives a failure back every 6 s: a 401
	// past the limit is one given back, no more than one per 6 s of the run.
	const refill = 6 * time.Second
	const burst = 10

	// 1. Through the edge, the pod's guesses are refused (401) until its
	// address is limited (429). Its forged headers change nothing.
	start := time.Now()
	n := 0
	for ; ; n++ {
		res := viaEdge(t, n)
		if limited(res) {
			break
		}
		if res.Status != http.StatusUnauthorized {
			t.Fatalf("guess %d through the edge: %d %.200s, want 401 or 429", n+1, res.Status, res.Body)
		}
		if n > burst+1+int(time.Since(start)/refill) {
			t.Fatalf("%d guesses through the edge and no 429: the failures are not counted", n+1)
		}
	}
	t.Logf("the pod was limited after %d guesses through the edge", n)

	// 2. Another client through the same edge (this host) is not limited, and
	// the pod still is: each client has its own bucket, not the edge's.
	req, _ := http.NewRequest(http.MethodPost, "https://"+env["BASE_DOMAIN"]+"/mcp", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("this host through the edge, no token, after the pod was limited: %d, want 401 (not 429: the edge's clients share no bucket)", res.StatusCode)
	}
	if res := viaEdge(t, 0); !limited(res) && !limited(viaEdge(t, 1)) {
		t.Fatalf("the pod through the edge, right after: %d %.200s, want 429", res.Status, res.Body)
	}

	// 3. The attack: the pod at the gitserver directly, naming a new client in
	// X-Forwarded-For each time with a guessed secret. Were the forgery
	// believed, each would be a fresh client (401 for ever); it is counted under
	// its peer, and limited like any one client. (The peer is not the pod's own
	// address here: kube-proxy masquerades a pod's connection to a Service on
	// this node as the bridge's 10.244.0.1, so the count starts afresh.)
	start = time.Now()
	for n = 0; ; n++ {
		res := direct(t, 100+n)
		if limited(res) {
			break
		}
		if res.Status != http.StatusUnauthorized {
			t.Fatalf("forged request %d at bex-hooks: %d %.200s, want 401 or 429", n+1, res.Status, res.Body)
		}
		if n > burst+1+int(time.Since(start)/refill) {
			t.Fatalf("%d forged requests at bex-hooks, each with a new X-Forwarded-For, and no 429: the forged client is believed", n+1)
		}
	}
	t.Logf("the pod's forged requests at bex-hooks were limited after %d", n)
}
