#!/usr/bin/env bash
# The images of a cluster of Docker containers (hack/cluster-capd.sh), made on
# this machine from Debian's packages and the binaries hack/tools.sh builds: no
# registry is asked for anything.
#
#   hack/capd-images.sh        load them into Docker unless they are there already
#
# bex.local/capd/node:KUBE_VERSION, a machine of Cluster API's Docker provider:
#   Debian 12 (mmdebstrap) with systemd, Debian's containerd and CNI plugins, runc
#   of bin/ (the 2025 fixes), kubelet, kubeadm and kubectl of KUBE_VERSION and
#   crictl (which the provider runs before it bootstraps a machine); kind's
#   entrypoint and units (sigs.k8s.io/kind@KIND_VERSION, from the module cache) for
#   systemd in a container; and every image kubeadm runs (hack/nodeimages
#   --kube-images), imported into containerd at boot, before the kubelet starts,
#   so that kubeadm pulls nothing. Its pods, and the machine itself, reach the
#   cluster and nothing else (hack/capd/isolate).
# bex.local/capd/node:KUBE_PREVIOUS_VERSION, the same of the release before (its
#   kubelet, kubeadm, kubectl and Kubernetes images): a cluster made there is
#   upgraded to KUBE_VERSION's image.
# bex.local/capd/haproxy:KUBE_VERSION, the cluster's load balancer: the same
#   layer, running Debian's haproxy as the provider expects of kindest/haproxy (its
#   configuration at /usr/local/etc/haproxy/haproxy.cfg, reloaded on SIGHUP).
#
# Each image carries the hash of its inputs (label co.bex.inputs): it is made again
# only when one changed. Where the Internet is reachable, CAPD_NODE_IMAGE and
# CAPD_LB_IMAGE may name upstream's kindest/node and kindest/haproxy instead
# (hack/cluster-capd.sh passes them on, and this script is not run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PATH="/usr/local/go/bin:$PATH"
say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'hack/capd-images.sh: %s\n' "$*" >&2; exit 2; }
# shellcheck source=versions.env
. hack/versions.env

# A node image per release: KUBE_VERSION's, and the release before's
# (KUBE_PREVIOUS_VERSION: a cluster made there to be upgraded), each with its own
# kubelet, kubeadm, kubectl and Kubernetes images (bin/kube-V, bin/kubenode-V,
# bin/kubeadm-V), on one root file system.
releases=("$KUBE_VERSION" "$KUBE_PREVIOUS_VERSION")
# CAPD names its load balancer REPOSITORY/haproxy:TAG (the DevCluster says which).
lb_image=bex.local/capd/haproxy:$KUBE_VERSION
docker info >/dev/null 2>&1 || die "Docker is not running (hack/cluster-capd.sh starts it)"
for b in bin/crictl bin/runc; do
	[[ -x $b ]] || die "$b is missing: run make tools"
done
for v in "${releases[@]}"; do
	for b in "bin/kubenode-$v/kubelet" "bin/kubeadm-$v/kubeadm" "bin/kube-$v/kubectl"; do
		[[ -x $b ]] || die "$b is missing: run make tools"
	done
done
kind_dir=$(cd / && GOFLAGS= go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | jq -r .Dir)
kind_files=$kind_dir/images/base/files
[[ -f $kind_files/usr/local/bin/entrypoint ]] || die "sigs.k8s.io/kind@$KIND_VERSION has no images/base/files/usr/local/bin/entrypoint"

# Each release's images, as its kubeadm names them, into bin/capd-images-V; and in
# each, the DaemonSets' and Deployments' images of both releases, which run on
# every node whatever its release while an upgrade is under way: kube-proxy (the
# control plane's release, on the nodes of both) and CoreDNS (Cluster API keeps
# the one the cluster was made with unless told otherwise; the same binary, this
# machine's CoreDNS, under each release's name). No registry serves them here.
declare -A kube_images pause_image
shared_images=
for v in "${releases[@]}"; do
	mkdir -p "bin/capd-images-$v"
	kube_images[$v]=$("bin/kubeadm-$v/kubeadm" config images list --kubernetes-version "$v" 2>/dev/null | tr '\n' ' ')
	[[ -n ${kube_images[$v]} ]] || die "kubeadm $v config images list printed nothing"
	pause_image[$v]=$(tr ' ' '\n' <<<"${kube_images[$v]}" | grep /pause:)
	shared_images+=" $(tr ' ' '\n' <<<"${kube_images[$v]}" | grep -E '/(coredns|kube-proxy):' | tr '\n' ' ')"
done
for v in "${releases[@]}"; do
	kube_images[$v]=$(tr ' ' '\n' <<<"${kube_images[$v]} $shared_images" | grep . | sort -u | tr '\n' ' ')
	go run ./hack/nodeimages --out "bin/capd-images-$v" --kube-images "${kube_images[$v]}" --kube-version "$v" >/dev/null
done
work=bin/capd-images-$KUBE_VERSION

# Debian's packages: what systemd, the kubelet, kube-proxy and containerd need in a
# node (kind's list, less storage drivers bex does not use), and haproxy for the
# load balancer.
packages=systemd,systemd-sysv,dbus,conntrack,iptables,nftables,iproute2,ethtool,socat,util-linux,mount,kmod,libseccomp2,ca-certificates,procps,containerd,containernetworking-plugins,haproxy,bash
inputs=$( {
	echo "$packages $KIND_VERSION"
	cat hack/capd-images.sh hack/capd/podnet-rbac.yaml hack/capd/isolate
	sha256sum bin/crictl bin/runc
	for v in "${releases[@]}"; do
		echo "$v ${kube_images[$v]}"
		cat "bin/capd-images-$v/kube-images.tar.inputs"
		sha256sum "bin/kubenode-$v/kubelet" "bin/kubeadm-$v/kubeadm" "bin/kube-$v/kubectl"
	done
	find "$kind_files" -type f -print0 | sort -z | xargs -0 sha256sum
} | sha256sum | cut -d' ' -f1)
have() { [[ $(docker image inspect -f '{{index .Config.Labels "co.bex.inputs"}}' "$1" 2>/dev/null) == "$inputs" ]]; }
if have "$lb_image" && have "bex.local/capd/node:$KUBE_VERSION" && have "bex.local/capd/node:$KUBE_PREVIOUS_VERSION"; then
	say "bex.local/capd/node:$KUBE_VERSION, bex.local/capd/node:$KUBE_PREVIOUS_VERSION and $lb_image are up to date"
	exit 0
fi

start=$SECONDS
rootfs=$work/rootfs
rm -rf "$rootfs"
say "Debian 12 for the node image (mmdebstrap)"
mmdebstrap --quiet --variant=minbase --include="$packages" --format=directory bookworm "$rootfs" \
	"deb http://deb.debian.org/debian bookworm main" \
	"deb http://deb.debian.org/debian bookworm-updates main" \
	"deb http://deb.debian.org/debian-security bookworm-security main"

# systemd in a container, as kind's base image sets it up: no units that need a
# real machine, no kernel log, binfmt (kernel-global) masked.
find "$rootfs/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
rm -f "$rootfs"/lib/systemd/system/multi-user.target.wants/* "$rootfs"/etc/systemd/system/*.wants/* \
	"$rootfs"/lib/systemd/system/local-fs.target.wants/* "$rootfs"/lib/systemd/system/sockets.target.wants/*udev* \
	"$rootfs"/lib/systemd/system/sockets.target.wants/*initctl* "$rootfs"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"$rootfs/etc/systemd/journald.conf"
# A machine applies its sysctl.d files at boot (systemd-sysctl). Network settings
# are its own network namespace's; every other key (fs.protected_regular,
# kernel.pid_max: procps' and systemd's defaults) is the host's kernel's, which a
# privileged container can write: a file that sets one is removed, so that a
# machine changes nothing of the host's (fs.protected_regular=2 broke the host's
# Postgres stand-ins, whose entrypoint writes a file it gave to postgres in /tmp).
for f in "$rootfs"/usr/lib/sysctl.d/*.conf "$rootfs"/etc/sysctl.d/*.conf "$rootfs"/etc/sysctl.conf; do
	[[ -e $f ]] || continue
	if grep -qvE '^[[:space:]]*([#;].*)?$|^[[:space:]]*-?net\.' "$f"; then rm -f "$f"; fi
done
ln -sf /dev/null "$rootfs/etc/systemd/system/systemd-binfmt.service"

# kind's entrypoint (cgroups, mounts, the node's address) and units.
install -D -m 0755 "$kind_files/usr/local/bin/entrypoint" "$rootfs/usr/local/bin/entrypoint"
install -d -m 0755 "$rootfs/kind/bin" "$rootfs/etc/systemd/system/kubelet.service.d" "$rootfs/etc/kubernetes/manifests"
install -m 0755 "$kind_files"/kind/bin/* "$rootfs/kind/bin/"
for f in kubelet.service kubelet.slice undo-mount-hacks.service; do
	install -m 0644 "$kind_files/etc/systemd/system/$f" "$rootfs/etc/systemd/system/$f"
done
install -m 0644 "$kind_files"/etc/systemd/system/kubelet.service.d/* "$rootfs/etc/systemd/system/kubelet.service.d/"
install -m 0644 "$kind_files"/etc/sysctl.d/* "$rootfs/etc/sysctl.d/"
install -m 0644 "$kind_files/etc/crictl.yaml" "$rootfs/etc/crictl.yaml"

# The binaries: Kubernetes' (each release's, below) at /usr/bin, where kind's units
# run them; runc of bin/ beside Debian's (which containerd is told not to use).
install -m 0755 bin/crictl "$rootfs/usr/local/bin/crictl"
install -m 0755 bin/runc "$rootfs/usr/local/sbin/runc"
install -d "$rootfs/opt/cni"
ln -sfn /usr/lib/cni "$rootfs/opt/cni/bin"

# The kubelet: this machine may run cgroup v1, which the kubelet refuses unless
# told (its drop-in directory, read after kubeadm's configuration).
install -d "$rootfs/etc/kubernetes/kubelet.conf.d"
cat >"$rootfs/etc/kubernetes/kubelet.conf.d/50-bex.conf" <<'EOF'
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
EOF
echo 'KUBELET_EXTRA_ARGS=--runtime-cgroups=/system.slice/containerd.service --config-dir=/etc/kubernetes/kubelet.conf.d' >"$rootfs/etc/default/kubelet"

# containerd: runc of bin/, systemd's cgroups (the kubelet's driver under kubeadm),
# the pause image kubeadm's release names (@PAUSE_IMAGE@, each release's, below),
# and the pod network's configuration made from a template once the kubelet tells
# containerd the node's pod CIDR.
cat >"$work/containerd-config.toml.in" <<'EOF'
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "@PAUSE_IMAGE@"
  tolerate_missing_hugepages_controller = true
  restrict_oom_score_adj = true
[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
  discard_unpacked_layers = true
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
    BinaryName = "/usr/local/sbin/runc"
# The registry mirror files that infra/clusterapi's kubeadm objects write.
[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "/etc/containerd/certs.d"
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/opt/cni/bin"
  conf_dir = "/etc/cni/net.d"
  conf_template = "/etc/cni/bex-podnet.template"
EOF
install -d "$rootfs/etc/cni/net.d"
cat >"$rootfs/etc/cni/bex-podnet.template" <<'EOF'
{
  "cniVersion": "1.0.0",
  "name": "bex-podnet",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [{{range $i, $range := .PodCIDRRanges}}{{if $i}}, {{end}}[{"subnet": "{{$range}}"}]{{end}}],
              "routes": [{{range $i, $route := .Routes}}{{if $i}}, {{end}}{"dst": "{{$route}}"}{{end}}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

# Kubernetes' images (each release's, below), imported before the kubelet starts.
install -d "$rootfs/bex/images"
cat >"$rootfs/etc/systemd/system/bex-preload.service" <<'EOF'
[Unit]
Description=Import the node's Kubernetes images into containerd (the node pulls nothing)
Requires=containerd.service
After=containerd.service
Before=kubelet.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for f in /bex/images/*.tar; do ctr -n k8s.io images import --no-unpack "$f" || exit 1; done'
[Install]
WantedBy=multi-user.target
EOF

# The pod network across nodes: a route to each other node's pod CIDR through its
# address (the nodes share one Docker network), kept by a watch of the nodes with
# the kubelet's own credentials, started once kubeadm wrote them. The Node
# authorizer lets a kubelet read its own Node only: hack/cluster-capd.sh grants the
# group system:nodes list and watch of nodes (podnet-rbac.yaml, here too).
cat >"$rootfs/usr/local/bin/bex-podnet-routes" <<'EOF'
#!/bin/bash
# Keeps a route to every other node's pod CIDR, via that node's address.
set -u
self=$(hostname)
kubectl --kubeconfig=/etc/kubernetes/kubelet.conf get nodes --watch \
	-o jsonpath='{.metadata.name} {.spec.podCIDR} {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}' |
	while read -r name cidr addr; do
		[[ $name != "$self" && -n $cidr && -n $addr ]] || continue
		ip route replace "$cidr" via "$addr"
		# bex-isolate lets the machine's pods reach this node's pods.
		nft add element inet bex_isolate peers "{ $cidr }"
	done
exit 1
EOF
chmod 0755 "$rootfs/usr/local/bin/bex-podnet-routes"
install -D -m 0644 hack/capd/podnet-rbac.yaml "$rootfs/etc/bex/podnet-rbac.yaml"
cat >"$rootfs/etc/systemd/system/bex-podnet-routes.service" <<'EOF'
[Unit]
Description=Routes to the other nodes' pods
After=kubelet.service
StartLimitIntervalSec=0
[Service]
ExecStart=/usr/local/bin/bex-podnet-routes
Restart=always
RestartSec=3s
EOF
cat >"$rootfs/etc/systemd/system/bex-podnet-routes.path" <<'EOF'
[Unit]
Description=Start the pod routes once the kubelet has its credentials
[Path]
PathExists=/etc/kubernetes/kubelet.conf
[Install]
WantedBy=multi-user.target
EOF

# What a pod (and the machine itself) may open a connection to: the cluster only
# (hack/capd/isolate). containerd and the kubelet require it: no pod runs on a
# machine whose rules are not in place.
install -m 0755 hack/capd/isolate "$rootfs/usr/local/sbin/bex-isolate"
cat >"$rootfs/etc/systemd/system/bex-isolate.service" <<'EOF'
[Unit]
Description=Pods and the machine reach the cluster only (no host, LAN or Internet)
Before=containerd.service kubelet.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/bex-isolate
[Install]
WantedBy=multi-user.target
EOF
for u in containerd kubelet; do
	install -d "$rootfs/etc/systemd/system/$u.service.d"
	printf '[Unit]\nRequires=bex-isolate.service\nAfter=bex-isolate.service\n' >"$rootfs/etc/systemd/system/$u.service.d/10-bex-isolate.conf"
done

# The load balancer's configuration until the provider writes its own.
install -d "$rootfs/usr/local/etc/haproxy"
cat >"$rootfs/usr/local/etc/haproxy/haproxy.cfg" <<'EOF'
defaults
  mode tcp
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend control-plane
  bind *:6443
  default_backend kube-apiservers
backend kube-apiservers
EOF

# haproxy, as the load balancer runs it. CAPD's configuration asks for 100,000
# connections, which needs 200,030 open files; where the hard limit is lower and
# cannot be raised (a sandboxed host), haproxy refuses it. CAPD starts the
# container with its own command (haproxy -W -db -f ...) and reloads it with
# SIGHUP, so the haproxy it finds first on PATH passes -n, which takes precedence
# over the configuration's maxconn: what the limit allows, at most 100,000.
cat >"$rootfs/usr/local/sbin/haproxy" <<'EOF'
#!/bin/sh
max=$((($(ulimit -Hn) - 100) / 2))
[ "$max" -le 100000 ] || max=100000
exec /usr/sbin/haproxy -n "$max" "$@"
EOF
chmod 0755 "$rootfs/usr/local/sbin/haproxy"

wants=$rootfs/etc/systemd/system/multi-user.target.wants
install -d "$wants"
ln -sf /lib/systemd/system/containerd.service "$wants/containerd.service"
for u in kubelet.service undo-mount-hacks.service bex-preload.service bex-podnet-routes.path bex-isolate.service; do
	ln -sf "/etc/systemd/system/$u" "$wants/$u"
done

tar=$work/rootfs.tar
# import_rootfs VERSION: the root file system as the layer of bex.local/capd/rootfs:VERSION.
# docker import takes the layer; the configuration (a stop signal among it, which
# import cannot set) comes from a build on top of it, with nothing to send.
import_rootfs() {
	tar -C "$rootfs" --numeric-owner -cf "$tar" .
	docker import --change "LABEL co.bex.inputs=$inputs" "$tar" bex.local/capd/rootfs:"$1" >/dev/null
}
# (The legacy builder: Debian's Docker has no buildx. Its deprecation notice is
# shown only when the build fails.)
configure() { # IMAGE VERSION DOCKERFILE-LINES
	DOCKER_BUILDKIT=0 docker build --quiet -t "$1" - >/dev/null 2>"$work/build.log" <<EOF || die "docker build $1: $(cat "$work/build.log")"
FROM bex.local/capd/rootfs:$2
LABEL co.bex.inputs=$inputs
$3
EOF
}
# systemd: told it is in a container, stopped by SIGRTMIN+3 (SIGTERM would make it
# re-execute itself).
node_config='ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]'
for v in "${releases[@]}"; do
	say "importing bex.local/capd/node:$v into Docker"
	install -m 0755 "bin/kubenode-$v/kubelet" "bin/kubeadm-$v/kubeadm" "bin/kube-$v/kubectl" "$rootfs/usr/bin/"
	install -m 0644 "bin/capd-images-$v/kube-images.tar" "$rootfs/bex/images/kube-images.tar"
	sed "s|@PAUSE_IMAGE@|${pause_image[$v]}|" "$work/containerd-config.toml.in" >"$rootfs/etc/containerd/config.toml"
	import_rootfs "$v"
	configure "bex.local/capd/node:$v" "$v" "$node_config"
	if [[ $v == "$KUBE_VERSION" ]]; then
		# haproxy in master-worker mode (CAPD passes the same command): SIGHUP
		# reloads it, SIGUSR1 stops it gracefully.
		configure "$lb_image" "$v" 'STOPSIGNAL SIGUSR1
ENTRYPOINT ["haproxy", "-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]'
	fi
done
rm -rf "$rootfs" "$tar"
# The images these replace, untagged now: about 850 MB each.
docker image prune -f --filter label=co.bex.inputs >/dev/null
say "bex.local/capd/node:$KUBE_VERSION, bex.local/capd/node:$KUBE_PREVIOUS_VERSION and $lb_image made in $((SECONDS - start)) s"
