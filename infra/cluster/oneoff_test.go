package cluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/deployer/runtime/kube"
	"bex.co/bex/internal/testenv"
)

// TestKubeOneOffs runs one-off pods of an app pushed to the cluster through the
// kube runtime's OneOffs, from this process with the admin's kubeconfig, on the
// node's real kubelet: exit status, stdin from a pipe and its EOF, a TTY and a
// resize, Ctrl-C, and no pod left after.
func TestKubeOneOffs(t *testing.T) {
	const name = "oneoffs"
	mustPush(t, newHostRepo(t, name))
	rc, err := clientcmd.BuildConfigFromFlags("", env["KUBECONFIG"])
	if err != nil {
		t.Fatal(err)
	}
	s := k8sruntime.NewScheme()
	if err := appv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(rc, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(rc)
	app := &appv1.App{}
	testenv.Eventually(t, 120*time.Second, "the App has an image", func() error {
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, app); err != nil {
			return err
		}
		if app.Spec.Image == "" {
			return io.ErrUnexpectedEOF
		}
		return nil
	})
	oo, err := kube.NewOneOffs(kube.Config{HostUsers: true}, rc)
	if err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, o runtime.OneOff) int {
		t.Helper()
		o.App, o.Image, o.Release = app, app.Spec.Image, app.Spec.Release
		if o.ID == "" {
			o.ID = runtime.NewOneOffID()
		}
		o.Process = "run." + o.ID
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		start := time.Now()
		exit, err := oo.Run(ctx, o)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		t.Logf("run %q: exit %d in %.1f s", o.Command, exit, time.Since(start).Seconds())
		// Deleted when Run returns; the kubelet has its 1 s of grace to stop it.
		testenv.Eventually(t, 30*time.Second, "the pod of "+o.ID+" is gone", func() error {
			_, err := cs.CoreV1().Pods("default").Get(context.Background(), kube.OneOffPodName(name, o.ID), metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there: %v", err)
			}
			return nil
		})
		return exit
	}

	t.Run("exit status and output", func(t *testing.T) {
		var out bytes.Buffer
		exit := run(t, runtime.OneOff{Command: []string{"sh", "-c", "echo hello $GREETING; exit 7"},
			Env: []appv1.EnvVar{{Name: "GREETING", Value: "w$rld"}}, Stdout: &out})
		if exit != 7 || !strings.Contains(out.String(), "hello w$rld") {
			t.Fatalf("exit %d, output %q", exit, out.String())
		}
	})
	t.Run("stdin from a pipe reaches EOF", func(t *testing.T) {
		var out bytes.Buffer
		exit := run(t, runtime.OneOff{Command: []string{"sh", "-c", "wc -l; echo done"},
			Stdin: strings.NewReader("a\nb\nc\n"), Stdout: &out})
		if exit != 0 || !strings.Contains(out.String(), "3") || !strings.Contains(out.String(), "done") {
			t.Fatalf("exit %d, output %q", exit, out.String())
		}
	})
	t.Run("tty, resize, ctrl-c", func(t *testing.T) {
		pr, pw := io.Pipe()
		resize := make(chan runtime.WindowSize, 1)
		var mu syncBuffer
		go func() {
			// Wait for the shell's first size, then resize and ask again, then Ctrl-C a sleep.
			_, _ = pw.Write([]byte("stty size\n"))
			waitFor(&mu, "40 100", time.Minute)
			resize <- runtime.WindowSize{Width: 132, Height: 50}
			// The resize goes on its own stream: ask until the shell sees it.
			for i := 0; i < 60 && !waitFor(&mu, "50 132", time.Second); i++ {
				_, _ = pw.Write([]byte("stty size\n"))
			}
			// The quotes keep the terminal's echo of the line from matching.
			_, _ = pw.Write([]byte("(echo sl''eeping; exec sleep 300)\n"))
			waitFor(&mu, "sleeping\r\n", time.Minute)
			_, _ = pw.Write([]byte{0x03})
			_, _ = pw.Write([]byte("exit 5\n"))
		}()
		exit := run(t, runtime.OneOff{Command: []string{"sh"}, Stdin: pr, Stdout: &mu,
			TTY: &runtime.TTY{Term: "xterm", Width: 100, Height: 40, Resize: resize}})
		_ = pw.Close()
		if exit != 5 || !strings.Contains(mu.String(), "40 100") || !strings.Contains(mu.String(), "50 132") {
			t.Fatalf("exit %d, output %q", exit, mu.String())
		}
	})
}

// syncBuffer is safe for the copy goroutines and the test.
type syncBuffer = testenv.SyncBuffer

// waitFor polls b until it holds s, for at most within.
func waitFor(b *syncBuffer, s string, within time.Duration) bool {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if strings.Contains(b.String(), s) {
			return true
		}
	}
	return false
}
