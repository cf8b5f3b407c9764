package local

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	bkclient "github.com/moby/buildkit/client"
	"github.com/tonistiigi/fsutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/deployer/runtime"
	"bex.co/bex/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// The test app: busybox httpd serving /www, whose index says the version. At start
// it writes $GREETING into /www/greeting.txt, so a GET shows that env vars arrived.
const appDockerfile = `FROM busybox
RUN mkdir -p /www && echo "version %s" > /www/index.html
CMD ["sh", "-c", "echo \"$GREETING\" > /www/greeting.txt; echo booting %s on $PORT; exec httpd -f -p $PORT -h /www"]
`

var images struct {
	once   sync.Once
	v1, v2 string
	err    error
}

// testImages builds the v1 and v2 images once per test binary and returns their
// digest references, as the builder would hand them to the deployer.
func testImages(t testing.TB) (v1, v2 string) {
	t.Helper()
	bk := testenv.SharedBuildkitd(t)
	testenv.SharedBusybox(t)
	images.once.Do(func() {
		images.v1, images.err = buildImage(bk, "v1")
		if images.err == nil {
			images.v2, images.err = buildImage(bk, "v2")
		}
	})
	if images.err != nil {
		t.Fatal(images.err)
	}
	return images.v1, images.v2
}

func buildImage(bk *testenv.Buildkitd, version string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "bex-local-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), fmt.Appendf(nil, appDockerfile, version, version), 0o644); err != nil {
		return "", err
	}
	c, err := bk.Client(ctx)
	if err != nil {
		return "", err
	}
	defer c.Close()
	fs, err := fsutil.NewFS(dir)
	if err != nil {
		return "", err
	}
	const repo = "docker.io/library/bex-local-test"
	ch := make(chan *bkclient.SolveStatus)
	go func() {
		for range ch {
		}
	}()
	resp, err := c.Solve(ctx, nil, bkclient.SolveOpt{
		Frontend:      "dockerfile.v0",
		FrontendAttrs: map[string]string{"filename": "Dockerfile", "image-resolve-mode": "local"},
		LocalMounts:   map[string]fsutil.FS{"context": fs, "dockerfile": fs},
		Exports: []bkclient.ExportEntry{{Type: bkclient.ExporterImage,
			Attrs: map[string]string{"name": repo + ":" + version, "unpack": "true"}}},
	}, ch)
	if err != nil {
		return "", fmt.Errorf("build %s: %w", version, err)
	}
	digest := resp.ExporterResponse["containerimage.digest"]
	if !strings.HasPrefix(digest, "sha256:") {
		return "", fmt.Errorf("build %s: no digest in %v", version, resp.ExporterResponse)
	}
	// The digest reference, like the builder's result: not a name in containerd.
	return repo + "@" + digest, nil
}

var portBase atomic.Int32

// fixture is one test's runtime, namespace and App.
type fixture struct {
	t        testing.TB
	cd       *testenv.Containerd
	cp       *testenv.ControlPlane
	rt       *Runtime
	cfg      Config
	app      *appv1.App
	v1, v2   string
	logs     *bytes.Buffer
	logMu    *sync.Mutex
	k8s      client.Client
	released bool
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func newFixture(t testing.TB, name string) *fixture {
	t.Helper()
	f := &fixture{t: t, cd: testenv.SharedContainerd(t), cp: testenv.SharedControlPlane(t), logs: &bytes.Buffer{}, logMu: &sync.Mutex{}}
	f.v1, f.v2 = testImages(t)
	f.k8s = f.cp.Client
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := f.k8s.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	f.app = &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: name}}
	if err := f.k8s.Create(ctx, f.app); err != nil {
		t.Fatal(err)
	}
	base := 21000 + 200*int(portBase.Add(1))
	f.cfg = Config{
		Address: f.cd.Address, Namespace: testenv.Namespace, StateDir: t.TempDir(),
		PortMin: base, PortMax: base + 199,
		Drain: 500 * time.Millisecond, StopTimeout: 2 * time.Second, BootTimeout: 20 * time.Second,
		RestartBackoff: 50 * time.Millisecond, RestartBackoffMax: 500 * time.Millisecond,
	}
	f.rt = f.newRuntime()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := f.rt.Delete(ctx, f.key()); err != nil {
			t.Errorf("cleanup: Delete: %v", err)
		}
		f.rt.Close()
		if t.Failed() {
			f.logMu.Lock()
			t.Logf("runtime log:\n%s", f.logs.String())
			f.logMu.Unlock()
		}
	})
	return f
}

func (f *fixture) newRuntime() *Runtime {
	f.t.Helper()
	log := slog.New(slog.NewTextHandler(lockedWriter{f.logMu, f.logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rt, err := New(f.cfg, f.k8s, log)
	if err != nil {
		f.t.Fatal(err)
	}
	return rt
}

func (f *fixture) key() types.NamespacedName {
	return types.NamespacedName{Namespace: f.app.Namespace, Name: f.app.Name}
}

func (f *fixture) desired(release int64, image string, web int32) runtime.Desired {
	return runtime.Desired{App: f.app, Release: release, Image: image,
		Processes: map[string]appv1.ProcessSpec{"web": {Replicas: web}},
		Env:       []appv1.EnvVar{{Name: "GREETING", Value: "hello"}}}
}

// syncUntil calls Sync, as the reconciler does, until done says so.
func (f *fixture) syncUntil(d runtime.Desired, timeout time.Duration, what string, done func(runtime.Status) bool) runtime.Status {
	f.t.Helper()
	var st runtime.Status
	testenv.Eventually(f.t, timeout, what, func() error {
		var err error
		if st, err = f.rt.Sync(context.Background(), d); err != nil {
			f.t.Fatalf("Sync: %v", err)
		}
		if !done(st) {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	return st
}

func rolledOut(st runtime.Status) bool { return st.RolledOut }

func failed(st runtime.Status) bool { return st.Failure != "" }

// endpoints reads the app's EndpointSlices from the API: the URLs of the ready
// endpoints, sorted.
func (f *fixture) endpoints() []string {
	f.t.Helper()
	urls, err := readEndpoints(f.k8s, f.key())
	if err != nil {
		f.t.Fatal(err)
	}
	return urls
}

func readEndpoints(c client.Client, key types.NamespacedName) ([]string, error) {
	list := &discoveryv1.EndpointSliceList{}
	if err := c.List(context.Background(), list, client.InNamespace(key.Namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: key.Name}); err != nil {
		return nil, err
	}
	var urls []string
	for _, s := range list.Items {
		if (s.AddressType != discoveryv1.AddressTypeFQDN && s.AddressType != discoveryv1.AddressTypeIPv4) || len(s.Ports) != 1 || s.Ports[0].Port == nil {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready {
				for _, a := range e.Addresses {
					urls = append(urls, fmt.Sprintf("http://%s:%d", a, *s.Ports[0].Port))
				}
			}
		}
	}
	sort.Strings(urls)
	return urls, nil
}

var httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func get(url string) (string, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return strings.TrimSpace(string(body)), nil
}

func (f *fixture) mustGet(url, want string) {
	f.t.Helper()
	got, err := get(url)
	if err != nil || got != want {
		f.t.Fatalf("GET %s = %q, %v; want %q", url, got, err, want)
	}
}

// containers lists the app's containers in containerd: id -> labels.
func (f *fixture) containers() map[string]map[string]string {
	f.t.Helper()
	cl, err := f.cd.Client()
	if err != nil {
		f.t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	ctrs, err := cl.Containers(ctx, fmt.Sprintf("labels.%q==%s,labels.%q==%s", labelNamespace, f.app.Namespace, labelApp, f.app.Name))
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]map[string]string{}
	for _, c := range ctrs {
		l, err := c.Labels(ctx)
		if errdefs.IsNotFound(err) {
			continue // removed between the list and now: the runtime stopped it
		}
		if err != nil {
			f.t.Fatal(err)
		}
		out[c.ID()] = l
	}
	return out
}

// containersAre checks that the app has n containers.
func (f *fixture) containersAre(n int) func() error {
	return func() error {
		if ctrs := f.containers(); len(ctrs) != n {
			return fmt.Errorf("%d containers: %v", len(ctrs), ctrs)
		}
		return nil
	}
}

// deployV1 rolls out release 1 (v1) and returns its endpoint.
func (f *fixture) deployV1() (runtime.Desired, string) {
	f.t.Helper()
	d := f.desired(1, f.v1, 1)
	st := f.syncUntil(d, time.Minute, "release 1 rolled out", rolledOut)
	if st.Serving != 1 || st.Failure != "" {
		f.t.Fatalf("release 1: %+v", st)
	}
	eps := f.endpoints()
	if len(eps) != 1 {
		f.t.Fatalf("endpoints of release 1: %v", eps)
	}
	f.mustGet(eps[0], "version v1")
	return d, eps[0]
}

func TestReleaseServesOnItsPortWithEnvAndLogs(t *testing.T) {
	f := newFixture(t, "serve")
	ctx := context.Background()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: f.app.Namespace},
		Data: map[string][]byte{"greeting": []byte("hello-from-secret")}}
	if err := f.k8s.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	d := runtime.Desired{App: f.app, Release: 1, Image: f.v1,
		Processes: map[string]appv1.ProcessSpec{
			"web": {Replicas: 1},
			// $(GREETING) and $(PORT) are expanded by the runtime, $$GREETING becomes
			// $GREETING for the shell.
			"worker": {Replicas: 1, Command: []string{"sh", "-c", "echo worker says $(GREETING) and $$GREETING on $(PORT); exec sleep 3600"}},
		},
		Env: []appv1.EnvVar{
			{Name: "GREETING", ValueFrom: &appv1.SecretKeySelector{Name: "creds", Key: "greeting"}},
			{Name: "PORT", Value: "1"}, // the runtime's PORT wins
		}}
	st := f.syncUntil(d, time.Minute, "rolled out", rolledOut)
	if st.Serving != 1 || st.Processes["web"] != (runtime.ProcessStatus{Desired: 1, Ready: 1}) ||
		st.Processes["worker"] != (runtime.ProcessStatus{Desired: 1, Ready: 1}) {
		t.Fatalf("status: %+v", st)
	}

	ctrs := f.containers()
	if len(ctrs) != 2 {
		t.Fatalf("containers: %v", ctrs)
	}
	var webPort, workerPort, webAddr string
	for id, l := range ctrs {
		if !strings.HasPrefix(id, "serve-shop-"+l[labelProcess]+"-r1-1-") || l[labelRelease] != "1" || l[labelIndex] != "1" {
			t.Errorf("container %s labels %v", id, l)
		}
		if l[labelProcess] == "web" {
			webPort, webAddr = l[labelPort], l[labelAddress]
		} else {
			workerPort = l[labelPort]
		}
	}
	if webPort == "" || workerPort == "" || webPort == workerPort {
		t.Fatalf("ports: web %q worker %q", webPort, workerPort)
	}

	// The EndpointSlice lists the web instance at its own address (on the tenants'
	// subnet), on its allocated port.
	subnet := netip.MustParsePrefix(f.cfg.withDefaults().TenantNet.AppsSubnet)
	if a, err := netip.ParseAddr(webAddr); err != nil || !subnet.Contains(a) {
		t.Fatalf("web instance's address %q: want one in %s", webAddr, subnet)
	}
	want := "http://" + webAddr + ":" + webPort
	if eps := f.endpoints(); len(eps) != 1 || eps[0] != want {
		t.Fatalf("endpoints %v, want [%s]", eps, want)
	}
	list := &discoveryv1.EndpointSliceList{}
	if err := f.k8s.List(ctx, list, client.InNamespace(f.app.Namespace)); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != "shop-"+webPort || len(list.Items[0].OwnerReferences) != 1 ||
		list.Items[0].OwnerReferences[0].UID != f.app.UID || *list.Items[0].Ports[0].Name != "http" ||
		list.Items[0].AddressType != discoveryv1.AddressTypeIPv4 {
		t.Fatalf("endpointslices: %+v", list.Items)
	}
	svc := &corev1.Service{}
	if err := f.k8s.Get(ctx, f.key(), svc); err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || len(svc.OwnerReferences) != 1 || svc.OwnerReferences[0].Kind != "App" {
		t.Fatalf("service: %+v", svc)
	}

	f.mustGet(want, "version v1")
	f.mustGet(want+"/greeting.txt", "hello-from-secret")

	// Logs: recent lines of both instances, prefixed with the instance.
	wantLines := []string{"web.1[r1]: booting v1 on " + webPort,
		"worker.1[r1]: worker says hello-from-secret and hello-from-secret on " + workerPort}
	testenv.Eventually(t, 10*time.Second, "logs show "+strings.Join(wantLines, " | "), func() error {
		var buf bytes.Buffer
		if err := f.rt.Logs(ctx, f.key(), false, &buf); err != nil {
			t.Fatal(err)
		}
		for _, l := range wantLines {
			if !strings.Contains(buf.String(), l+"\n") {
				return fmt.Errorf("logs:\n%s", buf.String())
			}
		}
		return nil
	})

	// Following shows the lines that come later.
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	go func() { _ = f.rt.Logs(fctx, f.key(), true, pw); pw.Close() }()
	found := make(chan bool, 1)
	// The follower has taken each file's offset once it has written that file's
	// recent lines: a line noted after both were read comes from following.
	caughtUp := make(chan struct{})
	go func() {
		up := caughtUp
		buf := make([]byte, 0, 4096)
		tmp := make([]byte, 1024)
		for {
			n, err := pr.Read(tmp)
			buf = append(buf, tmp[:n]...)
			if up != nil && strings.Contains(string(buf), wantLines[0]+"\n") && strings.Contains(string(buf), wantLines[1]+"\n") {
				close(up)
				up = nil
			}
			if strings.Contains(string(buf), "web.1[r1]: followed line") {
				found <- true
				return
			}
			if err != nil {
				found <- false
				return
			}
		}
	}()
	// A line the runtime itself appends, as it does when a command cannot start.
	var web *instance
	f.rt.mu.Lock()
	for _, inst := range f.rt.apps[f.key()].instances {
		if inst.web() {
			web = inst
		}
	}
	f.rt.mu.Unlock()
	select {
	case <-caughtUp:
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not show the recent lines within 10s")
	}
	f.rt.noteLog(web, "followed line")
	select {
	case ok := <-found:
		if !ok {
			t.Fatal("follow ended without the new line")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not show the new line within 10s")
	}
}

func TestNewReleaseReplacesOldWithoutFailedRequests(t *testing.T) {
	f := newFixture(t, "rollout")
	_, oldURL := f.deployV1()

	// Requests as the edge makes them: read the slices, pick a ready endpoint, GET.
	type result struct {
		body string
		err  error
	}
	var mu sync.Mutex
	var results []result
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		deadline := time.Now().Add(30 * time.Second)
		for i := 0; time.Now().Before(deadline); i++ {
			select {
			case <-stop:
				return
			default:
			}
			urls, err := readEndpoints(f.k8s, f.key())
			var r result
			if err != nil {
				r.err = err
			} else if len(urls) == 0 {
				r.err = fmt.Errorf("no ready endpoint")
			} else {
				r.body, r.err = get(urls[i%len(urls)])
			}
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		}
	}()
	count := func(body string) (n int) {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range results {
			if r.body == body {
				n++
			}
		}
		return n
	}
	testenv.Eventually(t, 10*time.Second, "requests reach v1", func() error {
		if got := count("version v1"); got < 5 {
			return fmt.Errorf("%d answers of v1", got)
		}
		return nil
	})

	d2 := f.desired(2, f.v2, 1)
	st := f.syncUntil(d2, time.Minute, "release 2 rolled out", rolledOut)
	if st.Serving != 2 || st.Failure != "" {
		t.Fatalf("release 2: %+v", st)
	}
	testenv.Eventually(t, 10*time.Second, "requests reach v2", func() error {
		if got := count("version v2"); got < 20 {
			return fmt.Errorf("%d answers of v2", got)
		}
		return nil
	})
	close(stop)
	<-done

	var failures []string
	firstV2 := -1
	for i, r := range results {
		if r.err != nil {
			failures = append(failures, fmt.Sprintf("request %d: %v", i, r.err))
		}
		if r.body == "version v2" && firstV2 < 0 {
			firstV2 = i
		}
	}
	if len(failures) > 0 {
		t.Fatalf("%d of %d requests failed during the rollout: %v", len(failures), len(results), failures)
	}
	if firstV2 <= 0 || results[0].body != "version v1" || results[len(results)-1].body != "version v2" {
		t.Fatalf("responses did not move from v1 to v2 (first v2 at %d of %d)", firstV2, len(results))
	}
	t.Logf("%d requests, all answered; v2 from request %d", len(results), firstV2)

	// The old instance drains, then goes (after RolledOut: it no longer serves), and
	// its port no longer answers.
	testenv.Eventually(t, 30*time.Second, "the old instance to stop", f.containersAre(1))
	ctrs := f.containers()
	if len(ctrs) != 1 {
		t.Fatalf("containers after the rollout: %v", ctrs)
	}
	for _, l := range ctrs {
		if l[labelRelease] != "2" {
			t.Fatalf("the remaining container is of release %s", l[labelRelease])
		}
	}
	if _, err := get(oldURL); err == nil {
		t.Fatalf("the old instance %s still answers", oldURL)
	}
}

func TestUnhealthyReleaseFailsAndOldKeepsServing(t *testing.T) {
	f := newFixture(t, "unhealthy")
	_, url := f.deployV1()

	d2 := f.desired(2, f.v2, 1)
	d2.Processes = map[string]appv1.ProcessSpec{"web": {Replicas: 1, Command: []string{"sleep", "3600"}}}
	d2.HealthCheck = &appv1.HealthCheck{Path: "/healthz", BootTimeoutSeconds: 2}
	st := f.syncUntil(d2, 30*time.Second, "a failure", failed)
	if st.Failure != appv1.HealthCheckFailedReason || st.Serving != 1 || st.RolledOut {
		t.Fatalf("status: %+v", st)
	}
	wantMsg := regexpish("web.1 did not answer GET /healthz on port ", " within 2s (last try: ")
	if !wantMsg(st.Message) || !strings.Contains(st.Message, "connection refused") {
		t.Fatalf("message %q", st.Message)
	}
	// The old release keeps its endpoint and answers.
	if eps := f.endpoints(); len(eps) != 1 || eps[0] != url {
		t.Fatalf("endpoints %v, want [%s]", eps, url)
	}
	f.mustGet(url, "version v1")
	// The failed release's instance is stopped and not started again.
	testenv.Eventually(t, 20*time.Second, "the failed instance is removed", f.containersAre(1))
	for range 5 {
		st2, err := f.rt.Sync(context.Background(), d2)
		if err != nil {
			t.Fatal(err)
		}
		if st2.Failure != st.Failure || st2.Message != st.Message || st2.Serving != 1 {
			t.Fatalf("repeated Sync: %+v", st2)
		}
		if n := len(f.containers()); n != 1 {
			t.Fatalf("the failed release was retried: %d containers", n)
		}
	}
	f.mustGet(url, "version v1")

	// A new release (here: the same image, healthy) is tried again and replaces v1.
	d3 := f.desired(3, f.v2, 1)
	d3.HealthCheck = &appv1.HealthCheck{Path: "/index.html", BootTimeoutSeconds: 5}
	f.syncUntil(d3, time.Minute, "release 3 rolled out", rolledOut)
	eps := f.endpoints()
	if len(eps) != 1 {
		t.Fatalf("endpoints %v", eps)
	}
	f.mustGet(eps[0], "version v2")
}

// regexpish reports whether s contains the parts in order.
func regexpish(parts ...string) func(string) bool {
	return func(s string) bool {
		for _, p := range parts {
			i := strings.Index(s, p)
			if i < 0 {
				return false
			}
			s = s[i+len(p):]
		}
		return true
	}
}

func TestCrashLoopAndRestartAfterKill(t *testing.T) {
	f := newFixture(t, "crash")
	d1, url := f.deployV1()

	// Killed from outside: restarted, counted, back in the endpoints on its port.
	cl, err := f.cd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	var id string
	for cid := range f.containers() {
		id = cid
	}
	ctr, err := cl.LoadContainer(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Kill(ctx, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st := f.syncUntil(d1, 30*time.Second, "web restarted once and ready", func(st runtime.Status) bool {
		return st.Processes["web"].Restarts == 1 && st.Processes["web"].Ready == 1
	})
	if st.Failure != "" || !st.RolledOut || st.Serving != 1 {
		t.Fatalf("after the kill: %+v", st)
	}
	testenv.Eventually(t, 10*time.Second, "the endpoint is back", func() error {
		if eps := f.endpoints(); len(eps) != 1 || eps[0] != url {
			return fmt.Errorf("endpoints %v", eps)
		}
		return nil
	})
	f.mustGet(url, "version v1")
	if ctrs := f.containers(); len(ctrs) != 1 || ctrs[id] == nil {
		t.Fatalf("the instance was replaced rather than restarted: %v", ctrs)
	}

	// A command that exits at once: crash loop, the old release untouched.
	d2 := f.desired(2, f.v2, 1)
	d2.Processes = map[string]appv1.ProcessSpec{"web": {Replicas: 1, Command: []string{"sh", "-c", "echo cannot connect to the database; exit 3"}}}
	st = f.syncUntil(d2, 30*time.Second, "a failure", failed)
	if st.Failure != appv1.CrashLoopReason || st.Serving != 1 {
		t.Fatalf("status: %+v", st)
	}
	if !regexpish("web.1 keeps exiting: 3 exits within 1m0s (last: exited with code 3)", "last log lines:\n", "cannot connect to the database")(st.Message) {
		t.Fatalf("message %q", st.Message)
	}
	if st.Processes["web"].Restarts < 2 {
		t.Fatalf("restarts of the crashing release: %+v", st.Processes)
	}
	if eps := f.endpoints(); len(eps) != 1 || eps[0] != url {
		t.Fatalf("endpoints %v, want [%s]", eps, url)
	}
	f.mustGet(url, "version v1")
	testenv.Eventually(t, 20*time.Second, "the crashing instance is removed", f.containersAre(1))
}

// TestHungInstanceIsRestarted: a web instance that stops answering while its
// process runs (here its httpd goes after 2 s, the shell stays) is taken out of
// the endpoints after LivenessFailures failed checks and restarted; it answers
// again, with the restart counted and the reason logged.
func TestHungInstanceIsRestarted(t *testing.T) {
	f := newFixture(t, "hung")
	f.rt.Close()
	f.cfg.LivenessInterval, f.cfg.LivenessFailures = 100*time.Millisecond, 3
	f.rt = f.newRuntime()
	d := f.desired(1, f.v1, 1)
	d.Processes = map[string]appv1.ProcessSpec{"web": {Replicas: 1, Command: []string{"sh", "-c",
		"httpd -f -p $PORT -h /www & sleep 2; kill $!; echo httpd gone; exec sleep 3600"}}}
	st := f.syncUntil(d, 30*time.Second, "web restarted after hanging, and ready again", func(st runtime.Status) bool {
		return st.Processes["web"].Restarts >= 1 && st.Processes["web"].Ready == 1
	})
	if st.Failure != "" || st.Serving != 1 {
		t.Fatalf("status %+v", st)
	}
	f.logMu.Lock()
	logs := f.logs.String()
	f.logMu.Unlock()
	if !strings.Contains(logs, "stopped answering its health check (3 checks in a row") {
		t.Fatalf("no liveness line in the runtime log:\n%s", logs)
	}
	eps := f.endpoints()
	if len(eps) != 1 {
		t.Fatalf("endpoints %v", eps)
	}
	f.mustGet(eps[0], "version v1")
}

func TestMissingImageIsReported(t *testing.T) {
	f := newFixture(t, "noimage")
	image := "docker.io/library/never-built@sha256:" + strings.Repeat("0", 64)
	st := f.syncUntil(f.desired(1, image, 1), 10*time.Second, "a failure", failed)
	want := "image " + image + " is not in containerd: push again to rebuild it"
	if st.Failure != appv1.ImageNotFoundReason || st.Message != want || st.Serving != 0 {
		t.Fatalf("status %+v, want ImageNotFound %q", st, want)
	}
	if n := len(f.containers()); n != 0 {
		t.Fatalf("%d containers for a missing image", n)
	}
}

func TestSuspendAndResume(t *testing.T) {
	f := newFixture(t, "suspend")
	d, _ := f.deployV1()
	d.Suspended = true
	st := f.syncUntil(d, 30*time.Second, "suspended", rolledOut)
	if st.Serving != 0 || st.Failure != "" {
		t.Fatalf("suspended: %+v", st)
	}
	if n := len(f.containers()); n != 0 {
		t.Fatalf("%d containers while suspended", n)
	}
	if eps := f.endpoints(); len(eps) != 0 {
		t.Fatalf("endpoints while suspended: %v", eps)
	}
	d.Suspended = false
	st = f.syncUntil(d, time.Minute, "resumed", rolledOut)
	if st.Serving != 1 {
		t.Fatalf("resumed: %+v", st)
	}
	eps := f.endpoints()
	if len(eps) != 1 {
		t.Fatalf("endpoints %v", eps)
	}
	f.mustGet(eps[0], "version v1")
}

func TestReplicasGetDistinctPortsAndEndpoints(t *testing.T) {
	f := newFixture(t, "replicas")
	d := f.desired(1, f.v1, 2)
	st := f.syncUntil(d, time.Minute, "two replicas", rolledOut)
	if st.Processes["web"] != (runtime.ProcessStatus{Desired: 2, Ready: 2}) {
		t.Fatalf("status %+v", st)
	}
	eps := f.endpoints()
	if len(eps) != 2 || eps[0] == eps[1] {
		t.Fatalf("endpoints %v: want two distinct ports", eps)
	}
	for _, u := range eps {
		f.mustGet(u, "version v1")
	}
	// Scale down within the release: one instance drains and goes.
	d.Processes = map[string]appv1.ProcessSpec{"web": {Replicas: 1}}
	f.syncUntil(d, 30*time.Second, "one replica", rolledOut)
	if got := f.endpoints(); len(got) != 1 || (got[0] != eps[0] && got[0] != eps[1]) {
		t.Fatalf("endpoints after scaling down: %v (before %v)", got, eps)
	}
	// The instance scaled away drains, then stops.
	testenv.Eventually(t, 30*time.Second, "one container after scaling down to 1", f.containersAre(1))
}

func TestRestartedRuntimeAdoptsRunningContainers(t *testing.T) {
	f := newFixture(t, "adopt")
	d := f.desired(1, f.v1, 2)
	f.syncUntil(d, time.Minute, "rolled out", rolledOut)
	before := f.containers()
	eps := f.endpoints()
	if err := f.rt.Close(); err != nil {
		t.Fatal(err)
	}

	f.rt = f.newRuntime() // bex restarted, same state dir
	for id, l := range before {
		port, _ := strconv.Atoi(l[labelPort])
		if owner, ok := f.rt.store.owner(port); !ok || owner != id {
			t.Fatalf("port %d is not reserved for %s after the restart (owner %q)", port, id, owner)
		}
	}
	st := f.syncUntil(d, 30*time.Second, "rolled out after the restart", rolledOut)
	if st.Serving != 1 || st.Processes["web"] != (runtime.ProcessStatus{Desired: 2, Ready: 2}) {
		t.Fatalf("status after the restart: %+v", st)
	}
	after := f.containers()
	if len(after) != len(before) {
		t.Fatalf("containers before %v, after %v", before, after)
	}
	for id := range before {
		if after[id] == nil {
			t.Fatalf("container %s was replaced after the restart: %v", id, after)
		}
	}
	if got := f.endpoints(); strings.Join(got, " ") != strings.Join(eps, " ") {
		t.Fatalf("endpoints after the restart %v, before %v", got, eps)
	}
	// New allocations avoid the adopted ports.
	p, err := f.rt.store.allocate("probe")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range before {
		if strconv.Itoa(p) == l[labelPort] {
			t.Fatalf("port %d given out twice", p)
		}
	}
	_ = f.rt.store.free(p, "probe")
	for _, u := range eps {
		f.mustGet(u, "version v1")
	}
	// Supervision works on adopted instances: a kill is a restart.
	cl, err := f.cd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for id := range before {
		ctr, err := cl.LoadContainer(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		task, err := ctr.Task(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = task.Kill(context.Background(), syscall.SIGKILL)
		break
	}
	f.syncUntil(d, 30*time.Second, "the adopted instance restarted", func(st runtime.Status) bool {
		return st.Processes["web"].Restarts == 1 && st.Processes["web"].Ready == 2
	})
}

func TestDeleteRemovesEverything(t *testing.T) {
	f := newFixture(t, "delete")
	f.deployV1()
	ctx := context.Background()
	nets := map[string]netip.Addr{}
	for _, inst := range f.instancesOf(f.key()) {
		nets[inst.netns] = inst.addr
	}
	if err := f.rt.Delete(ctx, f.key()); err != nil {
		t.Fatal(err)
	}
	f.assertNoNetworkLeft(nets)
	if n := len(f.containers()); n != 0 {
		t.Fatalf("%d containers after Delete", n)
	}
	if n := f.rt.store.reserved(); n != 0 {
		t.Fatalf("%d ports reserved after Delete", n)
	}
	if eps := f.endpoints(); len(eps) != 0 {
		t.Fatalf("endpoints after Delete: %v", eps)
	}
	if err := f.k8s.Get(ctx, f.key(), &corev1.Service{}); !apierrors.IsNotFound(err) {
		t.Fatalf("service after Delete: %v", err)
	}
	if _, err := os.Stat(f.rt.logDir(f.key())); !os.IsNotExist(err) {
		t.Fatalf("logs after Delete: %v", err)
	}
	if err := f.rt.Delete(ctx, f.key()); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
}

// ps:restart of one process type replaces its instances the way a rollout does (the
// new one ready before the old one leaves the endpoints) and leaves the other types
// running; the token survives an adoption.
func TestRestartReplacesOneProcessType(t *testing.T) {
	f := newFixture(t, "restart")
	d := f.desired(1, f.v1, 1)
	d.Processes["worker"] = appv1.ProcessSpec{Command: []string{"sh", "-c", "echo working; exec sleep 600"}, Replicas: 1}
	f.syncUntil(d, time.Minute, "release 1 rolled out", rolledOut)
	ids := func() map[string]string {
		out := map[string]string{}
		for id, l := range f.containers() {
			if prev, dup := out[l[labelProcess]]; dup {
				out[l[labelProcess]] = prev + "," + id
			} else {
				out[l[labelProcess]] = id
			}
		}
		return out
	}
	before := ids()

	d.Restarts = map[string]string{"web": "2026-01-01T00:00:00Z/"}
	var sawEmpty bool
	st := f.syncUntil(d, time.Minute, "web restarted", func(st runtime.Status) bool {
		if len(f.endpoints()) == 0 {
			sawEmpty = true
		}
		return st.RolledOut && len(f.containers()) == 2
	})
	if sawEmpty {
		t.Error("the endpoints were empty during the restart")
	}
	after := ids()
	if after["web"] == before["web"] || after["worker"] != before["worker"] || strings.Contains(after["web"], ",") {
		t.Fatalf("containers before %v, after %v: want a new web and the same worker", before, after)
	}
	if st.Serving != 1 || st.Processes["web"].Ready != 1 {
		t.Fatalf("status after the restart: %+v", st)
	}
	eps := f.endpoints()
	if len(eps) != 1 {
		t.Fatalf("endpoints %v", eps)
	}
	f.mustGet(eps[0], "version v1")

	// Adopted by a new runtime, the same token replaces nothing.
	f.rt.Close()
	f.rt = f.newRuntime()
	f.syncUntil(d, 30*time.Second, "adopted", rolledOut)
	if got := ids(); got["web"] != after["web"] || got["worker"] != after["worker"] {
		t.Fatalf("adoption replaced instances: %v, want %v", got, after)
	}
}
