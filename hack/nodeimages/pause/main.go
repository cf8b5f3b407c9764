package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	// From here on a SIGTERM ends it with 0. Before, Go's runtime handles it, and
	// as PID 1 (where the kernel's default action does not apply) exits 2: the
	// line says when the window has passed.
	os.Stderr.WriteString("pause: waiting\n")
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
