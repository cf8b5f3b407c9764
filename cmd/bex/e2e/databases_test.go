package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"

	"bex.co/bex/cmd/bex/up"
	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/machine/daemons"
	"bex.co/bex/internal/testenv"
)

// TestManagedDatabases is a user who keeps an app's data in a managed Postgres
// and Redis on one machine without a registry (bex up --local-bases: the
// servers run the Debian stand-ins). The app (hack/samples/hello-db) writes
// and reads through the real drivers (npm's pg and redis) with the variables
// the links give it. Its data outlives a redeploy, a rollback, a kill -9 of the
// database's server, a restart of bex up and a kill -9 of bex up; a backup
// brings back what it held, a garbage restore changes nothing; an app that is
// not linked cannot open a connection to the database; unlink takes the
// variable and the reach away; destroy is refused while linked, then removes
// the data.
func TestManagedDatabases(t *testing.T) {
	// The bex up the local bases' tests share: its restarts below start it
	// again with the flags it was started with (startLocalBases'), so the tests
	// after this one find it up, as they would have.
	p, cfg := startLocalBases(t)
	upArgs := localBasesArgs(cfg)
	t.Cleanup(func() {
		if t.Failed() {
			out := p.out.String()
			t.Logf("bex up's last output:\n%s", out[max(0, len(out)-20000):])
			for _, l := range []string{"gitserver.log", "deployer.log"} {
				b, _ := os.ReadFile(filepath.Join(p.dir, "logs", l))
				t.Logf("the end of %s:\n%s", l, b[max(0, len(b)-8000):])
			}
		}
	})

	began := time.Now()
	mustSSH(t, p, nil, "postgres:create", "shop", "--size", "256Mi")
	mustSSH(t, p, nil, "redis:create", "cache", "--size", "64Mi")
	for _, db := range []string{"shop", "cache"} {
		testenv.Eventually(t, 5*time.Minute, db+" runs", func() error {
			if phase := p.kubectl(t, "get", "databases.app.bex.co", db, "-o", "jsonpath={.status.phase}"); phase != "Running" {
				return fmt.Errorf("%s is %q: %s", db, phase, p.kubectl(t, "get", "databases.app.bex.co", db, "-o", "jsonpath={.status.conditions}"))
			}
			return nil
		})
	}
	t.Logf("both databases accept connections %s after postgres:create (the stand-ins imported in the meantime)", time.Since(began).Round(time.Millisecond))
	host := p.kubectl(t, "get", "databases.app.bex.co", "shop", "-o", "jsonpath={.status.host}")
	port := p.kubectl(t, "get", "databases.app.bex.co", "shop", "-o", "jsonpath={.status.port}")
	info := mustSSH(t, p, nil, "postgres:info", "shop")
	t.Logf("postgres:info:\n%s", info)
	secret := p.kubectl(t, "get", "secret", "bex-db-shop", "-o", "jsonpath={.data.password}")
	if !strings.Contains(info, port) {
		t.Errorf("postgres:info does not say the port %s", port)
	}
	if secret == "" || strings.Contains(info, decode(t, secret)) {
		t.Fatalf("postgres:info shows the password, or the Secret has none:\n%s", info)
	}

	app := p.newRepo(t, "hello-db", "notes")
	if out, err := app.push(); err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	mustSSH(t, p, nil, "postgres:link", "shop", "notes")
	mustSSH(t, p, nil, "redis:link", "cache", "notes")
	testenv.Eventually(t, 2*time.Minute, "notes has both variables", p.answers("notes", "/env", "DATABASE_URL=set REDIS_URL=set"))
	config := mustSSH(t, p, nil, "config", "notes")
	if strings.Contains(config, decode(t, secret)) {
		t.Errorf("the password was copied into the app's config:\n%s", config)
	}
	testenv.Eventually(t, time.Minute, "notes writes to Postgres", p.answers("notes", "/pg/write?v=apple", "wrote apple"))
	testenv.Eventually(t, time.Minute, "notes writes to Redis", p.answers("notes", "/redis/set?v=kept", "set kept"))
	data := func(t *testing.T, want string) {
		t.Helper()
		testenv.Eventually(t, 2*time.Minute, "notes reads "+want, p.answers("notes", "/pg/read", "notes: "+want+"\n"))
		testenv.Eventually(t, time.Minute, "notes reads its Redis key", p.answers("notes", "/redis/get", "note: kept"))
	}
	data(t, "apple")

	t.Run("an app that is not linked cannot connect", func(t *testing.T) {
		other := p.newRepo(t, "hello-db", "stranger")
		if out, err := other.push(); err != nil {
			t.Fatalf("push: %v\n%s", err, out)
		}
		testenv.Eventually(t, time.Minute, "stranger answers", p.answers("stranger", "/", "hello-db"))
		// The linked app reaches the address; the other gets nothing.
		if err := p.answers("notes", "/reach?host="+host+"&port="+port, "connected")(); err != nil {
			t.Fatal(err)
		}
		if err := p.answers("stranger", "/reach?host="+host+"&port="+port, "unreachable")(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("psql, backup and restore", func(t *testing.T) {
		out := mustSSH(t, p, strings.NewReader("SELECT 'from psql: ' || string_agg(v, ',') FROM notes;\n"), "postgres:psql", "shop")
		if !strings.Contains(out, "from psql: apple") {
			t.Fatalf("psql printed:\n%s", out)
		}
		dump := mustSSH(t, p, nil, "postgres:backup", "shop")
		if !strings.HasPrefix(dump, "PGDMP") {
			t.Fatalf("postgres:backup does not write pg_dump's custom format: %q", dump[:min(len(dump), 40)])
		}
		if err := p.answers("notes", "/pg/write?v=banana", "wrote banana")(); err != nil {
			t.Fatal(err)
		}
		data(t, "apple,banana")
		// Garbage is refused, and the data stays as it was.
		if _, stderr, err := sshIn(t, p, strings.NewReader("PGDMP but not really\n"), "postgres:restore", "shop"); err == nil {
			t.Fatalf("a garbage restore succeeded: %s", stderr)
		} else if n := strings.Count(strings.TrimSpace(stderr), "\n"); n > 5 {
			t.Errorf("a garbage restore says %d lines:\n%s", n+1, stderr)
		}
		data(t, "apple,banana")
		mustSSH(t, p, strings.NewReader(dump), "postgres:restore", "shop")
		data(t, "apple")
	})

	var backupID string
	t.Run("backups kept on the server", func(t *testing.T) {
		var bk struct {
			ID    string `json:"id"`
			Kind  string `json:"kind"`
			Bytes int64  `json:"bytes"`
		}
		if err := json.Unmarshal([]byte(mustSSH(t, p, nil, "postgres:backups:capture", "shop", "--json")), &bk); err != nil {
			t.Fatal(err)
		}
		if bk.ID == "" || bk.Kind != "captured" || bk.Bytes == 0 {
			t.Fatalf("postgres:backups:capture: %+v", bk)
		}
		backupID = bk.ID
		if err := p.answers("notes", "/pg/write?v=cherry", "wrote cherry")(); err != nil {
			t.Fatal(err)
		}
		data(t, "apple,cherry")
		if _, stderr, err := p.ssh(t, "postgres:restore", "shop", "--backup", "../../etc/passwd"); err == nil || !strings.Contains(stderr, "postgres:backups shop lists them") {
			t.Fatalf("restore of a backup that is not one: %v: %s", err, stderr)
		}
		data(t, "apple,cherry")
		mustSSH(t, p, nil, "postgres:restore", "shop", "--backup", backupID)
		data(t, "apple")
		list := mustSSH(t, p, nil, "postgres:backups", "shop")
		if !strings.Contains(list, backupID) || !strings.Contains(list, "@daily") {
			t.Fatalf("postgres:backups:\n%s", list)
		}
	})

	t.Run("the data outlives redeploys, rollbacks and kills", func(t *testing.T) {
		app.commit(t, "a change", map[string]string{"CHANGES": "one\n"})
		if out, err := app.push(); err != nil {
			t.Fatalf("push: %v\n%s", err, out)
		}
		data(t, "apple")
		mustSSH(t, p, nil, "rollback", "notes")
		data(t, "apple")

		// kill -9 of the server: the runtime starts it again on the same data.
		pid, err := postmaster(p, "shop")
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, time.Minute, "a new postmaster", func() error {
			n, err := postmaster(p, "shop")
			if err == nil && n == pid {
				return fmt.Errorf("still %d", n)
			}
			return err
		})
		data(t, "apple")

		// A restart of bex up: the server's instance gets a new address, the
		// app's URL stays the same.
		p.stop(t)
		p.start(t, upArgs...)
		data(t, "apple")

		// kill -9 of bex up.
		if err := p.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-p.exited
		p.start(t, upArgs...)
		data(t, "apple")
	})

	t.Run("unlink takes the variable and the reach", func(t *testing.T) {
		if _, stderr, err := p.ssh(t, "postgres:destroy", "shop", "--confirm", "shop"); err == nil || !strings.Contains(stderr, "notes") {
			t.Fatalf("destroy of a linked database: %v: %s", err, stderr)
		}
		// The backup outlived the restarts and kills too.
		if list := mustSSH(t, p, nil, "postgres:backups", "shop"); backupID == "" || !strings.Contains(list, backupID) {
			t.Errorf("backup %q is not listed after the restarts:\n%s", backupID, list)
		}
		backups := filepath.Join(p.dir, "database-backups", p.kubectl(t, "get", "databases.app.bex.co", "shop", "-o", "jsonpath={.metadata.uid}"))
		if _, err := os.Stat(backups); err != nil {
			t.Fatalf("the backups of shop: %v", err)
		}
		mustSSH(t, p, nil, "postgres:unlink", "shop", "notes")
		testenv.Eventually(t, 2*time.Minute, "notes lost DATABASE_URL", p.answers("notes", "/env", "DATABASE_URL=unset REDIS_URL=set"))
		if err := p.answers("notes", "/reach?host="+host+"&port="+port, "unreachable")(); err != nil {
			t.Fatal(err)
		}
		volumes, _ := filepath.Glob(filepath.Join(p.dir, "runtime", "volumes", "*", "shop.db", "*"))
		if len(volumes) == 0 {
			t.Fatalf("no volume of shop under %s", p.dir)
		}
		mustSSH(t, p, nil, "postgres:destroy", "shop", "--confirm", "shop")
		testenv.Eventually(t, 2*time.Minute, "shop and its data are gone", func() error {
			if out := p.kubectl(t, "get", "databases.app.bex.co", "--ignore-not-found", "shop", "-o", "name"); out != "" {
				return fmt.Errorf("still there: %s", out)
			}
			if _, err := os.Stat(backups); err == nil {
				return fmt.Errorf("its backups are still in %s", backups)
			}
			for _, v := range volumes {
				if _, err := os.Stat(v); err == nil {
					return fmt.Errorf("%s is still there", v)
				}
			}
			return nil
		})
		mustSSH(t, p, nil, "redis:unlink", "cache", "notes")
		mustSSH(t, p, nil, "redis:destroy", "cache", "--confirm", "cache")
	})
}

// mustSSH runs a bex command over ssh with stdin and fails the test unless it
// succeeds; it returns stdout.
func mustSSH(t *testing.T, p *platform, stdin *strings.Reader, args ...string) string {
	t.Helper()
	out, stderr, err := sshIn(t, p, stdin, args...)
	if err != nil {
		t.Fatalf("ssh %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr)
	}
	return out
}

// sshIn is platform.ssh with stdin.
func sshIn(t *testing.T, p *platform, stdin *strings.Reader, args ...string) (string, string, error) {
	t.Helper()
	fields := strings.Fields(p.sshCommand())
	cmd := exec.Command(fields[0], append(append(fields[1:], "-p", p.port(p.sshAddr), "git@127.0.0.1"), args...)...)
	if stdin != nil {
		cmd.Stdin = stdin
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// postmaster is the host PID of the Postgres server of database db: the
// task of its one running container (labelled with the runtime's name for it,
// <db>.db), whose first process the entrypoint replaced with postgres. A
// SIGKILL to it is a kill -9 of the database's container.
func postmaster(p *platform, db string) (int, error) {
	cl, err := daemons.ContainerdClient(filepath.Join(p.dir, "containerd", "containerd.sock"), up.ContainerdNamespace)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctrs, err := cl.Containers(ctx, fmt.Sprintf(`labels.%q==%q`, appv1.LabelApp, appv1.RuntimeName(db)))
	if err != nil {
		return 0, err
	}
	var pids []int
	for _, c := range ctrs {
		task, err := c.Task(ctx, nil)
		if err != nil {
			continue
		}
		if st, err := task.Status(ctx); err == nil && st.Status == containerd.Running {
			pids = append(pids, int(task.Pid()))
		}
	}
	if len(pids) != 1 {
		return 0, fmt.Errorf("want one running server of %s, found %v in %d containers", db, pids, len(ctrs))
	}
	return pids[0], nil
}

func decode(t *testing.T, b64 string) string {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
