//go:build tools

// Package tools pins the commands this module builds: Cluster API's core, kubeadm
// bootstrap and kubeadm control plane managers, and the Docker provider's manager
// (CAPD), whose DevCluster/DevMachine inMemory backend is the in-memory
// infrastructure provider.
package tools

import (
	_ "sigs.k8s.io/cluster-api/bootstrap/kubeadm"
	_ "sigs.k8s.io/cluster-api/cmd/clusterctl"
	_ "sigs.k8s.io/cluster-api/controlplane/kubeadm"
	_ "sigs.k8s.io/cluster-api/core"
	_ "sigs.k8s.io/cluster-api/test/infrastructure/docker"
)
