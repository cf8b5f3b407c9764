package e2e

import (
	"bufio"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// dialHelperEnv makes the test binary a helper that dials the unix socket named
// by its value and exits: 0 when connected, 13 on EACCES, 1 otherwise. The test
// runs it as nobody, to try the sockets as an unprivileged local user would.
const dialHelperEnv = "BEX_E2E_DIAL_UNIX"

func dialHelper() {
	path := os.Getenv(dialHelperEnv)
	conn, err := net.Dial("unix", path)
	if err == nil {
		conn.Close()
		fmt.Println("connected")
		os.Exit(0)
	}
	fmt.Println(err)
	if errors.Is(err, syscall.EACCES) {
		os.Exit(13)
	}
	os.Exit(1)
}

// listener is one listening socket of bex up's processes.
type listener struct {
	kind  string // "tcp" or "unix"
	addr  string // host:port, or the socket's path
	owner string // the process's name (comm) and pid
}

// TestListenersRefuseStrangers starts bex up, lists every listening socket of its
// processes (its descendants and every process naming its state dir, such as
// containerd's shims) from /proc/net/{tcp,tcp6,unix}, and tries each without
// credentials: each must refuse, or (the edge, ssh) serve only what is public. A
// listener this test does not know fails it: a new one needs an entry here and
// in docs/architecture.md's table. It also checks the oom_score_adj of the
// platform's processes and of a tenant's build step and app.
func TestListenersRefuseStrangers(t *testing.T) {
	p := newPlatform(t)
	t.Cleanup(p.kill)
	began := time.Now()
	p.start(t)
	t.Logf("bex up started in %s", time.Since(began).Round(time.Millisecond))

	// A tenant, so that its shim's sockets are listed too, and it says its
	// oom_score_adj from a build step and from a request.
	probe := p.newRepo(t, "hello-shell", "oomprobe")
	probe.commit(t, "say the oom_score_adj", map[string]string{
		"Dockerfile": "FROM busybox\n" +
			"RUN echo \"build step oom_score_adj=$(cat /proc/self/oom_score_adj)\"\n" +
			"RUN mkdir -p /www/cgi-bin && echo ok > /www/index.html\n" +
			"COPY oom.sh /www/cgi-bin/oom\nRUN chmod 755 /www/cgi-bin/oom\n" +
			"CMD [\"sh\", \"-c\", \"exec httpd -f -p \\\"$PORT\\\" -h /www\"]\n",
		"oom.sh": "#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n'\necho \"oom_score_adj=$(cat /proc/self/oom_score_adj)\"\n",
	})
	out, err := probe.push()
	if err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}

	var ports struct{ EtcdClient, APIServer int }
	data, err := os.ReadFile(filepath.Join(p.dir, "controlplane", "ports.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &ports); err != nil {
		t.Fatal(err)
	}
	etcdAddr := fmt.Sprintf("127.0.0.1:%d", ports.EtcdClient)
	apiAddr := fmt.Sprintf("127.0.0.1:%d", ports.APIServer)

	t.Run("oom_score_adj", func(t *testing.T) {
		checkOOMScores(t, p, out)
	})
	// After a start and a push (logs, a repository, a build, an app instance):
	// nothing bex wrote is readable by other users, but the CA certificate.
	t.Run("state dir modes", func(t *testing.T) {
		for _, own := range daemonsOwn {
			if fi, err := os.Stat(filepath.Join(p.dir, own)); err == nil {
				t.Logf("%s (the daemon's own): %s", own, fi.Mode().Perm())
			}
		}
		if wide := tooWide(t, p.dir); len(wide) > 0 {
			t.Errorf("wider than 0600/0700 in the state dir:\n%s", strings.Join(wide, "\n"))
		}
		if fi, err := os.Stat(filepath.Join(p.dir, "logs")); err != nil || !fi.IsDir() {
			t.Errorf("no logs directory to check: %v", err)
		}
		// ca.pem is a file of its own that others can open, not a link into the
		// edge's directory, which they cannot pass.
		if fi, err := os.Lstat(filepath.Join(p.dir, "ca.pem")); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
			t.Errorf("ca.pem: %v %v, want a regular file 0644", fi, err)
		}
	})

	pids := platformPIDs(p)
	found := listeners(t, pids)
	if len(found) == 0 {
		t.Fatal("found no listener at all")
	}
	nobody := unprivilegedDialer(t)
	// Each known listener and the check that it refuses a stranger.
	tcp := map[string]func() error{
		p.sshAddr:   func() error { return sshRefusesUnknownKey(t, p) },
		p.httpAddr:  func() error { return edgeHTTPServesNoPlatform(p) },
		p.httpsAddr: func() error { return edgeHTTPSServesOnlyRoutes(p) },
		p.hooksAddr: func() error { return hooksRefuseWithoutSecret(p) },
		etcdAddr:    func() error { return etcdRefusesWithoutCertificate(p, etcdAddr) },
		apiAddr:     func() error { return apiRefusesAnonymous(apiAddr) },
	}
	for _, l := range found {
		t.Logf("%-4s %-70s %s", l.kind, l.addr, l.owner)
		var check func() error
		switch l.kind {
		case "tcp":
			check = tcp[l.addr]
			if check == nil {
				t.Errorf("tcp listener %s of %s is not known to this test: add its check here and its row to docs/architecture.md", l.addr, l.owner)
				continue
			}
		case "unix":
			if strings.HasPrefix(l.addr, "@") || l.addr == "" {
				t.Errorf("abstract or unnamed unix listener %q of %s: any process of the network namespace reaches it", l.addr, l.owner)
				continue
			}
			check = func() error { return nobody(l.addr) }
		}
		if err := check(); err != nil {
			t.Errorf("%s listener %s of %s: %v", l.kind, l.addr, l.owner, err)
		}
	}
	// The ones the table promises are there (a test that found nothing would pass).
	listed := map[string]bool{}
	for _, l := range found {
		listed[l.addr] = true
	}
	for addr := range tcp {
		if !listed[addr] {
			t.Errorf("no listener on %s", addr)
		}
	}
	for _, sock := range []string{"containerd/containerd.sock", "buildkitd/buildkitd.sock", "controlplane/run/peer.sock", "run/deployer-health.sock", "run/edge-stats.sock"} {
		if !listed[filepath.Join(p.dir, sock)] {
			t.Errorf("no listener on %s", filepath.Join(p.dir, sock))
		}
	}
}

// platformPIDs are bex up, its descendants, and the processes whose command line
// names its state dir (containerd's shims, which leave their parent).
func platformPIDs(p *platform) map[int]bool {
	parent := parentPIDs()
	pids := map[int]bool{p.cmd.Process.Pid: true}
	for changed := true; changed; {
		changed = false
		for pid, pp := range parent {
			if pids[pp] && !pids[pid] {
				pids[pid], changed = true, true
			}
		}
	}
	for _, line := range processesMentioning(p.dir) {
		if pid, err := strconv.Atoi(strings.SplitN(line, ":", 2)[0]); err == nil {
			pids[pid] = true
		}
	}
	return pids
}

// listeners lists the listening TCP and unix sockets that the processes pids hold.
func listeners(t *testing.T, pids map[int]bool) []listener {
	t.Helper()
	owners := map[string]string{} // socket inode → "comm[pid]"
	cwds := map[string]string{}   // socket inode → its process's working directory
	for pid := range pids {
		cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if inode, ok := strings.CutPrefix(link, "socket:["); err == nil && ok {
				inode = strings.TrimSuffix(inode, "]")
				owners[inode] = fmt.Sprintf("%s[%d]", strings.TrimSpace(string(comm)), pid)
				cwds[inode] = cwd
			}
		}
	}
	var found []listener
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for _, f := range procTable(t, file) {
			// sl local rem st tx:rx tr:when retr uid timeout inode
			if len(f) < 10 || f[3] != "0A" { // TCP_LISTEN
				continue
			}
			if owner, ok := owners[f[9]]; ok {
				found = append(found, listener{kind: "tcp", addr: hexAddr(t, f[1]), owner: owner})
			}
		}
	}
	for _, f := range procTable(t, "/proc/net/unix") {
		// Num RefCount Protocol Flags Type St Inode [Path]
		if len(f) < 7 {
			continue
		}
		flags, _ := strconv.ParseUint(f[3], 16, 32)
		if flags&0x10000 == 0 { // __SO_ACCEPTCON: listening
			continue
		}
		owner, ok := owners[f[6]]
		if !ok {
			continue
		}
		path := ""
		if len(f) > 7 {
			path = f[7]
		}
		if path != "" && !strings.HasPrefix(path, "@") && !filepath.IsAbs(path) {
			// Bound to a relative path (etcd's peer socket): relative to the
			// process's working directory.
			path = filepath.Join(cwds[f[6]], path)
		}
		found = append(found, listener{kind: "unix", addr: path, owner: owner})
	}
	return found
}

func procTable(t *testing.T, file string) [][]string {
	t.Helper()
	fh, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var rows [][]string
	sc := bufio.NewScanner(fh)
	sc.Scan() // the header
	for sc.Scan() {
		rows = append(rows, strings.Fields(sc.Text()))
	}
	return rows
}

// hexAddr decodes /proc/net/tcp's "0100007F:1F90" (the address in the kernel's
// byte order, 32 bits at a time) into "127.0.0.1:8080".
func hexAddr(t *testing.T, s string) string {
	t.Helper()
	host, portHex, _ := strings.Cut(s, ":")
	raw, err := hex.DecodeString(host)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+4 <= len(raw); i += 4 {
		raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	port, _ := strconv.ParseUint(portHex, 16, 16)
	ip := net.IP(raw)
	if v4 := ip.To4(); v4 != nil && len(raw) == 16 && !ip.IsUnspecified() {
		ip = v4
	}
	return net.JoinHostPort(ip.String(), strconv.FormatUint(port, 10))
}

// unprivilegedDialer returns a check that dials a unix socket as nobody (uid and
// gid 65534, no supplementary groups) and wants permission denied.
func unprivilegedDialer(t *testing.T) func(path string) error {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary's own directory is private: a copy nobody may run.
	dir, err := os.MkdirTemp("", "bex-e2e-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "dial")
	if out, err := exec.Command("cp", self, bin).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	return func(path string) error {
		cmd := exec.Command(bin)
		cmd.Env = []string{dialHelperEnv + "=" + path}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == 13 {
			return nil
		}
		return fmt.Errorf("as nobody, want permission denied, got %v: %s", err, strings.TrimSpace(string(out)))
	}
}

// sshRefusesUnknownKey: a key bex does not know gets no session.
func sshRefusesUnknownKey(t *testing.T, p *platform) error {
	key := filepath.Join(t.TempDir(), "stranger")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		return fmt.Errorf("ssh-keygen: %v: %s", err, out)
	}
	out, err := exec.Command("ssh", "-F", "/dev/null", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
		"-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes",
		"-p", p.port(p.sshAddr), "git@127.0.0.1", "apps").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Permission denied") {
		return fmt.Errorf("ssh with an unknown key: %v: %s", err, out)
	}
	return nil
}

func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// edgeHTTPServesNoPlatform: plain HTTP redirects to HTTPS (or answers ACME
// challenges); it serves nothing of the platform.
func edgeHTTPServesNoPlatform(p *platform) error {
	hc := &http.Client{Timeout: 10 * time.Second, CheckRedirect: noRedirects}
	for _, path := range []string{"/", "/mcp", "/hooks/oomprobe", "/api/v1/secrets"} {
		resp, err := hc.Get("http://" + p.httpAddr + path)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 3 && resp.StatusCode != http.StatusNotFound {
			return fmt.Errorf("GET %s: %s, want a redirect to HTTPS or 404", path, resp.Status)
		}
	}
	return nil
}

// edgeHTTPSServesOnlyRoutes: the platform's host serves /hooks/ and /mcp, which
// refuse without a secret or a token; any other path is 404, and a host no app
// serves gets no certificate.
func edgeHTTPSServesOnlyRoutes(p *platform) error {
	hc, err := p.httpsClient()
	if err != nil {
		return err
	}
	base := "https://localhost:" + p.port(p.httpsAddr)
	for _, c := range []struct {
		method, url string
		want        int
	}{
		{"POST", base + "/mcp", http.StatusUnauthorized},
		{"POST", base + "/hooks/oomprobe", http.StatusNotFound}, // no webhook secret: "no webhook here"
		{"GET", base + "/api/v1/secrets", http.StatusNotFound},
		{"GET", base + "/metrics", http.StatusNotFound},
		// A name no app serves gets no certificate: the handshake fails.
		{"GET", "https://nothing-here.localhost:" + p.port(p.httpsAddr) + "/", 0},
	} {
		req, _ := http.NewRequest(c.method, c.url, strings.NewReader("{}"))
		resp, err := hc.Do(req)
		if c.want == 0 {
			if err == nil {
				resp.Body.Close()
				return fmt.Errorf("%s %s: %s, want a failed handshake", c.method, c.url, resp.Status)
			}
			if !strings.Contains(err.Error(), "tls: ") {
				return fmt.Errorf("%s %s: %w, want a failed handshake", c.method, c.url, err)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", c.method, c.url, err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			return fmt.Errorf("%s %s: %s, want %d", c.method, c.url, resp.Status, c.want)
		}
	}
	return nil
}

// hooksRefuseWithoutSecret: the gitserver's HTTP listener answers a webhook only
// with a valid signature, MCP only with a token.
func hooksRefuseWithoutSecret(p *platform) error {
	hc := &http.Client{Timeout: 10 * time.Second}
	for path, want := range map[string]int{"/mcp": http.StatusUnauthorized, "/hooks/oomprobe": http.StatusNotFound, "/metrics": http.StatusNotFound} {
		resp, err := hc.Post("http://"+p.hooksAddr+path, "application/json", strings.NewReader("{}"))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			return fmt.Errorf("POST %s: %s, want %d", path, resp.Status, want)
		}
	}
	return nil
}

// etcdRefusesWithoutCertificate: plain HTTP gets no data, TLS without a client
// certificate no handshake, and the API's admin certificate (another CA) neither.
func etcdRefusesWithoutCertificate(p *platform, addr string) error {
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Post("http://"+addr+"/v3/kv/range", "application/json", strings.NewReader(`{"key":"AA==","range_end":"AA=="}`))
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || strings.Contains(string(body), `"kvs"`) {
			return fmt.Errorf("plain HTTP: %s: %s", resp.Status, body)
		}
	}
	admin, err := tls.LoadX509KeyPair(filepath.Join(p.dir, "controlplane", "pki", "admin.crt"), filepath.Join(p.dir, "controlplane", "pki", "admin.key"))
	if err != nil {
		return err
	}
	for name, certs := range map[string][]tls.Certificate{"no client certificate": nil, "the API's admin certificate": {admin}} {
		tc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			InsecureSkipVerify: true, //nolint:gosec // the server is not what is tested
			Certificates:       certs,
		}}}
		resp, err := tc.Post("https://"+addr+"/v3/kv/range", "application/json", strings.NewReader(`{"key":"AA==","range_end":"AA=="}`))
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return fmt.Errorf("TLS with %s: %s: %s", name, resp.Status, body)
		}
	}
	return nil
}

// apiRefusesAnonymous: without a certificate or a token every path is 401.
func apiRefusesAnonymous(addr string) error {
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true, //nolint:gosec // the server is not what is tested
	}}}
	for _, path := range []string{"/api/v1/secrets", "/apis/app.bex.co/v1alpha1/users", "/readyz", "/version"} {
		resp, err := hc.Get("https://" + addr + path)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			return fmt.Errorf("GET %s without credentials: %s, want 401", path, resp.Status)
		}
	}
	return nil
}

// checkOOMScores: the platform's processes are protected (a negative
// oom_score_adj, or, where the kernel refuses to lower it for want of
// CAP_SYS_RESOURCE, the value bex up started with), and a tenant's build step
// and app get the tenants' 500, above all of them.
func checkOOMScores(t *testing.T, p *platform, pushOut string) {
	want := map[string]int{"bex": -999, "etcd": -999, "kube-apiserver": -999, "containerd": -999, "buildkitd": -500}
	for _, c := range []string{"deployer", "edge", "gitserver"} {
		want["bex "+c] = -900
	}
	capable := canLowerOOMScore(t)
	inherited := oomScoreOf(t, os.Getpid()) // bex up started with the test's
	seen := map[string]bool{}
	for pid := range platformPIDs(p) {
		name := processName(pid)
		w, ok := want[name]
		if !ok {
			continue
		}
		seen[name] = true
		got := oomScoreOf(t, pid)
		if !capable {
			w = inherited
		}
		if got != w {
			t.Errorf("%s (pid %d): oom_score_adj %d, want %d (CAP_SYS_RESOURCE: %v)", name, pid, got, w, capable)
		}
		if got >= 500 {
			t.Errorf("%s (pid %d): oom_score_adj %d, not below the tenants' 500", name, pid, got)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("no process %q found", name)
		}
	}
	if !strings.Contains(pushOut, "build step oom_score_adj=500") {
		t.Errorf("the build step's oom_score_adj is not 500:\n%s", strings.Join(lines(pushOut, "oom_score_adj"), "\n"))
	}
	testenv.Eventually(t, 30*time.Second, "the app's oom_score_adj", p.answers("oomprobe", "/cgi-bin/oom", "oom_score_adj=500"))
}

// processName is "bex <subcommand>" for bex's own, else the program's base name.
func processName(pid int) string {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	name := filepath.Base(args[0])
	if name == "bex" && len(args) > 1 && args[1] != "up" {
		return "bex " + args[1]
	}
	return name
}

func oomScoreOf(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// canLowerOOMScore reports whether this process has CAP_SYS_RESOURCE (bit 24 of
// CapEff), as bex up, its child, has.
func canLowerOOMScore(t *testing.T) bool {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return caps&(1<<24) != 0
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return false
}
