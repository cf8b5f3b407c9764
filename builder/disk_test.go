package builder

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDiskGuardStopsABuildUnderTheMargin: on a real small file system (a 64 MiB
// tmpfs, the kernel's own statfs), the guard of a running build ends its context
// with ErrDiskFull once a writer takes the free space under the margin, and the
// build's error then says how full the disk got; a build that succeeds keeps its
// result, and one that failed with room to spare keeps its own error.
func TestDiskGuardStopsABuildUnderTheMargin(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mounting a tmpfs (the test needs root): %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount: %v\n%s", err, out)
		}
	})
	// 25% of 64 MiB, 16 MiB, is smaller than 1 GiB: it is the margin.
	b := &Builder{cfg: Config{StateDir: dir, MinFreeBytes: 1 << 30, MinFreePercent: 25}, log: slog.Default()}

	ctx, g := b.watchDisk(context.Background())
	if g == nil {
		t.Fatal("no guard on a state dir with a margin")
	}
	own := errors.New("step failed")
	if err := g.done(own); err != own {
		t.Fatalf("a build that failed with room to spare: %v, want its own error", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("the build was stopped with room to spare: %v", context.Cause(ctx))
	}

	ctx, g = b.watchDisk(context.Background())
	// 56 MiB of 64: 8 MiB left, under the margin.
	filler := filepath.Join(dir, "fill")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for range 56 {
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the guard did not stop the build with 8 MiB of 64 free")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, ErrDiskFull) {
		t.Fatalf("the build was stopped by %v, want ErrDiskFull", cause)
	}
	// The space comes back (buildkitd's garbage collection, here the filler
	// removed), so done does not wait.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	err = g.done(ctx.Err())
	if !errors.Is(err, ErrDiskFull) || !strings.Contains(err.Error(), "the build filled the disk of "+dir+" (") ||
		!strings.Contains(err.Error(), "MiB free of 64 MiB, under the 16 MiB bex keeps") {
		t.Fatalf("the error of a build that filled the disk: %v", err)
	}

	// A build that succeeds keeps its result.
	_, g = b.watchDisk(context.Background())
	if err := g.done(nil); err != nil {
		t.Fatalf("a build that succeeded: %v", err)
	}
	// No margin, no guard.
	b.cfg.MinFreeBytes = 0
	if _, g := b.watchDisk(context.Background()); g != nil {
		t.Fatal("a guard with the margin off")
	}
}
