// Package baseimage makes base images without a registry: Debian's static
// busybox packed as a one-layer OCI image and imported into containerd as
// docker.io/library/busybox:latest, so that `FROM busybox` builds on a machine
// that cannot pull (with BuildKit's image-resolve-mode local). bex up uses it
// (--busybox-base), and so does the test harness.
package baseimage
