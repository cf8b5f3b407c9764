#!/usr/bin/env bash
# `make run`: starts bex on this machine with development defaults: unprivileged
# ports (SSH 2222, HTTP 8080, HTTPS 8443), apps at https://<app>.localhost:8443,
# certificates from a local CA (.state/ca.pem), everything kept in .state/.
# hack/tools.sh and `make build` have run before this. Ctrl-C stops everything.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

state=${BEX_STATE_DIR:-$root/.state}
args=(
	--state-dir "$state"
	--ssh-addr "${BEX_SSH_ADDR:-127.0.0.1:2222}"
	--http-addr "${BEX_HTTP_ADDR:-127.0.0.1:8080}"
	--https-addr "${BEX_HTTPS_ADDR:-127.0.0.1:8443}"
	--base-domain "${BEX_BASE_DOMAIN:-localhost}"
)
# The first key found becomes the admin's, so that the first push just works.
key=${ADMIN_KEY:-}
if [[ -z $key ]]; then
	for k in ~/.ssh/id_ed25519.pub ~/.ssh/id_ecdsa.pub ~/.ssh/id_rsa.pub; do
		if [[ -f $k ]]; then key=$k; break; fi
	done
fi
if [[ -n $key ]]; then
	echo "==> $key will be the admin's key (set ADMIN_KEY=FILE for another)"
	args+=(--admin-key "$key")
else
	echo "==> no SSH key in ~/.ssh: make one with ssh-keygen -t ed25519, or set ADMIN_KEY=FILE"
fi
# Base images come from a registry; a machine that cannot reach one builds from
# images already in containerd: busybox from Debian's busybox-static, and, for apps
# without a Dockerfile, Debian stand-ins for the official node, golang, python and
# distroless images (built once per machine with mmdebstrap, in
# /var/cache/bex/baseimage; the first start takes minutes).
if [[ -z ${BEX_IMAGE_RESOLVE_MODE:-} ]] && ! curl -s -o /dev/null --max-time 5 https://registry-1.docker.io/v2/; then
	echo "==> no container registry reachable: builds use local base images (--local-bases: Debian stand-ins and busybox-static)"
	args+=(--image-resolve-mode local --local-bases)
fi
echo "==> $(bin/bex version): starting bex up (state in $state)"
# Make the daemons that `make tools` built in bin/ findable next to bin/bex.
export PATH="$root/bin:$PATH"
exec bin/bex up "${args[@]}"
