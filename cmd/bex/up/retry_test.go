package up

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The error bex up once died of, right after the CRDs were installed.
var noUserKind = &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "app.bex.co", Kind: "User"}, SearchedVersions: []string{"v1alpha1"}}

func TestRetryTransientRetriesUntilItWorks(t *testing.T) {
	errs := []error{
		fmt.Errorf("reading user admin: %w", noUserKind),
		apierrors.NewServiceUnavailable("etcd is settling"),
		fmt.Errorf("dial: %w", syscall.ECONNREFUSED),
		apierrors.NewInternalError(errors.New("etcdserver: leader changed")),
	}
	calls := 0
	err := retryTransient(context.Background(), func(context.Context) error {
		calls++
		if calls <= len(errs) {
			return errs[calls-1]
		}
		return nil
	})
	if err != nil || calls != len(errs)+1 {
		t.Fatalf("retryTransient = %v after %d calls, want nil after %d", err, calls, len(errs)+1)
	}
}

func TestRetryTransientStopsOnAPermanentError(t *testing.T) {
	calls := 0
	invalid := apierrors.NewBadRequest("the key is not an OpenSSH public key")
	err := retryTransient(context.Background(), func(context.Context) error { calls++; return invalid })
	if !errors.Is(err, invalid) || calls != 1 {
		t.Fatalf("retryTransient = %v after %d calls, want the error at once", err, calls)
	}
}

func TestRetryTransientSaysWhatFailedAtTheDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := retryTransient(ctx, func(context.Context) error { return noUserKind })
	if err == nil || !strings.Contains(err.Error(), "the API server did not take bex's CRDs and admin keys after") ||
		!strings.Contains(err.Error(), `no matches for kind "User"`) {
		t.Fatalf("retryTransient at the deadline = %v", err)
	}
}
