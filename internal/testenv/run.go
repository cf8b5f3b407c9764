package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

var runSeq atomic.Int64

// Run runs image to completion in containerd on the host network, with args (or the
// image's own command when none are given), and returns what it printed and its exit
// code. Tests use it to prove that what BuildKit built actually runs.
func (c *Containerd) Run(ctx context.Context, image string, args ...string) (output string, exitCode uint32, err error) {
	cl, err := c.Client()
	if err != nil {
		return "", 0, err
	}
	defer cl.Close()
	img, err := cl.GetImage(ctx, image)
	if err != nil {
		return "", 0, fmt.Errorf("image %s: %w", image, err)
	}
	if err := EnsureUnpacked(ctx, img); err != nil {
		return "", 0, err
	}
	id := fmt.Sprintf("testenv-run-%d-%d", os.Getpid(), runSeq.Add(1))
	specOpts := []oci.SpecOpts{oci.WithImageConfig(img), oci.WithHostNamespace(specs.NetworkNamespace), oci.WithHostResolvconf}
	if len(args) > 0 {
		specOpts = append(specOpts, oci.WithProcessArgs(args...))
	}
	ctr, err := cl.NewContainer(ctx, id,
		containerd.WithImage(img),
		containerd.WithNewSnapshot(id, img),
		containerd.WithNewSpec(specOpts...))
	if err != nil {
		return "", 0, fmt.Errorf("create container: %w", err)
	}
	// Each clean-up gets its own deadline, counted from when it starts: one counted
	// from the container's creation ran out while a slow command was still running
	// on a loaded machine, and the task's delete then failed the run.
	cleanup := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	}
	defer func() {
		c, cancel := cleanup()
		defer cancel()
		_ = ctr.Delete(c, containerd.WithSnapshotCleanup)
	}()

	// stdout and stderr come through FIFOs that this process copies into out:
	// Delete waits for that copy to finish, so nothing the process printed is
	// missing when out is read. (With a log file, the shim copies, and Delete
	// does not wait for it: short-lived processes lost their output now and then.)
	var out SyncBuffer
	task, err := ctr.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &out, &out), cio.WithFIFODir(filepath.Dir(c.Address))))
	if err != nil {
		return "", 0, fmt.Errorf("create task: %w", err)
	}
	defer func() {
		c, cancel := cleanup()
		defer cancel()
		_, _ = task.Delete(c, containerd.WithProcessKill)
	}()
	statusC, err := task.Wait(ctx)
	if err != nil {
		return "", 0, err
	}
	if err := task.Start(ctx); err != nil {
		return "", 0, fmt.Errorf("start task: %w", err)
	}
	select {
	case st := <-statusC:
		code, _, err := st.Result()
		c, cancel := cleanup()
		defer cancel()
		if _, derr := task.Delete(c); derr != nil && err == nil {
			err = fmt.Errorf("delete task: %w", derr)
		}
		return strings.TrimRight(out.String(), "\n"), code, err
	case <-ctx.Done():
		return "", 0, ctx.Err()
	}
}

// EnsureUnpacked unpacks img for containerd's default snapshotter unless it is:
// images are imported without (baseimage.Import), as the runtime unpacks what
// it runs when it first runs it.
func EnsureUnpacked(ctx context.Context, img containerd.Image) error {
	if ok, err := img.IsUnpacked(ctx, "overlayfs"); err != nil || ok {
		return err
	}
	if err := img.Unpack(ctx, "overlayfs"); err != nil {
		return fmt.Errorf("unpack %s: %w", img.Name(), err)
	}
	return nil
}
