package api

import (
	"log/slog"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Failed API keys are limited per client address: a client may fail
// AuthBurst times at once, then once every AuthEvery; past that every
// failed key of its is a 429 (too_many_requests) instead of a 401, until it
// is back under. A valid key always gets through, from that address too: a
// NAT or a proxy puts many clients behind one address, and one of them
// sending wrong keys locked the others out. Each client's failures are
// logged at most once a minute, with their count, never the key; a burst
// that stops is logged when its minute ends.
const (
	// AuthBurst leaves room for a client's honest mistakes and for a test
	// that tries a bad key on every route (about 100); 2000 wrong keys at
	// 3000/s were all answered.
	AuthBurst = 200
	AuthEvery = 200 * time.Millisecond
)

type authLimiter struct {
	mu      sync.Mutex
	clients map[string]*rate.Limiter // guarded by mu
	now     func() time.Time
	warn    *windowLog
}

func newAuthLimiter(log *slog.Logger) *authLimiter {
	return newAuthLimiterAt(log, time.Now)
}

func newAuthLimiterAt(log *slog.Logger, now func() time.Time) *authLimiter {
	w := newWindowLog(log, time.Minute)
	w.now = now
	return &authLimiter{clients: map[string]*rate.Limiter{}, now: now, warn: w}
}

// wait reports how long client must wait before its key is checked again:
// 0 if it is under the limit. A key refused unchecked counts in the log as
// a failed one.
func (a *authLimiter) wait(client string) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	l := a.clients[client]
	if l == nil {
		return 0
	}
	now := a.now()
	if l.TokensAt(now) >= 1 {
		return 0
	}
	r := l.ReserveN(now, 1)
	d := r.DelayFrom(now)
	r.CancelAt(now)
	a.warn.note(client, "failed API keys")
	return d
}

// failed counts a failed key of client.
func (a *authLimiter) failed(client string) {
	a.mu.Lock()
	now := a.now()
	if len(a.clients) > 10000 { // forget the clients back at full burst
		for k, l := range a.clients {
			if l.TokensAt(now) >= AuthBurst {
				delete(a.clients, k)
			}
		}
	}
	l := a.clients[client]
	if l == nil {
		l = rate.NewLimiter(rate.Every(AuthEvery), AuthBurst)
		a.clients[client] = l
	}
	l.AllowN(now, 1)
	a.mu.Unlock()
	a.warn.note(client, "failed API keys")
}

// retryAfter is d in whole seconds, at least 1, for a Retry-After header.
func retryAfter(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}
