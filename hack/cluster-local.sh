#!/usr/bin/env bash
# A one-node Kubernetes cluster on this machine, with bex installed from infra/bex:
#
#   hack/cluster-local.sh up DIR     build what is missing, start the node (state under
#                                    DIR), install bex, write DIR/cluster.env
#   hack/cluster-local.sh down DIR   stop it; no process, mount or network device is left
#
# DIR/cluster.env holds KUBECONFIG=, SSH_ADDR=host:port, HTTPS_ADDR=host:port,
# BASE_DOMAIN=, CA_FILE= (the CA the edge's certificates chain to) and
# ADMIN_IDENTITY= (the admin's private key, when this script made it).
# ADMIN_KEY=FILE.pub makes that key the first admin's instead.
#
# Needs root (a network namespace, mounts, cgroups) and a cgroup v1 host; the
# daemons come from hack/tools.sh. docs/cluster.md, "A cluster on this machine",
# says what runs where and why.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PATH="/usr/local/go/bin:$PATH"
die() { printf 'hack/cluster-local.sh: %s\n' "$*" >&2; exit 2; }

[[ $# -eq 2 && ( $1 == up || $1 == down ) ]] || die "usage: hack/cluster-local.sh up|down DIR"
case $1 in
up)
	bash hack/tools.sh >&2
	;;
esac
mkdir -p bin
go build -o bin/clusterlocal ./hack/clusterlocal
exec bin/clusterlocal "$1" "$2"
