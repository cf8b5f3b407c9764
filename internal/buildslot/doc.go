// Package buildslot bounds how many builds run at once: a Pool of slots, and
// each build's Slot, which it can give back while it waits for something that
// is not its own work (the base images bex up is still making) and take again
// after. The gitserver's pipeline owns the pool a server's builds share; the
// builder uses one of its own when it is used alone.
package buildslot
