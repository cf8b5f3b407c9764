package mcpserver_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
	"bex.co/bex/gitserver/mcpserver"
	"bex.co/bex/internal/testenv"
)

// edgeFigures is the edge's counters as a test sets them, per app.
type edgeFigures map[string]backend.TrafficWindow

func (f edgeFigures) AppTraffic(_ context.Context, app string, windows ...time.Duration) ([]backend.TrafficWindow, error) {
	out := make([]backend.TrafficWindow, len(windows))
	for i, w := range windows {
		out[i] = f[app]
		out[i].Window = w
	}
	return out, nil
}

// edgeCerts is the edge's certificates as a test sets them, per app.
type edgeCerts map[string][]backend.CertificateState

func (c edgeCerts) AppCertificates(_ context.Context, app string) ([]backend.CertificateState, error) {
	return c[app], nil
}

// TestDiagnoseNamesACrashLoop, through the real MCP client on a real API
// server: diagnose of an app whose instances crash-loop (the deployer's
// RolledOut condition, with the app's last line and its secret) and whose
// edge figures are half 5xx and whose certificate expired says so in its findings, with the app's output
// masked and framed, and names logs and rollback next; a healthy app with
// clean figures is healthy, with no findings.
func TestDiagnoseNamesACrashLoop(t *testing.T) {
	figures := edgeFigures{
		"broken": {Requests: 40, Status5xx: 20, P50: 0.004, P95: 0.2},
		"fine":   {Requests: 100, Status5xx: 1, P50: 0.002, P95: 0.01},
	}
	tb := newTestbed(t, "mcpdiag", func(c *backend.Config) {
		c.Traffic = figures
		c.Certificates = edgeCerts{
			"broken": {{Host: "broken.localhost", State: "expired", NotAfter: "2026-01-01T00:00:00Z", Issuer: "local"}},
			"fine":   {{Host: "fine.localhost", State: "valid", NotAfter: "2027-01-01T00:00:00Z", Issuer: "local"}},
		}
		c.DiskCheck = func() error { return nil }
	})
	ann := tb.user(t, "ann", appv1.UserSpec{Role: appv1.RoleMember})
	const secret = "s3cret-value-of-broken"
	img := "bex.local/app@sha256:" + strings.Repeat("a", 64)
	tb.apps(t,
		&appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "broken"}, Spec: appv1.AppSpec{Members: []string{ann.Name}, Image: img, Release: 3,
			Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}, Env: []appv1.EnvVar{{Name: "TOKEN", Value: secret}}}},
		&appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "fine"}, Spec: appv1.AppSpec{Members: []string{ann.Name}, Image: img, Release: 1,
			Processes: map[string]appv1.ProcessSpec{"web": {Replicas: 1}}}})
	setStatus := func(name string, revision int64, cond metav1.Condition) {
		a := &appv1.App{}
		if err := tb.cp.Client.Get(tb.ctx, client.ObjectKey{Namespace: tb.ns, Name: name}, a); err != nil {
			t.Fatal(err)
		}
		a.Status.Phase, a.Status.Revision, a.Status.URL = appv1.AppPhaseRunning, revision, "https://"+name+".example"
		cond.ObservedGeneration = a.Generation
		meta.SetStatusCondition(&a.Status.Conditions, cond)
		if err := tb.cp.Client.Status().Update(tb.ctx, a); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, "the cache has "+name+"'s status", func() error {
			c := &appv1.App{}
			if err := tb.cache.Get(tb.ctx, client.ObjectKey{Namespace: tb.ns, Name: name}, c); err != nil {
				return err
			}
			if c.Status.Revision != revision {
				return context.DeadlineExceeded
			}
			return nil
		})
	}
	setStatus("broken", 3, metav1.Condition{Type: appv1.RolledOutCondition, Status: metav1.ConditionFalse, Reason: appv1.CrashLoopReason,
		Message: "web.1 exited with status 1 (restarted 5 times); last log lines:\n\x1b[31mpanic: token " + secret + " refused\x1b[0m"})
	setStatus("fine", 1, metav1.Condition{Type: appv1.RolledOutCondition, Status: metav1.ConditionTrue, Reason: appv1.RolledOutReason, Message: "release v1 serves"})
	s := tb.connect(t, ann, "agent", backend.TokenScope{})

	var d mcpserver.Diagnosis
	text, isErr := callTool(t, s, "diagnose", map[string]any{"app": "broken"}, &d)
	if isErr {
		t.Fatal(text)
	}
	if d.Healthy || d.Trouble != appv1.CrashLoopReason || d.ServingRelease != 3 || d.Disk != "ok" {
		t.Errorf("broken's diagnosis: %+v", d)
	}
	all := strings.Join(d.Findings, " ")
	if !strings.Contains(all, "crash-looping") || !strings.Contains(all, "20 of its 40 requests") || !strings.Contains(all, "The certificate of broken.localhost expired") {
		t.Errorf("broken's findings: %q", d.Findings)
	}
	if !slices.Contains(d.NextTools, "logs") || !slices.Contains(d.NextTools, "rollback") {
		t.Errorf("broken's next tools: %q", d.NextTools)
	}
	if len(d.Traffic) != 2 || d.Traffic[0].Minutes != 5 || d.Traffic[1].Minutes != 60 || d.Traffic[0].P95 != 0.2 {
		t.Errorf("broken's traffic: %+v", d.Traffic)
	}
	for _, out := range []string{text, d.TroubleMessage} {
		if strings.Contains(out, secret) || strings.Contains(out, "\x1b") {
			t.Errorf("diagnose returns the app's secret or an escape: %q", out)
		}
	}
	if !strings.Contains(d.TroubleMessage, "[redacted: TOKEN]") || !strings.Contains(d.TroubleMessage, "untrusted-app-output") {
		t.Errorf("the trouble message is not masked and framed: %q", d.TroubleMessage)
	}
	if !strings.Contains(text, "crash-looping") {
		t.Errorf("diagnose's text does not name the crash loop: %s", text)
	}

	var ok mcpserver.Diagnosis
	if text, isErr := callTool(t, s, "diagnose", map[string]any{"app": "fine"}, &ok); isErr || !ok.Healthy || len(ok.Findings) != 0 ||
		len(ok.Certificates) != 1 || ok.Certificates[0].State != "valid" {
		t.Errorf("fine's diagnosis: %s %+v", text, ok)
	}
}
