package buildslot

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSlotsBoundTheBuildsAndComeBack(t *testing.T) {
	p := NewPool(1)
	waited := 0
	a, b := p.Slot(nil), p.Slot(func() { waited++ })
	if err := a.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := a.Acquire(context.Background()); err != nil {
		t.Fatalf("acquiring a held slot again: %v", err)
	}
	// The pool is full: b waits, says so once, and gives up with its context.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := b.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) || waited != 1 {
		t.Fatalf("b.Acquire on a full pool = %v after %d waits; want the deadline after 1", err, waited)
	}
	b.Release() // holds none: nothing happens
	// a gives its slot back (twice is once): b gets it without waiting.
	a.Release()
	a.Release()
	if err := b.Acquire(context.Background()); err != nil || waited != 1 {
		t.Fatalf("b.Acquire on a free pool = %v after %d waits; want at once", err, waited)
	}
	// a waits for b, and gets the slot when b gives it back.
	got := make(chan error, 1)
	go func() { got <- a.Acquire(context.Background()) }()
	select {
	case err := <-got:
		t.Fatalf("a took a slot b holds: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	b.Release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if p.Size() != 1 {
		t.Fatalf("Size = %d", p.Size())
	}
}
