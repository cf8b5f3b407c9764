package main

import (
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestSharedFlagsHaveOneDefault: a flag that several subcommands declare (bex up
// and the components it runs, which it passes only some of) has the same default
// in each, as each takes it from the owner's DefaultConfig. The exceptions say
// why they differ.
func TestSharedFlagsHaveOneDefault(t *testing.T) {
	differ := map[string]string{
		"namespace":        "the deployer's empty --namespace reconciles every namespace",
		"max-push-objects": "bex up's 0 passes nothing, and the gitserver keeps its own default",
		"hooks-addr":       "bex up serves the webhooks on loopback for its edge; a gitserver alone serves none unless told",
	}
	cmds := map[string]*cobra.Command{
		"up":        (&upCmd{}).command(),
		"gitserver": (&gitserverCmd{}).command(),
		"edge":      (&edgeCmd{}).command(),
		"deployer":  (&deployerCmd{}).command(),
	}
	type decl struct{ cmd, def string }
	seen := map[string][]decl{}
	for name, cmd := range cmds {
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			seen[f.Name] = append(seen[f.Name], decl{name, f.DefValue})
		})
	}
	shared := 0
	for flag, decls := range seen {
		if len(decls) < 2 {
			continue
		}
		shared++
		if why, ok := differ[flag]; ok {
			t.Logf("--%s: %v (%s)", flag, decls, why)
			continue
		}
		for _, d := range decls[1:] {
			if d.def != decls[0].def {
				t.Errorf("--%s: %s's default is %q, %s's %q", flag, decls[0].cmd, decls[0].def, d.cmd, d.def)
			}
		}
	}
	if shared < 20 {
		t.Errorf("only %d flags are shared; the test reads the wrong commands", shared)
	}
}
