package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"bex.co/bex/internal/volumearchive"
)

// volumeArchiveCmd is `bex volume-archive backup|restore DIR`, hidden: what the
// helper pod of a volume's backup or restore runs on a cluster
// (deployer/runtime/kube VolumeData), the volume's claim mounted at DIR, as the
// pod's uid 0 (the app's root): a tar of DIR on stdout, or DIR's contents
// replaced by the tar on stdin (internal/volumearchive, ids relative to 0).
// A refused archive is one line on stderr and exit status 2, DIR unchanged.
type volumeArchiveCmd struct {
	mode   string // "backup" or "restore"
	in     io.Reader
	out    io.Writer
	errOut io.Writer
	dir    string
	// handshake: wait for the reader's attach before the archive (backup).
	handshake bool
	// terminationLog also gets the line of a failure (the pod's
	// terminationMessagePath, which the gitserver reads from the pod's status).
	terminationLog string
}

func newVolumeArchiveCmd(out, errOut io.Writer) *cobra.Command {
	parent := &cobra.Command{
		Use:    "volume-archive",
		Short:  "Write or restore a tar of a mounted volume (the helper pod of volumes:backup and volumes:restore on a cluster)",
		Hidden: true,
	}
	for _, mode := range []string{"backup", "restore"} {
		parent.AddCommand(wire(&volumeArchiveCmd{mode: mode, out: out, errOut: errOut}))
	}
	return parent
}

func (c *volumeArchiveCmd) command() *cobra.Command {
	short := "Write a tar archive of DIR's contents to stdout"
	if c.mode == "restore" {
		short = "Replace DIR's contents with the tar archive read from stdin (exit 2: refused, DIR unchanged)"
	}
	cmd := &cobra.Command{
		Use:   c.mode + " DIR",
		Short: short,
		Args:  cobra.ExactArgs(1),
		PreRunE: func(cmd *cobra.Command, args []string) error {
			c.dir, c.in = args[0], cmd.InOrStdin()
			return nil
		},
	}
	if c.mode == "backup" {
		cmd.Flags().BoolVar(&c.handshake, "handshake", false, "write ready lines until a byte arrives on stdin, then a start line, then the archive (for a reader that attaches late)")
	}
	cmd.Flags().StringVar(&c.terminationLog, "termination-log", "", "a file that also gets the line of a failure (the pod's terminationMessagePath)")
	return cmd
}

// exitError ends bex with its status and its line on stderr as it is.
type exitError struct {
	code int
	line string
}

func (e exitError) Error() string { return e.line }

func (c *volumeArchiveCmd) run(ctx context.Context) error {
	err := c.do(ctx)
	if err == nil {
		return nil
	}
	var ee exitError
	if !errors.As(err, &ee) {
		ee = exitError{code: 1, line: fmt.Sprintf("volumes:%s failed: %v", c.mode, err)}
	}
	// One line: the gitserver passes it on as the error's message.
	ee.line = strings.ReplaceAll(ee.line, "\n", " ")
	if c.terminationLog != "" {
		_ = os.WriteFile(c.terminationLog, []byte(ee.line), 0o644)
	}
	return ee
}

func (c *volumeArchiveCmd) do(ctx context.Context) error {
	root, err := os.OpenRoot(c.dir)
	if err != nil {
		return fmt.Errorf("open the volume: %w", err)
	}
	defer root.Close()
	if c.mode == "backup" {
		if c.handshake {
			if err := volumearchive.AwaitReader(ctx, c.in, c.out); err != nil {
				return err
			}
		}
		return volumearchive.Write(ctx, root, 0, c.out)
	}
	err = volumearchive.Restore(ctx, root, 0, c.in)
	if errors.Is(err, volumearchive.ErrBadArchive) {
		return exitError{code: volumearchive.ExitRefused, line: fmt.Sprintf("volumes:restore refused the archive, and the volume is as it was: %v", err)}
	}
	return err
}

func (c *volumeArchiveCmd) close() error { return nil }
