package testenv

import (
	"fmt"
	"testing"
	"time"
)

// Eventually calls f until it returns nil, and fails t with what and f's last error
// when timeout passes first. Tests of asynchronous things (a cache, a controller, a
// daemon) wait with it instead of sleeping.
func Eventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	if err := Poll(timeout, f); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Poll is Eventually for code that has no test to fail (a daemon shared by
// several tests, stopped after them): it returns f's last error, saying how long
// it was tried, when timeout passes first.
func Poll(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still %w after %s", err, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
