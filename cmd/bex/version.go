package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"

	"github.com/spf13/cobra"
)

// version is set at build time: go build -ldflags "-X main.version=v0.1.0".
var version = "dev"

// versionCmd prints the version of bex and of the Go toolchain that built it.
type versionCmd struct {
	out  io.Writer
	json bool
}

func (c *versionCmd) command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version of bex",
		Args:  cobra.NoArgs,
	}
	cmd.Flags().BoolVar(&c.json, "json", false, "print JSON, for scripts and agents")
	return cmd
}

func (c *versionCmd) run(context.Context) error {
	if c.json {
		return json.NewEncoder(c.out).Encode(map[string]string{
			"version":  version,
			"go":       runtime.Version(),
			"platform": runtime.GOOS + "/" + runtime.GOARCH,
		})
	}
	_, err := fmt.Fprintf(c.out, "bex %s (%s, %s/%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return err
}

func (c *versionCmd) close() error { return nil }
