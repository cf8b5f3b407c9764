package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"bex.co/bex/infra/testapps"
	"bex.co/bex/internal/testenv"
)

// TestManagedPostgres: a Postgres made with postgres:create runs as a
// CloudNativePG Cluster of 2 instances; an app linked to it writes and reads
// through DATABASE_URL; a backup, a change and a restore give the backed up
// data, from a dump and from a backup kept on the server; deleting the
// primary's pod keeps the app's writes working after the switch; destroy is
// refused while linked, then takes the Cluster along.
func TestManagedPostgres(t *testing.T) {
	operand := env["CNPG_POSTGRES_IMAGE"]
	if operand == "" {
		t.Fatal("cluster.env has no CNPG_POSTGRES_IMAGE= (hack/cluster-local.sh up writes it)")
	}
	kubectl(t, "-n", "cnpg-system", "rollout", "status", "deployment/cnpg-controller-manager", "--timeout=5m")
	const db, app = "shop", "notes"
	// What an earlier run on the same cluster left (BEX_TEST_CLUSTER_ENV).
	_, _, _ = bex("apps:destroy", app, "--confirm", app)
	_, _, _ = bex("postgres:destroy", db, "--confirm", db)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := kubectlRun("", "-n", "default", "get", "databases.app.bex.co,cluster.postgresql.cnpg.io,pods,pvc", "-o", "wide")
			t.Logf("objects:\n%s", out)
			out, _ = kubectlRun("", "-n", "default", "get", "databases.app.bex.co", db, "-o", "yaml")
			t.Logf("%s", out)
		}
		_, _, _ = bex("apps:destroy", app, "--confirm", app)
		_, _, _ = bex("postgres:destroy", db, "--confirm", db)
	})
	testenv.Eventually(t, 3*time.Minute, "no Cluster of an earlier run", func() error {
		if out, _ := kubectlRun("", "-n", "default", "get", "cluster.postgresql.cnpg.io", db, "--ignore-not-found", "-o", "name"); strings.TrimSpace(out) != "" {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	})

	start := time.Now()
	bexOK(t, "postgres:create", db, "--size", volumeSize, "--instances", "2")
	testenv.Eventually(t, 8*time.Minute, db+" runs", func() error {
		var in struct {
			Status, Message, Host string
		}
		if err := json.Unmarshal([]byte(bexOK(t, "postgres:info", db, "--json")), &in); err != nil {
			return err
		}
		if in.Status != "Running" {
			return fmt.Errorf("%s: %s", in.Status, in.Message)
		}
		return nil
	})
	t.Logf("postgres:create to Running: %.1f s", time.Since(start).Seconds())

	r := newRepo(t, "hello-shell", app)
	r.commit(t, "notes on Postgres", map[string]string{"Dockerfile": testapps.NotesDockerfile(operand), "notes.sh": testapps.NotesScript})
	// The first push makes the app; the link is one release more.
	mustPush(t, r)
	bexOK(t, "postgres:link", db, app)
	waitBody(t, app, "/cgi-bin/notes?write=apple", "wrote apple", 3*time.Minute)
	waitBody(t, app, "/cgi-bin/notes", "notes: apple", time.Minute)

	// A dump, a change, a restore: the dump's data.
	dump, stderr, err := bexIO(nil, "postgres:backup", db)
	if err != nil || !bytes.HasPrefix(dump, []byte("PGDMP")) {
		t.Fatalf("postgres:backup: %v: %s: %q", err, stderr, dump[:min(len(dump), 40)])
	}
	waitBody(t, app, "/cgi-bin/notes?write=banana", "wrote banana", time.Minute)
	if _, stderr, err := bexIO([]byte("PGDMP but not really\n"), "postgres:restore", db); err == nil {
		t.Fatalf("a garbage restore succeeded: %s", stderr)
	}
	waitBody(t, app, "/cgi-bin/notes", "notes: apple,banana", time.Minute)
	if out, stderr, err := bexIO(dump, "postgres:restore", db); err != nil {
		t.Fatalf("postgres:restore: %v\n%s%s", err, out, stderr)
	}
	waitBody(t, app, "/cgi-bin/notes", "notes: apple\n", time.Minute)

	// A backup kept on the server.
	var bk struct{ ID string }
	if err := json.Unmarshal([]byte(bexOK(t, "postgres:backups:capture", db, "--json")), &bk); err != nil || bk.ID == "" {
		t.Fatalf("postgres:backups:capture: %v %+v", err, bk)
	}
	waitBody(t, app, "/cgi-bin/notes?write=cherry", "wrote cherry", time.Minute)
	bexOK(t, "postgres:restore", db, "--backup", bk.ID)
	waitBody(t, app, "/cgi-bin/notes", "notes: apple\n", time.Minute)

	// The primary's pod dies once the replica is ready: the replica takes
	// over, and the app writes again through the same URL.
	field := func(path string) string {
		out, _ := kubectlRun("", "-n", "default", "get", "cluster.postgresql.cnpg.io", db, "-o", "jsonpath={"+path+"}")
		return strings.TrimSpace(out)
	}
	testenv.Eventually(t, 5*time.Minute, "both instances ready", func() error {
		if n := field(".status.readyInstances"); n != "2" {
			return fmt.Errorf("readyInstances %q", n)
		}
		return nil
	})
	primary := field(".status.currentPrimary")
	if primary == "" {
		t.Fatal("the Cluster names no primary")
	}
	lost := time.Now()
	kubectl(t, "-n", "default", "delete", "pod", primary, "--wait=false")
	testenv.Eventually(t, 5*time.Minute, "the replica becomes the primary", func() error {
		if p := field(".status.currentPrimary"); p == primary || p == "" {
			return fmt.Errorf("currentPrimary %q", p)
		}
		return nil
	})
	waitBody(t, app, "/cgi-bin/notes?write=damson", "wrote damson", 3*time.Minute)
	t.Logf("the app writes again %.1f s after the primary's pod was deleted (new primary %s)", time.Since(lost).Seconds(), field(".status.currentPrimary"))
	waitBody(t, app, "/cgi-bin/notes", "notes: apple,damson", time.Minute)

	// Destroy: refused while linked, then everything goes.
	if _, stderr, err := bex("postgres:destroy", db, "--confirm", db); err == nil || !strings.Contains(stderr, app) {
		t.Fatalf("destroy of a linked database: %v: %s", err, stderr)
	}
	bexOK(t, "postgres:unlink", db, app)
	bexOK(t, "postgres:destroy", db, "--confirm", db)
	testenv.Eventually(t, 3*time.Minute, "the Database and its Cluster are gone", func() error {
		out, _ := kubectlRun("", "-n", "default", "get", "databases.app.bex.co,cluster.postgresql.cnpg.io", "--ignore-not-found", "-o", "name")
		if strings.Contains(out, "/"+db) {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	})
}

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
