package cluster

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// TestBuildStepNetwork pushes an app whose RUN step is the probe
// (testdata/probe, as a command) trying what a hostile build step would: the
// cluster's Services (the API server, the registry, the gitserver), another pod,
// buildkitd's own pod, the node's listeners (the kubelet, the API server, the
// registry's node port) and the host's end of the node's link. Every one must be
// refused from the step (infra/bex/buildkitd.yaml: a bridge of its own, confined
// by `bex build-network`), while the step still resolves names through the
// cluster's DNS. The control: the same app, once deployed, asks the same
// addresses from its pod, where the Services and the node's ports answer, so the
// targets were there to be reached.
func TestBuildStepNetwork(t *testing.T) {
	const app = "stepprobe"
	_, _, _ = bex("apps:destroy", app, "--confirm", app)
	t.Cleanup(func() { _, _, _ = bex("apps:destroy", app, "--confirm", app) })
	r := probeRepo(t, app)

	nodeIP := netip.MustParseAddr(strings.TrimSpace(kubectl(t, "get", "nodes", "-o", `jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}`)))
	hostIP := nodeIP.Prev() // hack/clusterlocal: the node's link is a /30
	svc := func(name string) string {
		return strings.TrimSpace(kubectl(t, "-n", "bex-system", "get", "service", name, "-o", "jsonpath={.spec.clusterIP}"))
	}
	podIP := func(label string) string {
		return strings.TrimSpace(kubectl(t, "-n", "bex-system", "get", "pods", "-l", "app.kubernetes.io/name="+label,
			"--field-selector=status.phase=Running", "-o", "jsonpath={.items[0].status.podIP}"))
	}
	type target struct {
		what, addr string
		live       bool // answers a pod of an app (the control below checks it)
	}
	targets := []target{
		{"the API server's Service", "10.96.0.1:443", true},
		{"the registry's Service", net.JoinHostPort(svc("bex-registry"), "5000"), true},
		{"the gitserver's Service", net.JoinHostPort(svc("bex-gitserver"), "22"), true},
		{"the webhooks' Service", net.JoinHostPort(svc("bex-hooks"), "80"), true},
		{"the registry's pod", net.JoinHostPort(podIP("bex-registry"), "5000"), true},
		{"buildkitd's own pod", net.JoinHostPort(podIP("bex-buildkitd"), "1234"), true},
		{"the node's kubelet", net.JoinHostPort(nodeIP.String(), "10250"), true},
		{"the node's API server", net.JoinHostPort(nodeIP.String(), "6443"), true},
		{"the registry's node port", net.JoinHostPort(nodeIP.String(), "30500"), true},
		{"the host's end of the node's link", net.JoinHostPort(hostIP.String(), "22"), false},
	}
	args := make([]string, len(targets))
	for i, tg := range targets {
		args[i] = tg.addr
	}
	// A nonce in the RUN line: a step BuildKit cached from an earlier run would
	// print nothing.
	nonce := fmt.Sprintf("%08x", rand.Uint32())
	r.commit(t, "probe in a build step", map[string]string{"Dockerfile": "FROM busybox\nCOPY --chmod=755 probe /probe\n" +
		"RUN echo " + nonce + " && /probe tcp " + strings.Join(args, " ") + " && /probe dns kubernetes.default.svc.cluster.local\n" +
		"CMD [\"/probe\"]\n"})
	out, err := r.push()
	if err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	got := map[string]probeResult{}
	for _, m := range regexp.MustCompile(`PROBE (\{.*\})`).FindAllStringSubmatch(out, -1) {
		var res probeResult
		if err := json.Unmarshal([]byte(m[1]), &res); err != nil {
			t.Fatalf("%v: %s", err, m[0])
		}
		got[res.Target] = res
	}
	for _, tg := range targets {
		res, ok := got[tg.addr]
		switch {
		case !ok:
			t.Errorf("the build's output has no probe line for %s (%s):\n%s", tg.what, tg.addr, out)
		case res.Connected:
			t.Errorf("a build step reached %s (%s)", tg.what, tg.addr)
		default:
			t.Logf("from a build step, %-36s %-22s refused: %s", tg.what, tg.addr, res.Err)
		}
	}
	if dns := got["dns kubernetes.default.svc.cluster.local"]; !dns.Connected || dns.Body != "10.96.0.1" {
		t.Errorf("a build step does not resolve names through the cluster's DNS: %+v", dns)
	}

	// The control, from the deployed app's pod.
	hc := httpsClient(t)
	var fromPod []probeResult
	testenv.Eventually(t, time.Minute, "the app's probe answers", func() error {
		code, body, err := get(hc, app, "/tcp?"+url.Values{"addr": args}.Encode())
		if err == nil && code != 200 {
			err = fmt.Errorf("%d %.200s", code, body)
		}
		if err == nil {
			err = json.Unmarshal([]byte(body), &fromPod)
		}
		return err
	})
	for i, tg := range targets {
		if tg.live && !fromPod[i].Connected {
			t.Errorf("the control: an app's pod does not reach %s (%s) either (%s), so the step's refusal proves nothing", tg.what, tg.addr, fromPod[i].Err)
		}
	}
}
