package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/useshards/shard/client"
)

// Limits on what one client can hold of the server: a request body that
// stalls, connections from one address, failed API keys, and what a log
// line carries of a request.

// Defaults of the limits (the flags of shard serve).
const (
	DefaultHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout   = 60 * time.Second
	DefaultBodyTimeout   = 30 * time.Second
	// MinBodyRate is the slowest a request body may come, on average,
	// past its first BodyTimeout: a body trickling a byte every two
	// seconds always "moves", yet must not hold a connection for days.
	MinBodyRate = 1 << 10 // bytes per second
	// DefaultMaxClientConns bounds the TCP connections one client address
	// holds at once.
	DefaultMaxClientConns = 128
)

// errBodyStalled is what a read of a stalled request body returns.
type errBodyStalled struct{ idle time.Duration }

func (e errBodyStalled) Error() string {
	return fmt.Sprintf("the request body stalled: nothing came for %s, or it came slower than %d bytes/s", e.idle, MinBodyRate)
}

// bodyDeadline cuts a request body that stalls: before each read of the
// body the connection's read deadline is set idle from now, or sooner if
// the time the reads have waited for the client so far passes idle plus
// what it has sent at MinBodyRate. Only the client's time counts: a
// handler that reads slowly (an unpacking import, a proxied app that
// reads slowly) is not the client's fault. A body that moves is never
// cut; a response stream is not bounded by it (the deadline is lifted at
// the body's end).
func bodyDeadline(idle time.Duration, next http.Handler) http.Handler {
	if idle <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = &deadlineBody{ReadCloser: r.Body, rc: http.NewResponseController(w), idle: idle}
		}
		next.ServeHTTP(w, r)
	})
}

type deadlineBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	idle   time.Duration
	n      int64         // bytes read so far
	waited time.Duration // time spent in reads: waiting for the client
	ended  bool          // the body ended (or failed): the deadline is lifted
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	if b.ended {
		return b.ReadCloser.Read(p)
	}
	now := time.Now()
	wait := min(b.idle, b.idle+time.Duration(b.n/MinBodyRate)*time.Second-b.waited)
	if b.rc.SetReadDeadline(now.Add(wait)) != nil {
		// A writer without deadlines (a test recorder): nothing to cut.
		b.ended = true
	}
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	b.waited += time.Since(now)
	if err != nil {
		b.ended = true
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			// The deadline stays past: the server, which reads what is
			// left of a body before it answers, gives up at once and
			// closes the connection after the answer.
			err = errBodyStalled{b.idle}
		case err == io.EOF:
			b.rc.SetReadDeadline(time.Time{})
		}
	}
	return n, err
}

// lift ends the deadline for the rest of the body: a framed exec body's
// stdin may rightly be quiet for as long as its command runs (it ends with
// the command, as a WebSocket's messages do).
func (b *deadlineBody) lift() {
	b.ended = true
	b.rc.SetReadDeadline(time.Time{})
}

// MaxLogValue bounds what a log line carries of any one value a request
// gives (its path, its query, a header): a 500KB path must not be 500KB of
// log per request.
const MaxLogValue = 256

// logValue is s bounded to MaxLogValue bytes, with a marker saying how long
// it was when cut.
func logValue(s string) string {
	if len(s) <= MaxLogValue {
		return s
	}
	return fmt.Sprintf("%s...[%d bytes]", s[:MaxLogValue], len(s))
}

// logErr is an error's text for a log line, bounded like a request's
// values (an error may quote them).
func logErr(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if len(s) <= 4*MaxLogValue {
		return s
	}
	return fmt.Sprintf("%s...[%d bytes]", s[:4*MaxLogValue], len(s))
}

// clientAddr is the address a request came from: the IP of a TCP peer,
// "" for the Unix socket.
func clientAddr(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return ""
	}
	return host
}

// LimitListener bounds the connections one client address holds at once:
// the connection past max gets a 429 and is closed. max <= 0: no bound.
//
// exempt (nil: none) names addresses the limit does not apply to: the other
// nodes of a cluster, whose connections carry every user's calls sent on
// (one key's streams must not use up a node's budget for all).
func LimitListener(l net.Listener, max int, log *slog.Logger, exempt func(ip string) bool) net.Listener {
	if max <= 0 {
		return l
	}
	return &limitListener{Listener: l, max: max, open: map[string]int{}, warn: newWindowLog(log, time.Minute), exempt: exempt}
}

type limitListener struct {
	net.Listener
	max    int
	exempt func(ip string) bool
	mu     sync.Mutex
	open   map[string]int // client address → connections open; guarded by mu
	warn   *windowLog
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := clientAddr(c.RemoteAddr().String())
		if l.exempt != nil && l.exempt(ip) {
			return c, nil
		}
		l.mu.Lock()
		if l.open[ip] >= l.max {
			l.mu.Unlock()
			l.warn.note(ip, "connections refused: this client holds the most it may at once", "max", l.max)
			go refuseConn(c, l.max)
			continue
		}
		l.open[ip]++
		l.mu.Unlock()
		return &limitConn{Conn: c, release: func() { l.release(ip) }}, nil
	}
}

func (l *limitListener) release(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[ip]--; l.open[ip] <= 0 {
		delete(l.open, ip)
	}
}

// refuseConn answers a connection over the bound with a 429 and closes it.
func refuseConn(c net.Conn, max int) {
	defer c.Close()
	body, _ := json.Marshal(Error{Code: client.CodeTooManyConnections,
		Message: fmt.Sprintf("this client already holds %d connections to the server: close some, or reuse them", max)})
	c.SetWriteDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(c, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\nRetry-After: 1\r\n\r\n%s\n", len(body)+1, body)
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// windowLog logs a warning at most once per window for each client, with
// how many times it happened since the last line.
type windowLog struct {
	log    *slog.Logger
	window time.Duration
	now    func() time.Time
	mu     sync.Mutex
	seen   map[string]*windowCount // guarded by mu
}

type windowCount struct {
	last  time.Time   // of the last line
	n     int         // times since
	flush *time.Timer // writes the count when the window ends, if any
}

func newWindowLog(log *slog.Logger, window time.Duration) *windowLog {
	return &windowLog{log: log, window: window, now: time.Now, seen: map[string]*windowCount{}}
}

// note counts one event of client; a line goes out if the client's last
// one is a window old (or there was none).
func (w *windowLog) note(client, msg string, args ...any) {
	if w == nil || w.log == nil {
		return
	}
	w.mu.Lock()
	now := w.now()
	if len(w.seen) > 10000 { // forget the quiet ones
		for k, c := range w.seen {
			if now.Sub(c.last) >= w.window {
				delete(w.seen, k)
			}
		}
	}
	c := w.seen[client]
	if c == nil {
		c = &windowCount{}
		w.seen[client] = c
	}
	c.n++
	if !c.last.IsZero() && now.Sub(c.last) < w.window {
		// A burst that stops must be told too: when the window ends.
		if c.flush == nil {
			c.flush = time.AfterFunc(c.last.Add(w.window).Sub(now), func() { w.flushCount(client, msg, args) })
		}
		w.mu.Unlock()
		return
	}
	n := c.n
	c.last, c.n = now, 0
	w.mu.Unlock()
	w.log.Warn(msg, append([]any{"client", client, "count", n, "window", w.window}, args...)...)
}

// flushCount writes the count of client's events since its last line, if
// there were any, at the end of a window.
func (w *windowLog) flushCount(client, msg string, args []any) {
	w.mu.Lock()
	c := w.seen[client]
	if c == nil {
		w.mu.Unlock()
		return
	}
	c.flush = nil
	n := c.n
	if n == 0 {
		w.mu.Unlock()
		return
	}
	c.last, c.n = w.now(), 0
	w.mu.Unlock()
	w.log.Warn(msg, append([]any{"client", client, "count", n, "window", w.window}, args...)...)
}
