package sourcelimit

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Config is how many failures a source may make.
type Config struct {
	// PerMinute is how many failed attempts a minute a source may make, once
	// its burst is spent.
	PerMinute float64
	// Burst is how many failed attempts in a row a fresh source may make.
	Burst int
	// MaxSources bounds the sources remembered; past it, those with nothing
	// held against them are forgotten first, then the least recently seen.
	MaxSources int
}

// DefaultConfig is 10 failures a minute after a burst of 10, for up to 10000
// sources.
func DefaultConfig() Config { return Config{PerMinute: 10, Burst: 10, MaxSources: 10000} }

// Validate reports every problem of c at once, naming each field under prefix.
func (c Config) Validate(prefix string) error {
	var errs []error
	if !(c.PerMinute > 0) || math.IsInf(c.PerMinute, 0) {
		errs = append(errs, fmt.Errorf("%s.PerMinute %v must be positive", prefix, c.PerMinute))
	}
	if c.Burst < 1 {
		errs = append(errs, fmt.Errorf("%s.Burst %d must be at least 1", prefix, c.Burst))
	}
	if c.MaxSources < 1 {
		errs = append(errs, fmt.Errorf("%s.MaxSources %d must be at least 1", prefix, c.MaxSources))
	}
	return errors.Join(errs...)
}

// Limiter keeps a bucket per source. It is safe for concurrent use.
type Limiter struct {
	cfg Config
	// Now is the clock; nil: time.Now.
	Now func() time.Time

	mu      sync.Mutex
	sources map[string]*entry
}

// entry is a source's bucket: tokens (at most Burst) as of last, refilling at
// PerMinute. A token bucket of its own rather than a rate.Limiter: an attempt
// is taken when it starts and given back when it succeeds, possibly long
// after, which a rate.Reservation cannot undo once its time has come.
type entry struct {
	tokens float64
	last   time.Time
	seen   time.Time
}

// refill brings e's tokens up to now.
func (l *Limiter) refill(e *entry, now time.Time) {
	if now.After(e.last) {
		e.tokens = math.Min(float64(l.cfg.Burst), e.tokens+now.Sub(e.last).Minutes()*l.cfg.PerMinute)
		e.last = now
	}
}

// New returns a limiter; cfg must be valid.
func New(cfg Config) (*Limiter, error) {
	if err := cfg.Validate("sourcelimit.Config"); err != nil {
		return nil, err
	}
	return &Limiter{cfg: cfg, sources: map[string]*entry{}}, nil
}

func (l *Limiter) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

// Source is the source that remoteAddr (host:port, or a bare address) counts
// as: the IPv4 address, or the /64 of an IPv6 one. Anything else counts as
// itself.
func Source(remoteAddr string) string {
	host := remoteAddr
	if h, _, err := net.SplitHostPort(remoteAddr); err == nil {
		host = h
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// Attempt is one attempt let through: Failed keeps it counted, Succeeded gives
// it back. The first of the two to be called counts.
type Attempt struct {
	l    *Limiter
	e    *entry
	once sync.Once
}

// Failed keeps the attempt against its source.
func (a *Attempt) Failed() { a.once.Do(func() {}) }

// Succeeded gives the attempt back: successes cost a source nothing.
func (a *Attempt) Succeeded() {
	a.once.Do(func() {
		a.l.mu.Lock()
		defer a.l.mu.Unlock()
		a.l.refill(a.e, a.l.now())
		a.e.tokens = math.Min(float64(a.l.cfg.Burst), a.e.tokens+1)
	})
}

// Begin lets an attempt of source through, counted against it until Succeeded
// says otherwise; or, when source has no failure left, returns nil and how long
// until it has one.
func (l *Limiter) Begin(source string) (*Attempt, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	e := l.sources[source]
	if e == nil {
		if len(l.sources) >= l.cfg.MaxSources {
			l.evict(now)
		}
		e = &entry{tokens: float64(l.cfg.Burst), last: now}
		l.sources[source] = e
	}
	e.seen = now
	l.refill(e, now)
	if e.tokens < 1 {
		return nil, time.Duration((1 - e.tokens) / l.cfg.PerMinute * float64(time.Minute))
	}
	e.tokens--
	return &Attempt{l: l, e: e}, 0
}

// evict makes room for one source: it forgets every source whose bucket is
// full (nothing held against it), or, when none is, the least recently seen.
func (l *Limiter) evict(now time.Time) {
	var oldest string
	var oldestSeen time.Time
	removed := false
	for k, e := range l.sources {
		if l.refill(e, now); e.tokens >= float64(l.cfg.Burst) {
			delete(l.sources, k)
			removed = true
			continue
		}
		if oldest == "" || e.seen.Before(oldestSeen) {
			oldest, oldestSeen = k, e.seen
		}
	}
	if !removed && oldest != "" {
		delete(l.sources, oldest)
	}
}

// Len is how many sources are remembered.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.sources)
}

// RetryAfter is d in whole seconds, rounded up, at least 1: the value of a
// Retry-After header.
func RetryAfter(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}
