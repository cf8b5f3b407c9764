package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// leaseHolder is the holder of the deployers' leader election Lease: the pod's
// name (its hostname), "_", and a random suffix (controller-runtime's identity).
func leaseHolder(t *testing.T) string {
	t.Helper()
	return strings.TrimSpace(kubectl(t, "-n", "bex-system", "get", "lease", "bex-deployer.app.bex.co", "-o", "jsonpath={.spec.holderIdentity}"))
}

// TestLeaderFailover: two deployer replicas; the leader's pod is killed (no
// grace: it cannot release the Lease), another replica takes the Lease over once
// it expires, and a push deploys and serves. Not parallel: the other tests' pushes
// would wait on the election meanwhile.
func TestLeaderFailover(t *testing.T) {
	pods := strings.Fields(kubectl(t, "-n", "bex-system", "get", "pods", "-l", "app.kubernetes.io/name=bex-deployer",
		"--field-selector=status.phase=Running", "-o", "jsonpath={.items[*].metadata.name}"))
	if len(pods) != 2 {
		t.Fatalf("want two deployer pods running, have %v", pods)
	}
	var leader string
	testenv.Eventually(t, 30*time.Second, "a deployer holds the Lease", func() error {
		h := leaseHolder(t)
		for _, p := range pods {
			if strings.HasPrefix(h, p+"_") {
				leader = p
				return nil
			}
		}
		return fmt.Errorf("holder %q is none of %v", h, pods)
	})
	other := pods[0]
	if other == leader {
		other = pods[1]
	}
	t.Logf("leader %s, standby %s", leader, other)
	start := time.Now()
	kubectl(t, "-n", "bex-system", "delete", "pod", leader, "--grace-period=0", "--force", "--wait=false")
	// Once the Lease expires every live replica races for it: the standby, or
	// the pod the Deployment made in place of the killed one when it is up by
	// then. Either is a failover; the killed pod holding it is not.
	var holder string
	testenv.Eventually(t, 60*time.Second, "another deployer takes the Lease over", func() error {
		holder = leaseHolder(t)
		if holder == "" || strings.HasPrefix(holder, leader+"_") {
			return fmt.Errorf("holder %q", holder)
		}
		return nil
	})
	pod, _, _ := strings.Cut(holder, "_")
	kubectl(t, "-n", "bex-system", "get", "pod", pod) // a live pod, not a stale name
	who := "the standby"
	if pod != other {
		who = "the killed leader's replacement"
	}
	t.Logf("%s (%s) leads %.1f s after the leader's pod was killed", who, pod, time.Since(start).Seconds())

	const app = "failover"
	r := newHostRepo(t, app)
	mustPush(t, r)
	waitBody(t, app, "/", "hello from bex", 30*time.Second)

	// The Deployment makes a replacement, which stands by: two replicas again
	// for the tests that follow.
	testenv.Eventually(t, 90*time.Second, "two deployers available again", func() error {
		if n := kubectl(t, "-n", "bex-system", "get", "deployment", "bex-deployer", "-o", "jsonpath={.status.availableReplicas}"); n != "2" {
			return fmt.Errorf("available %q", n)
		}
		return nil
	})
	if h := leaseHolder(t); h != holder {
		t.Errorf("the Lease moved again, from %q to %q", holder, h)
	}
}
