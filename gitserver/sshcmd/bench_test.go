package sshcmd_test

import (
	"context"
	"fmt"
	osuser "os/user"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/testenv"
)

// BenchmarkSSHCommand measures `ssh bex@HOST apps:list --json` with 100 apps, in the
// same iterations as the bare SSH cost: a command the same server answers at once
// (handshake, authentication and session; no API read), and OpenSSH's sshd running
// `true`. The real ssh client makes every connection. The goal is list/noop <= 1.5.
func BenchmarkSSHCommand(b *testing.B) {
	s := newServer(b)
	admin := s.addUser("bench", appv1.RoleAdmin, false)
	ctx := context.Background()
	for i := range 100 {
		a := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("app-%03d", i), Namespace: s.ns}}
		if err := s.cp.Client.Create(ctx, a); err != nil {
			b.Fatal(err)
		}
	}
	var apps []struct{ Name string }
	s.eventually(func() error {
		admin.json(&apps, "apps:list")
		if len(apps) != 100 {
			return fmt.Errorf("%d apps listed", len(apps))
		}
		return nil
	})
	sshd := testenv.StartSSHD(b, admin.key)
	me, err := osuser.Current()
	if err != nil {
		b.Fatal(err)
	}
	run := func(user, addr string, args ...string) time.Duration {
		cmd := testenv.SSHCommand(admin.key, user, addr, args...)
		start := time.Now()
		out, err := cmd.Output()
		d := time.Since(start)
		if err != nil && args[0] != "true" {
			b.Fatalf("ssh %v: %v\n%s", args, err, out)
		}
		return d
	}
	// Warm both servers (first connections load keys and fill caches).
	run("bex", s.addr, "apps:list", "--json")
	run(me.Username, sshd.Addr, "true")

	var list, noop, openssh time.Duration
	for b.Loop() {
		list += run("bex", s.addr, "apps:list", "--json")
		// "true" is not a bex command: the tree is built and answers at once.
		noop += run("bex", s.addr, "true")
		openssh += run(me.Username, sshd.Addr, "true")
	}
	n := float64(b.N)
	b.ReportMetric(list.Seconds()/n, "list-s/op")
	b.ReportMetric(noop.Seconds()/n, "noop-s/op")
	b.ReportMetric(openssh.Seconds()/n, "sshd-s/op")
	b.ReportMetric(float64(list)/float64(noop), "list/noop")
	b.ReportMetric(float64(list)/float64(openssh), "list/sshd")
	b.ReportMetric(float64(noop)/float64(openssh), "noop/sshd")
}
