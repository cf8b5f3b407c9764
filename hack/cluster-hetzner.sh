#!/usr/bin/env bash
# From zero to bex on Hetzner Cloud, with Cluster API's Hetzner provider (CAPH).
# Needs Docker, kind and clusterctl on this machine (for the temporary management
# cluster), a Hetzner Cloud project with an API token and an SSH key, and the bex
# image in a registry the servers can pull from (make image, then push
# bin/bex-image.tar, e.g. skopeo copy oci-archive:bin/bex-image.tar docker://...).
#
#   HCLOUD_TOKEN=... SSH_KEY_NAME=my-key HCLOUD_REGION=fsn1 \
#   BEX_IMAGE=registry.example.com/bex:v1 BASE_DOMAIN=apps.example.com \
#   ACME_EMAIL=me@example.com hack/cluster-hetzner.sh
#
# 1. a kind cluster "bex-mgmt" runs Cluster API's controllers for now;
# 2. clusterctl init --infrastructure hetzner ($CAPH_VERSION), the Secret "hetzner"
#    with the token (labelled so that clusterctl move takes it along);
# 3. infra/clusterapi/overlays/hetzner-caph (or hetzner-caph-baremetal with
#    OVERLAY=hetzner-caph-baremetal), rendered, filled in, applied: a load balancer
#    for the API server, CONTROL_PLANE_MACHINE_COUNT (3) control plane servers and
#    WORKER_MACHINE_COUNT (2) workers of HCLOUD_*_MACHINE_TYPE (cpx31), spread over
#    placement groups;
# 4. on the new cluster: the Hetzner cloud controller manager (nodes, load
#    balancers), Cilium (pod network), the Hetzner CSI driver (volumes for the
#    registry and the gitserver), then hack/install-bex.sh;
# 5. with MOVE=1, clusterctl move makes the new cluster manage itself and the kind
#    cluster can go.
. "$(dirname "$0")/cluster-lib.sh"
need docker kind clusterctl helm
: "${HCLOUD_TOKEN:?set HCLOUD_TOKEN to a read-write API token of the Hetzner Cloud project}"
: "${SSH_KEY_NAME:?set SSH_KEY_NAME to the name of an SSH key in the Hetzner Cloud project}"
export HCLOUD_REGION=${HCLOUD_REGION:-fsn1}
export CONTROL_PLANE_MACHINE_COUNT=${CONTROL_PLANE_MACHINE_COUNT:-3}
export WORKER_MACHINE_COUNT=${WORKER_MACHINE_COUNT:-2}
export HCLOUD_CONTROL_PLANE_MACHINE_TYPE=${HCLOUD_CONTROL_PLANE_MACHINE_TYPE:-cpx31}
export HCLOUD_WORKER_MACHINE_TYPE=${HCLOUD_WORKER_MACHINE_TYPE:-cpx31}
export SSH_KEY_NAME
OVERLAY=${OVERLAY:-hetzner-caph}
: "${BEX_IMAGE:?set BEX_IMAGE to the bex image in a registry the servers can pull from}"

printf 'kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\n' | management_cluster

if ! "$kubectl" get namespace caph-system >/dev/null 2>&1; then
	say "clusterctl init --infrastructure hetzner ($CAPH_VERSION), Cluster API $CLUSTER_API_VERSION"
	clusterctl init --core "cluster-api:$CLUSTER_API_VERSION" \
		--bootstrap "kubeadm:$CLUSTER_API_VERSION" --control-plane "kubeadm:$CLUSTER_API_VERSION" \
		--infrastructure "hetzner:$CAPH_VERSION" --wait-providers
fi
"$kubectl" create secret generic hetzner --from-literal=hcloud="$HCLOUD_TOKEN" \
	--dry-run=client -o yaml | "$kubectl" apply --server-side -f -
"$kubectl" label secret hetzner clusterctl.cluster.x-k8s.io/move="" --overwrite

generate "$OVERLAY"
"$kubectl" apply --server-side -f "$work/cluster.yaml"
workload_kubeconfig

export KUBECONFIG_WORKLOAD=$work/kubeconfig
wk() { KUBECONFIG=$KUBECONFIG_WORKLOAD "$@"; }
say "Hetzner cloud controller manager, Cilium and the Hetzner CSI driver on $CLUSTER_NAME"
wk "$kubectl" -n kube-system create secret generic hcloud --from-literal=token="$HCLOUD_TOKEN" \
	--dry-run=client -o yaml | wk "$kubectl" apply --server-side -f -
helm repo add hcloud https://charts.hetzner.cloud >/dev/null
helm repo add cilium https://helm.cilium.io >/dev/null
helm repo update >/dev/null
wk helm upgrade --install hccm hcloud/hcloud-cloud-controller-manager -n kube-system
wk helm upgrade --install cilium cilium/cilium -n kube-system
wk helm upgrade --install hcloud-csi hcloud/hcloud-csi -n kube-system
wait_available

wk "$root/hack/install-bex.sh"
# The SSH load balancer in the cluster's region.
wk "$kubectl" -n bex-system annotate service bex-gitserver --overwrite \
	load-balancer.hetzner.cloud/location="$HCLOUD_REGION"

if [[ ${MOVE:-0} == 1 ]]; then
	say "clusterctl move: $CLUSTER_NAME manages itself from now on"
	KUBECONFIG=$KUBECONFIG_WORKLOAD clusterctl init --core "cluster-api:$CLUSTER_API_VERSION" \
		--bootstrap "kubeadm:$CLUSTER_API_VERSION" --control-plane "kubeadm:$CLUSTER_API_VERSION" \
		--infrastructure "hetzner:$CAPH_VERSION" --wait-providers
	clusterctl move --to-kubeconfig "$KUBECONFIG_WORKLOAD"
	say "done: kind delete cluster --name $MGMT_CLUSTER removes the management cluster"
fi
