package builder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"bex.co/bex/internal/buildslot"
)

// basesWaitLine is how often a build waiting for the base images says so.
const basesWaitLine = 15 * time.Second

// waitForBases returns once the file at path exists: empty, the base images a
// generated Dockerfile builds on are ready; otherwise it holds why they could not
// be made, and that is the build's error. `bex up --local-bases` makes the Debian
// stand-ins after it is up, in the background, and writes the file (whole, by a
// rename) when they are in containerd; a build that arrives first waits here,
// saying so every basesWaitLine, rather than failing on an image that is not
// there yet. The file's directory is watched (inotify), so the build goes on as
// soon as the file appears.
//
// While it waits the build gives its slot back, and takes one again once the
// file is there: builds waiting for the stand-ins (minutes on a fresh machine)
// must not hold every slot and stop the builds that need none.
func waitForBases(ctx context.Context, path string, slot *buildslot.Slot, out io.Writer, every time.Duration) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("waiting for the base images: %w", err)
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(path)); err != nil {
		return fmt.Errorf("waiting for the base images: %w", err)
	}
	began := time.Now()
	tick := time.NewTicker(every)
	defer tick.Stop()
	said := false
	for {
		// Checked after the watch is set, and after every event: a file that
		// appeared in between is seen either way.
		msg, err := os.ReadFile(path)
		switch {
		case err == nil:
			if said {
				fmt.Fprintf(out, "       The base images are ready (waited %s)\n", time.Since(began).Round(time.Second))
			}
			if reason := strings.TrimSpace(string(msg)); reason != "" {
				return fmt.Errorf("the base images for builds without a Dockerfile could not be made: %s (bex up makes them again when it starts; a Dockerfile of the app's own builds meanwhile)", reason)
			}
			return slot.Acquire(ctx)
		case !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("waiting for the base images: %w", err)
		}
		if !said {
			fmt.Fprintln(out, "-----> Waiting for the base images: bex up is making the Debian stand-ins for the official images (the first time takes minutes)")
			said = true
			slot.Release()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-w.Errors:
			return fmt.Errorf("waiting for the base images: %w", err)
		case <-w.Events:
		case <-tick.C:
			fmt.Fprintf(out, "       still waiting for the base images (%s so far)\n", time.Since(began).Round(time.Second))
		}
	}
}
