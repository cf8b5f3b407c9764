#!/usr/bin/env bash
# Makes this machine ready to run or to test bex, and says what it does.
# Idempotent: a second run checks and returns in seconds.
#
#   hack/tools.sh run   what `bex up` runs (`make run`): the Debian packages it needs
#                       and, built from their Go modules, runc, buildkitd and
#                       buildctl, kube-apiserver, etcd and kubectl.
#   hack/tools.sh       everything (`make tools`, `make test`, the cluster scripts):
#                       the above, then what only tests and clusters use.
#
#   1. Debian packages: git, openssh, containerd, busybox-static, CNI plugins,
#      mmdebstrap (the Debian stand-ins for the official base images), jq (the runc
#      wrapper's rewrite of build steps' specs, docs/cluster.md's migration),
#      libseccomp-dev and pkg-config (runc's seccomp support, cgo), runc (Debian's,
#      1.1: only containerd's package depends on it; bex uses bin/runc), ...; for
#      tests also nginx-light (the edge benchmarks), openssl (hack/install-bex.sh),
#      node and npm (the MCP SDK's client).
#   2. Daemons built from their Go modules into bin/<name>-<version>/, with
#      stable links bin/<binary> -> <name>-<version>/<binary>:
#        runc                               (hack/tools/runc: a release with the
#                                            November 2025 fixes that Debian's lacks)
#        buildkitd, buildctl                (hack/tools/buildkit)
#        kube-apiserver, etcd, kubectl      (hack/tools/kube)
#      and for tests and clusters only:
#        kubelet, kube-proxy, kube-scheduler,
#        kube-controller-manager            (hack/tools/kube into bin/kubenode-<version>:
#                                            hack/cluster-local.sh's node)
#        pebble, pebble-challtestsrv        (the bex module's tool directives)
#        caddy                              (hack/tools/caddy; the edge benchmarks' reference)
#        coredns                            (hack/tools/coredns; the one-node cluster's DNS)
#        registry                           (hack/tools/registry; distribution's, in-cluster)
#        cnpg-manager                       (CloudNativePG's operator, from its module
#                                            at CNPG_VERSION into bin/cnpg-<version>)
#        Cluster API's managers, clusterctl (hack/tools/clusterapi)
#        kubeadm, crictl                    (hack/tools/kube, hack/tools/critools:
#                                            hack/cluster-capd.sh's node image)
#        all of the above of                (hack/tools/kubeprevious into the same folders
#          KUBE_PREVIOUS_VERSION             of its version: a cluster to upgrade)
#   3. For tests, the official TypeScript MCP SDK (hack/mcp-client, npm ci) into
#      bin/mcp-sdk-<version>/node_modules, linked as bin/mcp-sdk: the MCP server's
#      tests talk to the server with its client too.
#
# On a fresh 2-core machine `run` builds in about 14 minutes, everything in about 35;
# the Go build cache makes later runs take seconds.
set -euo pipefail

mode=${1:-all}
case "$mode" in
run | all) ;;
*) printf 'usage: hack/tools.sh [run]\n' >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=versions.env
. hack/versions.env

say() { printf '==> %s\n' "$*"; }
die() { printf 'hack/tools.sh: %s\n' "$*" >&2; exit 1; }

# --- Go ---------------------------------------------------------------------------
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
command -v go >/dev/null 2>&1 || die "Go is missing: install Go 1.26 or newer into /usr/local/go (https://go.dev/doc/install), then run again"
gov=$(go env GOVERSION)
case "$gov" in
go1.2[6-9]* | go1.[3-9][0-9]* | go[2-9]*) ;;
*) die "Go $gov is too old: bex needs Go 1.26 or newer" ;;
esac

# --- Debian packages --------------------------------------------------------------
packages=(git openssh-client openssh-server runc containerd busybox-static ca-certificates curl iproute2 iptables containernetworking-plugins util-linux mmdebstrap jq libseccomp-dev pkg-config)
# Docker: hack/cluster-capd.sh's machines are its containers (tests and clusters
# only; mmdebstrap, above, also makes their node image).
[ "$mode" = all ] && packages+=(nginx-light openssl docker.io)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
# Node and npm for the MCP SDK's client: Debian's, unless a node is on PATH already
# (NodeSource's nodejs brings its own npm, which Debian's npm would conflict with).
if [ "$mode" = all ]; then
	command -v node >/dev/null 2>&1 || missing+=(nodejs)
	command -v npm >/dev/null 2>&1 || missing+=(npm)
	# pip, for make bench's floor of the Python plan (pip's own install of a sample).
	python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
fi
if [ ${#missing[@]} -gt 0 ]; then
	[ "$(id -u)" = 0 ] || die "missing packages ${missing[*]}: run as root, or: sudo apt-get install -y ${missing[*]}"
	say "installing Debian packages: ${missing[*]}"
	apt-get update -qq
	# Without systemd, a package's install would start its daemon through
	# invoke-rc.d (docker.io's dockerd, with Debian's runc): policy-rc.d says no,
	# unless the machine has its own policy. The cluster scripts start what they use.
	policy=
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		policy=/usr/sbin/policy-rc.d
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy"
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	[ -z "$policy" ] || rm -f "$policy"
else
	say "Debian packages present: ${packages[*]}$([ "$mode" = all ] && echo ", node and npm")"
fi

# --- Daemons from Go modules ------------------------------------------------------
mkdir -p bin

# build NAME DIR MODULE_DIR LDFLAGS "BINARIES" PKG... : builds PKGs in MODULE_DIR
# into bin/DIR unless bin/DIR/.complete exists and holds every one of BINARIES. The
# stamp is written last, so an interrupted build is redone.
build() {
	local name=$1 dir=$2 moddir=$3 ldflags=$4 bins=$5
	shift 5
	local complete=yes b
	[ -f "bin/$dir/.complete" ] || complete=no
	for b in $bins; do [ -x "bin/$dir/$b" ] || complete=no; done
	if [ $complete = yes ]; then
		say "$name: bin/$dir is built"
		return
	fi
	say "$name: building bin/$dir (the first time takes minutes; later runs use the Go build cache)"
	local start=$SECONDS
	mkdir -p "bin/$dir"
	(cd "$moddir" && go build -trimpath -ldflags "$ldflags" -o "$root/bin/$dir/" "$@")
	# etcd's main package is called "server"; envtest and bex look for "etcd".
	if [ -f "bin/$dir/server" ]; then mv "bin/$dir/server" "bin/$dir/etcd"; fi
	touch "bin/$dir/.complete"
	say "$name: built in $((SECONDS - start)) s"
}

# runc as its Makefile builds it (seccomp through cgo and libseccomp-dev; no
# libpathrs, a Rust library Debian does not package: runc's Go pathrs-lite does the
# same job); its version is the module's VERSION file, the commit the release tag.
CGO_ENABLED=1 GOFLAGS="-tags=seccomp,urfave_cli_no_docs" build "runc $RUNC_VERSION" "runc-$RUNC_VERSION" hack/tools/runc \
	"-s -w -X main.gitCommit=$RUNC_VERSION" "runc" \
	github.com/opencontainers/runc

build "buildkit $BUILDKIT_VERSION" "buildkit-$BUILDKIT_VERSION" hack/tools/buildkit \
	"-s -w -X github.com/moby/buildkit/version.Version=$BUILDKIT_VERSION" "buildkitd buildctl" \
	github.com/moby/buildkit/cmd/buildkitd github.com/moby/buildkit/cmd/buildctl

# kube_ldflags VERSION: a Kubernetes build's flags, which set the version it reports.
kube_ldflags() {
	local minor=${1#v1.}
	minor=${minor%%.*}
	echo "-s -w -X k8s.io/component-base/version.gitVersion=$1 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
}
kube_ldflags=$(kube_ldflags "$KUBE_VERSION")
build "kube-apiserver, kubectl and etcd $KUBE_VERSION" "kube-$KUBE_VERSION" hack/tools/kube \
	"$kube_ldflags" "kube-apiserver kubectl etcd" \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl go.etcd.io/etcd/server/v3

link() { ln -sfn "$1/$2" "bin/$2"; }
link "runc-$RUNC_VERSION" runc
link "buildkit-$BUILDKIT_VERSION" buildkitd
link "buildkit-$BUILDKIT_VERSION" buildctl
link "kube-$KUBE_VERSION" kube-apiserver
link "kube-$KUBE_VERSION" etcd
link "kube-$KUBE_VERSION" kubectl
for b in runc buildkitd buildctl kube-apiserver etcd kubectl; do
	[ -x "bin/$b" ] || die "bin/$b is missing after the build: remove bin/ and run make tools again"
done
if [ "$mode" = run ]; then
	say "what bex up runs is ready in bin/ (make tools builds the rest, for tests and clusters)"
	exit 0
fi

# --- For tests and clusters only --------------------------------------------------
# A release's node (kubelet, kube-proxy, scheduler, controller manager: the
# one-node cluster's) and kubeadm (the machines of hack/cluster-capd.sh,
# hack/capd-images.sh): KUBE_VERSION's from hack/tools/kube, and the release
# before's (KUBE_PREVIOUS_VERSION: a cluster made there and upgraded, infra/capd)
# from hack/tools/kubeprevious, with its kube-apiserver, kubectl and etcd (its own
# release's). The same folders for both, with links in bin/ to KUBE_VERSION's only.
kube_release() { # VERSION MODULE_DIR
	local flags
	flags=$(kube_ldflags "$1")
	build "kubelet, kube-proxy, kube-scheduler and kube-controller-manager $1" "kubenode-$1" "$2" \
		"$flags" "kubelet kube-proxy kube-scheduler kube-controller-manager" \
		k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy \
		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager
	build "kubeadm $1" "kubeadm-$1" "$2" "$flags" "kubeadm" k8s.io/kubernetes/cmd/kubeadm
}
kube_release "$KUBE_VERSION" hack/tools/kube
build "kube-apiserver, kubectl and etcd $KUBE_PREVIOUS_VERSION" "kube-$KUBE_PREVIOUS_VERSION" hack/tools/kubeprevious \
	"$(kube_ldflags "$KUBE_PREVIOUS_VERSION")" "kube-apiserver kubectl etcd" \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl go.etcd.io/etcd/server/v3
kube_release "$KUBE_PREVIOUS_VERSION" hack/tools/kubeprevious
# crictl: the machines of hack/cluster-capd.sh.
build "crictl $CRI_TOOLS_VERSION" "critools-$CRI_TOOLS_VERSION" hack/tools/critools \
	"-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRI_TOOLS_VERSION" "crictl" \
	sigs.k8s.io/cri-tools/cmd/crictl

build "pebble $PEBBLE_VERSION" "pebble-$PEBBLE_VERSION" . "-s -w" "pebble pebble-challtestsrv" \
	github.com/letsencrypt/pebble/v2/cmd/pebble github.com/letsencrypt/pebble/v2/cmd/pebble-challtestsrv

build "caddy $CADDY_VERSION" "caddy-$CADDY_VERSION" hack/tools/caddy "-s -w" "caddy" \
	github.com/caddyserver/caddy/v2/cmd/caddy

# CoreDNS and distribution's registry: static (CGO_ENABLED=0), since hack/nodeimages
# puts them alone in images of their own.
CGO_ENABLED=0 build "coredns $COREDNS_VERSION" "coredns-$COREDNS_VERSION" hack/tools/coredns \
	"-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" "coredns" \
	github.com/coredns/coredns

CGO_ENABLED=0 build "registry $REGISTRY_VERSION" "registry-$REGISTRY_VERSION" hack/tools/registry \
	"-s -w -X github.com/distribution/distribution/v3/version.version=$REGISTRY_VERSION" "registry" \
	github.com/distribution/distribution/v3/cmd/registry

# CloudNativePG's manager (the operator, and the instance manager it copies into
# each Postgres pod), built in the module's own directory of the module cache, so
# with its own go.mod and go.sum (no replace directives): upstream's dependencies.
# The exact version downloads though the proxy refuses the version list (which
# `go install PKG@VERSION` would ask for its deprecation check). Static, since
# hack/nodeimages puts it alone in an image (bex.local/cloudnative-pg).
cnpg_dir=cnpg-$CNPG_VERSION
cnpg_mod=.
if ! [ -f "bin/$cnpg_dir/.complete" ] || ! [ -x "bin/$cnpg_dir/manager" ]; then
	cnpg_mod=$(cd / && GOFLAGS= go mod download -json "github.com/cloudnative-pg/cloudnative-pg@$CNPG_VERSION" | jq -r .Dir) ||
		die "go mod download github.com/cloudnative-pg/cloudnative-pg@$CNPG_VERSION failed"
	[ -f "$cnpg_mod/go.mod" ] || die "no module directory for github.com/cloudnative-pg/cloudnative-pg@$CNPG_VERSION ($cnpg_mod)"
fi
CGO_ENABLED=0 build "CloudNativePG $CNPG_VERSION" "$cnpg_dir" "$cnpg_mod" "-s -w" "manager" ./cmd/manager

for b in kubelet kube-proxy kube-scheduler kube-controller-manager; do link "kubenode-$KUBE_VERSION" "$b"; done
link "kubeadm-$KUBE_VERSION" kubeadm
link "critools-$CRI_TOOLS_VERSION" crictl
link "pebble-$PEBBLE_VERSION" pebble
link "pebble-$PEBBLE_VERSION" pebble-challtestsrv
link "caddy-$CADDY_VERSION" caddy
link "coredns-$COREDNS_VERSION" coredns
link "registry-$REGISTRY_VERSION" registry
ln -sfn "$cnpg_dir/manager" bin/cnpg-manager
[ -x bin/cnpg-manager ] || die "bin/cnpg-manager is missing after the build: remove bin/$cnpg_dir and run make tools again"
[ -x bin/coredns ] && [ -x bin/registry ] || die "bin/coredns or bin/registry is missing after the build: remove bin/coredns-* bin/registry-* and run make tools again"

for b in kubelet kube-proxy kube-scheduler kube-controller-manager kubeadm crictl pebble pebble-challtestsrv caddy; do
	[ -x "bin/$b" ] || die "bin/$b is missing after the build: remove bin/ and run make tools again"
done

# Cluster API's managers for infra's in-memory Cluster API test and
# hack/cluster-capd.sh's management plane, one release (CLUSTER_API_VERSION) from
# hack/tools/clusterapi: core, kubeadm bootstrap, kubeadm control plane, and CAPD
# (whose inMemory backend is the in-memory provider, its docker backend
# hack/cluster-capd.sh's machines); and clusterctl, which fills in the variables of
# infra/clusterapi's templates. Two of
# the packages are called kubeadm, so each is built into a folder of its own under
# bin/cluster-api-VERSION; the links carry the names of Cluster API's images.
capi_ldflags="-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=$CLUSTER_API_VERSION"
for capi in core:core:sigs.k8s.io/cluster-api/core:cluster-api-controller \
	bootstrap-kubeadm:kubeadm:sigs.k8s.io/cluster-api/bootstrap/kubeadm:kubeadm-bootstrap-controller \
	controlplane-kubeadm:kubeadm:sigs.k8s.io/cluster-api/controlplane/kubeadm:kubeadm-control-plane-controller \
	infrastructure-docker:docker:sigs.k8s.io/cluster-api/test/infrastructure/docker:capd-manager \
	clusterctl:clusterctl:sigs.k8s.io/cluster-api/cmd/clusterctl:clusterctl; do
	IFS=: read -r capi_sub capi_bin capi_pkg capi_link <<<"$capi"
	build "Cluster API $CLUSTER_API_VERSION $capi_link" "cluster-api-$CLUSTER_API_VERSION/$capi_sub" hack/tools/clusterapi \
		"$capi_ldflags" "$capi_bin" "$capi_pkg"
	ln -sfn "cluster-api-$CLUSTER_API_VERSION/$capi_sub/$capi_bin" "bin/$capi_link"
	[ -x "bin/$capi_link" ] || die "bin/$capi_link is missing after the build: remove bin/cluster-api-$CLUSTER_API_VERSION and run make tools again"
done

# --- The official TypeScript MCP SDK ----------------------------------------------
# npm ci of hack/mcp-client's pinned lock into bin/mcp-sdk-<version>. The stamp holds
# the lock's hash, so a changed lock is installed again, and is written last, so an
# interrupted install is redone. --ignore-scripts: nothing of the packages runs here.
mcp_sdk=$(node -p 'require("./hack/mcp-client/package.json").dependencies["@modelcontextprotocol/sdk"]')
mcp_dir="bin/mcp-sdk-$mcp_sdk"
mcp_lock=$(sha256sum hack/mcp-client/package-lock.json | cut -d' ' -f1)
if [ "$(cat "$mcp_dir/.complete" 2>/dev/null)" = "$mcp_lock" ]; then
	say "MCP SDK $mcp_sdk: $mcp_dir is installed"
else
	say "MCP SDK $mcp_sdk: installing into $mcp_dir (npm ci)"
	start=$SECONDS
	rm -rf "$mcp_dir"
	mkdir -p "$mcp_dir"
	cp hack/mcp-client/package.json hack/mcp-client/package-lock.json "$mcp_dir/"
	(cd "$mcp_dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
	echo "$mcp_lock" >"$mcp_dir/.complete"
	say "MCP SDK $mcp_sdk: installed in $((SECONDS - start)) s"
fi
ln -sfn "mcp-sdk-$mcp_sdk" bin/mcp-sdk
[ -f bin/mcp-sdk/node_modules/@modelcontextprotocol/sdk/package.json ] ||
	die "bin/mcp-sdk has no @modelcontextprotocol/sdk after the install: remove $mcp_dir and run make tools again"
say "tools ready in bin/"
