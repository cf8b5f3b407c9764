package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/snapshots"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/releases"
	"bex.co/bex/internal/testenv"
)

// TestDeployerRunsAReleaseOnContainerd runs `bex deployer` in process with the
// local runtime against the real API server and containerd: a release of a busybox
// httpd image comes up, is published as an EndpointSlice, and answers HTTP; deleting
// the App stops it.
func TestDeployerRunsAReleaseOnContainerd(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	bk := testenv.SharedBuildkitd(t)
	testenv.SharedBusybox(t)
	ns := cp.Namespace(t, "deployer-e2e")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "Dockerfile"), []byte("FROM busybox\nRUN mkdir /www && echo 'hello from release 1' > /www/index.html\n"), 0o644)
	bctx, bcancel := context.WithTimeout(ctx, 2*time.Minute)
	digest, log, err := bk.BuildImage(bctx, src, src, "bex.local/web:1")
	bcancel()
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}

	var stderr bytes.Buffer
	// The package's other tests may have run a deployer in this process.
	d := &deployerCmd{errOut: &stderr, log: slog.New(slog.NewTextHandler(io.MultiWriter(&stderr), nil)), inProcessAgain: true}
	cmd := wire(d)
	cmd.SetArgs([]string{"--state-dir", t.TempDir(), "--kubeconfig", cp.Kubeconfig, "--namespace", ns,
		"--containerd-addr", bk.Containerd.Address, "--containerd-namespace", testenv.Namespace,
		"--metrics-addr", "0", "--health-addr", "0", "--https-port", "8443", "--keep-releases", "1"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()

	if err := cp.Client.Create(ctx, &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns}}); err != nil {
		t.Fatal(err)
	}
	rec := &releases.Recorder{Client: cp.Client, Namespace: ns}
	n, err := rec.Record(ctx, "web", releases.Change{Image: "bex.local/web@" + digest, Cause: appv1.ReleaseCauseDeploy,
		Processes: map[string][]string{"web": {"httpd", "-f", "-p", "$(PORT)", "-h", "/www"}}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 90*time.Second)
	defer wcancel()
	url, err := rec.Wait(wctx, "web", n, nil)
	if err != nil {
		t.Fatalf("Wait: %v\n%s", err, stderr.String())
	}
	if url != "https://web.localhost:8443" {
		t.Fatalf("url %s", url)
	}

	var slices discoveryv1.EndpointSliceList
	if err := cp.Client.List(ctx, &slices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: "web"}); err != nil {
		t.Fatal(err)
	}
	if len(slices.Items) != 1 || len(slices.Items[0].Endpoints) != 1 || len(slices.Items[0].Ports) != 1 {
		t.Fatalf("endpoint slices %+v", slices.Items)
	}
	ep := slices.Items[0]
	resp, err := http.Get(fmt.Sprintf("http://%s:%d/", ep.Endpoints[0].Addresses[0], *ep.Ports[0].Port))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "hello from release 1") {
		t.Fatalf("GET = %q", body)
	}

	// The edge routes https://web.localhost to the instance the deployer published,
	// with a certificate of its local CA, and redirects HTTP there.
	httpsPort, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	edgeState := t.TempDir()
	ready := make(chan string, 1)
	ed := &edgeCmd{errOut: &stderr, log: slog.New(slog.NewTextHandler(&stderr, nil)), ready: ready}
	edgeCommand := wire(ed)
	edgeCommand.SetArgs([]string{"--kubeconfig", cp.Kubeconfig, "--namespace", ns, "--state-dir", edgeState,
		"--http-addr", "127.0.0.1:0", "--https-addr", fmt.Sprintf("127.0.0.1:%d", httpsPort)})
	edgeDone := make(chan error, 1)
	edgeCtx, stopEdge := context.WithCancel(ctx)
	go func() { edgeDone <- edgeCommand.ExecuteContext(edgeCtx) }()
	httpAddr := <-ready
	caPEM, err := os.ReadFile(filepath.Join(edgeState, "edge", "ca", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	edgeClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if strings.HasPrefix(addr, "web.localhost:") {
				addr = "127.0.0.1:" + strings.TrimPrefix(addr, "web.localhost:")
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
	appURL := fmt.Sprintf("https://web.localhost:%d/", httpsPort)
	testenv.Eventually(t, 30*time.Second, "release 1 through the edge", func() error {
		resp, err := edgeClient.Get(appURL)
		if err != nil {
			return fmt.Errorf("%v\n%s", err, stderr.String())
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "hello from release 1") {
			return fmt.Errorf("%s: %s\n%s", resp.Status, body, stderr.String())
		}
		return nil
	})
	req, _ := http.NewRequest(http.MethodGet, "http://"+httpAddr+"/", nil)
	req.Host = "web.localhost"
	redirect, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	redirect.Body.Close()
	if redirect.StatusCode != http.StatusPermanentRedirect || redirect.Header.Get("Location") != appURL {
		t.Fatalf("HTTP answered %s, Location %q; want a redirect to %s", redirect.Status, redirect.Header.Get("Location"), appURL)
	}
	stopEdge()
	if err := <-edgeDone; err != nil {
		t.Fatalf("bex edge ended with %v", err)
	}

	// Release 2 (a BuildKit build like the gitserver's) rolls out; with
	// --keep-releases 1, release 1 is pruned and its image bex.local/web:1 leaves
	// containerd (the default --image-repo bex.local), while busybox, of another
	// name in the same namespace, stays.
	os.WriteFile(filepath.Join(src, "Dockerfile"), []byte("FROM busybox\nRUN mkdir /www && echo 'hello from release 2' > /www/index.html\n"), 0o644)
	bctx, bcancel = context.WithTimeout(ctx, 2*time.Minute)
	digest2, log, err := bk.BuildImage(bctx, src, src, "bex.local/web:2")
	bcancel()
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	cd, err := bk.Containerd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cd.Close()
	// What the namespace holds, for the log: BuildKit's cache keeps its layers
	// under its own leases, so the bytes that go are what only the image held.
	usage := func() (bytes int64, snaps int) {
		_ = cd.ContentStore().Walk(ctx, func(i content.Info) error { bytes += i.Size; return nil })
		_ = cd.SnapshotService("overlayfs").Walk(ctx, func(context.Context, snapshots.Info) error { snaps++; return nil })
		return bytes, snaps
	}
	bytesBefore, snapsBefore := usage()
	n, err = rec.Record(ctx, "web", releases.Change{Image: "bex.local/web@" + digest2, Cause: appv1.ReleaseCausePush})
	if err != nil {
		t.Fatal(err)
	}
	wctx2, wcancel2 := context.WithTimeout(ctx, 90*time.Second)
	defer wcancel2()
	if _, err := rec.Wait(wctx2, "web", n, nil); err != nil {
		t.Fatalf("Wait for release 2: %v\n%s", err, stderr.String())
	}
	has := func(name string) bool {
		_, err := cd.GetImage(ctx, name)
		return err == nil
	}
	testenv.Eventually(t, 30*time.Second, "release 1 and its image pruned", func() error {
		rels, err := rec.List(ctx, "web")
		if err != nil {
			return err
		}
		if len(rels) != 1 || has("bex.local/web:1") {
			return fmt.Errorf("%d releases, bex.local/web:1 present %v", len(rels), has("bex.local/web:1"))
		}
		return nil
	})
	bytesAfter, snapsAfter := usage()
	t.Logf("containerd namespace %s: content %d bytes, %d snapshots with both images; %d bytes, %d snapshots after release 1's image went", testenv.Namespace, bytesBefore, snapsBefore, bytesAfter, snapsAfter)
	if !has("bex.local/web:2") || !has(testenv.BusyboxRef) {
		t.Fatalf("bex.local/web:2 present %v, %s present %v", has("bex.local/web:2"), testenv.BusyboxRef, has(testenv.BusyboxRef))
	}

	// Deleting the App stops its processes and removes its endpoints.
	app := &appv1.App{}
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, app); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Delete(ctx, app); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the App and its endpoints gone", func() error {
		err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, &appv1.App{})
		if err := cp.Client.List(ctx, &slices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: "web"}); err != nil {
			return err
		}
		if !apierrors.IsNotFound(err) || len(slices.Items) > 0 {
			return fmt.Errorf("the App or its endpoints are still there: %v, %d slices", err, len(slices.Items))
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("bex deployer ended with %v", err)
	}
}
