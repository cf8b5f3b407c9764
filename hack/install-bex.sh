#!/usr/bin/env bash
# Installs bex (infra/bex) on the cluster of $KUBECONFIG: a workload cluster made by
# hack/cluster-capd.sh or hack/cluster-hetzner.sh, or any other.
#
#   BASE_DOMAIN=apps.example.com ACME_EMAIL=me@example.com \
#   BEX_IMAGE=registry.example.com/bex:v1 hack/install-bex.sh
#
# Settings (environment):
#   BEX_IMAGE      the bex image the nodes pull (default bex.local/bex:dev, which
#                  hack/cluster-capd.sh loads into the nodes from `make image`)
#   BASE_DOMAIN    apps answer at <app>.BASE_DOMAIN; point *.BASE_DOMAIN at the nodes
#   ACME_EMAIL     Let's Encrypt account (empty: a local CA per edge, for trying only)
#   SSH_URL        how users reach the gitserver (default ssh://git@git.BASE_DOMAIN)
#   HOOKS_URL      where the webhooks and the MCP endpoint are published (the
#                  Service bex-hooks; docs/cluster.md), shown by `webhooks APP`
#                  (default https://BASE_DOMAIN, where the edge serves them)
#   ADMIN_KEY      the first admin's public key (default ~/.ssh/id_ed25519.pub)
#   KUBECTL        the kubectl to use (default: bin/kubectl, else kubectl on PATH)
#   REGISTRY_NODE_PASSWORD
#                  the password of the registry's user node, with which every
#                  node's kubelet pulls the apps' images: the one set in the
#                  nodes' /var/lib/kubelet/config.json (docs/cluster.md; made
#                  and kept by hack/cluster-*.sh). Needed when the registry's
#                  credentials are made (the first run); 16 or more of A-Z a-z
#                  0-9 . _ ~ -
#   CNPG_IMAGE     the image of CloudNativePG's operator (infra/cnpg), which the
#                  Postgres pods' init container runs too (default: upstream's
#                  ghcr.io/cloudnative-pg/cloudnative-pg of CNPG_VERSION;
#                  hack/cluster-local.sh loads bex.local/cloudnative-pg, built
#                  from the Go module, into its node)
#   CNPG_POSTGRES_IMAGE
#                  the Postgres image the managed databases' CloudNativePG
#                  Clusters run (the deployer's --cluster-postgres-image;
#                  default ghcr.io/cloudnative-pg/postgresql:15;
#                  hack/cluster-local.sh pushes one made from Debian's packages)
#   REDIS_IMAGE    the Redis image the managed Redis databases' StatefulSets run
#                  (the deployer's --redis-image; its tag is the version
#                  offered; default docker.io/library/redis:7, or an image that
#                  behaves as it does: docker-entrypoint.sh drops root, with
#                  redis-cli; hack/cluster-local.sh pushes bex's stand-in made
#                  from Debian's packages)
#   EXTRA_PATCHES  a file of kustomize patches (a YAML list, as under `patches:`)
#                  added to the overlay, for what a cluster needs of its own
#                  (hack/cluster-local.sh: a node port for the gitserver,
#                  --host-users for a node without user namespaces)
#
# --print writes the manifests it would apply to stdout and stops (infra's tests
# dry-run them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'hack/install-bex.sh: %s\n' "$*" >&2; exit 1; }

kubectl=${KUBECTL:-}
if [[ -z $kubectl ]]; then
	if [[ -x $root/bin/kubectl ]]; then kubectl=$root/bin/kubectl; else kubectl=kubectl; fi
fi
image=${BEX_IMAGE:-bex.local/bex:dev}
base_domain=${BASE_DOMAIN:-apps.example.com}
acme_email=${ACME_EMAIL:-}
ssh_url=${SSH_URL:-ssh://git@git.$base_domain}
hooks_url=${HOOKS_URL:-https://$base_domain}

# name:tag, the tag after the last path element's colon (a registry's port is not
# a tag).
image_name=$image image_tag=latest
if [[ ${image##*/} == *:* ]]; then image_name=${image%:*} image_tag=${image##*:}; fi
cnpg_image=${CNPG_IMAGE:-}
cnpg_name=$cnpg_image cnpg_tag=latest
if [[ ${cnpg_image##*/} == *:* ]]; then cnpg_name=${cnpg_image%:*} cnpg_tag=${cnpg_image##*:}; fi

# An overlay of infra/bex with this installation's image and settings, in a
# temporary directory: nothing in the repository changes.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# kustomize takes bases by relative path only.
rel=$(realpath --relative-to="$work" "$root/infra/bex" 2>/dev/null ||
	python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$root/infra/bex" "$work")
cat >"$work/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $rel
images:
  - name: bex.local/bex
    newName: $image_name
    newTag: "$image_tag"
$(if [[ -n $cnpg_image ]]; then printf '  - name: ghcr.io/cloudnative-pg/cloudnative-pg\n    newName: %s\n    newTag: "%s"\n' "$cnpg_name" "$cnpg_tag"; fi)
patches:
  - patch: |
      apiVersion: v1
      kind: ConfigMap
      metadata:
        name: bex-config
        namespace: bex-system
      data:
        BEX_BASE_DOMAIN: "$base_domain"
        BEX_ACME_EMAIL: "$acme_email"
        BEX_SSH_URL: "$ssh_url"
        BEX_HOOKS_URL: "$hooks_url"
$(if [[ -n ${CNPG_POSTGRES_IMAGE:-} ]]; then printf '        BEX_CLUSTER_POSTGRES_IMAGE: "%s"\n' "$CNPG_POSTGRES_IMAGE"; fi)
$(if [[ -n ${REDIS_IMAGE:-} ]]; then printf '        BEX_REDIS_IMAGE: "%s"\n' "$REDIS_IMAGE"; fi)
YAML
if [[ -n ${EXTRA_PATCHES:-} ]]; then
	[[ -f $EXTRA_PATCHES ]] || die "EXTRA_PATCHES=$EXTRA_PATCHES is not a file"
	sed 's/^/  /' "$EXTRA_PATCHES" >>"$work/kustomization.yaml"
fi
if [[ ${1:-} == --print ]]; then
	"$kubectl" kustomize "$work"
	exit 0
fi

key=${ADMIN_KEY:-$HOME/.ssh/id_ed25519.pub}
[[ -f $key ]] || die "no admin key at $key: make one with ssh-keygen -t ed25519, or set ADMIN_KEY=FILE"

"$kubectl" apply --server-side -f "$root/infra/bex/namespace.yaml"
# The edge's local CA (used without ACME_EMAIL): made once here and kept in a
# Secret, so that every edge on every node signs with the same CA and a restarted
# edge keeps it; clients trust ca.pem of the Secret bex-system/bex-edge-ca.
if ! "$kubectl" -n bex-system get secret bex-edge-ca >/dev/null 2>&1; then
	say "making the edge's local CA (Secret bex-system/bex-edge-ca)"
	openssl ecparam -name prime256v1 -genkey -noout -out "$work/ca-key.pem"
	openssl req -x509 -new -key "$work/ca-key.pem" -out "$work/ca.pem" -days 3650 \
		-subj "/O=bex/CN=bex local CA" \
		-addext "basicConstraints=critical,CA:TRUE,pathlen:0" -addext "keyUsage=critical,keyCertSign,cRLSign"
	"$kubectl" -n bex-system create secret generic bex-edge-ca \
		--from-file=ca.pem="$work/ca.pem" --from-file=ca-key.pem="$work/ca-key.pem"
	rm -f "$work/ca-key.pem"
fi
# Mutual TLS between the gitserver and buildkitd, whose TCP port any pod may reach
# where the CNI enforces no NetworkPolicy, and whose build steps are root on the
# node: a CA made here, buildkitd's server certificate (Secret bex-buildkitd-tls)
# and the gitserver's client certificate (Secret bex-buildkit-client-tls), each
# with ca.pem, cert.pem, key.pem. The CA's key never leaves this script: nothing
# in the cluster can issue another certificate. Made once; both again when either
# is missing (the CA's key is gone), and then the two components restart to load
# them. To renew: delete both Secrets and run this script again.
restart_buildkit=
if ! "$kubectl" -n bex-system get secret bex-buildkitd-tls >/dev/null 2>&1 ||
	! "$kubectl" -n bex-system get secret bex-buildkit-client-tls >/dev/null 2>&1; then
	say "making buildkitd's mutual TLS (Secrets bex-system/bex-buildkitd-tls, bex-buildkit-client-tls)"
	tls=$work/buildkit-tls
	mkdir -m 0700 "$tls"
	openssl ecparam -name prime256v1 -genkey -noout -out "$tls/ca-key.pem"
	openssl req -x509 -new -key "$tls/ca-key.pem" -out "$tls/ca.pem" -days 3650 \
		-subj "/O=bex/CN=bex buildkit CA" \
		-addext "basicConstraints=critical,CA:TRUE,pathlen:0" -addext "keyUsage=critical,keyCertSign,cRLSign"
	# issue NAME CN EXTKEYUSAGE [SANS]: NAME-key.pem and NAME.pem, signed by the CA.
	issue() {
		local ext=$tls/$1.ext
		printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\n' "$3" >"$ext"
		[[ -z ${4:-} ]] || printf 'subjectAltName=%s\n' "$4" >>"$ext"
		openssl ecparam -name prime256v1 -genkey -noout -out "$tls/$1-key.pem"
		openssl req -new -key "$tls/$1-key.pem" -subj "/O=bex/CN=$2" -out "$tls/$1.csr"
		openssl x509 -req -in "$tls/$1.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca-key.pem" -CAcreateserial \
			-days 3650 -sha256 -extfile "$ext" -out "$tls/$1.pem" 2>"$tls/$1.log" ||
			{ cat "$tls/$1.log" >&2; die "openssl could not sign the $1 certificate"; }
	}
	issue server bex-buildkitd serverAuth \
		DNS:bex-buildkitd,DNS:bex-buildkitd.bex-system,DNS:bex-buildkitd.bex-system.svc,DNS:bex-buildkitd.bex-system.svc.cluster.local
	issue client bex-gitserver clientAuth
	rm -f "$tls/ca-key.pem"
	for s in bex-buildkitd-tls:server bex-buildkit-client-tls:client; do
		"$kubectl" -n bex-system create secret generic "${s%%:*}" --from-file=ca.pem="$tls/ca.pem" \
			--from-file=cert.pem="$tls/${s#*:}.pem" --from-file=key.pem="$tls/${s#*:}-key.pem" \
			--dry-run=client -o yaml | "$kubectl" apply --server-side --force-conflicts -f - >/dev/null
	done
	rm -rf "$tls"
	# Pods already running read the old ones at their start.
	if "$kubectl" -n bex-system get deployment bex-buildkitd >/dev/null 2>&1; then restart_buildkit=1; fi
fi

# The secret the edge sends with the requests it proxies to the gitserver's
# webhooks and MCP endpoint (X-Bex-Edge-Secret), so that the gitserver believes
# the client the edge names there for its limits on failed tokens and signatures
# per client. The edge's address cannot vouch for it: any pod reaches the
# gitserver too where the CNI enforces no NetworkPolicy. Random, made once,
# mounted into the edge and the gitserver only. To renew: delete the Secret and
# run this script again (both restart to read it).
restart_platform=
if ! "$kubectl" -n bex-system get secret bex-platform-secret >/dev/null 2>&1; then
	say "making the edge's proxy secret (Secret bex-system/bex-platform-secret)"
	(umask 077 && openssl rand -hex 32 >"$work/platform-secret")
	"$kubectl" -n bex-system create secret generic bex-platform-secret --from-file=secret="$work/platform-secret" \
		--dry-run=client -o yaml | "$kubectl" apply --server-side --force-conflicts -f - >/dev/null
	rm -f "$work/platform-secret"
	if "$kubectl" -n bex-system get daemonset bex-edge >/dev/null 2>&1; then restart_platform=1; fi
fi

# The registry's credentials (infra/bex/registry.yaml): it takes no request
# without HTTP basic authentication against an htpasswd file of bcrypt entries
# (Secret bex-registry-htpasswd), for three users with passwords of their own:
# builder, the gitserver's builds and deploy:image (its Docker config.json,
# Secret bex-registry-builder); deployer, its --registry-delete (Secret
# bex-registry-deployer); node, the kubelets' pulls, whose password is
# REGISTRY_NODE_PASSWORD, set in every node's /var/lib/kubelet/config.json and
# held by no Secret, so no pod can read it. distribution authorises nothing per
# user: each of them may read, push and delete. Made once; all again when any is
# missing. To change the passwords: delete the Secret bex-registry-htpasswd and
# run this script again (with the nodes' REGISTRY_NODE_PASSWORD).
registry_host=bex-registry.bex-system.svc.cluster.local:5000
restart_registry=
if ! "$kubectl" -n bex-system get secret bex-registry-htpasswd >/dev/null 2>&1 ||
	! "$kubectl" -n bex-system get secret bex-registry-builder >/dev/null 2>&1 ||
	! "$kubectl" -n bex-system get secret bex-registry-deployer >/dev/null 2>&1; then
	node_password=${REGISTRY_NODE_PASSWORD:-}
	[[ -n $node_password ]] ||
		die "REGISTRY_NODE_PASSWORD is not set: set it to the password in the nodes' /var/lib/kubelet/config.json (docs/cluster.md, \"The registry's credentials\")"
	[[ ${#node_password} -ge 16 && $node_password =~ ^[A-Za-z0-9._~-]+$ ]] ||
		die "REGISTRY_NODE_PASSWORD must be 16 or more of A-Z a-z 0-9 . _ ~ - (openssl rand -hex 24 makes one)"
	command -v go >/dev/null 2>&1 || [[ -x /usr/local/go/bin/go ]] ||
		die "Go is missing (hack/htpasswd makes the registry's bcrypt entries): install Go 1.26 or newer, then run again"
	go=go
	command -v go >/dev/null 2>&1 || go=/usr/local/go/bin/go
	say "making the registry's credentials (Secrets bex-system/bex-registry-htpasswd, bex-registry-builder, bex-registry-deployer)"
	reg=$work/registry-auth
	mkdir -m 0700 "$reg"
	builder_password=$(openssl rand -hex 24)
	deployer_password=$(openssl rand -hex 24)
	printf 'builder %s\ndeployer %s\nnode %s\n' "$builder_password" "$deployer_password" "$node_password" |
		(cd "$root" && "$go" run ./hack/htpasswd) >"$reg/htpasswd" || die "hack/htpasswd failed"
	# dockerconfig USER PASSWORD: a Docker config.json with the one registry.
	dockerconfig() {
		printf '{"auths":{"%s":{"auth":"%s"}}}\n' "$registry_host" "$(printf '%s:%s' "$1" "$2" | openssl base64 -A)"
	}
	dockerconfig builder "$builder_password" >"$reg/builder.json"
	dockerconfig deployer "$deployer_password" >"$reg/deployer.json"
	"$kubectl" -n bex-system create secret generic bex-registry-htpasswd --from-file=htpasswd="$reg/htpasswd" \
		--dry-run=client -o yaml | "$kubectl" apply --server-side --force-conflicts -f - >/dev/null
	for s in builder deployer; do
		"$kubectl" -n bex-system create secret generic "bex-registry-$s" --from-file=config.json="$reg/$s.json" \
			--dry-run=client -o yaml | "$kubectl" apply --server-side --force-conflicts -f - >/dev/null
	done
	rm -rf "$reg"
	# Pods already running would see the new files only after the kubelet's
	# next sync of their volumes.
	if "$kubectl" -n bex-system get deployment bex-registry >/dev/null 2>&1; then restart_registry=1; fi
fi

say "applying infra/bex (image $image, apps at *.$base_domain)"
"$kubectl" apply --server-side -k "$work"
if [[ -n $restart_buildkit ]]; then
	"$kubectl" -n bex-system rollout restart deployment/bex-buildkitd statefulset/bex-gitserver
fi
if [[ -n $restart_platform ]]; then
	"$kubectl" -n bex-system rollout restart daemonset/bex-edge statefulset/bex-gitserver
fi
if [[ -n $restart_registry ]]; then
	"$kubectl" -n bex-system rollout restart deployment/bex-registry deployment/bex-deployer statefulset/bex-gitserver
fi
say "the first admin's key: $key (ConfigMap bex-system/bex-admin-keys)"
"$kubectl" -n bex-system create configmap bex-admin-keys --from-file=admin.pub="$key" \
	--dry-run=client -o yaml | "$kubectl" apply --server-side -f -

say "waiting for the components"
"$kubectl" -n bex-system rollout status deployment/bex-registry --timeout=5m
"$kubectl" -n bex-system rollout status deployment/bex-buildkitd --timeout=5m
"$kubectl" -n bex-system rollout status deployment/bex-deployer --timeout=5m
"$kubectl" -n bex-system rollout status statefulset/bex-gitserver --timeout=5m
"$kubectl" -n bex-system rollout status daemonset/bex-edge --timeout=5m
# CloudNativePG's operator: its first start makes its webhooks' certificate and
# may restart once, until the kubelet has mounted it.
"$kubectl" -n cnpg-system rollout status deployment/cnpg-controller-manager --timeout=5m

addr=$("$kubectl" -n bex-system get service bex-gitserver -o jsonpath='{.status.loadBalancer.ingress[0].ip}')
port=22
if [[ -z $addr ]]; then
	# No load balancer (a laptop cluster): the node port on a node.
	addr=$("$kubectl" get nodes -o jsonpath='{.items[0].status.addresses[?(@.type=="InternalIP")].address}')
	port=$("$kubectl" -n bex-system get service bex-gitserver -o jsonpath='{.spec.ports[0].nodePort}')
fi
cat <<TEXT

bex is installed. Point DNS *.$base_domain (and git.$base_domain) at the nodes, then:

  git remote add bex ssh://git@$addr:$port/myapp
  git push bex main

Apps answer at https://<app>.$base_domain. kubectl get apps shows them.
Webhooks and agents (MCP): publish the Service bex-system/bex-hooks with TLS at
$hooks_url (docs/cluster.md, "Webhooks and agents").
TEXT
