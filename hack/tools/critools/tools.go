//go:build tools

// Package tools pins crictl, which Cluster API's Docker provider runs in each
// machine container (hack/capd's node image) before it bootstraps the machine.
package tools

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
