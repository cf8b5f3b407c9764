package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/spf13/cobra"

	"bex.co/bex/builder/plan"
)

// planCmd shows the Dockerfile bex would generate for a directory without one.
type planCmd struct {
	out  io.Writer
	dir  string
	json bool
}

func (c *planCmd) command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "plan [DIR]",
		Short: "Show how bex would build DIR when it has no Dockerfile",
		Long: "plan detects the stack of DIR (default: the current directory) — Go, Node, Python,\n" +
			"a static site or a Procfile — and prints the Dockerfile bex generates for it.",
		Args: cobra.MaximumNArgs(1),
		PreRunE: func(_ *cobra.Command, args []string) error {
			c.dir = "."
			if len(args) == 1 {
				c.dir = args[0]
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&c.json, "json", false, "print the plan as JSON, for scripts and agents")
	return cmd
}

func (c *planCmd) run(context.Context) error {
	if fi, err := os.Stat(c.dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", c.dir)
	}
	p, err := plan.Detect(os.DirFS(c.dir), plan.DefaultConfig())
	if err != nil {
		return err
	}
	if c.json {
		return json.NewEncoder(c.out).Encode(map[string]any{
			"stack": p.Stack, "dockerfile": p.Dockerfile, "processes": p.Processes, "notes": p.Notes,
		})
	}
	fmt.Fprintf(c.out, "# stack: %s\n", p.Stack)
	for _, n := range p.Notes {
		fmt.Fprintf(c.out, "# %s\n", n)
	}
	names := make([]string, 0, len(p.Processes))
	for name := range p.Processes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(c.out, "# process %s: %s\n", name, p.Processes[name])
	}
	_, err = io.WriteString(c.out, p.Dockerfile)
	return err
}

func (c *planCmd) close() error { return nil }
