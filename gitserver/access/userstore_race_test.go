package access_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/gitserver/backend"
)

// listBarrier holds every List until another List has come too, or 300 ms have
// passed: two removals that may run side by side then both read the users before
// either writes, which is the race to rule out.
type listBarrier struct {
	client.Client
	mu      sync.Mutex
	waiting chan struct{}
}

func (b *listBarrier) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	b.mu.Lock()
	if b.waiting == nil {
		w := make(chan struct{})
		b.waiting = w
		b.mu.Unlock()
		select {
		case <-w:
		case <-time.After(300 * time.Millisecond): // no wait: a removal that (rightly) runs alone never sees a second List, and goes on
			b.mu.Lock()
			b.waiting = nil
			b.mu.Unlock()
		}
	} else {
		close(b.waiting)
		b.waiting = nil
		b.mu.Unlock()
	}
	return b.Client.List(ctx, list, opts...)
}

// TestLastAdminKeysRemovedAtOnce: two admins with a key each remove their keys at
// the same moment; one removal goes through, the other is refused as the last
// admin key, and an admin key is left.
func TestLastAdminKeysRemovedAtOnce(t *testing.T) {
	s := runtime.NewScheme()
	if err := appv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	_, a := newKey(t)
	_, b := newKey(t)
	admin := func(name, key string) *appv1.User {
		return &appv1.User{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: appv1.UserSpec{Role: appv1.RoleAdmin, Keys: []appv1.SSHKey{{Name: "k", PublicKey: key}}}}
	}
	c := &listBarrier{Client: fake.NewClientBuilder().WithScheme(s).WithObjects(admin("ana", a), admin("bob", b)).Build()}
	ctx := context.Background()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, user := range []string{"ana", "bob"} {
		wg.Go(func() { _, errs[i] = backend.RemoveKey(ctx, c, user, "k") })
	}
	wg.Wait()
	refused := 0
	for _, err := range errs {
		if errors.Is(err, backend.ErrConflict) && strings.Contains(err.Error(), "last admin") {
			refused++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := backend.HasAdmin(ctx, c); refused != 1 || err != nil || !ok {
		t.Fatalf("%d refusals (want 1), an admin left: %v %v", refused, ok, err)
	}
}
