// Command bex is the one binary of the bex platform. Each subcommand is a small
// struct with flags bound in one place (parse), a run method and a close method, so
// that tests run it in process; only this package reads flags and BEX_* environment
// variables and wires the components together.
//
// Subcommands so far: version, plan (the Dockerfile bex would generate for a
// directory) and gitserver (the SSH git endpoint, wired to the builder and to the
// release recorder). The deployer, the edge and `bex up` arrive with their issues.
package main
