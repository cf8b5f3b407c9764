# Shared by hack/cluster-capd.sh and hack/cluster-hetzner.sh (sourced, not run).
# shellcheck shell=bash
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=versions.env
. "$root/hack/versions.env"
say() { printf '==> %s\n' "$*" >&2; }
die() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; exit 1; }
need() {
	local p
	for p in "$@"; do
		command -v "$p" >/dev/null 2>&1 || die "$p is missing: $(hint "$p")"
	done
}
hint() {
	case $1 in
	docker) echo "install Docker Engine (https://docs.docker.com/engine/install/)" ;;
	kind) echo "go install sigs.k8s.io/kind@latest (the management cluster runs in kind)" ;;
	clusterctl) echo "download clusterctl $CLUSTER_API_VERSION from the cluster-api releases (https://cluster-api.sigs.k8s.io/user/quick-start)" ;;
	*) echo "install it" ;;
	esac
}
kubectl=${KUBECTL:-}
if [[ -z $kubectl ]]; then
	if [[ -x $root/bin/kubectl ]]; then kubectl=$root/bin/kubectl; else kubectl=kubectl; fi
fi

CLUSTER_NAME=${CLUSTER_NAME:-bex}
KUBERNETES_VERSION=${KUBERNETES_VERSION:-v1.35.0}
MGMT_CLUSTER=${MGMT_CLUSTER:-bex-mgmt}
work=${WORK_DIR:-$root/.state/cluster-$CLUSTER_NAME}
mkdir -p "$work"

# The password of bex's registry's user node: the nodes' kubelets pull with it
# (/var/lib/kubelet/config.json of infra/clusterapi's kubeadm files, filled in
# by generate) and hack/install-bex.sh puts it in the registry's htpasswd. Made
# once and kept in $work, so machines made later (and a second run) get the
# same; or REGISTRY_NODE_PASSWORD from the environment.
if [[ -z ${REGISTRY_NODE_PASSWORD:-} ]]; then
	if [[ ! -s $work/registry-node-password ]]; then
		(umask 077 && openssl rand -hex 24 >"$work/registry-node-password")
	fi
	REGISTRY_NODE_PASSWORD=$(<"$work/registry-node-password")
fi
export REGISTRY_NODE_PASSWORD

# management_cluster makes the kind cluster that runs Cluster API's controllers
# (extra kind config on stdin), unless it exists.
management_cluster() {
	if kind get clusters 2>/dev/null | grep -qx "$MGMT_CLUSTER"; then
		say "management cluster kind-$MGMT_CLUSTER exists"
	else
		say "creating the management cluster kind-$MGMT_CLUSTER"
		kind create cluster --name "$MGMT_CLUSTER" --config -
	fi
	export KUBECONFIG=$work/management.kubeconfig
	kind get kubeconfig --name "$MGMT_CLUSTER" >"$KUBECONFIG"
}

# generate renders infra/clusterapi/overlays/$1 and lets clusterctl fill in the
# variables (from the environment) into $work/cluster.yaml.
generate() {
	"$kubectl" kustomize "$root/infra/clusterapi/overlays/$1" >"$work/template.yaml"
	clusterctl generate cluster "$CLUSTER_NAME" --from "$work/template.yaml" \
		--kubernetes-version "$KUBERNETES_VERSION" \
		--control-plane-machine-count "$CONTROL_PLANE_MACHINE_COUNT" \
		--worker-machine-count "$WORKER_MACHINE_COUNT" >"$work/cluster.yaml"
	say "cluster objects in $work/cluster.yaml"
}

# workload_kubeconfig waits until the control plane answers and writes the
# workload cluster's kubeconfig to $work/kubeconfig.
workload_kubeconfig() {
	say "waiting for the control plane of $CLUSTER_NAME (clusterctl describe cluster $CLUSTER_NAME shows progress)"
	"$kubectl" wait "cluster/$CLUSTER_NAME" --for=condition=ControlPlaneInitialized --timeout=30m
	clusterctl get kubeconfig "$CLUSTER_NAME" >"$work/kubeconfig"
	say "workload cluster kubeconfig: $work/kubeconfig"
}

# wait_available waits until every machine is up and its node Ready (after the CNI).
wait_available() {
	"$kubectl" wait "cluster/$CLUSTER_NAME" --for=condition=Available --timeout=30m
	clusterctl describe cluster "$CLUSTER_NAME" || true
}
