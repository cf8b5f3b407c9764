package up

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/discovery"
)

// retryTransient runs f until it succeeds, fails with an error that is not
// transient, or ctx ends, waiting a little longer after each failure. An API
// server that has just become ready may still refuse a request for a moment
// (its discovery lagging behind a new CRD, a storage error while etcd settles, a
// connection reset): such an error at start is retried, not fatal.
func retryTransient(ctx context.Context, f func(context.Context) error) error {
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := f(ctx)
		if err == nil || !transient(err) {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the API server did not take bex's CRDs and admin keys after %d attempts: %w", attempt, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the API server did not take bex's CRDs and admin keys after %d attempts: %w", attempt, err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// transient reports whether err may go away by itself: the API server's
// availability and consistency errors, a kind its discovery does not list yet,
// a connection refused or cut, a timeout.
func transient(err error) bool {
	var netErr net.Error
	switch {
	case meta.IsNoMatchError(err), discovery.IsGroupDiscoveryFailedError(err),
		apierrors.IsServiceUnavailable(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsTooManyRequests(err), apierrors.IsInternalError(err), apierrors.IsConflict(err),
		apierrors.IsUnexpectedServerError(err), apierrors.IsNotFound(err) && isCRDNotFound(err),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.As(err, &netErr) && netErr.Timeout(),
		errors.Is(err, context.DeadlineExceeded):
		return true
	}
	return false
}

// isCRDNotFound: a 404 for a CRD just applied (read back through a lagging cache).
func isCRDNotFound(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	return status.Status().Details.Group == "apiextensions.k8s.io"
}
