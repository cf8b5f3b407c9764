package capd

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"bex.co/bex/infra/testapps"
	"bex.co/bex/internal/testenv"
)

// TestAVolumeFollowsItsAppToAnotherMachine: an app's volume on the cluster of
// containers is a file system of its own (its size is the claim's), mounted on
// the host under DIR/volumes, which every machine mounts: the app's pod, moved
// to another machine, finds the file it wrote.
//
// It runs beside TestPostgresOnTheMachines, once the machines' tests are done.
func TestAVolumeFollowsItsAppToAnotherMachine(t *testing.T) {
	t.Parallel()
	app := fmt.Sprintf("capd-vol-%d", time.Now().Unix()%100000)
	pushSample(t, "hello-shell", app)
	t.Cleanup(func() { _, _ = bexTry("apps:destroy", app, "--confirm", app) })
	served(t, app, "/", "hello from bex")
	out := bex(t, "volumes:create", app, "data", "--path", "/www/data", "--size", "256Mi")
	if !strings.Contains(out, "Created the volume data (256Mi) of "+app+", mounted at /www/data.") {
		t.Errorf("volumes:create printed %q", out)
	}
	claim := kubectl(t, "get", "pvc", "-A", "--field-selector", "metadata.name="+app+"-vol-data",
		"-o", "jsonpath={.items[0].status.phase} {.items[0].spec.storageClassName} {.items[0].spec.volumeName}")
	if !strings.HasPrefix(claim, "Bound bex-local bex-local-app-") {
		t.Fatalf("the app's claim: %q, want Bound to one of the apps' volumes", claim)
	}
	// A file system of its own: df in the app's pod shows the claim's size
	// (256 MiB, less ext4's own), not the host's disk.
	// ssh sends one command line: the script is one quoted word of it.
	df := bex(t, "run", app, "--", "sh", "-c", `'echo kept > /www/data/f && df -k /www/data | tail -n 1'`)
	f := strings.Fields(df)
	if len(f) < 2 || !strings.Contains(df, "/www/data") {
		t.Fatalf("run wrote into the volume: %q", df)
	}
	var kb int
	if _, err := fmt.Sscan(f[len(f)-5], &kb); err != nil || kb < 200_000 || kb > 262_144 {
		t.Errorf("the volume's file system has %q 1K-blocks, want about 256 MiB: %q", f[len(f)-5], df)
	}
	served(t, app, "/data/f", "kept")

	// The web pod to another machine: its machine cordoned, the pod deleted.
	pods := readyPodNodes(t, app)
	if len(pods) != 1 {
		t.Fatalf("the app's ready pods: %v", pods)
	}
	var pod, node string
	for p, n := range pods {
		pod, node = p, n
	}
	kubectl(t, "cordon", node)
	uncordon := sync.OnceFunc(func() { kubectl(t, "uncordon", node) })
	t.Cleanup(uncordon)
	kubectl(t, "delete", "pod", "-A", "-l", "app.bex.co/app="+app, "--wait=false")
	// The old pod gone (it could answer while it stops) and a new one ready on
	// another machine.
	testenv.Eventually(t, 3*time.Minute, "the app's pod ready on another machine alone", func() error {
		p := readyPodNodes(t, app)
		if _, old := p[pod]; !old && len(p) == 1 {
			for _, n := range p {
				if n != node {
					return nil
				}
			}
		}
		return fmt.Errorf("ready pods and their nodes: %v", p)
	})
	uncordon()
	served(t, app, "/data/f", "kept")
	t.Logf("the volume's file is served from %v, after the pod left %s", readyPodNodes(t, app), node)
}

// TestPostgresOnTheMachines: a Postgres made with postgres:create runs as a
// CloudNativePG Cluster on a worker, on one of the apps' volumes; an app linked
// to it writes and reads through DATABASE_URL. (One instance: its failover is
// infra/cluster's, on the one-node cluster; what this cluster adds is the
// machines' volumes and images.)
func TestPostgresOnTheMachines(t *testing.T) {
	t.Parallel()
	operand := env["CNPG_POSTGRES_IMAGE"]
	if operand == "" {
		t.Fatal("cluster.env has no CNPG_POSTGRES_IMAGE= (hack/cluster-capd.sh up writes it)")
	}
	kubectl(t, "-n", "cnpg-system", "rollout", "status", "deployment/cnpg-controller-manager", "--timeout=5m")
	suffix := time.Now().Unix() % 100000
	db, app := fmt.Sprintf("capd-shop-%d", suffix), fmt.Sprintf("capd-notes-%d", suffix)
	t.Cleanup(func() {
		_, _ = bexTry("apps:destroy", app, "--confirm", app)
		_, _ = bexTry("postgres:destroy", db, "--confirm", db)
	})
	start := time.Now()
	bex(t, "postgres:create", db, "--size", "256Mi", "--instances", "1")
	testenv.Eventually(t, 8*time.Minute, db+" runs", func() error {
		var in struct{ Status, Message string }
		if err := json.Unmarshal([]byte(bex(t, "postgres:info", db, "--json")), &in); err != nil {
			return err
		}
		if in.Status != "Running" {
			return fmt.Errorf("%s: %s", in.Status, in.Message)
		}
		return nil
	})
	t.Logf("measured: postgres:create to Running in %.0f s", time.Since(start).Seconds())

	dir := t.TempDir()
	for name, content := range map[string]string{
		"Dockerfile": testapps.NotesDockerfile(operand),
		"notes.sh":   testapps.NotesScript,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pushDir(t, dir, app)
	bex(t, "postgres:link", db, app)
	served(t, app, "/cgi-bin/notes?write=apple", "wrote apple")
	served(t, app, "/cgi-bin/notes", "notes: apple")

	out := kubectl(t, "get", "pods", "-A", "-l", "cnpg.io/cluster="+db, "-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{"\n"}{end}`)
	t.Logf("the Cluster's instances and their machines:\n%s", out)
	claims := kubectl(t, "get", "pvc", "-A", "-l", "cnpg.io/cluster="+db, "-o", `jsonpath={range .items[*]}{.spec.storageClassName} {.spec.volumeName} {.status.phase}{"\n"}{end}`)
	for _, l := range strings.Split(strings.TrimSpace(claims), "\n") {
		if !strings.HasPrefix(l, "bex-local bex-local-app-") || !strings.HasSuffix(l, " Bound") {
			t.Errorf("an instance's claim is %q, want Bound to one of the apps' volumes", l)
		}
	}
}

// served waits until https://APP.BASE_DOMAIN/path answers with body containing want.
func served(t testing.TB, app, path, want string) {
	t.Helper()
	testenv.Eventually(t, 3*time.Minute, app+path+" answers "+want, func() error {
		body, err := curl(app, path)
		if err == nil && !strings.Contains(body, want) {
			err = fmt.Errorf("body %q", body)
		}
		return err
	})
}
