// Package imageimport brings an image from any registry into the app's own
// image repository, for deploy:image: it resolves a tag or digest reference to
// one manifest (the platform's, from an index), checks its size, and copies it
// to where the images of releases live, under the name the builder's images
// have (<image-repo>/<app>), so that the runtimes run it and prune it as they
// do a build: into containerd on one machine (pulled and unpacked), into the
// cluster's registry on a cluster (copied blob by blob, so the nodes pull it
// from there without credentials of their own).
//
// Two bounds: Config.MaxBytes on the compressed size the manifest declares,
// before anything is copied, and Config.MaxUnpackedBytes on what the layers
// unpack to, for a layer that compresses 1000:1 (a gzip bomb) passes the first.
// Each layer is decompressed (containerd's archive/compression, as its
// applier does) and counted, the larger of the tar stream's length and its
// files' declared sizes (a sparse file is written out in full), stopping as
// soon as the image's total is past the bound, from the one download: on one
// machine the image is pulled without unpacking, counted from the content
// store, then unpacked, and a refused one loses its name and, with the
// import's lease, its content; on a cluster each layer's stream into the
// registry is teed into a counter, which cancels the write once past the
// bound and holds a blob's end until counted, the manifest is written by
// digest, the layers the registry had already (not streamed) are read back
// from it to be counted, and only then is the image tagged.
//
// The source registry is a tenant's choice, so every connection to it goes
// through a dialer that refuses the addresses Config.Blocked names (loopback,
// private, link-local, metadata: the platform's own listeners and the cloud's
// metadata service) after resolution, for each address tried and each
// redirect; credentials for it come from Config.Credentials, by registry host,
// and never appear in an error or a log. The destination is the platform's own
// and is reached as the builder reaches it.
package imageimport
