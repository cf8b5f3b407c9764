package up

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"bex.co/bex/deployer/api/crds"
	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime/local"
	"bex.co/bex/edge"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/machine/baseimage"
	"bex.co/bex/internal/machine/controlplane"
	"bex.co/bex/internal/machine/daemons"
	"bex.co/bex/internal/machine/supervise"
	"bex.co/bex/internal/machine/tenantnet"
	"bex.co/bex/internal/ready"
)

// Platform is bex running on this machine.
type Platform struct {
	cfg  Config
	bins Binaries
	sup  *supervise.Supervisor
	lock *os.File

	containerdAddr string
	kubeconfig     string
	hasAdmin       bool
	buildCgroup    daemons.BuildCgroup
	crdsSaid       bool
	edgePorts      []int // the host ports tenants may reach (allowEdgePorts)
	// The stand-ins' work in the background (startLocalBases).
	basesCancel context.CancelFunc
	basesDone   chan struct{}
}

// Start checks the machine, then starts everything and returns once every part
// answers. Stop ends it all. On error, what was started is stopped again.
func Start(ctx context.Context, cfg Config) (_ *Platform, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bins, err := Preflight(cfg)
	if err != nil {
		return nil, err
	}
	runcLine, err := checkRunc(cfg, bins)
	if err != nil {
		return nil, err
	}
	// Everything bex writes in the state dir is root's alone (0700 and 0600) but
	// ca.pem, which users give to curl and browsers: the state dir itself is
	// 0711, so that a path known (ca.pem) opens and nothing can be listed. A
	// state dir made by an older bex is tightened here. Nothing of the apps
	// passes through it: containerd's bundles are in /run/bex.
	if err := os.MkdirAll(cfg.StateDir, 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(cfg.StateDir, 0o711); err != nil {
		return nil, err
	}
	p := &Platform{cfg: cfg, bins: bins, sup: supervise.New(cfg.Log), kubeconfig: filepath.Join(cfg.StateDir, "kubeconfig")}
	if err := p.takeLock(); err != nil {
		return nil, err
	}
	fmt.Fprint(cfg.Out, runcLine)
	defer func() {
		if err != nil {
			_ = p.Stop()
		}
	}()
	fmt.Fprintf(cfg.Out, "bex up: state in %s, logs in %s\n", cfg.StateDir, p.logDir())
	p.protect()
	if err := p.startDaemons(ctx); err != nil {
		return nil, err
	}
	if err := p.startAPI(ctx); err != nil {
		return nil, err
	}
	if err := p.startComponents(ctx); err != nil {
		return nil, err
	}
	p.printInstructions()
	if p.cfg.LocalBases {
		p.startLocalBases()
	}
	p.releaseStartupMemory()
	return p, nil
}

// Stop stops everything, the last started first, and releases the state dir.
func (p *Platform) Stop() error {
	fmt.Fprintln(p.cfg.Out, "bex up: stopping")
	p.stopLocalBases() // before containerd stops: it imports into it
	err := p.sup.Stop()
	if len(p.edgePorts) > 0 {
		err = errors.Join(err, tenantnet.DisallowHostPorts(context.Background(), tenantnet.DefaultConfig(), p.edgePorts...))
	}
	if p.lock != nil {
		p.lock.Close()
	}
	return err
}

func (p *Platform) logDir() string { return filepath.Join(p.cfg.StateDir, "logs") }

// takeLock makes sure one bex up uses a state dir at a time. The lock is a flock:
// the kernel releases it when the process ends, however it ends.
func (p *Platform) takeLock() error {
	path := filepath.Join(p.cfg.StateDir, "up.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	_ = f.Chmod(0o600)
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		return fmt.Errorf("another bex up (pid %s) is running on %s: stop it first, or pass another --state-dir", strings.TrimSpace(string(holder)), p.cfg.StateDir)
	}
	_ = f.Truncate(0)
	fmt.Fprintf(f, "%d\n", os.Getpid())
	p.lock = f
	return nil
}

// start starts one child and says so.
func (p *Platform) start(ctx context.Context, proc supervise.Process, what string) error {
	if proc.LogPath == "" {
		proc.LogPath = filepath.Join(p.logDir(), proc.Name+".log")
	}
	proc.OOMScoreAdj = oomScoreAdj[proc.Name]
	proc = p.withGoMemory(proc)
	began := time.Now()
	fmt.Fprintf(p.cfg.Out, "==> %-15s starting: %s\n", proc.Name, what)
	pid, err := p.sup.Start(ctx, proc)
	if err != nil {
		return err
	}
	fmt.Fprintf(p.cfg.Out, "    %-15s ready in %s (pid %d)\n", proc.Name, time.Since(began).Round(time.Millisecond), pid)
	return nil
}

func (p *Platform) startDaemons(ctx context.Context) error {
	p.containerdAddr = p.cfg.ContainerdAddr
	if p.containerdAddr == "" {
		// The build cgroup buildkitd's steps go to (limitBuildSteps makes it): a
		// step that names another cgroup parent is put back there by the wrapper.
		buildCgroup := daemons.BuildCgroupFor(filepath.Join(p.cfg.StateDir, "buildkitd"), 0).Name
		d := daemons.Containerd{Dir: filepath.Join(p.cfg.StateDir, "containerd"), Runc: p.bins["runc"], Jq: p.bins["jq"],
			TenantOOMScoreAdj: TenantOOMScoreAdj, BuildCgroup: buildCgroup}
		args, err := d.WriteConfig()
		if err != nil {
			return err
		}
		p.containerdAddr = d.Address()
		err = p.start(ctx, supervise.Process{
			Name: "containerd", Path: p.bins["containerd"], Args: args, Env: d.Env(), Ready: d.Ready,
			// The shims of the apps' containers are stopped with the deployer; these
			// are whatever is left (a build's), found by this containerd's socket.
			AfterStop: func() { daemons.KillProcessesWithArg(d.Address()); d.RemoveState() },
		}, "runs the apps' containers, "+d.Address())
		if err != nil {
			return err
		}
	}
	if p.cfg.BusyboxBase || p.cfg.LocalBases {
		if err := p.busyboxBase(ctx); err != nil {
			return err
		}
	}
	if p.cfg.LocalBases {
		// Made after bex is up (startLocalBases); an earlier start's word on them
		// is not this one's.
		if _, err := p.runPath(""); err != nil {
			return err
		}
		if err := os.Remove(p.basesReadyPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	tenantNet := tenantnet.DefaultConfig()
	tenantNet.AllowEgress = p.cfg.AllowTenantEgress
	b := daemons.Buildkitd{Dir: filepath.Join(p.cfg.StateDir, "buildkitd"), ContainerdAddress: p.containerdAddr, Namespace: ContainerdNamespace,
		TenantNet: &tenantNet}
	if err := p.limitBuildSteps(&b); err != nil {
		return err
	}
	if err := p.boundBuildCache(&b); err != nil {
		return err
	}
	// Build steps and apps each in a network namespace of their own, behind bex's
	// filter rules: installed before the first of them can run.
	if err := b.InstallNetwork(ctx); err != nil {
		return err
	}
	opened := "none"
	if len(p.cfg.AllowTenantEgress) > 0 {
		opened = p.egressArgs()[1]
	}
	fmt.Fprintf(p.cfg.Out, "    %-15s apps and builds reach the Internet and DNS, not the LAN nor link-local addresses (--allow-tenant-egress: %s)\n", "", opened)
	if err := p.allowEdgePorts(ctx); err != nil {
		return err
	}
	args, err := b.WriteConfig()
	if err != nil {
		return err
	}
	return p.start(ctx, supervise.Process{Name: "buildkitd", Path: p.bins["buildkitd"], Args: args, Ready: b.Ready,
		AfterStop: func() { _ = p.buildCgroup.Remove() }}, "builds images into containerd")
}

// allowEdgePorts lets tenants reach the edge's public ports on this machine's own
// addresses, so that an app calls another (or itself) at its public URL as from
// anywhere else; every other port of the host stays out of their reach. An edge on
// loopback needs nothing: a tenant's loopback is its own.
func (p *Platform) allowEdgePorts(ctx context.Context) error {
	for _, addr := range []string{p.cfg.HTTPAddr, p.cfg.HTTPSAddr} {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			continue // Validate refused a bad address before this
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() || host == "localhost" {
			continue
		}
		n, err := strconv.Atoi(port)
		if err != nil {
			continue
		}
		if err := tenantnet.AllowHostPorts(ctx, tenantnet.DefaultConfig(), n); err != nil {
			return err
		}
		p.edgePorts = append(p.edgePorts, n)
	}
	return nil
}

// egressArgs pass --allow-tenant-egress on to a child that installs the
// tenants' rules.
func (p *Platform) egressArgs() []string {
	if len(p.cfg.AllowTenantEgress) == 0 {
		return nil
	}
	var s []string
	for _, r := range p.cfg.AllowTenantEgress {
		s = append(s, r.String())
	}
	return []string{"--allow-tenant-egress", strings.Join(s, ",")}
}

// limitBuildSteps makes the cgroup build steps run under, with --build-memory as its
// limit (daemons.BuildCgroup), and points buildkitd's worker at it.
// pushBoundArgs pass bex up's bounds of a push on to the gitserver; a bound left
// at 0 keeps the gitserver's default.
func (p *Platform) pushBoundArgs() []string {
	var args []string
	if p.cfg.MaxObjectBytes > 0 {
		args = append(args, "--max-object-size", strconv.FormatInt(p.cfg.MaxObjectBytes, 10))
	}
	if p.cfg.MaxPushObjects > 0 {
		args = append(args, "--max-push-objects", strconv.FormatInt(p.cfg.MaxPushObjects, 10))
	}
	if p.cfg.MinFreeDiskBytes > 0 {
		args = append(args, "--min-free-disk", strconv.FormatInt(p.cfg.MinFreeDiskBytes, 10))
	}
	return args
}

func (p *Platform) limitBuildSteps(b *daemons.Buildkitd) error {
	limit := p.cfg.BuildMemory
	if limit == 0 {
		limit = daemons.DefaultBuildMemory()
	}
	p.buildCgroup = daemons.BuildCgroupFor(b.Dir, limit)
	if err := p.buildCgroup.Setup(); err != nil {
		return fmt.Errorf("limiting the memory of build steps: %w", err)
	}
	b.CgroupParent = p.buildCgroup.Name
	fmt.Fprintf(p.cfg.Out, "    %-15s build steps share %d MiB of memory (--build-memory) and %d tasks (each at most %d), cgroup %s\n", "", limit>>20, daemons.BuildPidsMax(), daemons.StepPidsMax(), p.buildCgroup.Dir())
	return nil
}

// boundBuildCache gives buildkitd's GC the build cache's bound and keep duration
// (--build-cache-size, --build-cache-keep); the default bound is measured on the
// state dir's file system now, so that it follows the disk bex up runs on.
func (p *Platform) boundBuildCache(b *daemons.Buildkitd) error {
	size := p.cfg.BuildCacheBytes
	if size == 0 {
		var err error
		if size, err = daemons.DefaultBuildCacheBytes(p.cfg.StateDir); err != nil {
			return fmt.Errorf("--build-cache-size: %w", err)
		}
	}
	b.CacheMaxBytes, b.CacheKeep = size, p.cfg.BuildCacheKeep
	keep := "no age limit"
	if b.CacheKeep > 0 {
		keep = "unused for " + b.CacheKeep.String()
	}
	fmt.Fprintf(p.cfg.Out, "    %-15s build cache at most %d MiB, or %s (--build-cache-size, --build-cache-keep)\n", "", size>>20, keep)
	return nil
}

// buildStepArgs tell the gitserver the build steps' limit and cgroup, so that it
// reports a step killed by it as such.
func (p *Platform) buildStepArgs() []string {
	return []string{"--build-memory", strconv.FormatInt(p.buildCgroup.Memory, 10), "--build-cgroup", p.buildCgroup.Dir()}
}

// releaseNetworks tears down the network namespaces the local runtime keeps in dir.
func releaseNetworks(dir string) error {
	n, err := tenantnet.NewAppsNetwork(tenantnet.DefaultConfig())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return n.DetachAll(ctx, dir)
}

// busyboxBase imports Debian's busybox as the busybox base image, unless
// containerd has one (imported before, or pulled).
func (p *Platform) busyboxBase(ctx context.Context) error {
	cl, err := daemons.ContainerdClient(p.containerdAddr, ContainerdNamespace)
	if err != nil {
		return err
	}
	defer cl.Close()
	if ok, err := baseimage.HasBusybox(ctx, cl); err != nil || ok {
		return err
	}
	start := time.Now()
	dir, err := os.MkdirTemp(p.cfg.StateDir, "busybox-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if _, err := baseimage.ImportBusybox(ctx, cl, p.bins["busybox"], dir); err != nil {
		return fmt.Errorf("busybox base: %w", err)
	}
	fmt.Fprintf(p.cfg.Out, "    %-15s %s from %s in %s: builds FROM busybox use it\n", "busybox base", baseimage.BusyboxRef,
		p.bins["busybox"], time.Since(start).Round(time.Millisecond))
	return nil
}

func (p *Platform) startAPI(ctx context.Context) error {
	cp, err := controlplane.Prepare(controlplane.Config{
		Dir:  filepath.Join(p.cfg.StateDir, "controlplane"),
		Etcd: p.bins["etcd"], APIServer: p.bins["kube-apiserver"], Log: p.cfg.Log,
	})
	if err != nil {
		return err
	}
	if err := p.start(ctx, cp.Etcd(), "the API's storage"); err != nil {
		return err
	}
	go cp.WatchSpace(ctx) // etcd's NOSPACE alarm, recovered while bex runs
	if err := p.start(ctx, cp.APIServer(), "the App API, "+cp.Host()); err != nil {
		return err
	}
	if err := cp.WriteKubeconfig(p.kubeconfig); err != nil {
		return err
	}
	rc, err := cp.RESTConfig()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, apiSetupTimeout)
	defer cancel()
	return retryTransient(ctx, func(ctx context.Context) error { return p.setupAPI(ctx, rc) })
}

// apiSetupTimeout bounds the CRDs and admin keys at start, retries included.
const apiSetupTimeout = 2 * time.Minute

// setupAPI installs the CRDs, waits until discovery lists their kinds, then gives
// the admin keys with a client made after that. Established comes before
// discovery lists a kind: a client that looked the kind up in between failed that
// call with `no matches for kind "User"` (seen 2 starts in 8; reproduced once in 15
// installs on this machine), which ended bex up.
func (p *Platform) setupAPI(ctx context.Context, rc *rest.Config) error {
	c, err := newClient(rc)
	if err != nil {
		return err
	}
	if err := crds.Install(ctx, c); err != nil {
		return err
	}
	if err := crds.WaitServed(ctx, rc); err != nil {
		return err
	}
	if c, err = newClient(rc); err != nil {
		return err
	}
	if !p.crdsSaid {
		fmt.Fprintf(p.cfg.Out, "    %-15s CRDs installed; kubectl --kubeconfig %s get apps\n", "", p.kubeconfig)
		p.crdsSaid = true
	}
	return p.ensureAdmins(ctx, c)
}

func newClient(rc *rest.Config) (client.Client, error) {
	s := k8sruntime.NewScheme()
	for _, add := range []func(*k8sruntime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, appv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return client.New(rc, client.Options{Scheme: s})
}

// ensureAdmins gives the admin keys to the admin user and finds out whether any
// admin exists, for the instructions.
func (p *Platform) ensureAdmins(ctx context.Context, c client.Client) error {
	changed, err := backend.EnsureAdminKeys(ctx, c, AdminUser, p.cfg.AdminKeys)
	if err != nil {
		return err
	}
	if changed > 0 {
		fmt.Fprintf(p.cfg.Out, "    %-15s %d key(s) added to user %s (admin)\n", "", changed, AdminUser)
	}
	p.hasAdmin, err = backend.HasAdmin(ctx, c)
	return err
}

// component is a bex subcommand run as a child of bex up.
func (p *Platform) component(name string, args []string, ready func(context.Context) error) supervise.Process {
	common := []string{"--state-dir", p.cfg.StateDir, "--kubeconfig", p.kubeconfig, "--namespace", Namespace}
	if p.cfg.LogFormat != "" {
		common = append(common, "--log-format", p.cfg.LogFormat)
	}
	return supervise.Process{
		Name:  name,
		Path:  p.cfg.Bex,
		Args:  append(append([]string{name}, common...), args...),
		Ready: ready,
		// A child's command line is all it is told: every setting it needs is one of
		// the flags above. The BEX_* variables bex up was started with are dropped on
		// purpose: bex sets any flag from BEX_<FLAG> (bindEnv), and bex up's
		// variables (BEX_STATE_DIR, BEX_BASE_DOMAIN, BEX_HTTPS_ADDR, ...) name flags
		// that the children also have, so passing them on would set a child's flag
		// that bex up chose not to pass, behind its back. KUBECONFIG likewise: the
		// children talk to bex up's API server, which --kubeconfig names.
		KeepEnv: func(kv string) bool { return !strings.HasPrefix(kv, "BEX_") && !strings.HasPrefix(kv, "KUBECONFIG=") },
	}
}

func (p *Platform) startComponents(ctx context.Context) error {
	// The deployer's probes on a socket only root reaches (STATE/run is 0700).
	health, err := p.runPath("deployer-health.sock")
	if err != nil {
		return err
	}
	deployer := p.component("deployer", []string{
		"--runtime", "local",
		"--containerd-addr", p.containerdAddr,
		"--containerd-namespace", ContainerdNamespace,
		"--base-domain", p.cfg.BaseDomain,
		"--https-port", port(p.cfg.HTTPSAddr),
		"--metrics-addr", "0",
		"--health-addr", "unix:" + health,
	}, ready.UnixHTTP(health, "/readyz"))
	// The deployer's local runtime installs the tenants' rules too: with the
	// same ranges, or it would close what bex up opened.
	deployer.Args = append(deployer.Args, p.egressArgs()...)
	deployer.Args = append(deployer.Args, p.databaseImageArgs()...)
	// Stopping the deployer leaves the apps' containers running (a restarted deployer
	// adopts them); bex up is stopping everything, so it stops them too.
	deployer.AfterStop = func() {
		if err := daemons.KillTasks(p.containerdAddr, ContainerdNamespace); err != nil {
			p.cfg.Log.Warn("stopping the apps' containers", "err", err)
		}
		// Their network namespaces go too (CNI DEL, unmount): the next start's
		// deployer attaches the adopted containers again.
		if err := releaseNetworks(filepath.Join(p.cfg.StateDir, "runtime", "net")); err != nil {
			p.cfg.Log.Warn("releasing the apps' network namespaces", "err", err)
		}
		// And their volumes are unmounted: the next start's deployer mounts them
		// again before it starts any container.
		if err := local.UnmountVolumes(filepath.Join(p.cfg.StateDir, "runtime")); err != nil {
			p.cfg.Log.Warn("unmounting the apps' volumes", "err", err)
		}
	}
	if err := p.start(ctx, deployer, "runs each App's release with containerd"); err != nil {
		return err
	}

	// The edge's request figures, for the gitserver's metrics and diagnose, on a
	// socket beside the deployer's: root's alone, out of the tenants' reach.
	stats, err := p.runPath("edge-stats.sock")
	if err != nil {
		return err
	}
	edgeArgs := []string{"--http-addr", p.cfg.HTTPAddr, "--https-addr", p.cfg.HTTPSAddr, "--base-domain", p.cfg.BaseDomain,
		"--stats-addr", "unix:" + stats}
	if p.cfg.HooksAddr != "" {
		// Git hosts and agents reach the webhooks and MCP over HTTPS on the base
		// domain, through the edge; the gitserver serves them on plain HTTP.
		edgeArgs = append(edgeArgs, "--platform-backend", dialable(p.cfg.HooksAddr))
	}
	if p.cfg.ACMEEmail != "" {
		edgeArgs = append(edgeArgs, "--acme-email", p.cfg.ACMEEmail)
	}
	if p.cfg.ACMECA != "" {
		edgeArgs = append(edgeArgs, "--acme-ca", p.cfg.ACMECA)
	}
	if p.cfg.TrustedProxies != "" {
		edgeArgs = append(edgeArgs, "--trusted-proxies", p.cfg.TrustedProxies)
	}
	if err := p.start(ctx, p.component("edge", edgeArgs, tcpReady(p.cfg.HTTPAddr, p.cfg.HTTPSAddr)), "HTTPS for every app"); err != nil {
		return err
	}
	if p.localCA() {
		if err := p.linkCA(); err != nil {
			return err
		}
	}

	gitArgs := []string{"--ssh-addr", p.cfg.SSHAddr, "--ssh-url", p.SSHURL(), "--runtime", "local", "--base-domain", p.cfg.BaseDomain,
		"--buildkit-addr", "unix://" + filepath.Join(p.cfg.StateDir, "buildkitd", "buildkitd.sock"),
		// system:df and system:prune read the images where the deployer runs them.
		"--containerd-addr", p.containerdAddr, "--containerd-namespace", ContainerdNamespace,
		"--edge-stats", "unix:" + stats}
	if p.cfg.ImageResolveMode != "" {
		gitArgs = append(gitArgs, "--image-resolve-mode", p.cfg.ImageResolveMode)
	}
	gitArgs = append(gitArgs, p.pushBoundArgs()...)
	if p.cfg.AllowPrivateUpstreams {
		gitArgs = append(gitArgs, "--allow-private-upstreams")
	}
	if p.cfg.AllowPrivateRegistries {
		gitArgs = append(gitArgs, "--allow-private-registries")
	}
	gitArgs = append(gitArgs, p.buildStepArgs()...)
	gitArgs = append(gitArgs, p.planImageArgs()...)
	if p.cfg.HooksAddr != "" {
		gitArgs = append(gitArgs, "--hooks-addr", p.cfg.HooksAddr, "--hooks-url", p.PlatformURL())
	}
	// A push waits for its build and rollout; give the pushes in flight time to end.
	gitArgs = append(gitArgs, p.egressArgs()...) // its one-offs install the rules too
	git := p.component("gitserver", gitArgs, tcpReady(p.cfg.SSHAddr))
	git.Grace = 30 * time.Second
	return p.start(ctx, git, "git push over SSH")
}

// localCA reports whether the edge issues certificates from its local CA
// (edge.UsesLocalCA, the rule bex edge follows).
func (p *Platform) localCA() bool {
	return edge.UsesLocalCA(p.cfg.ACMECA, p.cfg.ACMEEmail, p.cfg.BaseDomain)
}

// CAPath is where the local CA's certificate is, for curl --cacert and browsers.
func (p *Platform) CAPath() string { return filepath.Join(p.cfg.StateDir, "ca.pem") }

// linkCA puts the edge's CA certificate at STATE_DIR/ca.pem, where the docs say: a
// copy, 0644, since the edge's own directory is root's alone (a link into it would
// not open for anyone else). It replaces the link older versions made.
func (p *Platform) linkCA() error {
	data, err := os.ReadFile(filepath.Join(p.cfg.StateDir, "edge", "ca", "ca.pem"))
	if err != nil {
		return fmt.Errorf("the edge made no CA certificate: %w", err)
	}
	tmp := p.CAPath() + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p.CAPath())
}

// sshHost is the host and port users reach the SSH server at: the listen address,
// or this machine's name when it listens on every address.
func (p *Platform) sshHost() (host, port string) {
	host, port, _ = net.SplitHostPort(p.cfg.SSHAddr)
	if host == "" || host == "0.0.0.0" || host == "::" {
		host, _ = os.Hostname()
	}
	return host, port
}

// PlatformURL is where the edge serves bex's own endpoints: https://BASE-DOMAIN[:PORT].
func (p *Platform) PlatformURL() string {
	u := "https://" + p.cfg.BaseDomain
	if hp := port(p.cfg.HTTPSAddr); hp != "443" {
		u += ":" + hp
	}
	return u
}

// SSHURL is the server's address as git and ssh take it.
func (p *Platform) SSHURL() string {
	host, port := p.sshHost()
	return "ssh://git@" + net.JoinHostPort(host, port)
}

func (p *Platform) printInstructions() {
	host, sshPort := p.sshHost()
	remote := p.SSHURL() + "/<app>"
	if sshPort == "22" {
		remote = fmt.Sprintf("git@%s:<app>", host)
	}
	url := "https://<app>." + p.cfg.BaseDomain
	if hp := port(p.cfg.HTTPSAddr); hp != "443" {
		url += ":" + hp
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nbex is up.\n")
	if !p.hasAdmin {
		fmt.Fprintf(&b, "  No admin yet. Add your key (once), then start again:\n")
		fmt.Fprintf(&b, "      bex up --admin-key ~/.ssh/id_ed25519.pub ...\n")
		fmt.Fprintf(&b, "  or, while it runs:\n")
		fmt.Fprintf(&b, "      bex users add admin --admin --key ~/.ssh/id_ed25519.pub --state-dir %s\n", p.cfg.StateDir)
	}
	fmt.Fprintf(&b, "  Add more keys (a teammate's, a CI's):\n")
	fmt.Fprintf(&b, "      ssh -p %s git@%s keys:add NAME < KEY.pub      (users:add NAME for another user)\n", sshPort, host)
	fmt.Fprintf(&b, "  Push an app from its git repository:\n")
	fmt.Fprintf(&b, "      git remote add bex %s\n", remote)
	fmt.Fprintf(&b, "      git push bex main\n")
	fmt.Fprintf(&b, "  It answers at %s", url)
	if p.localCA() {
		fmt.Fprintf(&b, " (certificates from the local CA: curl --cacert %s)", p.CAPath())
	}
	fmt.Fprintf(&b, "\n  Manage apps: ssh -p %s git@%s help        (docs/commands.md; --json for scripts)\n", sshPort, host)
	fmt.Fprintf(&b, "  The API:     kubectl --kubeconfig %s get apps,releases\n", p.kubeconfig)
	if p.cfg.HooksAddr != "" {
		hooks := p.PlatformURL()
		fmt.Fprintf(&b, "  Webhooks:    %s/hooks/<app>    (ssh -p %s git@%s webhooks:secret <app>)\n", hooks, sshPort, host)
		fmt.Fprintf(&b, "  Agents:      %s/mcp            (MCP; a token: ssh -p %s git@%s tokens:create NAME)\n", hooks, sshPort, host)
	}
	fmt.Fprintf(&b, "  Ctrl-C stops everything; starting again brings every app back.\n")
	fmt.Fprint(p.cfg.Out, b.String())
}

// runPath is the path of name in STATE/run, the directory of bex's own sockets:
// 0700, so that only root reaches them.
func (p *Platform) runPath(name string) (string, error) {
	dir := filepath.Join(p.cfg.StateDir, "run")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", err
	}
	return filepath.Join(dir, name), nil
}

// tcpReady succeeds once every address accepts connections (a wildcard host
// dialled on loopback).
func tcpReady(addrs ...string) func(context.Context) error {
	dial := make([]string, len(addrs))
	for i, a := range addrs {
		dial[i] = dialable(a)
	}
	return ready.TCP(dial...)
}
