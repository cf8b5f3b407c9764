package main

import (
	"bex.co/bex/builder"
	"bex.co/bex/cmd/bex/up"
	"bex.co/bex/deployer/runtime/local"
)

// The defaults of flags that several subcommands declare, each taken from the
// DefaultConfig (or default) of the component that owns the setting, so that the
// subcommands agree with one another and with bex up, which passes none of these.
// defaults_test.go checks that every flag declared by several subcommands has
// one default.
var (
	// defaultImageRepo is the default of both --image-repo flags: the gitserver's
	// builds name images under it, the deployer removes pruned releases' images
	// under it.
	defaultImageRepo = builder.DefaultConfig().ImageRepo
	// defaultContainerdNamespace is the local runtime's, the one buildkitd
	// builds into.
	defaultContainerdNamespace = local.DefaultNamespace
	// defaultStateDir is bex up's, where every subcommand it runs keeps its state.
	defaultStateDir = up.DefaultConfig().StateDir
)
