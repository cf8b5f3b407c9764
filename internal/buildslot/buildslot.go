package buildslot

import "context"

// Pool is a number of build slots.
type Pool struct{ slots chan struct{} }

// NewPool returns a pool of n slots (n > 0).
func NewPool(n int) *Pool { return &Pool{slots: make(chan struct{}, n)} }

// Size is how many slots the pool has.
func (p *Pool) Size() int { return cap(p.slots) }

// Slot returns a build's slot in p, not yet held. waiting is called once
// each time Acquire must wait, before it waits, so that the build can say so.
func (p *Pool) Slot(waiting func()) *Slot { return &Slot{pool: p, waiting: waiting} }

// Slot is one build's hold on a slot of its pool. It is not safe for
// concurrent use: one build holds it.
type Slot struct {
	pool    *Pool
	waiting func()
	held    bool
}

// Acquire takes a slot, waiting while all are held, until ctx ends (then it
// returns ctx's error and holds none). Holding one already, it returns at once.
func (s *Slot) Acquire(ctx context.Context) error {
	if s.held {
		return nil
	}
	select {
	case s.pool.slots <- struct{}{}:
	default:
		if s.waiting != nil {
			s.waiting()
		}
		select {
		case s.pool.slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.held = true
	return nil
}

// Release gives the slot back; without one held it does nothing, so that a
// deferred Release is safe after an early one.
func (s *Slot) Release() {
	if s.held {
		<-s.pool.slots
		s.held = false
	}
}
