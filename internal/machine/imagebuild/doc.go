// Package imagebuild builds bex's own container image (hack/image/Dockerfile) with
// BuildKit, without a registry: the static bex binary as the build context, and a
// base made from this machine's git and the shared libraries it loads, handed to
// BuildKit as the named context "base" (an OCI layout) in place of the Dockerfile's
// Debian stage. `make image` (hack/image) and infra's tests use it.
package imagebuild
