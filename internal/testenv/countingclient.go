package testenv

import (
	"context"
	"sync/atomic"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CountingClient counts the reads (Get, List) that reach the API through it,
// for tests that prove a path makes none. Safe for concurrent use: servers under
// test read from their own goroutines.
type CountingClient struct {
	client.WithWatch
	reads atomic.Int64
}

// Reads is how many reads reached the API since the last Reset.
func (c *CountingClient) Reads() int { return int(c.reads.Load()) }

// Reset starts counting again from zero.
func (c *CountingClient) Reset() { c.reads.Store(0) }

func (c *CountingClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.reads.Add(1)
	return c.WithWatch.Get(ctx, key, obj, opts...)
}

func (c *CountingClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	c.reads.Add(1)
	return c.WithWatch.List(ctx, list, opts...)
}
