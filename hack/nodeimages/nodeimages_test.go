package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// k8sNamespace is the namespace the kubelet's containerd (CRI) keeps its images in.
const k8sNamespace = "k8s.io"

// TestNodeImages builds the five images, imports each with `ctr -n k8s.io images
// import` into a real containerd, and runs each as the cluster does.
func TestNodeImages(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	start := time.Now()
	written, err := Build(context.Background(), Options{Root: root, Out: out, Log: t.Output()})
	if err != nil {
		t.Fatal(err)
	}
	cold := time.Since(start)
	start = time.Now()
	again, err := Build(context.Background(), Options{Root: root, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	warm := time.Since(start)
	t.Logf("measure: nodeimages build into an empty DIR %v, again with nothing changed %v", cold.Round(time.Millisecond), warm.Round(time.Millisecond))
	for i, w := range written {
		t.Logf("measure: %s %s %.1f MiB", w.Image, filepath.Base(w.Archive), float64(w.Size)/(1<<20))
		if w.Skipped {
			t.Errorf("%s: skipped in an empty DIR", w.Image)
		}
		if !again[i].Skipped {
			t.Errorf("%s: written again with nothing changed", w.Image)
		}
	}

	versions, err := readEnv(filepath.Join(root, "hack", "versions.env"))
	if err != nil {
		t.Fatal(err)
	}
	images, err := readEnv(filepath.Join(out, "images.env"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"PAUSE_IMAGE":      "bex.local/pause:3.10",
		"COREDNS_IMAGE":    "bex.local/coredns:" + versions["COREDNS_VERSION"],
		"REGISTRY_IMAGE":   "docker.io/library/registry:3",
		"BUILDKIT_IMAGE":   "docker.io/moby/buildkit:" + versions["BUILDKIT_VERSION"],
		"PAUSE_ARCHIVE":    filepath.Join(out, "pause.tar"),
		"COREDNS_ARCHIVE":  filepath.Join(out, "coredns.tar"),
		"REGISTRY_ARCHIVE": filepath.Join(out, "registry.tar"),
		"BUILDKIT_ARCHIVE": filepath.Join(out, "buildkit.tar"),
		"CNPG_IMAGE":       "bex.local/cloudnative-pg:" + strings.TrimPrefix(versions["CNPG_VERSION"], "v"),
		"CNPG_ARCHIVE":     filepath.Join(out, "cloudnative-pg.tar"),
	}
	for k, v := range want {
		if images[k] != v {
			t.Errorf("images.env: %s=%q, want %q", k, images[k], v)
		}
	}
	if len(images) != len(want) {
		t.Errorf("images.env has %d lines, want %d: %v", len(images), len(want), images)
	}
	if t.Failed() {
		t.FailNow()
	}

	// The images run as the one-node cluster's containerd runs them: bin/runc
	// without bex's wrapper, which takes a container without a user namespace
	// (buildkitd's here, privileged) for a build step and confines it.
	c, err := testenv.StartContainerd(t.TempDir(), testenv.Unconfined())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	ctrBin, err := testenv.Binary("ctr")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := containerd.New(c.Address, containerd.WithDefaultNamespace(k8sNamespace))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), k8sNamespace), 5*time.Minute)
	defer cancel()
	for _, k := range []string{"PAUSE", "COREDNS", "REGISTRY", "BUILDKIT", "CNPG"} {
		start := time.Now()
		msg, err := exec.CommandContext(ctx, ctrBin, "-a", c.Address, "-n", k8sNamespace, "images", "import", images[k+"_ARCHIVE"]).CombinedOutput()
		if err != nil {
			t.Fatalf("ctr images import %s: %v\n%s", images[k+"_ARCHIVE"], err, msg)
		}
		if _, err := cl.GetImage(ctx, images[k+"_IMAGE"]); err != nil {
			t.Fatalf("after ctr import of %s (it said %q): %v", images[k+"_ARCHIVE"], strings.TrimSpace(string(msg)), err)
		}
		t.Logf("measure: ctr import %s %v", images[k+"_IMAGE"], time.Since(start).Round(time.Millisecond))
	}

	t.Run("pause", func(t *testing.T) {
		r := launch(ctx, t, cl, c, images["PAUSE_IMAGE"], nil)
		testenv.Eventually(t, 10*time.Second, "pause says it waits", func() error {
			if st := r.exited(); st != "" {
				t.Fatalf("pause ended (%s): %s", st, r.out.String())
			}
			if !strings.Contains(r.out.String(), "pause: waiting") {
				return fmt.Errorf("it printed %q", r.out.String())
			}
			return nil
		})
		st, err := r.task.Status(ctx)
		if err != nil || st.Status != containerd.Running {
			t.Fatalf("pause: status %v, %v; want running", st.Status, err)
		}
		if err := r.task.Kill(ctx, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := r.wait(ctx, t, 10*time.Second); code != 0 {
			t.Fatalf("pause exited %d on SIGTERM, want 0; it printed %q", code, r.out.String())
		}
	})

	t.Run("coredns", func(t *testing.T) {
		r := launch(ctx, t, cl, c, images["COREDNS_IMAGE"], []string{"-version"})
		if code := r.wait(ctx, t, 30*time.Second); code != 0 {
			t.Fatalf("coredns -version exited %d: %s", code, r.out.String())
		}
		v := "CoreDNS-" + strings.TrimPrefix(versions["COREDNS_VERSION"], "v")
		if !strings.Contains(r.out.String(), v) {
			t.Fatalf("coredns -version printed %q, want %s", r.out.String(), v)
		}
	})

	t.Run("coredns serves", func(t *testing.T) {
		port, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		cfg := t.TempDir()
		corefile := fmt.Sprintf(".:%d {\n  bind 127.0.0.1\n  hosts {\n    10.96.0.10 bex-check.test\n  }\n}\n", port)
		if err := os.WriteFile(filepath.Join(cfg, "Corefile"), []byte(corefile), 0o644); err != nil {
			t.Fatal(err)
		}
		// Kubernetes' CoreDNS Deployment's args.
		r := launch(ctx, t, cl, c, images["COREDNS_IMAGE"], []string{"-conf", "/etc/coredns/Corefile"},
			oci.WithMounts([]specs.Mount{bind(cfg, "/etc/coredns", "ro")}))
		resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", port))
		}}
		testenv.Eventually(t, 30*time.Second, "coredns answers for bex-check.test", func() error {
			if st := r.exited(); st != "" {
				t.Fatalf("coredns ended (%s): %s", st, r.out.String())
			}
			addrs, err := resolver.LookupHost(ctx, "bex-check.test.")
			if err != nil {
				return err
			}
			if len(addrs) != 1 || addrs[0] != "10.96.0.10" {
				return fmt.Errorf("bex-check.test: %v", addrs)
			}
			return nil
		})
	})

	t.Run("registry", func(t *testing.T) {
		port, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		cfg := filepath.Join(dir, "config")
		data := filepath.Join(dir, "data")
		for _, d := range []string{cfg, data} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		config := fmt.Sprintf("version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: /var/lib/registry\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:%d\n", port)
		if err := os.WriteFile(filepath.Join(cfg, "config.yml"), []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
		mounts := oci.WithMounts([]specs.Mount{bind(cfg, "/etc/distribution", "ro"), bind(data, "/var/lib/registry", "rw")})
		// infra/bex/registry.yaml's Deployment: args [serve, CONFIG].
		r := launch(ctx, t, cl, c, images["REGISTRY_IMAGE"], []string{"serve", "/etc/distribution/config.yml"}, mounts)
		url := fmt.Sprintf("http://127.0.0.1:%d/v2/", port)
		testenv.Eventually(t, 30*time.Second, "the registry answers GET /v2/ with 200", func() error {
			if st := r.exited(); st != "" {
				t.Fatalf("registry ended (%s): %s", st, r.out.String())
			}
			resp, err := http.Get(url)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("GET %s: %s", url, resp.Status)
			}
			return nil
		})
		// garbage-collect fails on a registry that holds no repository yet
		// ("Path not found: /docker/registry/v2/repositories"): push one.
		ref, err := name.ParseReference(fmt.Sprintf("127.0.0.1:%d/nodeimages/random:1", port))
		if err != nil {
			t.Fatal(err)
		}
		img, err := random.Image(1024, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
			t.Fatalf("push to the registry: %v", err)
		}
		if err := r.task.Kill(ctx, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		r.wait(ctx, t, 30*time.Second)
		// Its CronJob: args [garbage-collect, --delete-untagged, CONFIG].
		gc := launch(ctx, t, cl, c, images["REGISTRY_IMAGE"], []string{"garbage-collect", "--delete-untagged", "/etc/distribution/config.yml"}, mounts)
		if code := gc.wait(ctx, t, 30*time.Second); code != 0 {
			t.Fatalf("registry garbage-collect exited %d: %s", code, gc.out.String())
		}
	})

	// What each Postgres pod's init container does (CNPG's pkg/specs): the
	// image's /manager copies itself into the pod's /controller, and the copy
	// is the file the operator hashes (operator/manager_amd64), so that the
	// operator sees its instance managers as up to date.
	t.Run("cloudnative-pg bootstrap", func(t *testing.T) {
		ctl := t.TempDir()
		r := launch(ctx, t, cl, c, images["CNPG_IMAGE"], []string{"bootstrap", "/controller/manager"},
			oci.WithMounts([]specs.Mount{bind(ctl, "/controller", "rw")}))
		if code := r.wait(ctx, t, 30*time.Second); code != 0 {
			t.Fatalf("/manager bootstrap /controller/manager exited %d: %s", code, r.out.String())
		}
		got, err := os.ReadFile(filepath.Join(ctl, "manager"))
		if err != nil {
			t.Fatalf("bootstrap copied nothing (%v): %s", err, r.out.String())
		}
		want, err := os.ReadFile(filepath.Join(root, "bin", "cnpg-"+versions["CNPG_VERSION"], "manager"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("the copied manager (%d bytes) is not bin/cnpg-%s/manager (%d bytes)", len(got), versions["CNPG_VERSION"], len(want))
		}
		r = launch(ctx, t, cl, c, images["CNPG_IMAGE"], []string{"version"})
		if code := r.wait(ctx, t, 30*time.Second); code != 0 || !strings.Contains(r.out.String(), strings.TrimPrefix(versions["CNPG_VERSION"], "v")) {
			t.Fatalf("/manager version exited %d, printed %q; want %s", code, r.out.String(), versions["CNPG_VERSION"])
		}
	})

	t.Run("buildkit", func(t *testing.T) {
		// Short: the unix socket's path is at most 107 bytes.
		dir, err := os.MkdirTemp("", "nodeimages-bk-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		cfg, state, run := filepath.Join(dir, "config"), filepath.Join(dir, "state"), filepath.Join(dir, "run")
		for _, d := range []string{cfg, state, run} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		// infra/bex/buildkitd.yaml's configuration, less its registry's name.
		toml := "[worker.oci]\n  enabled = true\n  gc = true\n[worker.containerd]\n  enabled = false\n"
		if err := os.WriteFile(filepath.Join(cfg, "buildkitd.toml"), []byte(toml), 0o644); err != nil {
			t.Fatal(err)
		}
		r := launch(ctx, t, cl, c, images["BUILDKIT_IMAGE"],
			[]string{"--addr=unix:///run/buildkit/buildkitd.sock", "--config=/etc/buildkit/buildkitd.toml"},
			oci.WithPrivileged, oci.WithAllDevicesAllowed, oci.WithHostDevices,
			oci.WithMounts([]specs.Mount{bind(cfg, "/etc/buildkit", "ro"), bind(state, "/var/lib/buildkit", "rw"), bind(run, "/run/buildkit", "rw"),
				// What the CRI gives every container, writable for a privileged
				// one: runc needs it for each step's cgroup.
				{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "rw"}}}))
		t.Cleanup(func() { t.Logf("buildkitd printed:\n%s", r.out.String()) })
		// The Deployment's probe, run in the container with the image's buildctl.
		testenv.Eventually(t, 60*time.Second, "buildctl debug workers answers in the container", func() error {
			if st := r.exited(); st != "" {
				t.Fatalf("buildkitd ended (%s): %s", st, r.out.String())
			}
			out, code, err := r.exec(ctx, "buildctl", "--addr=unix:///run/buildkit/buildkitd.sock", "debug", "workers")
			if err != nil {
				return err
			}
			if code != 0 || !strings.Contains(out, "linux/amd64") {
				return fmt.Errorf("buildctl debug workers exited %d: %s", code, out)
			}
			return nil
		})

		buildctl, err := testenv.Binary("buildctl")
		if err != nil {
			t.Fatal(err)
		}
		src := t.TempDir()
		// A RUN step too: buildkitd runs it with the image's runc. Debian's
		// static busybox is the stage's only program.
		busybox, err := testenv.Binary("busybox")
		if err != nil {
			t.Fatal(err)
		}
		bb, err := os.ReadFile(busybox)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, "busybox"), bb, 0o755); err != nil {
			t.Fatal(err)
		}
		dockerfile := "FROM scratch\nCOPY hello /hello\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"sh\", \"-c\", \"echo ran in a step > /ran\"]\n"
		if err := os.WriteFile(filepath.Join(src, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, "hello"), []byte("built in the node image\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		result := filepath.Join(t.TempDir(), "fs.tar")
		start := time.Now()
		cmd := exec.CommandContext(ctx, buildctl, "--addr=unix://"+filepath.Join(run, "buildkitd.sock"), "build",
			"--frontend=dockerfile.v0", "--local=context="+src, "--local=dockerfile="+src, "--output=type=tar,dest="+result)
		if msg, err := cmd.CombinedOutput(); err != nil {
			// What runc in the container found (without the cgroup mount:
			// "no cgroup mount found in mountinfo").
			mi, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", r.task.Pid()))
			t.Logf("buildkitd's mounts:\n%s", mi)
			t.Fatalf("buildctl build: %v\n%s", err, msg)
		}
		t.Logf("measure: FROM scratch + COPY + RUN build %v", time.Since(start).Round(time.Millisecond))
		got, err := fileInTar(result, "hello")
		if err != nil {
			t.Fatal(err)
		}
		if got != "built in the node image\n" {
			t.Fatalf("the build's /hello holds %q", got)
		}
		got, err = fileInTar(result, "ran")
		if err != nil {
			t.Fatal(err)
		}
		if got != "ran in a step\n" {
			t.Fatalf("the build's /ran holds %q", got)
		}
	})
}

// running is a container started by launch.
type running struct {
	task    containerd.Task
	statusC <-chan containerd.ExitStatus
	out     *testenv.SyncBuffer
	env     []string
	fifoDir string
	status  *containerd.ExitStatus
}

// launch runs image as the kubelet would with args as the container's args: after
// the image's entrypoint, in place of its command. On the host network, so that
// the test reaches it on loopback. The container goes at the end of the test.
func launch(ctx context.Context, t *testing.T, cl *containerd.Client, c *testenv.Containerd, image string, args []string, opts ...oci.SpecOpts) *running {
	t.Helper()
	img, err := cl.GetImage(ctx, image)
	if err != nil {
		t.Fatal(err)
	}
	if err := img.Unpack(ctx, "overlayfs"); err != nil {
		t.Fatal(err)
	}
	ic, err := img.Spec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	specOpts := []oci.SpecOpts{oci.WithImageConfig(img), oci.WithHostNamespace(specs.NetworkNamespace), oci.WithHostResolvconf}
	if args != nil {
		specOpts = append(specOpts, oci.WithProcessArgs(append(append([]string{}, ic.Config.Entrypoint...), args...)...))
	}
	specOpts = append(specOpts, opts...)
	id := fmt.Sprintf("nodeimages-%d-%d", os.Getpid(), time.Now().UnixNano())
	ctr, err := cl.NewContainer(ctx, id, containerd.WithImage(img), containerd.WithNewSnapshot(id, img), containerd.WithNewSpec(specOpts...))
	if err != nil {
		t.Fatal(err)
	}
	r := &running{out: &testenv.SyncBuffer{}, env: ic.Config.Env, fifoDir: filepath.Dir(c.Address)}
	r.task, err = ctr.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, r.out, r.out), cio.WithFIFODir(r.fifoDir)))
	if err != nil {
		_ = ctr.Delete(ctx, containerd.WithSnapshotCleanup)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), k8sNamespace), 30*time.Second)
		defer cancel()
		_, _ = r.task.Delete(ctx, containerd.WithProcessKill)
		_ = ctr.Delete(ctx, containerd.WithSnapshotCleanup)
	})
	if r.statusC, err = r.task.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

// exited says how the container ended, "" while it runs.
func (r *running) exited() string {
	if r.status == nil {
		select {
		case st := <-r.statusC:
			r.status = &st
		default:
			return ""
		}
	}
	code, _, err := r.status.Result()
	return fmt.Sprintf("exit %d %v", code, err)
}

// wait waits for the container to end and returns its exit code.
func (r *running) wait(ctx context.Context, t *testing.T, timeout time.Duration) uint32 {
	t.Helper()
	if r.status == nil {
		select {
		case st := <-r.statusC:
			r.status = &st
		case <-time.After(timeout):
			t.Fatalf("still running after %v: %s", timeout, r.out.String())
		}
	}
	code, _, err := r.status.Result()
	if err != nil {
		t.Fatal(err)
	}
	return code
}

// exec runs args in the container, as a kubelet's exec probe does.
func (r *running) exec(ctx context.Context, args ...string) (string, uint32, error) {
	var out testenv.SyncBuffer
	id := fmt.Sprintf("probe-%d", time.Now().UnixNano())
	p, err := r.task.Exec(ctx, id, &specs.Process{Args: args, Env: r.env, Cwd: "/"}, cio.NewCreator(cio.WithStreams(nil, &out, &out), cio.WithFIFODir(r.fifoDir)))
	if err != nil {
		return "", 0, err
	}
	defer p.Delete(context.WithoutCancel(ctx))
	statusC, err := p.Wait(ctx)
	if err != nil {
		return "", 0, err
	}
	if err := p.Start(ctx); err != nil {
		return "", 0, err
	}
	select {
	case st := <-statusC:
		code, _, err := st.Result()
		p.Delete(context.WithoutCancel(ctx))
		return out.String(), code, err
	case <-time.After(20 * time.Second):
		_ = p.Kill(ctx, syscall.SIGKILL)
		return "", 0, errors.New("buildctl did not end in 20 s")
	}
}

func bind(src, dst, mode string) specs.Mount {
	return specs.Mount{Source: src, Destination: dst, Type: "bind", Options: []string{"rbind", mode}}
}

// fileInTar is what the tar file at path holds at name.
func fileInTar(path, name string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			return "", fmt.Errorf("%s has no %s: %w", path, name, err)
		}
		if strings.TrimPrefix(h.Name, "/") == name {
			b, err := io.ReadAll(tr)
			return string(b), err
		}
	}
}
