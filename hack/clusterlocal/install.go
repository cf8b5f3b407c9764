package main

import (
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// installAddons applies what a cluster brings before bex: CoreDNS (the cluster's
// DNS, which buildkitd needs to find the registry and the components to find each
// other), the volumes bex's PersistentVolumeClaims bind to, and those of the
// apps' volumes (storage.go).
func (l *layout) installAddons(k kubectl) error {
	env, err := l.imagesEnv()
	if err != nil {
		return err
	}
	if err := l.makeVolumeDirs(); err != nil {
		return err
	}
	manifests := strings.NewReplacer(
		"COREDNS_IMAGE", env["COREDNS_IMAGE"],
		"DNS_SERVICE_IP", dnsService,
		"CLUSTER_DOMAIN", clusterDomain,
	).Replace(corednsManifests) + "---\n" + l.volumeManifests() + "---\n" + l.appStorageManifests()
	if _, err := k(manifests, "apply", "--server-side", "--force-conflicts", "-f", "-"); err != nil {
		return err
	}
	if _, err := k("", "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=3m"); err != nil {
		return err
	}
	say("CoreDNS ready at %s", dnsService)
	return nil
}

// makeVolumeDirs makes the directories of the gitserver's and the registry's
// volumes (hostPath volumes get no fsGroup: the components run as 65532).
func (l *layout) makeVolumeDirs() error {
	for _, d := range []string{"gitserver", "registry"} {
		dir := l.path("volumes", d)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.Chown(dir, 65532, 65532); err != nil {
			return err
		}
	}
	return nil
}

// volumeManifests are the gitserver's and the registry's volumes, at their
// directories under DIR/volumes.
func (l *layout) volumeManifests() string {
	return strings.NewReplacer(
		"GITSERVER_VOLUME", l.path("volumes", "gitserver"),
		"REGISTRY_VOLUME", l.path("volumes", "registry"),
	).Replace(volumeManifests)
}

// installBex installs bex from infra/bex with hack/install-bex.sh, as on any
// cluster, with this node's settings: the images imported above (bex's and
// CloudNativePG's operator), the databases' servers' images pushed to bex's
// registry (the Postgres operand, Redis), the local CA, the
// gitserver on a fixed node port, and app pods in the node's user namespace
// (containerd 1.6 and runc 1.1 cannot give a pod one of its own: docs/cluster.md).
func (l *layout) installBex(root string, k kubectl) error {
	t := time.Now()
	env, err := l.imagesEnv()
	if err != nil {
		return err
	}
	pub, err := l.adminKey()
	if err != nil {
		return err
	}
	nodePassword, err := l.registryNodePassword()
	if err != nil {
		return err
	}
	patches := l.path("config", "bex-patches.yaml")
	if err := os.WriteFile(patches, []byte(strings.NewReplacer("SSH_NODE_PORT", fmt.Sprint(sshNodePort), "APP_STORAGE_CLASS", appStorageClass).Replace(bexPatches+l.extraPatches)), 0o644); err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(root, "hack", "install-bex.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+l.kubeconfig(),
		"KUBECTL="+filepath.Join(root, "bin", "kubectl"),
		"BEX_IMAGE=bex.local/bex:dev",
		"BASE_DOMAIN="+baseDomain,
		"ACME_EMAIL=",
		fmt.Sprintf("SSH_URL=ssh://git@%s:%d", l.nodeIP, sshNodePort),
		"ADMIN_KEY="+pub,
		"EXTRA_PATCHES="+patches,
		// The kubelet's config.json has it (writeConfigs).
		"REGISTRY_NODE_PASSWORD="+nodePassword,
		// CloudNativePG's operator as hack/nodeimages made it from the module.
		"CNPG_IMAGE="+env["CNPG_IMAGE"],
		// The Postgres the Databases' Clusters run: the Debian-made operand
		// this script pushed to bex's registry.
		"CNPG_POSTGRES_IMAGE="+operandImage(),
		// The Redis the Redis Databases' StatefulSets run: the Debian-made
		// stand-in this script pushed there too.
		"REDIS_IMAGE="+redisImage(),
	)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("hack/install-bex.sh: %w", err)
	}
	say("bex installed in %.0f s", time.Since(t).Seconds())
	return nil
}

// adminKey is the first admin's public key: ADMIN_KEY, or a key made for this
// cluster in DIR (its private half is ADMIN_IDENTITY in cluster.env).
func (l *layout) adminKey() (string, error) {
	if k := os.Getenv("ADMIN_KEY"); k != "" {
		if _, err := os.Stat(k); err != nil {
			return "", fmt.Errorf("ADMIN_KEY: %w", err)
		}
		return k, nil
	}
	id := l.path("admin_ed25519")
	if _, err := os.Stat(id); err != nil {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bex-local-admin", "-f", id).CombinedOutput(); err != nil {
			return "", fmt.Errorf("ssh-keygen: %v: %s", err, out)
		}
	}
	return id + ".pub", nil
}

// adminIdentity is the private key of the admin key, when it is known.
func (l *layout) adminIdentity() string {
	if k := os.Getenv("ADMIN_KEY"); k != "" {
		id := strings.TrimSuffix(k, ".pub")
		if _, err := os.Stat(id); err == nil && id != k {
			return id
		}
		return ""
	}
	return l.path("admin_ed25519")
}

func decodeBase64(s string) ([]byte, error) {
	return base64.StdEncoding.DecodeString(strings.TrimSpace(s))
}

// bexPatches are this node's kustomize patches over infra/bex (hack/install-bex.sh
// EXTRA_PATCHES).
const bexPatches = `- patch: |
    apiVersion: v1
    kind: Service
    metadata:
      name: bex-gitserver
      namespace: bex-system
    spec:
      type: NodePort
      ports:
        - {name: ssh, port: 22, targetPort: ssh, nodePort: SSH_NODE_PORT}
- patch: |
    apiVersion: v1
    kind: ConfigMap
    metadata:
      name: bex-buildkitd
      namespace: bex-system
    data:
      buildkitd.toml: |
        [worker.oci]
          enabled = true
          gc = true
          gckeepstorage = "20GB"
          networkMode = "cni"
          cniConfigPath = "/etc/buildkit/cni.conflist"
          cniBinaryPath = "/opt/cni/bin"
        [worker.containerd]
          enabled = false
        [registry."bex-registry.bex-system.svc.cluster.local:5000"]
          http = true
        # Nothing is pulled from Docker Hub here: its images come from bex's
        # registry, where up pushes the busybox base.
        [registry."docker.io"]
          mirrors = ["bex-registry.bex-system.svc.cluster.local:5000"]
- target: {kind: Deployment, name: bex-deployer}
  patch: |
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --host-users
- target: {kind: Deployment, name: bex-deployer}
  patch: |
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --volume-storage-class=APP_STORAGE_CLASS
- target: {kind: StatefulSet, name: bex-gitserver}
  patch: |
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --host-users
# Every registry this node can reach is on a private address (no internet here):
# deploy:image may pull from them.
- target: {kind: StatefulSet, name: bex-gitserver}
  patch: |
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --allow-private-registries
`

// addonManifests: CoreDNS as kubeadm installs it (its RBAC, a Corefile answering
// for the cluster's domain only: nothing outside the node can be reached, so there
// is nothing to forward to), and static hostPath volumes for the claims of
// infra/bex, bound by claimRef so that nothing else takes them.
const corednsManifests = `apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: system:coredns}
rules:
  - apiGroups: [""]
    resources: [endpoints, services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: system:coredns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:coredns}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes CLUSTER_DOMAIN in-addr.arpa ip6.arpa {
            pods insecure
            ttl 30
        }
        cache 30
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      securityContext:
        seccompProfile: {type: RuntimeDefault}
      containers:
        - name: coredns
          image: COREDNS_IMAGE
          imagePullPolicy: IfNotPresent
          args: [-conf, /etc/coredns/Corefile]
          ports:
            - {name: dns, containerPort: 53, protocol: UDP}
            - {name: dns-tcp, containerPort: 53, protocol: TCP}
          readinessProbe:
            httpGet: {path: /ready, port: 8181}
          livenessProbe:
            httpGet: {path: /health, port: 8080}
          resources:
            requests: {cpu: 50m, memory: 32Mi}
            limits: {memory: 170Mi}
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {add: [NET_BIND_SERVICE], drop: [ALL]}
          volumeMounts:
            - {name: config, mountPath: /etc/coredns, readOnly: true}
      volumes:
        - name: config
          configMap: {name: coredns}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: DNS_SERVICE_IP
  selector: {k8s-app: kube-dns}
  ports:
    - {name: dns, port: 53, protocol: UDP, targetPort: dns}
    - {name: dns-tcp, port: 53, protocol: TCP, targetPort: dns-tcp}
`

// volumeManifests: static hostPath volumes for the claims of infra/bex, bound by
// claimRef so that nothing else takes them.
const volumeManifests = `apiVersion: v1
kind: PersistentVolume
metadata: {name: bex-local-gitserver}
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  claimRef: {namespace: bex-system, name: repositories-bex-gitserver-0}
  hostPath: {path: GITSERVER_VOLUME, type: Directory}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: bex-local-registry}
spec:
  capacity: {storage: 20Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  claimRef: {namespace: bex-system, name: bex-registry}
  hostPath: {path: REGISTRY_VOLUME, type: Directory}
`
