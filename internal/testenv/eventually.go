package testenv

import (
	"testing"
	"time"
)

// Eventually calls f until it returns nil, and fails t with what and f's last error
// when timeout passes first. Tests of asynchronous things (a cache, a controller, a
// daemon) wait with it instead of sleeping.
func Eventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %v after %s", what, err, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
