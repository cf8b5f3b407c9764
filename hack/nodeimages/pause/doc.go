// Command pause is the one-node cluster's sandbox ("pause") container: the process
// that holds a pod's namespaces while its containers come and go. It does nothing
// but wait: it reaps the zombies that a shared PID namespace leaves to it (it is PID
// 1 there) and exits 0 when the kubelet stops the pod (SIGINT or SIGTERM).
//
// It is bex's own rather than registry.k8s.io/pause because the cluster has no
// registry to pull from; hack/nodeimages builds it static into bex.local/pause.
package main
