#!/bin/bash
# Installs containerd, runc, kubeadm and the kubelet on a plain Ubuntu 24.04 server
# (Hetzner's image), as CAPH's ubuntu templates do. No brace-style variables here:
# clusterctl would take them for template variables. A node image built with
# image-builder (HCLOUD_IMAGE_NAME) that has them already skips the installs.
set -euxo pipefail
KUBERNETES_VERSION=$(echo "$1" | sed 's/^v//')
MINOR=$(echo "$KUBERNETES_VERSION" | cut -d. -f1,2)
sed -i '/swap/d' /etc/fstab
swapoff -a
modprobe overlay
modprobe br_netfilter
sysctl --system
if ! command -v kubeadm >/dev/null; then
	apt-get update -y
	apt-get install -y apt-transport-https ca-certificates curl gpg containerd
	mkdir -p /etc/containerd /etc/apt/keyrings
	containerd config default >/etc/containerd/config.toml
	sed -i 's/SystemdCgroup = false/SystemdCgroup = true/' /etc/containerd/config.toml
	# Registry mirrors (bex's registry) are read from /etc/containerd/certs.d.
	grep -q 'config_path = "/etc/containerd/certs.d"' /etc/containerd/config.toml ||
		sed -i 's|config_path = ""|config_path = "/etc/containerd/certs.d"|' /etc/containerd/config.toml
	systemctl restart containerd
	curl -fsSL "https://pkgs.k8s.io/core:/stable:/v$MINOR/deb/Release.key" | gpg --dearmor -o /etc/apt/keyrings/kubernetes-apt-keyring.gpg
	echo "deb [signed-by=/etc/apt/keyrings/kubernetes-apt-keyring.gpg] https://pkgs.k8s.io/core:/stable:/v$MINOR/deb/ /" >/etc/apt/sources.list.d/kubernetes.list
	apt-get update -y
	apt-get install -y "kubelet=$KUBERNETES_VERSION-*" "kubeadm=$KUBERNETES_VERSION-*" "kubectl=$KUBERNETES_VERSION-*"
	apt-mark hold kubelet kubeadm kubectl
	systemctl enable --now kubelet
fi
