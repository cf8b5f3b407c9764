#!/usr/bin/env bash
# From zero to bex on a cluster of containers on this machine (Docker), with
# Cluster API's Docker provider (CAPD). Needs Docker, kind and clusterctl; the
# cluster is for trying bex as it runs on a real cluster, not for production.
#
#   make image && hack/cluster-capd.sh
#
# 1. a kind cluster "bex-mgmt" runs Cluster API's controllers (the management
#    cluster), with the Docker socket mounted for CAPD;
# 2. clusterctl init --infrastructure docker (versions from hack/versions.env);
# 3. infra/clusterapi/overlays/local-capd, rendered, filled in by clusterctl
#    generate cluster, applied: 1 control plane and WORKER_MACHINE_COUNT workers,
#    each a kindest/node container;
# 4. the kubeconfig, a CNI (Calico) and a storage class (local-path) on the new
#    cluster, then bex's image loaded into its nodes and hack/install-bex.sh.
#
# Settings: CLUSTER_NAME (bex), KUBERNETES_VERSION (v1.35.0, a kindest/node tag),
# WORKER_MACHINE_COUNT (1), BEX_IMAGE_TAR (bin/bex-image.tar), and those of
# install-bex.sh. Remove it all: kubectl delete cluster bex (on the management
# cluster), then kind delete cluster --name bex-mgmt.
. "$(dirname "$0")/cluster-lib.sh"
need docker kind clusterctl
export CONTROL_PLANE_MACHINE_COUNT=${CONTROL_PLANE_MACHINE_COUNT:-1}
export WORKER_MACHINE_COUNT=${WORKER_MACHINE_COUNT:-1}
CALICO_VERSION=${CALICO_VERSION:-v3.30.3}
LOCAL_PATH_VERSION=${LOCAL_PATH_VERSION:-v0.0.32}

management_cluster <<YAML
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
    extraMounts:
      - hostPath: /var/run/docker.sock
        containerPath: /var/run/docker.sock
YAML

if ! "$kubectl" get namespace capd-system >/dev/null 2>&1; then
	say "clusterctl init --infrastructure docker ($CLUSTER_API_VERSION)"
	clusterctl init --core "cluster-api:$CLUSTER_API_VERSION" \
		--bootstrap "kubeadm:$CLUSTER_API_VERSION" --control-plane "kubeadm:$CLUSTER_API_VERSION" \
		--infrastructure "docker:$CLUSTER_API_VERSION" --wait-providers
fi

generate local-capd
"$kubectl" apply --server-side -f "$work/cluster.yaml"
workload_kubeconfig

say "Calico $CALICO_VERSION (the pod network) and local-path $LOCAL_PATH_VERSION (volumes) on $CLUSTER_NAME"
KUBECONFIG=$work/kubeconfig "$kubectl" apply --server-side -f \
	"https://raw.githubusercontent.com/projectcalico/calico/$CALICO_VERSION/manifests/calico.yaml"
KUBECONFIG=$work/kubeconfig "$kubectl" apply --server-side -f \
	"https://raw.githubusercontent.com/rancher/local-path-provisioner/$LOCAL_PATH_VERSION/deploy/local-path-storage.yaml"
KUBECONFIG=$work/kubeconfig "$kubectl" patch storageclass local-path \
	-p '{"metadata":{"annotations":{"storageclass.kubernetes.io/is-default-class":"true"}}}'
wait_available

# No registry is needed for bex itself: its image goes straight into each node's
# containerd (the nodes are containers on this machine).
tar=${BEX_IMAGE_TAR:-$root/bin/bex-image.tar}
[[ -f $tar ]] || die "$tar is missing: run make image first"
# CAPD names the machine containers <cluster>-<machine>; <cluster>-lb is the load
# balancer, no node.
for node in $(docker ps --filter "name=^$CLUSTER_NAME-" --format '{{.Names}}' | grep -v -- '-lb$'); do
	say "loading $(basename "$tar") into $node"
	docker exec -i "$node" ctr -n k8s.io images import --all-platforms - <"$tar"
done

export BEX_IMAGE=${BEX_IMAGE:-bex.local/bex:dev}
KUBECONFIG=$work/kubeconfig "$root/hack/install-bex.sh"
