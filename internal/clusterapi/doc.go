// Package clusterapi runs Cluster API's management plane from one release's
// managers, built by hack/tools.sh into bin/ (core, kubeadm bootstrap, kubeadm
// control plane and CAPD), as processes against an API server of one's own: what
// infra's in-memory Cluster API test (TestClusterAPIInMemory) and hack/capdmgmt
// (the management plane of hack/cluster-capd.sh) share.
//
// A cluster would run each manager behind a Service, with its webhooks' serving
// certificate from cert-manager. Here every manager listens on loopback: one
// serving certificate for 127.0.0.1 (WebhookServingCert) serves them all, and the
// release's CRDs and webhook configurations (Release.CRDs, Release.Webhooks) are
// pointed at each manager's port instead of at a Service. The ports are fixed in
// Managers (a network namespace of one's own, as the in-memory test has) or free
// ones (WithFreePorts, for a run on the host).
//
// The release's sources (config/crd, config/webhook) come from the Go module cache:
// sigs.k8s.io/cluster-api for core and kubeadm, sigs.k8s.io/cluster-api/test for
// CAPD, at CLUSTER_API_VERSION of hack/versions.env (DownloadRelease).
package clusterapi
