package pipeline

import (
	"context"
	"sync"
)

// appLocks serialises pushes per app. A lock is a channel of one slot, so waiting
// can be bounded by a context; it lives in memory, so a crashed server holds none.
type appLocks struct {
	mu    sync.Mutex
	locks map[string]*appLock
}

type appLock struct {
	slot  chan struct{}
	owner string // what holds it, for the message of who waits
	users int    // holders and waiters; the entry goes when it drops to 0
}

// acquire takes app's lock, calling waiting once with the holder's description if it
// has to wait. It returns a release func, or ctx's error.
func (l *appLocks) acquire(ctx context.Context, app, owner string, waiting func(holder string)) (func(), error) {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[string]*appLock{}
	}
	lk := l.locks[app]
	if lk == nil {
		lk = &appLock{slot: make(chan struct{}, 1)}
		l.locks[app] = lk
	}
	lk.users++
	holder := lk.owner
	l.mu.Unlock()

	done := func() {
		l.mu.Lock()
		lk.users--
		if lk.users == 0 {
			delete(l.locks, app)
		}
		l.mu.Unlock()
	}
	select {
	case lk.slot <- struct{}{}:
	default:
		if waiting != nil {
			waiting(holder)
		}
		select {
		case lk.slot <- struct{}{}:
		case <-ctx.Done():
			done()
			return nil, ctx.Err()
		}
	}
	l.mu.Lock()
	lk.owner = owner
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			lk.owner = ""
			l.mu.Unlock()
			<-lk.slot
			done()
		})
	}, nil
}

// describe updates what holds app's lock, for the message that waiting pushes print.
func (l *appLocks) describe(app, owner string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if lk := l.locks[app]; lk != nil {
		lk.owner = owner
	}
}
