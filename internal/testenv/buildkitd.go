package testenv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	bkclient "github.com/moby/buildkit/client"
	"github.com/tonistiigi/fsutil"

	"bex.co/bex/internal/machine/daemons"
	"bex.co/bex/internal/machine/tenantnet"
)

// Buildkitd is a buildkitd whose containerd worker builds into a Containerd, in
// containerd namespace Namespace.
type Buildkitd struct {
	// Address is its gRPC address, "unix://<path>".
	Address string
	// Containerd is the containerd it builds into.
	Containerd *Containerd
	// StepCgroup is the directory of the cgroup its build steps run under, and
	// StepMemory that cgroup's limit (WithBuildMemory); empty without a limit.
	// StepPidsCgroup is its directory in the pids hierarchy (StepCgroup on
	// cgroup v2), whose pids.max bounds the steps' tasks together.
	StepCgroup     string
	StepMemory     int64
	StepPidsCgroup string

	proc   *process
	cgroup *daemons.BuildCgroup
}

// BuildkitdOption changes how StartBuildkitd configures the daemon.
type BuildkitdOption func(*buildkitdOptions)

type buildkitdOptions struct {
	daemons.Buildkitd
	buildMemory int64
	tcp         *BuildkitdTLS
}

// BuildkitdTLS is a TCP listener with mutual TLS, as buildkitd has on a cluster
// (infra/bex/buildkitd.yaml): buildkitd's own --tlscacert, --tlscert and
// --tlskey flags.
type BuildkitdTLS struct {
	// Addr is host:port, e.g. 127.0.0.1:PORT.
	Addr string
	// CA verifies the clients' certificates (buildkitd then requires one); Cert
	// and Key are buildkitd's own. Files of PEM.
	CA, Cert, Key string
}

// WithTCPTLS adds a TCP listener with mutual TLS beside the unix socket, which
// stays without TLS (buildkitd has none on unix sockets) and is what Ready uses.
func WithTCPTLS(l BuildkitdTLS) BuildkitdOption {
	return func(b *buildkitdOptions) { b.tcp = &l }
}

// WithHTTPRegistry lets buildkitd push to and pull from host (e.g. 127.0.0.1:5000)
// over plain HTTP: a test registry on loopback has no TLS.
func WithHTTPRegistry(host string) BuildkitdOption {
	return func(b *buildkitdOptions) { b.HTTPRegistries = append(b.HTTPRegistries, host) }
}

// WithBuildMemory puts the build steps under a cgroup of their own limited to
// limit bytes, as bex up does (daemons.BuildCgroup).
func WithBuildMemory(limit int64) BuildkitdOption {
	return func(b *buildkitdOptions) { b.buildMemory = limit }
}

// WithBuildCache bounds the build cache as bex up does (daemons.Buildkitd's
// CacheMaxBytes and CacheKeep, buildkitd's GC policy).
func WithBuildCache(maxBytes int64, keep time.Duration) BuildkitdOption {
	return func(b *buildkitdOptions) { b.CacheMaxBytes, b.CacheKeep = maxBytes, keep }
}

// WithTenantNet puts the RUN steps on cfg's builds network, behind cfg's rules
// (installed before the daemon starts), instead of the default one's: for a test
// whose rules (chains, subnets, allowed ranges) must be its own, which another
// test installing the default rules meanwhile cannot change.
func WithTenantNet(cfg tenantnet.Config) BuildkitdOption {
	return func(b *buildkitdOptions) { b.TenantNet = &cfg }
}

// StartBuildkitd starts buildkitd from bin/ with its state under dir, building into c.
func StartBuildkitd(dir string, c *Containerd, opts ...BuildkitdOption) (*Buildkitd, error) {
	bin, err := Binary("buildkitd")
	if err != nil {
		return nil, err
	}
	// RUN steps on the builds' network, as under bex up.
	tenantNet := tenantnet.DefaultConfig()
	o := buildkitdOptions{Buildkitd: daemons.Buildkitd{Dir: dir, ContainerdAddress: c.Address, Namespace: Namespace, TenantNet: &tenantNet}}
	for _, opt := range opts {
		opt(&o)
	}
	d := o.Buildkitd
	b := &Buildkitd{Address: d.Address(), Containerd: c}
	if o.buildMemory > 0 {
		cg := daemons.BuildCgroupFor(dir, o.buildMemory)
		if err := cg.Setup(); err != nil {
			return nil, err
		}
		d.CgroupParent = cg.Name
		b.cgroup, b.StepCgroup, b.StepMemory, b.StepPidsCgroup = &cg, cg.Dir(), o.buildMemory, cg.PidsDir()
	}
	if err := d.InstallNetwork(context.Background()); err != nil {
		return nil, err
	}
	args, err := d.WriteConfig()
	if o.tcp != nil {
		// --addr replaces the configuration's addresses: the socket is named again.
		args = append(args, "--addr", d.Address(), "--addr", "tcp://"+o.tcp.Addr,
			"--tlscacert", o.tcp.CA, "--tlscert", o.tcp.Cert, "--tlskey", o.tcp.Key)
	}
	if err == nil {
		b.proc, err = startProcess(dir, "buildkitd", bin, args)
	}
	if err != nil {
		if b.cgroup != nil {
			_ = b.cgroup.Remove()
		}
		return nil, err
	}
	err = b.proc.waitReady(30*time.Second, d.Ready)
	if err != nil {
		_ = b.Stop()
		return nil, err
	}
	return b, nil
}

// Client connects to the daemon.
func (b *Buildkitd) Client(ctx context.Context) (*bkclient.Client, error) {
	return bkclient.New(ctx, b.Address)
}

// Stop stops buildkitd, and removes its build steps' cgroup.
func (b *Buildkitd) Stop() error {
	err := b.proc.stop(10 * time.Second)
	if b.cgroup != nil {
		err = errors.Join(err, b.cgroup.Remove())
	}
	return err
}

// SharedBuildkitd returns the buildkitd of this test binary, started on first use
// with SharedContainerd as its worker.
func SharedBuildkitd(t testing.TB) *Buildkitd {
	t.Helper()
	c := SharedContainerd(t)
	return Shared(t, "buildkitd", func(dir string) (*Buildkitd, func() error, error) {
		b, err := StartBuildkitd(dir, c)
		if err != nil {
			return nil, nil, err
		}
		return b, b.Stop, nil
	})
}

// BuildImage builds the Dockerfile in dockerfileDir, with contextDir as its build
// context, into containerd as image name (unpacked, ready to run). Base images are
// resolved locally: nothing is pulled. It returns the image's digest and, whatever
// happened, the steps' output, which says why a build failed.
func (b *Buildkitd) BuildImage(ctx context.Context, contextDir, dockerfileDir, name string) (digest, log string, err error) {
	c, err := b.Client(ctx)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	contextFS, err := fsutil.NewFS(contextDir)
	if err != nil {
		return "", "", err
	}
	dockerfileFS, err := fsutil.NewFS(dockerfileDir)
	if err != nil {
		return "", "", err
	}
	ch := make(chan *bkclient.SolveStatus)
	var out strings.Builder
	done := make(chan struct{})
	go func() {
		defer close(done)
		for st := range ch {
			for _, v := range st.Vertexes {
				if v.Completed != nil && v.Cached {
					fmt.Fprintf(&out, "CACHED %s\n", v.Name) // as buildctl's plain progress says it
				} else if v.Completed != nil {
					fmt.Fprintf(&out, "%s\n", v.Name)
				}
				if v.Error != "" {
					fmt.Fprintf(&out, "%s: %s\n", v.Name, v.Error)
				}
			}
			for _, l := range st.Logs {
				out.Write(l.Data)
			}
		}
	}()
	resp, err := c.Solve(ctx, nil, bkclient.SolveOpt{
		Frontend:      "dockerfile.v0",
		FrontendAttrs: map[string]string{"filename": "Dockerfile", "image-resolve-mode": "local"},
		LocalMounts:   map[string]fsutil.FS{"context": contextFS, "dockerfile": dockerfileFS},
		Exports: []bkclient.ExportEntry{{
			Type:  bkclient.ExporterImage,
			Attrs: map[string]string{"name": name, "unpack": "true"},
		}},
	}, ch)
	<-done
	if err != nil {
		return "", out.String(), fmt.Errorf("build %s: %w", name, err)
	}
	return resp.ExporterResponse["containerimage.digest"], out.String(), nil
}
