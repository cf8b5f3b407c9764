package local

import (
	"context"
	"log/slog"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// TestARuntimeThatStartsKeepsTheLinksOfAnother: the links' chain is the
// machine's, so a second bex on it (its own state directory and containerd
// namespace) that starts and sweeps the links of namespaces that are gone
// keeps those of the first one's running instances, and still takes a link
// whose namespace is gone. The first one's instance was cut off from its
// database whenever another bex started, until this sweep asked the machine
// rather than its own directories.
func TestARuntimeThatStartsKeepsTheLinksOfAnother(t *testing.T) {
	f := newFixture(t, "links")
	ctx := context.Background()
	const port = "25917"
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: appv1.CredentialsSecret("pg"), Namespace: f.app.Namespace,
		Labels: map[string]string{appv1.LabelDatabase: "pg"}},
		Data: map[string][]byte{appv1.CredentialURL: []byte("postgres://u:p@10.89.0.1:" + port + "/d"), appv1.CredentialPort: []byte(port)}}
	if err := f.k8s.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	d := f.desired(1, f.v1, 1)
	d.Env = append(d.Env, appv1.EnvVar{Name: "DATABASE_URL", ValueFrom: &appv1.SecretKeySelector{Name: secret.Name, Key: appv1.CredentialURL}})
	f.syncUntil(d, time.Minute, "the linked release rolled out", rolledOut)

	links := func() []string {
		t.Helper()
		out, err := exec.Command("iptables", "-w", "-t", "filter", "-S", "BEX-LINKS").CombinedOutput()
		if err != nil {
			t.Fatalf("iptables -S BEX-LINKS: %v\n%s", err, out)
		}
		var mine []string
		for l := range strings.Lines(string(out)) {
			if strings.Contains(l, "--ctorigdstport "+port+" ") {
				mine = append(mine, strings.TrimSpace(l))
			}
		}
		return mine
	}
	before := links()
	if len(before) != 1 {
		t.Fatalf("the linked instance has %d rules for port %s, want 1: %q", len(before), port, before)
	}

	// What a namespace that is gone left: a rule of an owner with no attachment.
	tn := f.rt.net.tn
	stale := netip.MustParseAddr("10.89.254.253")
	if err := tn.AllowLinks(ctx, "links-test-gone", stale, []uint16{25917}); err != nil {
		t.Fatal(err)
	}
	if n := len(links()); n != 2 {
		t.Fatalf("%d rules for port %s after the stale one, want 2", n, port)
	}

	other := f.cfg
	other.StateDir, other.Namespace = t.TempDir(), "bex-links-other"
	other.PortMin, other.PortMax = f.cfg.PortMax+1, f.cfg.PortMax+50
	rt, err := New(other, f.k8s, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rt.Close()

	after := links()
	if len(after) != 1 || after[0] != before[0] {
		t.Fatalf("after another runtime started, the rules for port %s are %q; want the running instance's alone: %q", port, after, before)
	}
	// And the instance still runs, linked, under the first runtime.
	st := f.syncUntil(d, time.Minute, "release 1 still serving", rolledOut)
	if st.Serving != 1 {
		t.Fatalf("after another runtime started: %+v", st)
	}
}
