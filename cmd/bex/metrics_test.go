package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"bex.co/bex/internal/testenv"
)

// TestDeployerMetricsSecure runs `bex deployer --metrics-secure` in process
// against the real API server: its metrics are HTTPS (HTTP/1.1 only) and answer
// only a ServiceAccount token allowed to GET /metrics; no token is 401, a token
// without that right 403, plain HTTP no metrics. The control is a token with the
// right, which reads them.
func TestDeployerMetricsSecure(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "metrics")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	var stderr bytes.Buffer
	// The package's other tests may have run a deployer in this process.
	d := &deployerCmd{errOut: &stderr, log: slog.New(slog.NewTextHandler(&stderr, nil)), inProcessAgain: true}
	cmd := wire(d)
	cmd.SetArgs([]string{"--state-dir", t.TempDir(), "--kubeconfig", cp.Kubeconfig, "--namespace", ns,
		"--runtime", "kubernetes", "--metrics-addr", addr, "--metrics-secure", "--health-addr", "0"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("deployer: %v\n%s", err, stderr.String())
		}
	})

	// A ClusterRole like infra/bex's bex-metrics-reader, bound to one
	// ServiceAccount of the test's namespace; another has no binding.
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	reader := "bex-metrics-reader-" + ns
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: reader},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: reader},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: reader},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "scraper"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), reader, metav1.DeleteOptions{})
		_ = cs.RbacV1().ClusterRoles().Delete(context.Background(), reader, metav1.DeleteOptions{})
	})
	token := func(sa string) string {
		t.Helper()
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	scraper, stranger := token("scraper"), token("stranger")

	// The certificate is self-signed: a scraper skips verifying it, the token
	// is what authenticates. The client would take HTTP/2 if offered.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true,
	}}
	fetch := func(scheme, bearer string) (*http.Response, string, error) {
		req, _ := http.NewRequest(http.MethodGet, scheme+"://"+addr+"/metrics", nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, string(b), err
	}
	const metric = "rest_client_requests_total"

	testenv.Eventually(t, 3*time.Minute, "the deployer serves metrics with the scraper's token", func() error {
		select {
		case err := <-done:
			done <- err // for the cleanup
			t.Fatalf("the deployer ended before it served metrics: %v\n%s", err, stderr.String())
		default:
		}
		resp, body, err := fetch("https", scraper)
		if err != nil {
			return fmt.Errorf("%w (the deployer's log so far: %.2000s)", err, stderr.String())
		}
		if resp.StatusCode != 200 || !strings.Contains(body, metric) {
			return fmt.Errorf("%d %.200q", resp.StatusCode, body)
		}
		if resp.Proto != "HTTP/1.1" {
			return fmt.Errorf("%s, want HTTP/1.1 only", resp.Proto)
		}
		return nil
	})
	// A token the API server rejects is an authentication error to
	// controller-runtime's filter, which answers it with 500 (and logs it);
	// 401 would do as well.
	for _, c := range []struct {
		who, bearer string
		want        []int
	}{
		{"no token", "", []int{401}},
		{"a forged token", "not-a-token", []int{401, 500}},
		{"a ServiceAccount without the right", stranger, []int{403}},
	} {
		resp, body, err := fetch("https", c.bearer)
		if err != nil {
			t.Fatalf("%s: %v", c.who, err)
		}
		if !slices.Contains(c.want, resp.StatusCode) || strings.Contains(body, metric) {
			t.Errorf("%s: %d %.200q, want %v and no metrics", c.who, resp.StatusCode, body, c.want)
		}
	}
	if resp, body, err := fetch("http", scraper); err == nil && (resp.StatusCode == 200 || strings.Contains(body, metric)) {
		t.Errorf("plain HTTP: %d %.200q, want no metrics", resp.StatusCode, body)
	}
}
