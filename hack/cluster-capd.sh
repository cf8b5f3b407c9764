#!/usr/bin/env bash
# A bex cluster whose machines are Docker containers on this machine, made and
# kept by Cluster API with its Docker provider (CAPD): the way bex runs on Hetzner,
# with containers for servers.
#
#   hack/cluster-capd.sh up DIR     build what is missing, start Docker and a
#                                   management plane, make the cluster, install bex,
#                                   write DIR/cluster.env
#   hack/cluster-capd.sh down DIR   delete it all: no container, network, process or
#                                   mount of it is left
#
# DIR/cluster.env holds KUBECONFIG= (the workload cluster), MGMT_KUBECONFIG= (the
# management plane: kubectl get machines), SSH_ADDR=, HTTPS_ADDR=, BASE_DOMAIN=,
# CA_FILE= (the CA the edge's certificates chain to), ADMIN_IDENTITY= (the admin's
# private key, when this script made it) and CLUSTER_NAME=. ADMIN_KEY=FILE.pub
# makes that key the first admin's instead.
#
# Settings: WORKERS (1), CLUSTER_NAME (bex), CLUSTER_VERSION (KUBE_VERSION; or
# KUBE_PREVIOUS_VERSION, the release before: a cluster to upgrade, docs/cluster.md
# says how). Where the Internet is reachable,
# CAPD_NODE_IMAGE=kindest/node:TAG and CAPD_LB_IMAGE=kindest/haproxy:TAG use
# upstream's images instead of the ones hack/capd-images.sh makes here.
#
# What runs where: Docker (dockerd from Debian's docker.io, started here when it is
# not running, and stopped by down), the management plane (hack/capdmgmt: an API
# server of its own under DIR/mgmt and Cluster API's four managers), and the
# cluster's containers: CLUSTER_NAME-lb (haproxy in front of the API servers) and
# one per Machine, named after it. docs/cluster.md, "Machines that are
# containers", says why each setting is what it is.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PATH="/usr/local/go/bin:$PATH"
say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'hack/cluster-capd.sh: %s\n' "$*" >&2; exit 2; }

[[ $# -eq 2 && ($1 == up || $1 == down) ]] || die "usage: hack/cluster-capd.sh up|down DIR"
mkdir -p "$2"
dir=$(cd "$2" && pwd)
# shellcheck source=versions.env
. hack/versions.env
# The Cluster's name: up keeps it in DIR, so that down deletes what up made.
if [[ -s $dir/cluster-name ]]; then
	CLUSTER_NAME=$(<"$dir/cluster-name")
fi
CLUSTER_NAME=${CLUSTER_NAME:-bex}
WORKERS=${WORKERS:-1}
CLUSTER_VERSION=${CLUSTER_VERSION:-$KUBE_VERSION}
[[ $CLUSTER_VERSION == "$KUBE_VERSION" || $CLUSTER_VERSION == "$KUBE_PREVIOUS_VERSION" ]] ||
	die "CLUSTER_VERSION must be $KUBE_VERSION or $KUBE_PREVIOUS_VERSION (hack/versions.env), not $CLUSTER_VERSION"
kubectl=$root/bin/kubectl
mgmt() { "$kubectl" --kubeconfig "$dir/mgmt/kubeconfig" -n default "$@"; }
wl() { "$kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }
mkdir -p "$dir/logs"

# --- Docker -----------------------------------------------------------------------
# Docker's privileged containers get every capability Docker knows of; where this
# machine's bounding set lacks some (a sandboxed host), runc refuses to start them.
# The runtime Docker is started with here (bin/capd-runc) is runc of bin/ with each
# container's and exec's capabilities cut to the bounding set: nothing more than
# the host has, and nothing else changed.
capabilities=(CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP
	LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER
	SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE
	SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP
	MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF
	CHECKPOINT_RESTORE)
bounding=$((16#$(awk '/^CapBnd/ {print $2}' /proc/self/status)))
allowed= missing=
for i in "${!capabilities[@]}"; do
	if (((bounding >> i) & 1)); then
		allowed+="${allowed:+,}\"CAP_${capabilities[$i]}\""
	else
		missing+="${missing:+ }CAP_${capabilities[$i]}"
	fi
done

docker_up() {
	if docker info >/dev/null 2>&1; then
		if [[ -n $missing && $(docker info -f '{{.DefaultRuntime}}') != bex-capd ]]; then
			die "the running Docker cannot start privileged containers on this machine (its capability bounding set lacks $missing): stop it, and this script starts one that can"
		fi
		say "Docker is running: its settings are its own (CAPD publishes the load balancer's ports on every address unless its userland proxy is hack/capd/docker-proxy)"
		return
	fi
	command -v dockerd >/dev/null || die "dockerd is missing: run make tools (it installs Debian's docker.io)"
	sed -e "s|@RUNC@|$root/bin/runc|" -e "s|@ALLOWED@|[$allowed]|" hack/capd/runc >bin/capd-runc
	chmod 0755 bin/capd-runc
	[[ -x /usr/sbin/docker-proxy ]] || die "/usr/sbin/docker-proxy is missing: run make tools (it installs Debian's docker.io)"
	say "starting Docker (dockerd, log in $dir/logs/dockerd.log)"
	# No default bridge (the cluster has a network of its own, CAPD's "kind"), no
	# iptables rules (the containers reach each other on that bridge and nothing
	# outside; down leaves no chain behind), and ports published on loopback only
	# (the API servers' load balancer: CAPD asks for every address, and the
	# userland proxy, hack/capd/docker-proxy, publishes it on loopback).
	setsid dockerd --host unix:///var/run/docker.sock --bridge=none --iptables=false --ip=127.0.0.1 \
		--userland-proxy-path "$root/hack/capd/docker-proxy" \
		--add-runtime "bex-capd=$root/bin/capd-runc" --default-runtime bex-capd \
		--pidfile "$dir/dockerd.pid" </dev/null >"$dir/logs/dockerd.log" 2>&1 &
	local pid=$! i
	for ((i = 0; i < 300; i++)); do
		docker info >/dev/null 2>&1 && return
		kill -0 "$pid" 2>/dev/null || die "dockerd exited: $(tail -3 "$dir/logs/dockerd.log")"
		sleep 0.2
	done
	die "Docker did not answer within 60 s: $(tail -3 "$dir/logs/dockerd.log")"
}

# ours_dockerd prints the PID of the dockerd this script started for DIR, if it runs.
ours_dockerd() {
	local pid
	pid=$(cat "$dir/dockerd.pid" 2>/dev/null) || return 0
	[[ $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) == dockerd\ *"$dir/dockerd.pid"* ]] && echo "$pid"
	return 0
}

up() {
	local start=$SECONDS
	echo "$CLUSTER_NAME" >"$dir/cluster-name"
	bash hack/tools.sh >&2
	docker_up
	# CAPD mounts /lib/modules into every machine (read-only, for kube-proxy's
	# checks); a machine without modules (a container host) has none to give.
	[[ -d /lib/modules ]] || mkdir -p /lib/modules

	if [[ -z ${CAPD_NODE_IMAGE:-} ]]; then
		bash hack/capd-images.sh
		CAPD_NODE_IMAGE=bex.local/capd/node:$CLUSTER_VERSION
		CAPD_LB_IMAGE=bex.local/capd/haproxy:$KUBE_VERSION
	fi
	CAPD_LB_IMAGE=${CAPD_LB_IMAGE:-kindest/haproxy:v20230606-42a2262b}
	export CAPD_NODE_IMAGE
	export CAPD_LB_IMAGE_REPOSITORY=${CAPD_LB_IMAGE%/haproxy:*} CAPD_LB_IMAGE_TAG=${CAPD_LB_IMAGE##*/haproxy:}
	[[ $CAPD_LB_IMAGE == "$CAPD_LB_IMAGE_REPOSITORY/haproxy:$CAPD_LB_IMAGE_TAG" ]] ||
		die "CAPD_LB_IMAGE must be REPOSITORY/haproxy:TAG (CAPD names its load balancer so), not $CAPD_LB_IMAGE"

	# CAPD puts every container on the Docker network "kind" (kind's, which kind
	# makes); here nothing else makes it.
	if ! docker network inspect kind >/dev/null 2>&1; then
		docker network create kind >/dev/null
		touch "$dir/kind-network"
	fi

	# bex's images (make image, hack/nodeimages) into Docker, whence CAPD copies
	# them into every machine it makes (preLoadImages): no registry serves them.
	go build -o bin/clusterlocal ./hack/clusterlocal
	bin/clusterlocal images "$dir"
	local preload=\"bex.local/bex:dev\" key image archive
	docker load -q -i "$dir/images/bex-docker.tar" >/dev/null
	for key in REGISTRY BUILDKIT CNPG; do
		image=$(sed -n "s/^${key}_IMAGE=//p" "$dir/images/images.env")
		archive=$(sed -n "s/^${key}_ARCHIVE=//p" "$dir/images/images.env")
		docker load -q -i "$archive" >/dev/null
		preload+=",\"$image\""
	done
	export CAPD_PRELOAD_IMAGES="[$preload]"
	# The gitserver's and the registry's data: this directory, at the same path in
	# every machine.
	mkdir -p "$dir/volumes"
	export CAPD_EXTRA_MOUNTS="[{hostPath: $dir/volumes, containerPath: $dir/volumes}]"
	# The apps' volumes: a file system of its own each (its size bounds what an app
	# writes), mounted here under DIR/volumes/apps before the first machine is made,
	# so that every machine's mount of DIR/volumes has them; down unmounts them.
	bin/clusterlocal volumes-capd "$dir"

	go build -o bin/capdmgmt ./hack/capdmgmt
	bin/capdmgmt up "$dir"

	# The registry's password for the nodes' kubelets, made once and kept (where
	# hack/clusterlocal keeps it: install-capd puts it in the registry's htpasswd).
	if [[ ! -s $dir/config/registry-node-password ]]; then
		mkdir -p "$dir/config"
		(umask 077 && openssl rand -hex 24 >"$dir/config/registry-node-password")
	fi
	export REGISTRY_NODE_PASSWORD
	REGISTRY_NODE_PASSWORD=$(<"$dir/config/registry-node-password")
	export CLUSTER_NAME KUBERNETES_VERSION=$CLUSTER_VERSION
	"$kubectl" kustomize infra/clusterapi/overlays/local-capd >"$dir/template.yaml"
	XDG_CONFIG_HOME=$dir/clusterctl bin/clusterctl generate cluster "$CLUSTER_NAME" --from "$dir/template.yaml" \
		--target-namespace default --kubernetes-version "$CLUSTER_VERSION" \
		--control-plane-machine-count 1 --worker-machine-count "$WORKERS" >"$dir/cluster.yaml"
	mgmt apply --server-side --field-manager=bex-cluster-capd -f "$dir/cluster.yaml" >/dev/null
	say "Cluster $CLUSTER_NAME: 1 control plane and $WORKERS workers of Kubernetes $CLUSTER_VERSION (kubectl --kubeconfig $dir/mgmt/kubeconfig get machines)"

	mgmt wait "cluster/$CLUSTER_NAME" --for=condition=ControlPlaneInitialized --timeout=10m >/dev/null
	mgmt get secret "$CLUSTER_NAME-kubeconfig" -o 'jsonpath={.data.value}' | base64 -d >"$dir/kubeconfig.tmp"
	mv "$dir/kubeconfig.tmp" "$dir/kubeconfig"
	say "control plane up after $((SECONDS - start)) s; kubeconfig: $dir/kubeconfig"
	wl apply --server-side --field-manager=bex-cluster-capd -f hack/capd/podnet-rbac.yaml >/dev/null
	mgmt wait "cluster/$CLUSTER_NAME" --for=condition=Available --timeout=10m >/dev/null
	wl wait nodes --all --for=condition=Ready --timeout=5m >/dev/null
	say "$((WORKERS + 1)) nodes Ready after $((SECONDS - start)) s"

	# bex, as on the one-node cluster (hack/clusterlocal install-capd), its node
	# ports published at the control plane machine's address.
	local cp_ip
	cp_ip=$(wl get nodes -l node-role.kubernetes.io/control-plane \
		-o 'jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}')
	NODE_IP=$cp_ip bin/clusterlocal install-capd "$dir"
	cat >>"$dir/cluster.env" <<EOF
MGMT_KUBECONFIG=$dir/mgmt/kubeconfig
CLUSTER_NAME=$CLUSTER_NAME
EOF
	say "cluster up in $((SECONDS - start)) s; settings in $dir/cluster.env"
}

down() {
	local start=$SECONDS
	if [[ -f $dir/mgmt/ready ]] && docker info >/dev/null 2>&1; then
		say "deleting Cluster $CLUSTER_NAME (its machines' containers go with it)"
		mgmt delete cluster "$CLUSTER_NAME" --ignore-not-found --wait --timeout=3m >/dev/null ||
			say "the Cluster was not deleted within 3 minutes: removing its containers directly"
	fi
	if [[ -x bin/capdmgmt ]]; then
		bin/capdmgmt down "$dir"
	fi
	if docker info >/dev/null 2>&1; then
		# Whatever Cluster API left (a management plane that was gone already):
		# CAPD labels every container of a cluster with its name.
		local left
		left=$(docker ps -aq --filter "label=io.x-k8s.kind.cluster=$CLUSTER_NAME")
		[[ -z $left ]] || docker rm -f -v $left >/dev/null
		# The network "kind", when this script made it or started the Docker that
		# keeps it (Docker keeps a network, and its bridge device, across restarts),
		# and nothing else is on it.
		if [[ -f $dir/kind-network || -n $(ours_dockerd) ]] && docker network inspect kind >/dev/null 2>&1 &&
			[[ -z $(docker network inspect kind -f '{{range .Containers}}{{.Name}} {{end}}') ]]; then
			docker network rm kind >/dev/null
		fi
		rm -f "$dir/kind-network"
	fi
	# The apps' volumes, once no machine holds them.
	if [[ -x bin/clusterlocal ]]; then
		bin/clusterlocal unmount-capd "$dir"
	fi
	local pid
	pid=$(ours_dockerd)
	if [[ -n $pid ]]; then
		say "stopping the Docker this script started (PID $pid)"
		kill -TERM "$pid"
		local i
		for ((i = 0; i < 150; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.2
		done
		kill -0 "$pid" 2>/dev/null && die "dockerd (PID $pid) did not stop within 30 s"
		rm -f "$dir/dockerd.pid"
	fi
	say "down in $((SECONDS - start)) s"
}

"$1"
