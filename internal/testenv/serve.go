package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Start runs image's own command (its user, its CMD) in containerd on the host
// network, with env added to the image's, and leaves it running: for images with
// no shell (a Go binary on the distroless-like runtime) that the test reaches from
// outside. stop kills it and returns what it printed.
func (c *Containerd) Start(ctx context.Context, image string, env ...string) (stop func() string, err error) {
	cl, err := c.Client()
	if err != nil {
		return nil, err
	}
	img, err := cl.GetImage(ctx, image)
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("image %s: %w", image, err)
	}
	if err := EnsureUnpacked(ctx, img); err != nil {
		cl.Close()
		return nil, err
	}
	id := fmt.Sprintf("testenv-start-%d-%d", os.Getpid(), runSeq.Add(1))
	ctr, err := cl.NewContainer(ctx, id,
		containerd.WithImage(img),
		containerd.WithNewSnapshot(id, img),
		containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithEnv(env), oci.WithHostNamespace(specs.NetworkNamespace), oci.WithHostResolvconf))
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("create container: %w", err)
	}
	var out SyncBuffer
	cleanup := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = ctr.Delete(ctx, containerd.WithSnapshotCleanup)
		cl.Close()
	}
	task, err := ctr.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &out, &out), cio.WithFIFODir(filepath.Dir(c.Address))))
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("create task: %w", err)
	}
	statusC, err := task.Wait(ctx)
	if err == nil {
		err = task.Start(ctx)
	}
	if err != nil {
		_, _ = task.Delete(context.Background(), containerd.WithProcessKill)
		cleanup()
		return nil, fmt.Errorf("start task: %w", err)
	}
	return func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = task.Kill(ctx, syscall.SIGKILL)
		select {
		case <-statusC:
		case <-ctx.Done():
		}
		_, _ = task.Delete(ctx, containerd.WithProcessKill)
		cleanup()
		return out.String()
	}, nil
}
