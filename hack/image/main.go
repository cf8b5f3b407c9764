// Command image builds bex's container image (hack/image/Dockerfile) with BuildKit
// and writes it as an OCI archive: `make image` runs it from the repository root.
//
//	go run ./hack/image [--output bin/bex-image.tar] [--name bex.local/bex:VERSION]
//	                    [--buildkit-addr unix:///run/buildkit/buildkitd.sock] [--pull-base]
//
// It builds the static bex binary (CGO_ENABLED=0), makes the base image from this
// machine's git and CA certificates (internal/machine/imagebuild; --pull-base builds the
// Dockerfile's Debian stage instead, which needs a registry), and builds with the
// buildkitd at --buildkit-addr (default $BUILDKIT_HOST), or else with one of its
// own started from bin/buildkitd (OCI worker, state in a temporary directory,
// stopped at the end; needs root, as buildkitd does). Load the archive where it is
// needed: `ctr -n k8s.io images import bin/bex-image.tar` on a node, `skopeo copy
// oci-archive:bin/bex-image.tar docker://REGISTRY/bex:TAG` to a registry.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	bkclient "github.com/moby/buildkit/client"

	"bex.co/bex/internal/machine/daemons"
	"bex.co/bex/internal/machine/imagebuild"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "hack/image: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	output := flag.String("output", "bin/bex-image.tar", "where the OCI archive goes")
	version := flag.String("version", "dev", "the version bex reports (main.version)")
	name := flag.String("name", "", "the image's name (default bex.local/bex:VERSION)")
	addr := flag.String("buildkit-addr", os.Getenv("BUILDKIT_HOST"), "buildkitd to build with (default: $BUILDKIT_HOST, else one started from bin/buildkitd)")
	pullBase := flag.Bool("pull-base", false, "build the Dockerfile's Debian base stage (needs a registry) instead of a base made from this machine's git")
	flag.Parse()
	if *name == "" {
		*name = "bex.local/bex:" + *version
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "hack/image/Dockerfile")); err != nil {
		return errors.New("run it from the repository's root (make image)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	work, err := os.MkdirTemp("", "bex-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	start := time.Now()
	buildCtx := filepath.Join(work, "context")
	if err := imagebuild.Binary(ctx, root, buildCtx, "-s -w -X main.version="+*version); err != nil {
		return err
	}
	fmt.Printf("==> bex %s built (CGO_ENABLED=0) in %.1f s\n", *version, time.Since(start).Seconds())

	opts := imagebuild.Options{
		Dockerfile: filepath.Join(root, "hack/image/Dockerfile"),
		Context:    buildCtx,
		OCIArchive: *output,
		Name:       *name,
		Progress:   os.Stdout,
	}
	if !*pullBase {
		opts.BaseLayout = filepath.Join(work, "base")
		if opts.BaseDigest, err = imagebuild.Base(opts.BaseLayout); err != nil {
			return err
		}
		fmt.Printf("==> base image from this machine's git (%s)\n", opts.BaseDigest)
	}

	if *addr == "" {
		var stopBuildkitd func()
		*addr, stopBuildkitd, err = startBuildkitd(ctx, root, filepath.Join(work, "buildkitd"))
		if err != nil {
			return err
		}
		defer stopBuildkitd()
	}
	c, err := bkclient.New(ctx, *addr)
	if err != nil {
		return fmt.Errorf("buildkitd at %s: %w", *addr, err)
	}
	defer c.Close()
	digest, err := imagebuild.Build(ctx, c, opts)
	if err != nil {
		return err
	}
	fmt.Printf("==> %s (%s) written to %s in %.1f s\n", *name, digest, *output, time.Since(start).Seconds())
	return nil
}

// startBuildkitd starts bin/buildkitd with its OCI worker under dir and returns its
// address and how to stop it.
func startBuildkitd(ctx context.Context, root, dir string) (string, func(), error) {
	bin := filepath.Join(root, "bin", "buildkitd")
	if _, err := os.Stat(bin); err != nil {
		return "", nil, fmt.Errorf("%s is missing: run make tools, or set BUILDKIT_HOST", bin)
	}
	d := daemons.Buildkitd{Dir: dir}
	args, err := d.WriteConfig()
	if err != nil {
		return "", nil, err
	}
	log, err := os.Create(filepath.Join(dir, "buildkitd.log"))
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		log.Close()
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		err := d.Ready(rctx)
		cancel()
		if err == nil {
			return d.Address(), stop, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			out, _ := os.ReadFile(log.Name())
			return "", nil, fmt.Errorf("buildkitd did not become ready: %v\n%s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
