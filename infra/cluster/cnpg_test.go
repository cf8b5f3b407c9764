package cluster

import (
	"encoding/base64"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// cnpgCluster is a CloudNativePG Cluster in the apps' namespace (the one the
// operator watches), of the operand image that hack/cluster-local.sh pushes
// to bex's registry, on the node's local volumes (at most 256Mi each).
const cnpgCluster = `apiVersion: postgresql.cnpg.io/v1
kind: Cluster
metadata:
  name: %s
  namespace: default
spec:
  instances: %d
  imageName: %s
  storage:
    storageClass: bex-local
    size: ` + volumeSize + `
`

// kubectlRun runs the real kubectl on the cluster with stdin: its output, and
// an error with the output when it fails.
func kubectlRun(stdin string, args ...string) (string, error) {
	bin, err := testenv.Binary("kubectl")
	if err != nil {
		return "", err
	}
	cmd := exec.Command(bin, append([]string{"--kubeconfig", env["KUBECONFIG"]}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// psql runs SQL with psql in the instance's pod, over its local socket as
// the postgres user (CNPG's pg_hba: peer).
func psql(pod, sql string) (string, error) {
	return kubectlRun("", "-n", "default", "exec", pod, "-c", "postgres", "--",
		"psql", "-U", "postgres", "-d", "app", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql)
}

// TestCloudNativePG: CloudNativePG's operator (infra/cnpg, its image built from
// the module) runs a Cluster of the Debian-made operand image: one instance
// becomes ready and answers psql; with two, deleting the primary's pod makes
// the replica the primary, writes through the Cluster's -rw Service work again,
// and the old primary comes back as a replica of the new one.
func TestCloudNativePG(t *testing.T) {
	image := env["CNPG_POSTGRES_IMAGE"]
	if image == "" {
		t.Fatal("cluster.env has no CNPG_POSTGRES_IMAGE= (hack/cluster-local.sh up writes it)")
	}
	kubectl(t, "-n", "cnpg-system", "rollout", "status", "deployment/cnpg-controller-manager", "--timeout=5m")
	const name = "cnpg-probe"
	// One left by an earlier run (BEX_TEST_CLUSTER_ENV) goes first; its claims
	// go with it (the Cluster owns them).
	kubectl(t, "-n", "default", "delete", "cluster.postgresql.cnpg.io", name, "--ignore-not-found", "--wait=true", "--timeout=3m")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := kubectlRun("", "-n", "default", "get", "cluster.postgresql.cnpg.io,pods,pvc", "-l", "cnpg.io/cluster="+name, "-o", "wide")
			t.Logf("the Cluster's objects:\n%s", out)
			out, _ = kubectlRun("", "-n", "default", "describe", "cluster.postgresql.cnpg.io", name)
			t.Logf("%s", out)
			out, _ = kubectlRun("", "-n", "cnpg-system", "logs", "deployment/cnpg-controller-manager", "--tail=40")
			t.Logf("the operator's log:\n%s", out)
		}
		_, _ = kubectlRun("", "-n", "default", "delete", "cluster.postgresql.cnpg.io", name, "--ignore-not-found", "--wait=true", "--timeout=3m")
	})
	field := func(path string) string {
		out, _ := kubectlRun("", "-n", "default", "get", "cluster.postgresql.cnpg.io", name, "-o", "jsonpath={"+path+"}")
		return strings.TrimSpace(out)
	}
	waitReady := func(n int, timeout time.Duration) {
		t.Helper()
		kubectl(t, "-n", "default", "wait", "cluster.postgresql.cnpg.io/"+name,
			fmt.Sprintf("--for=jsonpath={.status.readyInstances}=%d", n), fmt.Sprintf("--timeout=%s", timeout))
	}

	// One instance.
	start := time.Now()
	if _, err := kubectlRun(fmt.Sprintf(cnpgCluster, name, 1, image), "apply", "--server-side", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	waitReady(1, 10*time.Minute)
	t.Logf("measure: a 1-instance Cluster ready %.1f s after its apply (with the pull of the operand image on a node that lacks it)", time.Since(start).Seconds())
	primary := field(".status.currentPrimary")
	if primary != name+"-1" {
		t.Fatalf("status.currentPrimary %q, want %s-1", primary, name)
	}
	out, err := psql(primary, "SELECT 1")
	if err != nil || strings.TrimSpace(out) != "1" {
		t.Fatalf("psql SELECT 1 in %s: %q, %v", primary, out, err)
	}
	if out, err := psql(primary, "SHOW server_version"); err != nil || !strings.HasPrefix(strings.TrimSpace(out), "15.") {
		t.Errorf("server_version %q (%v), want Debian's 15", out, err)
	}
	if out, err := kubectlRun("", "-n", "default", "exec", primary, "-c", "postgres", "--", "id", "-un"); err != nil || strings.TrimSpace(out) != "postgres" {
		t.Errorf("the instance runs as %q (%v), want postgres (uid 26)", out, err)
	}
	if _, err := psql(primary, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (1)"); err != nil {
		t.Fatal(err)
	}

	// Two: a replica made from the primary (pg_basebackup), streaming.
	start = time.Now()
	kubectl(t, "-n", "default", "patch", "cluster.postgresql.cnpg.io", name, "--type=merge", "-p", `{"spec":{"instances":2}}`)
	waitReady(2, 10*time.Minute)
	t.Logf("measure: the second instance ready %.1f s after instances: 2", time.Since(start).Seconds())
	replica := name + "-2"
	testenv.Eventually(t, time.Minute, "the replica has the primary's row", func() error {
		out, err := psql(replica, "SELECT count(*) FROM kept")
		if err != nil || strings.TrimSpace(out) != "1" {
			return fmt.Errorf("%q, %v", out, err)
		}
		return nil
	})

	// What an app uses: the -rw Service, as the app user of the Secret
	// <name>-app (its uri), from inside the cluster.
	uri, err := kubectlRun("", "-n", "default", "get", "secret", name+"-app", "-o", "jsonpath={.data.uri}")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(uri))
	if err != nil || !strings.Contains(string(raw), name+"-rw") {
		t.Fatalf("the Secret %s-app's uri %q (%v), want one of the -rw Service", name, raw, err)
	}
	write := func(from string, v int) error {
		_, err := kubectlRun("", "-n", "default", "exec", from, "-c", "postgres", "--",
			"psql", string(raw), "-X", "-v", "ON_ERROR_STOP=1", "-c", fmt.Sprintf("INSERT INTO kept VALUES (%d)", v))
		return err
	}
	if _, err := psql(primary, "GRANT INSERT, SELECT ON kept TO app"); err != nil {
		t.Fatal(err)
	}
	if err := write(replica, 2); err != nil {
		t.Fatalf("a write through %s-rw before the failover: %v", name, err)
	}

	// The primary's pod dies.
	start = time.Now()
	kubectl(t, "-n", "default", "delete", "pod", primary, "--wait=false")
	var promoted time.Duration
	testenv.Eventually(t, 5*time.Minute, "status.currentPrimary moves to the replica", func() error {
		if p := field(".status.currentPrimary"); p != replica {
			return fmt.Errorf("currentPrimary %q", p)
		}
		promoted = time.Since(start)
		return nil
	})
	testenv.Eventually(t, 5*time.Minute, "a write through "+name+"-rw after the failover", func() error {
		return write(replica, 3)
	})
	t.Logf("measure: failover: currentPrimary %s after %.1f s, writes through %s-rw work again after %.1f s",
		replica, promoted.Seconds(), name, time.Since(start).Seconds())
	if out, err := psql(replica, "SELECT string_agg(v::text, ',' ORDER BY v) FROM kept"); err != nil || strings.TrimSpace(out) != "1,2,3" {
		t.Fatalf("the new primary holds %q (%v), want 1,2,3", out, err)
	}

	// The old primary comes back as a replica of the new one.
	waitReady(2, 10*time.Minute)
	t.Logf("measure: both instances ready again %.1f s after the primary's pod was deleted", time.Since(start).Seconds())
	testenv.Eventually(t, 2*time.Minute, "the old primary replicates the new one's writes", func() error {
		out, err := psql(primary, "SELECT pg_is_in_recovery(), (SELECT count(*) FROM kept)")
		if err != nil || strings.TrimSpace(out) != "t|3" {
			return fmt.Errorf("%q, %v", out, err)
		}
		return nil
	})
}
