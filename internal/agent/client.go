package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Client talks to one sandbox's agent from the host.
type Client struct {
	Addr  string // ip:port of the agent
	Token string
}

// ErrStart is returned by Exec when the command could not start; it carries
// the agent's code (command_not_found, invalid_argument, ...).
type ErrStart struct{ Info ErrorInfo }

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

func (c *Client) send(conn net.Conn, req Request) error {
	req.Token = c.Token
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	return WriteFrame(conn, FrameRequest, b)
}

// Call runs a non-exec op (ping, sync, stats).
func (c *Client) Call(ctx context.Context, op string) (*Reply, error) {
	return c.Do(ctx, Request{Op: op})
}

// Do runs a non-exec op with its request fields (grant_file, ungrant_file).
func (c *Client) Do(ctx context.Context, req Request) (*Reply, error) {
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
	typ, p, err := ReadFrame(conn)
	if err != nil {
		return nil, err
	}
	if typ != FrameReply {
		return nil, fmt.Errorf("agent: unexpected frame %q", typ)
	}
	var r Reply
	if err := json.Unmarshal(p, &r); err != nil {
		return nil, err
	}
	if !r.OK {
		return &r, errors.New("agent: " + r.Error)
	}
	return &r, nil
}

// WaitReady pings the agent until it answers or ctx ends. It polls every
// 2 ms: a refused connection costs well under a millisecond, and every
// millisecond here is a millisecond of create time.
func (c *Client) WaitReady(ctx context.Context) error {
	const delay = 2 * time.Millisecond
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Call(pctx, OpPing)
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
	PID  int
	wmu  sync.Mutex
}

// Exec starts a command. It returns once the command started, or an
// *ErrStart if it could not.
func (c *Client) Exec(ctx context.Context, req Request) (*Session, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	req.Op = OpExec
	if err := c.send(conn, req); err != nil {
		conn.Close()
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Now()) })
	typ, p, err := ReadFrame(conn)
	stop()
	conn.SetReadDeadline(time.Time{})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("agent: %w", err)
	}
	switch typ {
	case FrameReply:
		conn.Close()
		var r Reply
		json.Unmarshal(p, &r)
		return nil, fmt.Errorf("agent refused: %s", r.Error)
	case FrameStarted:
		var st Started
		json.Unmarshal(p, &st)
		return &Session{conn: conn, PID: st.PID}, nil
	case FrameError:
		conn.Close()
		var ei ErrorInfo
		json.Unmarshal(p, &ei)
		return nil, &ErrStart{Info: ei}
	default:
		conn.Close()
		return nil, fmt.Errorf("agent: unexpected frame %q", typ)
	}
}

// Recv returns the next frame: FrameStdout, FrameStderr or FrameExit.
func (s *Session) Recv() (byte, []byte, error) { return ReadFrame(s.conn) }

func (s *Session) write(typ byte, p []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return WriteFrame(s.conn, typ, p)
}

// Stdin sends input; an empty p closes the command's stdin.
func (s *Session) Stdin(p []byte) error { return s.write(FrameStdin, p) }

// CloseStdin closes the command's stdin.
func (s *Session) CloseStdin() error { return s.write(FrameStdin, nil) }

// Resize changes the TTY size.
func (s *Session) Resize(rows, cols uint16) error {
	b, _ := json.Marshal(Resize{Rows: rows, Cols: cols})
	return s.write(FrameResize, b)
}

// Signal sends a signal to the command's process group.
func (s *Session) Signal(sig int) error {
	b, _ := json.Marshal(Signal{Signal: sig})
	return s.write(FrameSignal, b)
}

// Close drops the connection. The command keeps running.
func (s *Session) Close() error { return s.conn.Close() }
