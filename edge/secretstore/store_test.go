package secretstore_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"bex.co/bex/edge/secretstore"
	"bex.co/bex/internal/testenv"
)

// Conformance of the Secret-backed certmagic.Storage against a real API server:
// load/store/list/stat/delete, fs.ErrNotExist, locks that exclude, locks released on
// expiry.

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

func newStore(t *testing.T, ns, id string, lease time.Duration) *secretstore.Store {
	t.Helper()
	cp := testenv.SharedControlPlane(t)
	s, err := secretstore.New(secretstore.Config{Namespace: ns, LeaseDuration: lease, PollInterval: 50 * time.Millisecond, Identity: id}, cp.Client)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestStoreLoadListStatDelete(t *testing.T) {
	ns := testenv.SharedControlPlane(t).Namespace(t, "certs")
	s := newStore(t, ns, "a", time.Minute)
	ctx := context.Background()

	if _, err := s.Load(ctx, "certificates/ca/web.example.com/web.example.com.crt"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load of a missing key: %v", err)
	}
	if _, err := s.Stat(ctx, "nothing"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Stat of a missing key: %v", err)
	}
	if _, err := s.List(ctx, "certificates", true); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("List of a missing directory: %v", err)
	}
	keys := map[string]string{
		"certificates/ca/web.example.com/web.example.com.crt": "cert",
		"certificates/ca/web.example.com/web.example.com.key": "key",
		"certificates/ca/api.example.com/api.example.com.crt": "cert2",
		"acme/ca/users/ops@example.com/ops.json":              "account",
	}
	for k, v := range keys {
		if err := s.Store(ctx, k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	// Overwrite.
	if err := s.Store(ctx, "certificates/ca/web.example.com/web.example.com.crt", []byte("renewed")); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Load(ctx, "certificates/ca/web.example.com/web.example.com.crt"); err != nil || string(v) != "renewed" {
		t.Fatalf("Load = %q, %v", v, err)
	}
	info, err := s.Stat(ctx, "certificates/ca/web.example.com/web.example.com.key")
	if err != nil || !info.IsTerminal || info.Size != 3 || time.Since(info.Modified) > time.Minute {
		t.Fatalf("Stat of a key = %+v, %v", info, err)
	}
	if info, err := s.Stat(ctx, "certificates/ca"); err != nil || info.IsTerminal {
		t.Fatalf("Stat of a directory = %+v, %v", info, err)
	}
	if !s.Exists(ctx, "acme/ca/users") || s.Exists(ctx, "acme/other") {
		t.Fatal("Exists is wrong")
	}
	got, err := s.List(ctx, "certificates/ca", false)
	if err != nil || !slices.Equal(got, []string{"certificates/ca/api.example.com", "certificates/ca/web.example.com"}) {
		t.Fatalf("List non-recursive = %v, %v", got, err)
	}
	got, err = s.List(ctx, "certificates", true)
	if err != nil || len(got) != 3 {
		t.Fatalf("List recursive = %v, %v", got, err)
	}
	// Deleting a directory deletes what is below it.
	if err := s.Delete(ctx, "certificates/ca/web.example.com"); err != nil {
		t.Fatal(err)
	}
	if s.Exists(ctx, "certificates/ca/web.example.com/web.example.com.crt") || !s.Exists(ctx, "certificates/ca/api.example.com/api.example.com.crt") {
		t.Fatal("Delete of a directory removed the wrong keys")
	}
	if err := s.Delete(ctx, "certificates/ca/web.example.com"); err != nil {
		t.Fatalf("Delete of what is gone: %v", err)
	}
	// Another replica sees the same keys.
	other := newStore(t, ns, "b", time.Minute)
	if v, err := other.Load(ctx, "acme/ca/users/ops@example.com/ops.json"); err != nil || string(v) != "account" {
		t.Fatalf("another replica loads %q, %v", v, err)
	}
}

func TestLocksExclude(t *testing.T) {
	ns := testenv.SharedControlPlane(t).Namespace(t, "locks")
	a := newStore(t, ns, "a", 2*time.Second)
	b := newStore(t, ns, "b", 2*time.Second)
	ctx := context.Background()
	if err := a.Lock(ctx, "issue_cert_web.example.com"); err != nil {
		t.Fatal(err)
	}
	// b waits while a holds it, longer than the lease duration: a renews it.
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	// The wait ends at the deadline, or just before it when the client's rate
	// limiter sees that its next request would pass it (under load).
	if err := b.Lock(short, "issue_cert_web.example.com"); err == nil {
		t.Fatal("b took a held lock")
	} else if !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "would exceed context deadline") {
		t.Fatalf("b's wait for a held lock ended with %v, not at its deadline", err)
	}
	// Another name is free.
	if err := b.Lock(ctx, "issue_cert_api.example.com"); err != nil {
		t.Fatal(err)
	}
	acquired := make(chan error, 1)
	go func() { acquired <- b.Lock(ctx, "issue_cert_web.example.com") }()
	if err := a.Unlock(ctx, "issue_cert_web.example.com"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-acquired:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b did not get the lock after a released it")
	}
	if err := a.Unlock(ctx, "never-held"); err == nil {
		t.Fatal("unlocking a lock not held succeeded")
	}
}

func TestLocksOfADeadHolderExpire(t *testing.T) {
	cp := testenv.SharedControlPlane(t)
	ns := cp.Namespace(t, "expiry")
	ctx := context.Background()
	s := newStore(t, ns, "alive", 2*time.Second)
	// A holder that died: its Lease was last renewed long ago. The Lease's name is
	// the store's, found by taking a lock once and looking.
	if err := s.Lock(ctx, "probe"); err != nil {
		t.Fatal(err)
	}
	var leases coordinationv1.LeaseList
	if err := cp.Client.List(ctx, &leases); err != nil {
		t.Fatal(err)
	}
	if err := s.Unlock(ctx, "probe"); err != nil {
		t.Fatal(err)
	}
	var name string
	for _, l := range leases.Items {
		if l.Namespace == ns {
			name = l.Name
		}
	}
	if name == "" {
		t.Fatal("no Lease was written for a lock")
	}
	dead, seconds, old := "dead-replica", int32(2), metav1.NewMicroTime(time.Now().Add(-time.Minute))
	stale := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &dead, LeaseDurationSeconds: &seconds, RenewTime: &old, AcquireTime: &old}}
	if err := cp.Client.Create(ctx, stale); err != nil {
		t.Fatal(err)
	}
	lockCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := s.Lock(lockCtx, "probe"); err != nil {
		t.Fatalf("an expired lock was not taken over: %v", err)
	}
	if err := s.Unlock(ctx, "probe"); err != nil {
		t.Fatal(err)
	}
}
