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
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	defer ctr.Delete(cleanup, containerd.WithSnapshotCleanup)

	// The shim writes stdout and stderr to one log file, in the order the process
	// wrote them. The exit status can arrive before the shim has copied the last of
	// it, so the file is read only after the task is deleted: Delete waits for the
	// shim's copying.
	logPath := filepath.Join(filepath.Dir(c.Address), id+".log")
	defer os.Remove(logPath)
	task, err := ctr.NewTask(ctx, cio.LogFile(logPath))
	if err != nil {
		return "", 0, fmt.Errorf("create task: %w", err)
	}
	defer task.Delete(cleanup, containerd.WithProcessKill)
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
		if _, derr := task.Delete(cleanup); derr != nil && err == nil {
			err = fmt.Errorf("delete task: %w", derr)
		}
		out, _ := os.ReadFile(logPath)
		return strings.TrimRight(string(out), "\n"), code, err
	case <-ctx.Done():
		return "", 0, ctx.Err()
	}
}
