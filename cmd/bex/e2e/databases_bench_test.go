package e2e

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"bex.co/bex/cmd/bex/up"
	"bex.co/bex/internal/machine/daemons"
	"bex.co/bex/internal/testenv"
)

// BenchmarkDatabases measures the managed databases of one `bex up
// --local-bases`, each beside the same thing without bex, in the same run:
//
//   - create → accepting: from `ssh postgres:create` (and `redis:create`) to
//     the server answering its protocol at its own address (a Postgres
//     startup message gets its authentication request, as pg_isready asks; a
//     Redis PING its reply), and to `postgres:info --json` saying Running;
//     the baseline is the same image started bare in bex up's containerd (the
//     same entrypoint and command, its data on a directory of the host, the
//     host's network) to the same answer; the deployer's log says when the
//     server's instance started, which splits bex's time into making the
//     instance (Secret, port, volume, network, container) and the server's own
//     start on it;
//   - queries per second: pgbench -S -T 5 -c 4 (the image's pgbench) from a
//     one-off of a linked app, through bex's path (the instance → the gateway's
//     port → DNAT → the server), against the same pgbench run bare from the
//     host to the server's own address and from inside the server's network
//     namespace to its PORT, each way twice (in an order and its reverse);
//   - idle memory of one Postgres and one Redis: the working set (usage less
//     inactive files, as docker stats and the kubelet count it) of the
//     server's container's cgroup, and the PSS of its processes, after an
//     idle spell; the baseline is the same server started bare, idle as long.
func BenchmarkDatabases(b *testing.B) {
	cfg := testenv.StandInsConfig()
	p := newPlatform(b)
	b.Cleanup(p.kill)
	began := time.Now()
	p.start(b, "--local-bases", "--local-bases-cache", cfg.CacheDir, "--build-memory", "1Gi")
	upTook := time.Since(began)
	b.Cleanup(func() {
		if b.Failed() {
			out := p.out.String()
			b.Logf("bex up's last output:\n%s", out[max(0, len(out)-8000):])
			for _, l := range []string{"gitserver.log", "deployer.log"} {
				log, _ := os.ReadFile(filepath.Join(p.dir, "logs", l))
				b.Logf("the end of %s:\n%s", l, log[max(0, len(log)-8000):])
			}
		}
	})
	// Nothing is timed before the stand-ins are in containerd: a database
	// created earlier waits for its image, which is the import's time, not the
	// database's.
	testenv.Eventually(b, 40*time.Minute, "the local bases are made", func() error {
		msg, err := os.ReadFile(filepath.Join(p.dir, "run", "local-bases.ready"))
		if err != nil {
			return err
		}
		if len(msg) > 0 {
			b.Fatalf("the local bases could not be made: %s", msg)
		}
		return nil
	})
	basesTook := time.Since(began)
	d := newDBBench(b, p, cfg.Names.Postgres, cfg.Names.Redis)
	// The databases' DNAT rules are the machine's (iptables), not this bex
	// up's state dir's: a database left behind keeps its gateway port's rule
	// after the state dir is gone, and another bex up's database given that
	// port is refused; so are the link rules of its instances. So the app and
	// every database made here are destroyed before bex up stops, even when
	// the benchmark fails.
	b.Cleanup(d.destroyAll)

	// The linked app: the Postgres image (its pgbench) with busybox's httpd as
	// the web process its rollout waits for.
	client := p.newRepo(b, "hello-shell", "pgclient")
	client.commit(b, "pgbench", map[string]string{"Dockerfile": "FROM busybox AS web\n" +
		"FROM " + cfg.Names.Postgres + "\n" +
		"COPY --from=web /bin/busybox /usr/local/bin/busybox\n" +
		"RUN mkdir -p /www && echo 'pgbench client' > /www/index.html\n" +
		`CMD ["sh", "-c", "exec busybox httpd -f -p \"$PORT\" -h /www"]` + "\n"})
	pushed := time.Now()
	d.pushed = true
	if out, err := client.push(); err != nil {
		b.Fatalf("push pgclient: %v\n%s", err, out)
	}
	b.Logf("bex up was up in %s, the stand-ins in its containerd after %s, pgclient pushed and serving in %s",
		upTook.Round(time.Millisecond), basesTook.Round(time.Millisecond), time.Since(pushed).Round(time.Millisecond))

	var create timings
	qps := map[string][]float64{}
	var mem map[string]cgroupMemory
	for i := 0; i < b.N; i++ {
		pg, cache := fmt.Sprintf("bench-pg-%d", i), fmt.Sprintf("bench-cache-%d", i)
		t := map[string]float64{}
		barePG := d.startBare(b, d.pgImage)
		t["pg-bare"] = barePG.took.Seconds()
		d.made[pg], d.made[cache] = "postgres", "redis"
		t["pg-running"], t["pg-started"], t["pg-accepting"] = d.timeCreate(b, "postgres", pg)
		bareRedis := d.startBare(b, d.redisImage)
		t["redis-bare"] = bareRedis.took.Seconds()
		t["redis-running"], t["redis-started"], t["redis-accepting"] = d.timeCreate(b, "redis", cache)
		create.add(t)
		if i == 0 {
			// Both bare servers started before bex's, so they have idled at
			// least as long.
			time.Sleep(10 * time.Second) // no wait: the idle spell whose memory is measured
			mem = map[string]cgroupMemory{
				"pg":         d.serverMemory(b, pg),
				"pg-bare":    d.memoryOf(b, barePG.pid),
				"redis":      d.serverMemory(b, cache),
				"redis-bare": d.memoryOf(b, bareRedis.pid),
			}
			var idle []string
			for _, k := range []string{"pg", "pg-bare", "redis", "redis-bare"} {
				idle = append(idle, fmt.Sprintf("%s %.1f MiB working set (%.1f usage), %.1f PSS (%d processes)", k, mem[k].WorkingSet, mem[k].Usage, mem[k].PSS, mem[k].Procs))
			}
			b.Logf("idle: %s", strings.Join(idle, "; "))
		}
		barePG.stop()
		bareRedis.stop()

		if i == 0 {
			mustSSHB(b, p, "postgres:link", "bench-pg-0", "pgclient")
			d.pgbench(b, "", d.direct(b, "bench-pg-0", false), "-i", "-s", "1", "-q")
		}
		q := d.queries(b, "bench-pg-0")
		for k, v := range q {
			qps[k] = append(qps[k], v)
		}
		b.Logf("%d: create → instance started, accepting, Running (bare → accepting): postgres %.2fs, %.2fs, %.2fs (%.2fs), redis %.2fs, %.2fs, %.2fs (%.2fs); pgbench -S -c 4: %.0f tps through bex's path, %.0f from the host, %.0f in the server's network namespace",
			i, t["pg-started"], t["pg-accepting"], t["pg-running"], t["pg-bare"], t["redis-started"], t["redis-accepting"], t["redis-running"], t["redis-bare"], q["bex"], q["host"], q["netns"])
		if i > 0 {
			// Gone before the next iteration's clocks start.
			mustSSHB(b, p, "postgres:destroy", pg, "--confirm", pg)
			mustSSHB(b, p, "redis:destroy", cache, "--confirm", cache)
			testenv.Eventually(b, 2*time.Minute, pg+" and "+cache+" are gone", func() error {
				if out := p.kubectl(b, "get", "databases.app.bex.co", "--ignore-not-found", pg, cache, "-o", "name"); out != "" {
					return fmt.Errorf("still there: %s", out)
				}
				return nil
			})
			delete(d.made, pg)
			delete(d.made, cache)
		}
	}

	create.report(b, "create")
	b.ReportMetric(create.mean("pg-accepting")/create.mean("pg-bare"), "pg-create/bare")
	b.ReportMetric(create.mean("redis-accepting")/create.mean("redis-bare"), "redis-create/bare")
	mean := func(v []float64) float64 {
		var s float64
		for _, x := range v {
			s += x
		}
		return s / float64(len(v))
	}
	for k, v := range qps {
		b.ReportMetric(mean(v), "pg-qps-"+k)
	}
	b.ReportMetric(mean(qps["bex"])/mean(qps["host"]), "pg-qps-bex/host")
	b.ReportMetric(mean(qps["bex"])/mean(qps["netns"]), "pg-qps-bex/netns")
	for k, m := range mem {
		b.ReportMetric(m.WorkingSet, "idle-"+k+"-MB")
		b.ReportMetric(m.PSS, "idle-"+k+"-PSS-MB")
	}
	for _, e := range []string{"pg", "redis"} {
		b.ReportMetric(mem[e].WorkingSet/mem[e+"-bare"].WorkingSet, "idle-"+e+"/bare")
	}
}

// dbBench is what the database benchmark works with: the platform, its
// containerd, and the servers' images.
type dbBench struct {
	b                   *testing.B
	p                   *platform
	cl                  *containerd.Client
	fifoDir             string
	pgImage, redisImage string
	seq                 int
	made                map[string]string // the databases made: name → engine
	pushed              bool              // pgclient exists
}

// destroyAll destroys pgclient and the databases made, and waits until they
// are gone (their rules with them).
func (d *dbBench) destroyAll() {
	b, p := d.b, d.p
	// The app goes first, and with it the link and the rules of its
	// instances (an unlink would leave the old instance's until it drained).
	if d.pushed {
		p.destroyApp(b, "pgclient")
	}
	names := []string{"get", "databases.app.bex.co", "--ignore-not-found", "-o", "name"}
	for name, engine := range d.made {
		if _, stderr, err := p.ssh(b, engine+":destroy", name, "--confirm", name); err != nil {
			b.Errorf("%s:destroy %s: %v: %s", engine, name, err, stderr)
		}
		names = append(names, name)
	}
	if len(d.made) == 0 {
		return
	}
	if err := testenv.Poll(2*time.Minute, func() error {
		if out := p.kubectl(b, names...); out != "" {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	}); err != nil {
		b.Errorf("the databases made are not gone: %v", err)
	}
}

func newDBBench(b *testing.B, p *platform, pgImage, redisImage string) *dbBench {
	sock := filepath.Join(p.dir, "containerd", "containerd.sock")
	cl, err := daemons.ContainerdClient(sock, up.ContainerdNamespace)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cl.Close() })
	return &dbBench{b: b, p: p, cl: cl, fifoDir: filepath.Dir(sock), pgImage: pgImage, redisImage: redisImage, made: map[string]string{}}
}

// The bare servers' credentials; bex's come from the database's Secret.
const benchPassword = "bench-password"

// bareServer is a server started bare, and how long it took to answer.
type bareServer struct {
	pid  int
	took time.Duration
	stop func()
}

// startBare starts image's server as the deployer does (the same entrypoint
// and command, with its lock on the data dir), but bare in bex up's containerd:
// no user or network namespace of its own (the host's network, on loopback),
// no limits, its data on a directory of the host. It returns once the server
// answers its protocol. (bex up's runc wrapper still gives a container without
// a user namespace a build step's confinement: a pids limit, and a cgroup below
// the builds' one.)
func (d *dbBench) startBare(b *testing.B, image string) bareServer {
	port, err := testenv.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	data := b.TempDir()
	var cmd, mountAt string
	var env []string
	var probe func(addr string) error
	switch image {
	case d.pgImage:
		mountAt = "/var/lib/postgresql/data"
		env = []string{"POSTGRES_PASSWORD=" + benchPassword, "POSTGRES_USER=bench", "POSTGRES_DB=bench", "PGDATA=" + mountAt + "/pgdata"}
		cmd = `docker-entrypoint.sh postgres -p "$PORT" -c listen_addresses=127.0.0.1`
		probe = func(addr string) error { return pgAnswers(addr, "bench", "bench") }
	default:
		mountAt = "/data"
		env = []string{"REDIS_PASSWORD=" + benchPassword}
		cmd = `docker-entrypoint.sh redis-server --port "$PORT" --requirepass "$REDIS_PASSWORD" --appendonly yes --appendfsync everysec --dir /data --protected-mode no --bind 127.0.0.1`
		probe = redisAnswers
	}
	env = append(env, "PORT="+strconv.Itoa(port))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	img, err := d.cl.GetImage(ctx, image)
	if err != nil {
		b.Fatal(err)
	}
	// Unpacked before the clock starts, and for the runtime's snapshotter:
	// bex's server then finds it unpacked too.
	if err := img.Unpack(ctx, "overlayfs"); err != nil {
		b.Fatal(err)
	}
	var out testenv.SyncBuffer
	began := time.Now()
	task, _, cleanup := d.container(ctx, b, img, &out,
		oci.WithHostNamespace(specs.NetworkNamespace),
		oci.WithEnv(env),
		oci.WithMounts([]specs.Mount{{Destination: mountAt, Type: "bind", Source: data, Options: []string{"rbind", "rw"}}}),
		oci.WithProcessArgs("sh", "-c", "exec 9<"+mountAt+" && flock 9 && exec "+cmd))
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := pollExited(ctx, task, func() error { return probe(addr) }); err != nil {
		cleanup()
		b.Fatalf("bare %s on %s: %v\n%s", image, addr, err, out.String())
	}
	return bareServer{pid: int(task.Pid()), took: time.Since(began), stop: cleanup}
}

// container creates and starts a container of img with opts, its output into
// out; cleanup kills and removes it (also at the end of the benchmark).
func (d *dbBench) container(ctx context.Context, b *testing.B, img containerd.Image, out io.Writer, opts ...oci.SpecOpts) (containerd.Task, <-chan containerd.ExitStatus, func()) {
	d.seq++
	id := fmt.Sprintf("bench-db-%d-%d", os.Getpid(), d.seq)
	if err := testenv.EnsureUnpacked(ctx, img); err != nil {
		b.Fatal(err)
	}
	ctr, err := d.cl.NewContainer(ctx, id, containerd.WithImage(img), containerd.WithNewSnapshot(id, img),
		containerd.WithNewSpec(append([]oci.SpecOpts{oci.WithImageConfig(img)}, opts...)...))
	if err != nil {
		b.Fatal(err)
	}
	var task containerd.Task
	done := false
	cleanup := func() {
		if done {
			return
		}
		done = true
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if task != nil {
			_, _ = task.Delete(c, containerd.WithProcessKill)
		}
		_ = ctr.Delete(c, containerd.WithSnapshotCleanup)
	}
	b.Cleanup(cleanup)
	task, err = ctr.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, out, out), cio.WithFIFODir(d.fifoDir)))
	if err != nil {
		cleanup()
		b.Fatal(err)
	}
	statusC, err := task.Wait(ctx)
	if err != nil {
		cleanup()
		b.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		cleanup()
		b.Fatal(err)
	}
	return task, statusC, cleanup
}

// pollExited calls f every 20 ms until it succeeds, the task exits or ctx
// ends.
func pollExited(ctx context.Context, task containerd.Task, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		if st, serr := task.Status(ctx); serr == nil && st.Status == containerd.Stopped {
			return fmt.Errorf("exited with %d (%v)", st.ExitStatus, err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%v: %w", ctx.Err(), err)
		}
		time.Sleep(20 * time.Millisecond) // no wait: the poll that is measured, 20 ms its resolution
	}
}

// timeCreate runs `ssh ENGINE:create NAME` and returns the seconds until
// ENGINE:info --json says Running, until the deployer started the server's
// instance (its log's time), and until the server answers its protocol at its
// own address (found from its container's task: the address of its network
// namespace, its listener's port), polled from the moment of the command.
func (d *dbBench) timeCreate(b *testing.B, engine, name string) (running, started, accepting float64) {
	began := time.Now()
	if _, stderr, err := d.p.ssh(b, engine+":create", name, "--size", "256Mi"); err != nil {
		b.Fatalf("%s:create %s: %v: %s", engine, name, err, stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ran := make(chan error, 1)
	go func() {
		ran <- pollCtx(ctx, func() error {
			out, stderr, err := d.p.ssh(b, engine+":info", name, "--json")
			if err != nil {
				return fmt.Errorf("%v: %s", err, stderr)
			}
			var info struct{ Status, Message string }
			if err := json.Unmarshal([]byte(out), &info); err != nil {
				return fmt.Errorf("%s:info --json: %v: %s", engine, err, out)
			}
			if info.Status != "Running" {
				return fmt.Errorf("%s is %s: %s", name, info.Status, info.Message)
			}
			running = time.Since(began).Seconds()
			return nil
		})
	}()
	err := pollCtx(ctx, func() error {
		addr, err := d.serverAddr(name)
		if err != nil {
			return err
		}
		if engine == "redis" {
			err = redisAnswers(addr.String())
		} else {
			// The database's owner and database, as its URL names them.
			owner := strings.ReplaceAll(name, "-", "_")
			err = pgAnswers(addr.String(), owner, owner)
		}
		if err == nil {
			accepting = time.Since(began).Seconds()
		}
		return err
	})
	if rerr := <-ran; rerr != nil || err != nil {
		b.Fatalf("%s %s: running: %v; accepting: %v", engine, name, rerr, err)
	}
	at, err := d.instanceStarted(name)
	if err != nil {
		b.Fatal(err)
	}
	return running, at.Sub(began).Seconds(), accepting
}

// instanceStarted is when the deployer's log says that database name's server
// instance started (its container's task, on its volume and network).
func (d *dbBench) instanceStarted(name string) (time.Time, error) {
	log, err := os.ReadFile(filepath.Join(d.p.dir, "logs", "deployer.log"))
	if err != nil {
		return time.Time{}, err
	}
	for _, l := range lines(string(log), `msg="instance started"`) {
		if !strings.Contains(l, "/"+name+".db ") {
			continue
		}
		if v, ok := strings.CutPrefix(strings.Fields(l)[0], "time="); ok {
			return time.Parse(time.RFC3339Nano, v)
		}
	}
	return time.Time{}, fmt.Errorf("the deployer's log does not say that %s's server started", name)
}

// pollCtx calls f every 20 ms until it succeeds or ctx ends.
func pollCtx(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%v: %w", ctx.Err(), err)
		}
		time.Sleep(20 * time.Millisecond) // no wait: the poll that is measured, 20 ms its resolution
	}
}

// serverAddr is the address a database's server listens on: its network
// namespace's address (the local one of its fib_trie that is not loopback)
// and the port of the TCP listener in that namespace (the PORT its container
// was given; the environment of its process does not say it: Redis writes
// its process title over it).
func (d *dbBench) serverAddr(name string) (netip.AddrPort, error) {
	pid, err := postmaster(d.p, name)
	if err != nil {
		return netip.AddrPort{}, err
	}
	tcp, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return netip.AddrPort{}, err
	}
	var port uint64
	for _, l := range strings.Split(string(tcp), "\n")[1:] {
		// sl local_address rem_address st ...: 0A is LISTEN.
		if f := strings.Fields(l); len(f) > 3 && f[3] == "0A" {
			if _, hex, ok := strings.Cut(f[1], ":"); ok {
				port, _ = strconv.ParseUint(hex, 16, 16)
				break
			}
		}
	}
	if port == 0 {
		return netip.AddrPort{}, fmt.Errorf("server %d of %s listens on no TCP port yet", pid, name)
	}
	trie, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/fib_trie", pid))
	if err != nil {
		return netip.AddrPort{}, err
	}
	var last netip.Addr
	for _, l := range strings.Split(string(trie), "\n") {
		l = strings.TrimSpace(l)
		if a, ok := strings.CutPrefix(l, "|-- "); ok {
			last, _ = netip.ParseAddr(a)
		} else if strings.Contains(l, "/32 host LOCAL") && last.IsValid() && !last.IsLoopback() {
			return netip.AddrPortFrom(last, uint16(port)), nil
		}
	}
	return netip.AddrPort{}, fmt.Errorf("server %d of %s has no address yet", pid, name)
}

// pgAnswers says whether the Postgres at addr accepts connections: its answer
// to a startup message is an authentication request ('R'), as pg_isready
// asks; a server that is starting up answers with an error.
func pgAnswers(addr, user, db string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	body := binary.BigEndian.AppendUint32(nil, 3<<16) // protocol 3.0
	for _, s := range []string{"user", user, "database", db, ""} {
		body = append(append(body, s...), 0)
	}
	msg := append(binary.BigEndian.AppendUint32(nil, uint32(len(body)+4)), body...)
	if _, err := c.Write(msg); err != nil {
		return err
	}
	reply := make([]byte, 256)
	n, err := io.ReadAtLeast(c, reply, 1)
	if err != nil {
		return err
	}
	if reply[0] != 'R' {
		return fmt.Errorf("%s answers %q", addr, reply[:n])
	}
	return nil
}

// redisAnswers says whether the Redis at addr answers a PING (a password's
// refusal is an answer).
func redisAnswers(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+") && !strings.HasPrefix(line, "-") {
		return fmt.Errorf("%s answers %q", addr, line)
	}
	return nil
}

// direct is the URL of database name, from its Secret, pointed at its
// server's own address (netns false: from the host, over the server's veth,
// without the DNAT) or at its PORT on the loopback of its network namespace.
func (d *dbBench) direct(b *testing.B, name string, netns bool) string {
	u := d.url(b, name)
	addr, err := d.serverAddr(name)
	if err != nil {
		b.Fatal(err)
	}
	u.Host = addr.String()
	if netns {
		u.Host = fmt.Sprintf("127.0.0.1:%d", addr.Port())
	}
	return u.String()
}

// url is the URL in database name's Secret: what a linked app gets.
func (d *dbBench) url(b *testing.B, name string) *url.URL {
	enc := d.p.kubectl(b, "get", "secret", "bex-db-"+name, "-o", "jsonpath={.data.url}")
	raw, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		b.Fatal(err)
	}
	u, err := url.Parse(string(raw))
	if err != nil {
		b.Fatal(err)
	}
	return u
}

// pgbench runs the Postgres image's pgbench with args and then dbURL, bare in
// bex up's containerd: in the network namespace netns (a path), or the host's
// when it is "". It returns what pgbench printed.
func (d *dbBench) pgbench(b *testing.B, netns, dbURL string, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	img, err := d.cl.GetImage(ctx, d.pgImage)
	if err != nil {
		b.Fatal(err)
	}
	ns := oci.WithHostNamespace(specs.NetworkNamespace)
	if netns != "" {
		ns = oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: netns})
	}
	var out testenv.SyncBuffer
	_, statusC, cleanup := d.container(ctx, b, img, &out, ns, oci.WithProcessArgs(append(append([]string{"pgbench"}, args...), dbURL)...))
	defer cleanup()
	var st containerd.ExitStatus
	select {
	case st = <-statusC:
	case <-ctx.Done():
		b.Fatalf("pgbench %s did not end: %s", strings.Join(args, " "), out.String())
	}
	// The output is complete once the task is deleted (the FIFOs are drained).
	cleanup()
	if st.ExitCode() != 0 {
		b.Fatalf("pgbench %s: exit %d:\n%s", strings.Join(args, " "), st.ExitCode(), out.String())
	}
	return out.String()
}

// The read-only query of pgbench (-S: a SELECT by primary key), 4 clients, 5 s.
var pgbenchRun = []string{"-n", "-S", "-T", "5", "-c", "4"}

var tpsLine = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// queries runs the same pgbench on database name three ways and returns the
// transactions (queries) per second of each: from the host to the server's
// own address ("host"), from a one-off of the linked app pgclient through
// bex's path ("bex"), from inside the server's network namespace ("netns").
func (d *dbBench) queries(b *testing.B, name string) map[string]float64 {
	tps := func(how, out string) float64 {
		m := tpsLine.FindStringSubmatch(out)
		if m == nil {
			b.Fatalf("pgbench (%s) printed no tps:\n%s", how, out)
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			b.Fatal(err)
		}
		return v
	}
	run := map[string]func() float64{
		"host": func() float64 { return tps("host", d.pgbench(b, "", d.direct(b, name, false), pgbenchRun...)) },
		"bex": func() float64 {
			// `run` takes the words as the command; sh expands the linked variable.
			stdout, stderr, err := d.p.ssh(b, "run", "pgclient", "--", "sh", "-c", `'pgbench `+strings.Join(pgbenchRun, " ")+` "$DATABASE_URL"'`)
			if err != nil {
				b.Fatalf("run pgclient pgbench: %v\n%s%s", err, stdout, stderr)
			}
			return tps("bex", stdout+stderr)
		},
		"netns": func() float64 {
			pid, err := postmaster(d.p, name)
			if err != nil {
				b.Fatal(err)
			}
			return tps("netns", d.pgbench(b, fmt.Sprintf("/proc/%d/ns/net", pid), d.direct(b, name, true), pgbenchRun...))
		},
	}
	// Each way twice, in an order and its reverse, so that a drift of the
	// machine's load (shared with others) weighs on each way alike.
	res := map[string]float64{}
	for _, how := range []string{"host", "bex", "netns", "netns", "bex", "host"} {
		res[how] += run[how]() / 2
	}
	return res
}

// cgroupMemory is the memory of one container, in MiB: its cgroup's usage,
// the working set (usage less inactive file pages: what docker stats and the
// kubelet count), and the PSS of its processes summed.
type cgroupMemory struct {
	Usage, WorkingSet, PSS float64
	Procs                  int
}

// serverMemory is the memory of database name's server's container.
func (d *dbBench) serverMemory(b *testing.B, name string) cgroupMemory {
	pid, err := postmaster(d.p, name)
	if err != nil {
		b.Fatal(err)
	}
	return d.memoryOf(b, pid)
}

// memoryOf is the memory of the memory cgroup of process pid (cgroup v1's
// memory hierarchy when the machine has one, else v2's).
func (d *dbBench) memoryOf(b *testing.B, pid int) cgroupMemory {
	m, err := cgroupMemoryOf(pid)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

func cgroupMemoryOf(pid int) (cgroupMemory, error) {
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return cgroupMemory{}, err
	}
	var dir, usageFile, inactiveKey string
	for _, l := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[1] == "memory" || strings.Contains(","+f[1]+",", ",memory,"):
			dir, usageFile, inactiveKey = filepath.Join("/sys/fs/cgroup/memory", f[2]), "memory.usage_in_bytes", "total_inactive_file"
		case f[0] == "0" && f[1] == "" && dir == "":
			root := "/sys/fs/cgroup"
			if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
				root = "/sys/fs/cgroup/unified"
			}
			dir, usageFile, inactiveKey = filepath.Join(root, f[2]), "memory.current", "inactive_file"
		}
	}
	if dir == "" {
		return cgroupMemory{}, fmt.Errorf("process %d is in no memory cgroup: %s", pid, cg)
	}
	usage, err := os.ReadFile(filepath.Join(dir, usageFile))
	if err != nil {
		return cgroupMemory{}, err
	}
	stat, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return cgroupMemory{}, err
	}
	u, err := strconv.ParseFloat(strings.TrimSpace(string(usage)), 64)
	if err != nil {
		return cgroupMemory{}, err
	}
	var inactive float64
	for _, l := range strings.Split(string(stat), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == inactiveKey {
			inactive, _ = strconv.ParseFloat(f[1], 64)
		}
	}
	m := cgroupMemory{Usage: u / (1 << 20), WorkingSet: max(0, u-inactive) / (1 << 20)}
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return cgroupMemory{}, err
	}
	for _, s := range strings.Fields(string(procs)) {
		rollup, err := os.ReadFile(filepath.Join("/proc", s, "smaps_rollup"))
		if err != nil {
			continue // exited meanwhile
		}
		m.Procs++
		for _, l := range strings.Split(string(rollup), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "Pss:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				m.PSS += kb / 1024
			}
		}
	}
	if m.Procs == 0 {
		return cgroupMemory{}, errors.New("no process in " + dir)
	}
	return m, nil
}

// mustSSHB runs a bex command over ssh and fails b unless it succeeds.
func mustSSHB(b *testing.B, p *platform, args ...string) string {
	b.Helper()
	out, stderr, err := p.ssh(b, args...)
	if err != nil {
		b.Fatalf("ssh %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr)
	}
	return out
}
