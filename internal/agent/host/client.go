// Package host is the server's client of a sandbox's agent
// (internal/agent/guest): one connection per op or per exec, in the
// protocol of internal/agent/proto.
package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/useshards/shard/internal/agent/proto"
	"github.com/useshards/shard/internal/framing"
)

// Client talks to one sandbox's agent from the host.
type Client struct {
	Addr  string // ip:port of the agent
	Token string
}

// ErrStart is returned by Exec when the command could not start; it carries
// the agent's code (command_not_found, invalid_argument, ...).
type ErrStart struct{ Info proto.ErrorInfo }

func (e *ErrStart) Error() string { return e.Info.Message }

func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", c.Addr)
	if err != nil {
		return nil, err
	}
	conn.(*net.TCPConn).SetNoDelay(true)
	return conn, nil
}

func (c *Client) send(conn net.Conn, req proto.Request) error {
	req.Token = c.Token
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	return framing.Write(conn, proto.FrameRequest, b)
}

// Call runs a non-exec op (ping, sync, stats).
func (c *Client) Call(ctx context.Context, op string) (*proto.Reply, error) {
	return c.Do(ctx, proto.Request{Op: op})
}

// Do runs a non-exec op with its request fields (grant_file, ungrant_file).
func (c *Client) Do(ctx context.Context, req proto.Request) (*proto.Reply, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if err := c.send(conn, req); err != nil {
		return nil, err
	}
	typ, p, err := framing.Read(conn)
	if err != nil {
		return nil, err
	}
	if typ != proto.FrameReply {
		return nil, fmt.Errorf("agent: unexpected frame %q", typ)
	}
	var r proto.Reply
	if err := json.Unmarshal(p, &r); err != nil {
		return nil, err
	}
	if !r.OK {
		if unknownOp(req.Op, &r) {
			return &r, fmt.Errorf("agent: %s: %w", r.Error, ErrUnsupported)
		}
		return &r, errors.New("agent: " + r.Error)
	}
	return &r, nil
}

// ErrUnsupported is what Do returns (wrapped) when the agent refused the op
// as one it does not have: it is older than the op.
var ErrUnsupported = errors.New("the agent is older than this op")

// unknownOp reports whether r refuses op as one the agent does not have.
// An agent says so in UnknownOp; one from before UnknownOp (and caps) said
// so only in these words, which are read for it alone: a newer agent always
// sets the field.
func unknownOp(op string, r *proto.Reply) bool {
	return r.UnknownOp || r.Error == "unknown op "+op
}

// Caps asks the agent what it can do (a ping). An agent from before caps
// lists none: it is taken to have proto.LegacyCaps.
func (c *Client) Caps(ctx context.Context) (proto.Caps, error) {
	r, err := c.Call(ctx, proto.OpPing)
	if err != nil {
		return nil, err
	}
	if len(r.Caps) == 0 {
		return slices.Clone(proto.LegacyCaps), nil
	}
	return r.Caps, nil
}

// WaitReady pings the agent until it answers or ctx ends. It polls every
// 2 ms: a refused connection costs well under a millisecond, and every
// millisecond here is a millisecond of create time.
func (c *Client) WaitReady(ctx context.Context) error {
	const delay = 2 * time.Millisecond
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Call(pctx, proto.OpPing)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent at %s did not answer: %w", c.Addr, err)
		case <-time.After(delay):
		}
	}
}

// Session is a running exec. Recv returns its output frames in order and
// finally a FrameExit; the methods that send are safe for concurrent use.
type Session struct {
	conn net.Conn
	rd   io.Reader // conn, waking once per frame (see lowatReader)
	PID  int
	Caps proto.Caps // what the agent can do beyond the first protocol (Started.Caps)
	wmu  sync.Mutex

	smu     sync.Mutex
	scond   *sync.Cond // on smu: window or stopped changed
	credit  bool       // the agent grants stdin window (CapStdinCredit)
	window  int        // with credit: stdin bytes that may be sent now
	stopped bool       // Close: Stdin gives up

	received atomic.Int64 // stdout and stderr bytes received
}

// stdinChunk is the most stdin one frame carries to an agent that grants
// no window: an older agent queues up to 1024 frames, so small frames bound
// what it holds (32 MiB). With a window, a frame is up to the window.
const stdinChunk = 32 << 10

// creditChunk is the most stdin one frame carries within a window: fewer,
// larger writes into the command's pipe (each a trip through gVisor's
// Sentry), and still two frames to a window, so one is on its way while
// the other is written.
const creditChunk = 128 << 10

// ErrSessionClosed is what Stdin returns once the session is closed.
var ErrSessionClosed = errors.New("agent: the exec session is closed")

// Exec starts a command. It returns once the command started, or an
// *ErrStart if it could not.
func (c *Client) Exec(ctx context.Context, req proto.Request) (*Session, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	req.Op = proto.OpExec
	if err := c.send(conn, req); err != nil {
		conn.Close()
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Now()) })
	typ, p, err := framing.Read(conn)
	stop()
	conn.SetReadDeadline(time.Time{})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("agent: %w", err)
	}
	switch typ {
	case proto.FrameReply:
		conn.Close()
		var r proto.Reply
		json.Unmarshal(p, &r)
		return nil, fmt.Errorf("agent refused: %s", r.Error)
	case proto.FrameStarted:
		var st proto.Started
		json.Unmarshal(p, &st)
		s := &Session{conn: conn, rd: newLowatReader(conn), PID: st.PID, Caps: st.Caps}
		s.scond = sync.NewCond(&s.smu)
		if s.Has(proto.CapStdinCredit) && st.StdinWindow > 0 {
			s.credit, s.window = true, st.StdinWindow
		}
		return s, nil
	case proto.FrameError:
		conn.Close()
		var ei proto.ErrorInfo
		json.Unmarshal(p, &ei)
		return nil, &ErrStart{Info: ei}
	default:
		conn.Close()
		return nil, fmt.Errorf("agent: unexpected frame %q", typ)
	}
}

// Has reports whether the agent said it can do capability c.
func (s *Session) Has(c string) bool { return s.Caps.Has(c) }

// Recv returns the next frame: FrameStdout, FrameStderr or FrameExit.
// Stdin credit is taken here, never returned: a session's stdin moves only
// while someone receives.
func (s *Session) Recv() (byte, []byte, error) { return s.RecvInto(nil) }

// RecvInto is Recv reading a frame's payload into buf when it fits.
func (s *Session) RecvInto(buf []byte) (byte, []byte, error) {
	for {
		typ, p, err := framing.ReadInto(s.rd, proto.MaxFrame, buf)
		if err != nil {
			return typ, p, err
		}
		switch typ {
		case proto.FrameCredit:
			var c proto.Credit
			if json.Unmarshal(p, &c) == nil && c.Bytes > 0 {
				s.smu.Lock()
				s.window += c.Bytes
				s.scond.Broadcast()
				s.smu.Unlock()
			}
			continue
		case proto.FrameStdout, proto.FrameStderr:
			s.received.Add(int64(len(p)))
		}
		return typ, p, nil
	}
}

// Window is how much stdin may be sent now without waiting for credit, and
// whether the agent grants a window at all (CapStdinCredit).
func (s *Session) Window() (n int, credit bool) {
	s.smu.Lock()
	defer s.smu.Unlock()
	return s.window, s.credit
}

// Received is how many output bytes (stdout and stderr) came from the
// agent so far.
func (s *Session) Received() int64 { return s.received.Load() }

func (s *Session) write(typ byte, p []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return framing.Write(s.conn, typ, p)
}

// Stdin sends input; an empty p closes the command's stdin. It sends frames
// of at most 32 KiB and, with an agent that grants stdin window, waits for
// window: a command that does not read its stdin holds up the caller. It
// gives up with ErrSessionClosed when the session is closed.
func (s *Session) Stdin(p []byte) error {
	if len(p) == 0 {
		return s.CloseStdin()
	}
	for len(p) > 0 {
		n := min(len(p), stdinChunk)
		if s.credit {
			n = min(len(p), creditChunk)
		}
		s.smu.Lock()
		for s.credit && s.window == 0 && !s.stopped {
			s.scond.Wait()
		}
		if s.stopped {
			s.smu.Unlock()
			return ErrSessionClosed
		}
		if s.credit {
			n = min(n, s.window)
			s.window -= n
		}
		s.smu.Unlock()
		if err := s.write(proto.FrameStdin, p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// CloseStdin closes the command's stdin.
func (s *Session) CloseStdin() error { return s.write(proto.FrameStdin, nil) }

// Resize changes the TTY size.
func (s *Session) Resize(rows, cols uint16) error {
	b, _ := json.Marshal(proto.Resize{Rows: rows, Cols: cols})
	return s.write(proto.FrameResize, b)
}

// Signal sends a signal to the command's process group.
func (s *Session) Signal(sig int) error {
	b, _ := json.Marshal(proto.Signal{Signal: sig})
	return s.write(proto.FrameSignal, b)
}

// Detach tells the agent nobody reads this exec's output any more: it
// drops the output inside the sandbox, and only the exit frame still comes.
// It reports false when the agent cannot (an older one): its output keeps
// coming, for the caller to drop. Stdin, signals and the exit are as before.
func (s *Session) Detach() bool {
	if !s.Has(proto.CapDetach) {
		return false
	}
	// With stdin window nothing holds the agent's direction up for long;
	// an older agent's may be held by stdin it does not read, so never
	// make the caller wait for it.
	go s.write(proto.FrameDetach, nil)
	return true
}

// SetDeadline bounds the session's reads and writes (zero: no bound), so a
// caller is never held for ever by an agent that stopped answering.
func (s *Session) SetDeadline(t time.Time) error { return s.conn.SetDeadline(t) }

// CloseWrite half-closes the connection after the exit frame: the agent
// waits for the client to close first (see guest's awaitClose), then
// closes, and Recv returns io.EOF. Before the exit it would tell the agent
// the client is gone.
func (s *Session) CloseWrite() error {
	if tc, ok := s.conn.(*net.TCPConn); ok {
		return tc.CloseWrite()
	}
	return s.conn.Close()
}

// Close drops the connection. The command keeps running.
func (s *Session) Close() error {
	s.smu.Lock()
	s.stopped = true
	s.scond.Broadcast()
	s.smu.Unlock()
	return s.conn.Close()
}
