// Command pause is the one-node cluster's sandbox ("pause") container: the process
// that holds a pod's namespaces while its containers come and go. It does nothing
// but wait: it reaps the zombies that a shared PID namespace leaves to it (it is PID
// 1 there) and exits 0 when the kubelet stops the pod (SIGINT or SIGTERM).
//
// It is bex's own rather than registry.k8s.io/pause because the cluster has no
// registry to pull from; hack/nodeimages builds it static into bex.local/pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		// One SIGCHLD may stand for many children that ended: reap them all.
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
