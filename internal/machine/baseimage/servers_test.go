package baseimage_test

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"bex.co/bex/internal/machine/baseimage"
	"bex.co/bex/internal/testenv"
)

// The user namespace the servers run in, as the local runtime runs an app's
// instances: container ids 0..65535 are these host ids (far above the
// runtime's own ranges, which start at 1<<30).
const (
	serverHostID  = 3 << 30
	serverIDRange = 65536
)

// TestServerStandIns builds (or finds in the cache) the stand-ins, and runs the
// Postgres and Redis ones as the deployer runs a managed database's server: the
// same command (flock on the volume, then docker-entrypoint.sh), as the mapped
// root of a user namespace with the runtime's capabilities, no new privileges
// and the default seccomp profile, on a data directory that is a volume's root
// (root's, with a lost+found). Each is used with its client from a second
// process in the container, stopped with SIGTERM, and started again on the same
// data, which must still be there.
func TestServerStandIns(t *testing.T) {
	c := testenv.SharedContainerd(t)
	cl, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()
	cfg := testenv.StandInsConfig()
	cfg.Progress = testWriter{t}
	imgs, err := baseimage.Import(ctx, cl, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range imgs {
		if img.Kind == "postgres" || img.Kind == "redis" {
			t.Logf("%-8s %s %s built=%v (%s, %d MiB unpacked)", img.Kind, img.Name, img.Digest, img.Built, layoutSize(t, img.Layout), unpackedSize(t, img.Layout)>>20)
		}
	}
	h := &serverHarness{c: c, cl: cl}

	t.Run("postgres", func(t *testing.T) {
		data := volumeRoot(t)
		const port = "25001"
		// A database name that needs quoting as an identifier.
		const user, password, db = "app", "s3cret 'pass\" word", `shop "db" 1`
		env := []string{"PORT=" + port, "POSTGRES_USER=" + user, "POSTGRES_PASSWORD=" + password,
			"POSTGRES_DB=" + db, "PGDATA=/var/lib/postgresql/data/pgdata"}
		// deployer/databases' command for a Postgres server.
		args := []string{"sh", "-c", `exec 9</var/lib/postgresql/data && flock 9 && exec docker-entrypoint.sh postgres -p "$PORT" -c listen_addresses='*'`}
		psql := func(s *runningServer, pw string, sql ...string) (string, uint32) {
			cmd := []string{"psql", "-X", "-v", "ON_ERROR_STOP=1", "-At", "-h", "127.0.0.1", "-p", port, "-U", user, "-d", db}
			for _, q := range sql {
				cmd = append(cmd, "-c", q)
			}
			return s.exec(ctx, t, []string{"PGPASSWORD=" + pw}, cmd...)
		}
		ready := func(s *runningServer) {
			s.waitFor(ctx, t, 2*time.Minute, "pg_isready", func() error {
				out, code := s.exec(ctx, t, nil, "pg_isready", "-h", "127.0.0.1", "-p", port)
				if code != 0 {
					return fmt.Errorf("pg_isready: exit %d: %s", code, out)
				}
				return nil
			})
		}

		began := time.Now()
		s := h.start(ctx, t, cfg.Names.Postgres, data, "/var/lib/postgresql/data", env, args...)
		ready(s)
		t.Logf("first start (initdb) ready in %s", time.Since(began).Round(time.Millisecond))
		if out, code := psql(s, password,
			"CREATE TABLE items (name text)", "INSERT INTO items VALUES ('kept across restarts')"); code != 0 {
			t.Fatalf("psql: exit %d: %s", code, out)
		}
		out, code := psql(s, password,
			"SELECT current_user, current_database(), current_setting('fsync'), current_setting('server_encoding'), current_setting('data_directory')")
		if want := user + "|" + db + "|on|UTF8|/var/lib/postgresql/data/pgdata"; code != 0 || out != want {
			t.Errorf("psql: exit %d, %q; want %q", code, out, want)
		}
		// JIT asked for on every query: the server has no JIT provider and must
		// run them without it.
		if out, code := psql(s, password, "SET jit_above_cost = 0", "SELECT sum(g) FROM generate_series(1, 1000) g"); code != 0 || !strings.HasSuffix(out, "500500") {
			t.Errorf("a query with JIT asked for: exit %d, %q", code, out)
		}
		// Clients from any address, with a password: the rule the entrypoint
		// adds to initdb's (which take loopback only).
		if out, code := psql(s, password, "SELECT count(*) FROM pg_hba_file_rules WHERE type = 'host' AND database = '{all}' AND user_name = '{all}' AND address = 'all' AND auth_method = 'scram-sha-256' AND error IS NULL"); code != 0 || out != "1" {
			t.Errorf("pg_hba.conf's rule for every address: exit %d, %q; want one", code, out)
		}
		// The password is required over TCP.
		if out, code := psql(s, "wrong", "SELECT 1"); code == 0 || !strings.Contains(out, "password authentication failed") {
			t.Errorf("psql with a wrong password: exit %d, %q; want refused", code, out)
		}
		if out, code := s.exec(ctx, t, []string{"PGPASSWORD=" + password}, "pg_dump", "-h", "127.0.0.1", "-p", port, "-U", user, "-d", db, "-t", "items"); code != 0 || !strings.Contains(out, "CREATE TABLE public.items") {
			t.Errorf("pg_dump: exit %d, %q", code, out)
		}
		// The server is the container's first process (the entrypoint exec'd
		// it, so SIGTERM reaches it), as postgres; its data is its own and
		// private; the password file initdb read is gone; lost+found is
		// untouched.
		out, code = s.exec(ctx, t, nil, "sh", "-c",
			`cat /proc/1/comm; awk '/^Uid:/ {print $2}' /proc/1/status; id -u postgres; stat -c '%a %U' "$PGDATA" /var/lib/postgresql/data/lost+found; ls -A /tmp | wc -l`)
		lines := strings.Split(out, "\n")
		if code != 0 || len(lines) != 6 || lines[0] != "postgres" || lines[1] != lines[2] || lines[1] == "0" ||
			lines[3] != "700 postgres" || lines[4] != "700 root" || lines[5] != "0" {
			t.Errorf("the server's process and files: exit %d:\n%s\nwant postgres, as postgres (not 0), PGDATA 700 postgres, lost+found 700 root, /tmp empty", code, out)
		}
		h.memory(ctx, t, s, "postgres idle")
		first := s.stop(ctx, t, syscall.SIGTERM)
		if !strings.Contains(first, "docker-entrypoint.sh: initialised /var/lib/postgresql/data/pgdata") {
			t.Errorf("the first start did not say it initialised the data:\n%s", first)
		}
		if strings.Contains(first, password) {
			t.Errorf("the server's output holds the password:\n%s", first)
		}

		// Again on the same data: no initdb, the row is there.
		s = h.start(ctx, t, cfg.Names.Postgres, data, "/var/lib/postgresql/data", env, args...)
		ready(s)
		if out, code := psql(s, password, "SELECT name FROM items"); code != 0 || out != "kept across restarts" {
			t.Errorf("after a restart: exit %d, %q; want the row", code, out)
		}
		second := s.stop(ctx, t, syscall.SIGTERM)
		if strings.Contains(second, "initialised") || strings.Contains(second, "The files belonging to this database system") {
			t.Errorf("the second start initialised the data again:\n%s", second)
		}
	})

	t.Run("redis", func(t *testing.T) {
		data := volumeRoot(t)
		const port, password = "25002", "r3dis-pass"
		env := []string{"PORT=" + port, "REDIS_PASSWORD=" + password}
		// deployer/databases' command for a Redis server.
		args := []string{"sh", "-c", `exec 9</data && flock 9 && exec docker-entrypoint.sh redis-server --port "$PORT" --requirepass "$REDIS_PASSWORD" --appendonly yes --appendfsync everysec --dir /data --protected-mode no`}
		cli := func(s *runningServer, auth bool, cmd ...string) string {
			full := []string{"redis-cli", "-h", "127.0.0.1", "-p", port}
			var env []string
			if auth {
				// REDISCLI_AUTH is -a without the password in the arguments.
				env = []string{"REDISCLI_AUTH=" + password}
			}
			out, _ := s.exec(ctx, t, env, append(full, cmd...)...)
			return out
		}
		ready := func(s *runningServer) {
			s.waitFor(ctx, t, time.Minute, "redis-cli PING", func() error {
				if out := cli(s, true, "PING"); out != "PONG" {
					return fmt.Errorf("PING: %q", out)
				}
				return nil
			})
		}

		began := time.Now()
		s := h.start(ctx, t, cfg.Names.Redis, data, "/data", env, args...)
		ready(s)
		t.Logf("ready in %s", time.Since(began).Round(time.Millisecond))
		if out := cli(s, false, "GET", "k"); !strings.Contains(out, "NOAUTH") {
			t.Errorf("GET without the password: %q, want NOAUTH", out)
		}
		if out := cli(s, true, "SET", "k", "kept across restarts"); out != "OK" {
			t.Errorf("SET: %q", out)
		}
		if out := cli(s, true, "GET", "k"); out != "kept across restarts" {
			t.Errorf("GET: %q", out)
		}
		out, code := s.exec(ctx, t, nil, "sh", "-c",
			`cat /proc/1/comm; awk '/^Uid:/ {print $2}' /proc/1/status; id -u redis; stat -c '%U' /data /data/appendonlydir; stat -c '%a %U' /data/lost+found`)
		lines := strings.Split(out, "\n")
		if code != 0 || len(lines) != 6 || lines[0] != "redis-server" || lines[1] != lines[2] || lines[1] == "0" ||
			lines[3] != "redis" || lines[4] != "redis" || lines[5] != "700 root" {
			t.Errorf("the server's process and files: exit %d:\n%s\nwant redis-server, as redis (not 0), /data and its AOF redis's, lost+found 700 root", code, out)
		}
		h.memory(ctx, t, s, "redis idle")
		s.stop(ctx, t, syscall.SIGTERM)

		s = h.start(ctx, t, cfg.Names.Redis, data, "/data", env, args...)
		ready(s)
		if out := cli(s, true, "GET", "k"); out != "kept across restarts" {
			t.Errorf("GET after a restart: %q, want the value", out)
		}
		s.stop(ctx, t, syscall.SIGTERM)
	})
}

// volumeRoot is a directory that stands for a fresh volume's root as the
// runtime mounts it: owned by the container's root, with lost+found, its
// parents passable by the container's ids (as the runtime's are).
func volumeRoot(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(dir, "volume")
	lf := filepath.Join(data, "lost+found")
	if err := os.MkdirAll(lf, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{data, lf} {
		if err := os.Chown(d, serverHostID, serverHostID); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(data, 0o755); err != nil {
		t.Fatal(err)
	}
	return data
}

type serverHarness struct {
	c  *testenv.Containerd
	cl *containerd.Client
}

// runningServer is one server's container and task.
type runningServer struct {
	h      *serverHarness
	ctr    containerd.Container
	task   containerd.Task
	exited <-chan containerd.ExitStatus
	out    *testenv.SyncBuffer
	done   bool
}

var serverSeq atomic.Int64

// start runs args in image with env, data bound at mountAt, confined as the
// local runtime confines an instance, in a network namespace of its own (only
// its loopback: the servers listen on every address).
func (h *serverHarness) start(ctx context.Context, t *testing.T, image, data, mountAt string, env []string, args ...string) *runningServer {
	t.Helper()
	img, err := h.cl.GetImage(ctx, image)
	if err != nil {
		t.Fatal(err)
	}
	// Import does not unpack: the runtime does, before it runs an image.
	if err := testenv.EnsureUnpacked(ctx, img); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("baseimage-server-%d-%d", os.Getpid(), serverSeq.Add(1))
	ids := []specs.LinuxIDMapping{{ContainerID: 0, HostID: serverHostID, Size: serverIDRange}}
	ctr, err := h.cl.NewContainer(ctx, id,
		containerd.WithImage(img),
		containerd.WithUserNSRemappedSnapshot(id, img, ids, ids),
		containerd.WithNewSpec(
			oci.WithImageConfig(img),
			oci.WithProcessArgs(args...),
			oci.WithEnv(env),
			oci.WithMounts([]specs.Mount{{Destination: mountAt, Type: "bind", Source: data, Options: []string{"rbind", "rw", "nosuid", "nodev"}}}),
			oci.WithUserNamespace(ids, ids),
			oci.WithCapabilities(appCapabilities),
			oci.WithNoNewPrivileges,
			seccomp.WithDefaultProfile(),
		))
	if err != nil {
		t.Fatalf("create container: %v", err)
	}
	s := &runningServer{h: h, ctr: ctr, out: &testenv.SyncBuffer{}}
	t.Cleanup(func() { s.remove() })
	s.task, err = ctr.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, s.out, s.out), cio.WithFIFODir(filepath.Dir(h.c.Address))))
	if err != nil {
		t.Fatalf("create task: %v", err)
	}
	if s.exited, err = s.task.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.task.Start(ctx); err != nil {
		t.Fatalf("start task: %v", err)
	}
	return s
}

// exec runs args in the server's container, as its first process runs (root
// of the namespace, the same confinement), with env added.
func (s *runningServer) exec(ctx context.Context, t *testing.T, env []string, args ...string) (string, uint32) {
	t.Helper()
	spec, err := s.ctr.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := *spec.Process
	p.Args, p.Env, p.Terminal = args, append(slices.Clone(p.Env), env...), false
	var out testenv.SyncBuffer
	proc, err := s.task.Exec(ctx, fmt.Sprintf("exec-%d", serverSeq.Add(1)), &p,
		cio.NewCreator(cio.WithStreams(nil, &out, &out), cio.WithFIFODir(filepath.Dir(s.h.c.Address))))
	if err != nil {
		t.Fatalf("exec %q: %v", args, err)
	}
	defer proc.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill)
	statusC, err := proc.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Start(ctx); err != nil {
		t.Fatalf("exec %q: start: %v", args, err)
	}
	var st containerd.ExitStatus
	select {
	case st = <-statusC:
	case <-ctx.Done():
		t.Fatalf("exec %q: %v", args, ctx.Err())
	}
	// Delete waits for the output's copy to finish.
	if _, err := proc.Delete(ctx); err != nil {
		t.Fatalf("exec %q: delete: %v", args, err)
	}
	return strings.TrimRight(out.String(), "\n"), st.ExitCode()
}

// waitFor calls check until it succeeds; the server exiting meanwhile fails t
// at once, with what it printed.
func (s *runningServer) waitFor(ctx context.Context, t *testing.T, timeout time.Duration, what string, check func() error) {
	t.Helper()
	err := testenv.Poll(timeout, func() error {
		if st, err := s.task.Status(ctx); err != nil || st.Status != containerd.Running {
			t.Fatalf("%s: the server is not running (%s, %v); it printed:\n%s", what, st.Status, err, s.out.String())
		}
		return check()
	})
	if err != nil {
		t.Fatalf("%s: %v; the server printed:\n%s", what, err, s.out.String())
	}
}

// stop sends sig, waits for the server to exit (0), removes its container and
// returns what it printed.
func (s *runningServer) stop(ctx context.Context, t *testing.T, sig syscall.Signal) string {
	t.Helper()
	began := time.Now()
	if err := s.task.Kill(ctx, sig); err != nil {
		t.Fatal(err)
	}
	var st containerd.ExitStatus
	select {
	case st = <-s.exited:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the server did not exit within 2m of %s:\n%s", sig, s.out.String())
	}
	if _, err := s.task.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	s.remove()
	if st.ExitCode() != 0 {
		t.Errorf("the server exited %d on %s:\n%s", st.ExitCode(), sig, s.out.String())
	}
	t.Logf("stopped (%s) in %s", sig, time.Since(began).Round(time.Millisecond))
	return s.out.String()
}

func (s *runningServer) remove() {
	if s.done {
		return
	}
	s.done = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if s.task != nil {
		_, _ = s.task.Delete(ctx, containerd.WithProcessKill)
	}
	_ = s.ctr.Delete(ctx, containerd.WithSnapshotCleanup)
}

// memory logs what the server's container uses, from its cgroup (v2 or v1's
// memory controller): the whole charge, and what is not page cache.
func (h *serverHarness) memory(ctx context.Context, t *testing.T, s *runningServer, what string) {
	t.Helper()
	spec, err := s.ctr.Spec(ctx)
	if err != nil || spec.Linux == nil {
		t.Logf("%s: memory unknown (%v)", what, err)
		return
	}
	read := func(path string) (map[string]int64, int64, error) {
		stat, err := os.ReadFile(path + "/memory.stat")
		if err != nil {
			return nil, 0, err
		}
		m := map[string]int64{}
		for _, line := range strings.Split(string(stat), "\n") {
			k, v, ok := strings.Cut(line, " ")
			if n, err := strconv.ParseInt(v, 10, 64); ok && err == nil {
				m[k] = n
			}
		}
		for _, f := range []string{"memory.current", "memory.usage_in_bytes"} {
			if data, err := os.ReadFile(path + "/" + f); err == nil {
				n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
				return m, n, err
			}
		}
		return m, 0, errors.New("no memory.current nor memory.usage_in_bytes")
	}
	cg := spec.Linux.CgroupsPath
	if m, total, err := read("/sys/fs/cgroup" + cg); err == nil {
		t.Logf("%s: %d MiB in its cgroup, %d MiB anonymous, %d MiB shared memory", what, total>>20, m["anon"]>>20, m["shmem"]>>20)
	} else if m, total, err := read("/sys/fs/cgroup/memory" + cg); err == nil {
		t.Logf("%s: %d MiB in its cgroup, %d MiB rss, %d MiB shared memory", what, total>>20, m["total_rss"]>>20, m["total_shmem"]>>20)
	} else {
		t.Logf("%s: memory unknown (cgroup %s: %v)", what, cg, err)
	}
}

// unpackedSize is the size of the files in the layout's image.
func unpackedSize(t *testing.T, dir string) int64 {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			total += hdr.Size
		}
		rc.Close()
	}
	return total
}

// appCapabilities is the capability set the runtimes give an app's processes
// (deployer/runtime.Capabilities: Docker's default without NET_RAW and MKNOD),
// written out here: internal/ takes nothing from a component.
var appCapabilities = []string{
	"CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_NET_BIND_SERVICE", "CAP_SETFCAP", "CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT",
}
