// Command nodeimages writes the images that the one-node Kubernetes cluster
// (hack/cluster-local.sh, issue 20) runs besides bex's own, as docker archives for
// `ctr -n k8s.io images import`: the cluster has no registry to pull them from.
//
//	go run ./hack/nodeimages --out DIR [--bin BIN]
//
// It writes DIR/pause.tar (bex.local/pause:3.10, the pause program of
// hack/nodeimages/pause), DIR/coredns.tar (bex.local/coredns:COREDNS_VERSION),
// DIR/registry.tar (docker.io/library/registry:3, distribution's registry),
// DIR/buildkit.tar (docker.io/moby/buildkit:BUILDKIT_VERSION, with this machine's
// runc) and DIR/cloudnative-pg.tar (bex.local/cloudnative-pg:CNPG_VERSION without
// its v, CloudNativePG's operator laid out as upstream's image: /manager, a link to
// /operator/manager_amd64), and DIR/images.env, whose lines NAME_IMAGE= and
// NAME_ARCHIVE= say what it wrote. The registry and buildkit images carry the
// names infra/bex's manifests use, so that the manifests run unchanged; the others
// are bex.local's, since only the cluster's own configuration names them (the
// operator's through hack/install-bex.sh's CNPG_IMAGE).
//
// Each image is one layer made of files of this machine (imagebuild.HostLayer):
// CoreDNS, the registry, buildkitd and buildctl from BIN (hack/tools.sh builds
// them), runc and the shared libraries that it and buildkitd load from the host;
// the operator's is CloudNativePG's static manager (BIN/cnpg-CNPG_VERSION) alone.
// An archive whose layer and configuration are what DIR/NAME.tar.inputs records is
// not written again.
package main
