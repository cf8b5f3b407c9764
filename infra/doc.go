// Package infra holds no code: it is where the tests of the manifests beside it live.
//
//   - clusterapi/base: the provider-neutral Cluster API objects of a bex workload
//     cluster (Cluster, KubeadmControlPlane, MachineDeployment,
//     KubeadmConfigTemplate), a clusterctl template with ${VARIABLES};
//   - clusterapi/overlays/local-capd: containers on one machine (CAPD's DevCluster);
//   - clusterapi/overlays/hetzner-caph: Hetzner Cloud (CAPH), and
//     hetzner-caph-baremetal: plus Hetzner dedicated servers;
//   - bex: bex installed on a cluster (namespace, CRDs, RBAC per component, the
//     deployer, gitserver, buildkitd, registry and edge), and cnpg, which it
//     includes: CloudNativePG's CRDs (the module's, checked byte for byte) and
//     operator, the Postgres of Databases on a cluster.
//
// The tests render each with the kubectl in bin/ (`kubectl kustomize`), substitute
// the template variables as `clusterctl generate cluster` does, and send the result
// to a real API server (envtest) as a server-side dry-run, with the real CRDs
// loaded: Cluster API core, kubeadm and CAPD from the Go module cache, CAPH from
// testdata/crds, bex's own. Broken variants must be refused. The RBAC of infra/bex
// is applied and checked with SubjectAccessReviews, and the bex image's Dockerfile
// (hack/image) is built with BuildKit from a base made on this machine.
package infra
