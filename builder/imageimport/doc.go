// Package imageimport brings an image from any registry into the app's own
// image repository, for deploy:image: it resolves a tag or digest reference to
// one manifest (the platform's, from an index), checks its size, and copies it
// to where the images of releases live, under the name the builder's images
// have (<image-repo>/<app>), so that the runtimes run it and prune it as they
// do a build: into containerd on one machine (pulled and unpacked), into the
// cluster's registry on a cluster (copied blob by blob, so the nodes pull it
// from there without credentials of their own).
//
// The source registry is a tenant's choice, so every connection to it goes
// through a dialer that refuses the addresses Config.Blocked names (loopback,
// private, link-local, metadata: the platform's own listeners and the cloud's
// metadata service) after resolution, for each address tried and each
// redirect; credentials for it come from Config.Credentials, by registry host,
// and never appear in an error or a log. The destination is the platform's own
// and is reached as the builder reaches it.
package imageimport
