package gitserver

import (
	"testing"
	"time"
)

// TestUnauthWaitEnds: a connection past the caps waits at most its wait, and
// then has no slot; one past the queue's bounds is refused without waiting; a
// closing limiter ends the waits at once; and a freed slot goes to the first
// waiter it fits, not to a waiter of a source still at its cap.
func TestUnauthWaitEnds(t *testing.T) {
	l := &unauthLimiter{perSource: 1, total: 2, queuedPerSource: 1, queuedTotal: 2}
	relA, _, why := l.acquire("a", time.Second)
	if why != "" {
		t.Fatalf("the first slot: %s", why)
	}
	const wait = 100 * time.Millisecond
	if _, waited, why := l.acquire("a", wait); why != unauthTimeout || waited < wait {
		t.Fatalf("a waiter whose slot never frees: %s after %s", why, waited)
	}
	// a queued (its slot busy), then one more from a: refused at once.
	got := make(chan string, 1)
	go func() { _, _, why := l.acquire("a", time.Minute); got <- why }()
	waitQueued(t, l, 1)
	start := time.Now()
	if _, _, why := l.acquire("a", time.Minute); why != unauthFull || time.Since(start) > time.Second {
		t.Fatalf("past the queue of its source: %s after %s", why, time.Since(start))
	}
	// b takes the second slot; c queues behind a. A's slot freed goes to a's
	// waiter, b's to c's.
	relB, _, _ := l.acquire("b", time.Second)
	gotC := make(chan func(), 1)
	go func() { rel, _, _ := l.acquire("c", time.Minute); gotC <- rel }()
	waitQueued(t, l, 2)
	if _, _, why := l.acquire("d", time.Minute); why != unauthFull {
		t.Fatalf("past the total queue: %s", why)
	}
	relB()
	relC := <-gotC
	if relC == nil {
		t.Fatal("c got no slot when b's freed")
	}
	l.mu.Lock()
	left := len(l.queue) == 1 && l.queue[0].src == "a" && !l.queue[0].granted
	l.mu.Unlock()
	if !left {
		t.Fatal("a's waiter got a slot of another source while a is at its cap")
	}
	relA()
	if why := <-got; why != "" {
		t.Fatalf("a's waiter: %s", why)
	}
	// Closing: a waiter is woken with no slot, and newcomers get none.
	go func() { _, _, why := l.acquire("e", time.Minute); got <- why }()
	waitQueued(t, l, 1)
	l.close()
	if why := <-got; why != unauthClosed {
		t.Fatalf("a waiter at close: %s", why)
	}
	if _, _, why := l.acquire("f", time.Minute); why != unauthClosed {
		t.Fatalf("after close: %s", why)
	}
}

func waitQueued(t *testing.T, l *unauthLimiter, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		q := len(l.queue)
		l.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiting, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}
