package api

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/store"
)

// Short limits for the tests: the server's are DefaultHeaderTimeout,
// DefaultIdleTimeout and DefaultBodyTimeout.
const (
	testHeader = 300 * time.Millisecond
	testIdle   = 300 * time.Millisecond
	testBody   = 300 * time.Millisecond
	// cutWithin is how long a test waits for a connection to be cut
	// before it calls it held: a bound on a hang, not a speed claim.
	cutWithin = 10 * time.Second
)

// serveLoopback serves h on a loopback listener as shard serve does (its
// header and idle timeouts, the per-client cap), and returns its address.
func serveLoopback(t *testing.T, h http.Handler, maxConns int) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: testHeader, IdleTimeout: testIdle}
	go srv.Serve(LimitListener(l, maxConns, slog.New(slog.DiscardHandler), nil))
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// heldFor reads c until the server closes it (or cutWithin passes) and
// says how long that took and whether it was closed.
func heldFor(t *testing.T, c net.Conn, from time.Time) (time.Duration, bool) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(cutWithin))
	_, err := io.Copy(io.Discard, c)
	held := time.Since(from)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return held, false
	}
	return held, true
}

// A client that sends its headers a byte at a time (slowloris) is cut at
// the header timeout, however it trickles.
func TestSlowHeadersCut(t *testing.T) {
	s, _ := testServer(t)
	addr := serveLoopback(t, s.Handler(), 0)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		for _, b := range []byte("GET /v0/version HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 1000)) {
			if _, err := c.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	held, cut := heldFor(t, c, start)
	if !cut {
		t.Fatalf("a slowloris was held %s and not cut (header timeout %s)", held, testHeader)
	}
	t.Logf("slowloris cut after %s (header timeout %s)", held, testHeader)
	<-closed
}

// A keep-alive connection left idle after a request is closed at the idle
// timeout.
func TestIdleConnCut(t *testing.T) {
	s, _ := testServer(t)
	addr := serveLoopback(t, s.Handler(), 0)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "GET /v0/version HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		t.Fatalf("GET /v0/version = %d (close %v), want 200 kept alive", resp.StatusCode, resp.Close)
	}
	idleFrom := time.Now()
	c.SetReadDeadline(time.Now().Add(cutWithin))
	_, err = br.ReadByte()
	held := time.Since(idleFrom)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("an idle keep-alive connection was held %s and not closed (idle timeout %s)", held, testIdle)
	}
	t.Logf("idle keep-alive closed after %s (idle timeout %s)", held, testIdle)
}

// postSlow sends a POST whose body comes as chunks, pause apart, and
// returns the response's status and body.
func postSlow(t *testing.T, addr, path string, declared int, chunks []string, pause time.Duration) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, declared)
	go func() {
		for _, ch := range chunks {
			time.Sleep(pause)
			if _, err := io.WriteString(c, ch); err != nil {
				return
			}
		}
	}()
	c.SetReadDeadline(time.Now().Add(cutWithin))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("POST %s: no response: %v", path, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A request body that stops coming is cut with a 400 saying so, as is one
// that trickles (a byte at a time: it moves, but slower than MinBodyRate);
// a body that comes in pauses shorter than the timeout, at a fair rate, is
// read whole.
func TestStalledBodyCut(t *testing.T) {
	s, _ := testServer(t)
	s.BodyTimeout = testBody
	h := admin2(s.Handler())
	addr := serveLoopback(t, h, 0)

	t.Run("stalled", func(t *testing.T) {
		start := time.Now()
		code, body := postSlow(t, addr, "/v0/sandboxes", 100, []string{`{"name":`}, 0)
		if code != 400 || !strings.Contains(body, "stalled") {
			t.Fatalf("stalled body = %d %s, want 400 saying it stalled", code, body)
		}
		t.Logf("stalled body cut after %s (body timeout %s)", time.Since(start), testBody)
	})
	t.Run("trickle", func(t *testing.T) {
		var chunks []string
		for range 200 {
			chunks = append(chunks, " ")
		}
		code, body := postSlow(t, addr, "/v0/sandboxes", 200, chunks, 20*time.Millisecond)
		if code != 400 || !strings.Contains(body, "stalled") {
			t.Fatalf("trickled body = %d %s, want 400 saying it stalled", code, body)
		}
	})
	t.Run("moving", func(t *testing.T) {
		// 16 pieces of 4KiB, 100ms apart: 1.6s in all, past the timeout,
		// never pausing as long as it.
		var chunks []string
		body := `{"name":"x!"}` + strings.Repeat(" ", 16*4096-13)
		for i := 0; i < len(body); i += 4096 {
			chunks = append(chunks, body[i:i+4096])
		}
		code, got := postSlow(t, addr, "/v0/sandboxes", len(body), chunks, testBody/3)
		// Read whole, the body is judged: the name is refused.
		if code != 400 || strings.Contains(got, "stalled") || !strings.Contains(got, "x!") {
			t.Fatalf("moving body = %d %s, want the name refused (the body read whole)", code, got)
		}
	})
}

// admin2 serves h as the administrator (as the Unix socket is).
func admin2(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, admin(r)) })
}

// A response that streams for longer than every timeout, after a body was
// read, is not cut while it moves.
func TestMovingStreamNotCut(t *testing.T) {
	h := bodyDeadline(testBody, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		rc := http.NewResponseController(w)
		for i := range 20 { // 2s: past the body, header and idle timeouts
			fmt.Fprintf(w, "line %d\n", i)
			rc.Flush()
			time.Sleep(100 * time.Millisecond)
		}
		fmt.Fprintln(w, "end")
	}))
	addr := serveLoopback(t, h, 0)
	resp, err := http.Post("http://"+addr+"/", "text/plain", strings.NewReader("some body"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || !bytes.HasSuffix(b, []byte("end\n")) {
		t.Fatalf("stream = %q, %v: want it whole, to its end", b, err)
	}
}

// The connection past the bound from one address gets a 429 and is
// closed; once one closes, a new one is taken.
func TestClientConnCap(t *testing.T) {
	s, _ := testServer(t)
	addr := serveLoopback(t, s.Handler(), 2)
	get := func(c net.Conn) (*http.Response, error) {
		fmt.Fprint(c, "GET /v0/version HTTP/1.1\r\nHost: x\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(cutWithin))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
		}
		return resp, err
	}
	var conns []net.Conn
	for i := range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
		resp, err := get(c)
		switch {
		case i < 2 && (err != nil || resp.StatusCode != 200):
			t.Fatalf("connection %d: %v %v, want 200", i+1, resp, err)
		case i == 2 && (err != nil || resp.StatusCode != 429):
			t.Fatalf("connection 3 of a cap of 2: %v %v, want a 429", resp, err)
		}
	}
	if _, cut := heldFor(t, conns[2], time.Now()); !cut {
		t.Fatal("the refused connection was not closed")
	}
	conns[0].Close()
	// The server sees the close a moment later: try until it has.
	deadline := time.Now().Add(cutWithin)
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := get(c)
		c.Close()
		if err == nil && resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a close, a new connection still got %v %v", resp, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Failed API keys from one address are 429 past AuthBurst (with a
// Retry-After), logged once with their count and never the key; a valid
// key from another address is not slowed.
func TestFailedKeysLimited(t *testing.T) {
	ctx := project.Unscoped(context.Background(), "a test: tokens are made as createToken makes them")
	db, err := store.Open(ctx, filepath.Join(t.TempDir(), "shard.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tokens := &auth.Tokens{Store: db}
	_, key, err := tokens.Create(ctx, "ok", []string{auth.SandboxRead}, "default")
	if err != nil {
		t.Fatal(err)
	}
	var logBuf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logBuf, nil))
	now := time.Now() // a stopped clock: no refill while the test runs
	s := &Server{Tokens: tokens, Log: log, authFails: newAuthLimiterAt(log, func() time.Time { return now })}
	h := s.Handler()
	do := func(from, key string) *http.Response {
		r, _ := http.NewRequest(http.MethodGet, "/v0/tokens", nil)
		r.RemoteAddr = from + ":1234"
		r.Header.Set("Authorization", "Bearer "+key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Result()
	}
	const wrong = "shard_wrongwrongwrong_secretsecret"
	codes := map[int]int{}
	var last *http.Response
	for range 2000 {
		last = do("192.0.2.1", wrong)
		codes[last.StatusCode]++
	}
	if codes[401] != AuthBurst || codes[429] != 2000-AuthBurst {
		t.Errorf("2000 wrong keys from one address: %v, want %d 401 then 429s", codes, AuthBurst)
	}
	if ra := last.Header.Get("Retry-After"); ra == "" || ra == "0" {
		t.Errorf("429 Retry-After = %q, want whole seconds", ra)
	}
	// The right key gets through from the limited address too (clients
	// behind one NAT share it), and from another address.
	if got := do("192.0.2.1", key).StatusCode; got != 403 {
		t.Errorf("a valid key (sandbox:read) from the limited address = %d, want 403 (known, not allowed)", got)
	}
	// sandbox:read may not list tokens: a 403 says the key was taken.
	if got := do("192.0.2.2", key).StatusCode; got != 403 {
		t.Errorf("a valid key (sandbox:read) from another address = %d, want 403 (known, not allowed)", got)
	}
	logged := logBuf.String()
	if n := strings.Count(logged, "failed API keys"); n != 1 {
		t.Errorf("log has %d lines of failed keys, want 1 (one per client per minute):\n%s", n, logged)
	}
	if !strings.Contains(logged, "client=192.0.2.1") || strings.Contains(logged, "wrongwrong") {
		t.Errorf("log = %q: want the client, never the key", logged)
	}
	// A minute on, the next attempt logs the count of the ones between.
	now = now.Add(time.Minute)
	logBuf.Reset()
	do("192.0.2.1", wrong)
	if !strings.Contains(logBuf.String(), "count=2000") {
		t.Errorf("a minute later the log says %q, want count=2000 (the failed attempts since its last line)", logBuf.String())
	}
}

// A burst that stops is logged at the end of its window, not only when
// the next event comes (which may be never).
func TestWindowLogFlushesABurst(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	w := newWindowLog(slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &buf}, nil)), 100*time.Millisecond)
	for range 5 {
		w.note("192.0.2.9", "failed API keys")
	}
	text := func() string { mu.Lock(); defer mu.Unlock(); return buf.String() }
	if n := strings.Count(text(), "count=1 "); n != 1 {
		t.Fatalf("after a burst of 5: %q, want the first line only", text())
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(text(), "count=4 ") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(text(), "count=4 ") {
		t.Errorf("the burst's rest was never logged: %q, want a line with count=4 when its window ended", text())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// No log line carries more than a bounded part of what a request gives:
// 200 proxied requests with a 500KB path each added 95MiB of log (a 502
// logged the whole path, and its error quoted it again).
func TestLogLinesBounded(t *testing.T) {
	long := strings.Repeat("p", 500<<10)
	var logBuf bytes.Buffer
	s := &Server{Log: slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	h := admin2(s.Handler())
	tests := []struct {
		name string
		do   func()
		want string // in the log
	}{
		{"a 502 of the ports proxy", func() {
			r := httptest.NewRequest(http.MethodGet, "/v0/sandboxes/x/ports/80/"+long, nil)
			s.writeError(httptest.NewRecorder(), r, fmt.Errorf("nothing answers on port 80: GET /%s: %w", long, io.ErrUnexpectedEOF))
		}, "request failed"},
		{"a panic in a handler, and the request's line", func() {
			// No sandbox service: the handler panics.
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/v0/sandboxes/"+long, nil))
		}, "panic in handler"},
		{"an unknown endpoint's request line", func() {
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/v0/"+long, nil))
		}, "request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logBuf.Reset()
			tt.do()
			got := logBuf.String()
			if !strings.Contains(got, tt.want) || !strings.Contains(got, "bytes]") {
				t.Errorf("log %.300q: want %q with the path cut and marked", got, tt.want)
			}
			if len(got) > 8<<10 {
				t.Errorf("log of one request is %d bytes, want at most 8KiB", len(got))
			}
		})
	}
}

// Only the client's time counts against a body: a handler that pauses
// between reads (an import unpacking as it reads, a proxied app that reads
// slowly) does not get its client cut, though the body then comes slower
// than MinBodyRate.
func TestSlowReaderNotCut(t *testing.T) {
	h := bodyDeadline(testBody, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first := make([]byte, 512)
		if _, err := io.ReadFull(r.Body, first); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		time.Sleep(3 * testBody) // the rest waits in the socket meanwhile
		rest, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		fmt.Fprintf(w, "read %d", len(first)+len(rest))
	}))
	addr := serveLoopback(t, h, 0)
	code, body := postSlow(t, addr, "/", 1024, []string{strings.Repeat("x", 512), strings.Repeat("y", 512)}, 50*time.Millisecond)
	if code != 200 || body != "read 1024" {
		t.Fatalf("a slow handler's read = %d %s, want all 1024 bytes read", code, body)
	}
}
