// Package controlplane is the Kubernetes API of a single bex machine: etcd and
// kube-apiserver, run by `bex up` with their data under one directory.
//
// Everything they need is made once and kept: a CA, the API server's serving
// certificate, an admin client certificate (group system:masters), the
// service-account signing key, and the loopback ports, so that the kubeconfig
// written beside them stays valid across restarts and `kubectl get apps` keeps
// working. There is no kube-controller-manager: bex's own controllers do all the
// work its objects need, so nothing that relies on garbage collection or the
// namespace controller may be assumed.
//
// etcd runs with an explicit space quota (QuotaFor) and the API server compacts
// its history; a NOSPACE alarm (the quota reached: every write refused) does not
// keep etcd from counting as ready, and is handled at each start and while bex
// runs (WatchSpace): compaction, defragmentation, then the alarm disarmed when
// there is room (space.go).
//
// Not every built-in API is served: only those bex or the server itself uses (core, RBAC, authentication, authorization,
// coordination, apiextensions, apiregistration, discovery, networking,
// admissionregistration), for a small idle footprint; `kubectl get deployments`
// here says the server has no such resource.
package controlplane
