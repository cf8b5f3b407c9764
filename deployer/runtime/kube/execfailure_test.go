package kube_test

import (
	"bytes"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"bex.co/bex/deployer/runtime/kube"
)

// TestOneOffExecFailureExitsAsAShell: a one-off whose container the kubelet
// reports as not started (StartError, runc's message: the command is not
// there) exits 127 with the shell's line, not 128 or an error of bex.
func TestOneOffExecFailureExitsAsAShell(t *testing.T) {
	f, oo := oneOffFixture(t)
	o := f.oneOff("e0ec000000001")
	o.Command = []string{"nosuchcmd"}
	var stdout, stderr bytes.Buffer
	o.Stdout, o.Stderr = &stdout, &stderr
	res := make(chan runResult, 1)
	go func() {
		exit, err := oo.Run(f.ctx, o)
		res <- runResult{exit, err}
	}()
	pod := f.waitPod(kube.OneOffPodName("hello", o.ID))
	pod.Status.Phase = corev1.PodFailed
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: kube.OneOffContainer, Image: pod.Spec.Containers[0].Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError",
			Message: `failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: exec: "nosuchcmd": executable file not found in $PATH: unknown`}},
	}}
	if err := f.c.Status().Update(f.ctx, pod); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil || r.exit != 127 || stderr.String() != "bex: nosuchcmd: command not found\n" {
		t.Fatalf("Run = %d, %v, stderr %q; want 127 and the shell's line", r.exit, r.err, stderr.String())
	}
}
