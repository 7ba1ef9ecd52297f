package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
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
	Caps []string // what the agent can do beyond the first protocol (Started.Caps)
	wmu  sync.Mutex

	smu     sync.Mutex
	scond   *sync.Cond // on smu: window or stopped changed
	credit  bool       // the agent grants stdin window (CapStdinCredit)
	window  int        // with credit: stdin bytes that may be sent now
	stopped bool       // Close: Stdin gives up

	received atomic.Int64 // stdout and stderr bytes received

	// With direct IO (CapDirectIO): output is read from the FIFOs and
	// merged with the connection's frames into merged.
	io       *HostIO
	merged   chan hostFrame
	quit     chan struct{} // closed by Close: the merging goroutines give up
	quitOnce sync.Once
	ioOnce   sync.Once
}

type hostFrame struct {
	typ byte
	p   []byte
	err error
}

// stdinChunk is the most stdin one frame carries: an older agent queues
// up to 1024 frames, so small frames bound what it holds (32 MiB).
const stdinChunk = 32 << 10

// ErrSessionClosed is what Stdin returns once the session is closed.
var ErrSessionClosed = errors.New("agent: the exec session is closed")

// Exec starts a command. It returns once the command started, or an
// *ErrStart if it could not. With hio (made by MakeHostIO; nil: none) the
// command's stdio are those FIFOs when the agent can; the session owns hio
// either way.
func (c *Client) Exec(ctx context.Context, req Request, hio *HostIO) (*Session, error) {
	if hio != nil && req.TTY {
		hio.Close() // a terminal is the agent's to give
		hio = nil
	}
	conn, err := c.dial(ctx)
	if err != nil {
		if hio != nil {
			hio.Close()
		}
		return nil, err
	}
	if hio != nil {
		req.IO = hio.Paths()
		defer func() {
			if hio != nil {
				hio.Close()
			}
		}()
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
		s := &Session{conn: conn, PID: st.PID, Caps: st.Caps, quit: make(chan struct{})}
		s.scond = sync.NewCond(&s.smu)
		if s.Has(CapStdinCredit) && st.StdinWindow > 0 {
			s.credit, s.window = true, st.StdinWindow
		}
		if hio != nil && s.Has(CapDirectIO) {
			if err := hio.started(); err != nil {
				// The sandbox took its FIFOs away (it may: they are in
				// its root). Its command runs on, its output drained
				// inside; this exec has nothing to show for it.
				s.write(FrameDetach, nil)
				s.Close()
				return nil, fmt.Errorf("agent: the exec's FIFOs: %w", err)
			}
			s.io, hio = hio, nil
			s.startMerge()
		}
		return s, nil
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

// Has reports whether the agent said it can do capability c.
func (s *Session) Has(c string) bool { return slices.Contains(s.Caps, c) }

// Recv returns the next frame: FrameStdout, FrameStderr or FrameExit.
// Stdin credit is taken here, never returned: a session's stdin moves only
// while someone receives.
func (s *Session) Recv() (byte, []byte, error) {
	if s.io != nil {
		select {
		case f := <-s.merged:
			return f.typ, f.p, f.err
		case <-s.quit:
			return 0, nil, ErrSessionClosed
		}
	}
	return s.recvConn()
}

func (s *Session) recvConn() (byte, []byte, error) {
	for {
		typ, p, err := ReadFrame(s.conn)
		if err != nil {
			return typ, p, err
		}
		switch typ {
		case FrameCredit:
			var c Credit
			if json.Unmarshal(p, &c) == nil && c.Bytes > 0 {
				s.smu.Lock()
				s.window += c.Bytes
				s.scond.Broadcast()
				s.smu.Unlock()
			}
			continue
		case FrameStdout, FrameStderr:
			s.received.Add(int64(len(p)))
		}
		return typ, p, nil
	}
}

// Received is how many output bytes (stdout and stderr) came from the
// agent so far.
func (s *Session) Received() int64 { return s.received.Load() }

func (s *Session) write(typ byte, p []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return WriteFrame(s.conn, typ, p)
}

// Stdin sends input; an empty p closes the command's stdin. It sends frames
// of at most 32 KiB and, with an agent that grants stdin window, waits for
// window: a command that does not read its stdin holds up the caller. It
// gives up with ErrSessionClosed when the session is closed.
func (s *Session) Stdin(p []byte) error {
	if len(p) == 0 {
		return s.CloseStdin()
	}
	if s.io != nil {
		if s.io.in == nil {
			return nil // the command has no stdin: dropped, as the agent does
		}
		_, err := s.io.in.Write(p)
		if errors.Is(err, os.ErrClosed) {
			return ErrSessionClosed
		}
		return err
	}
	for len(p) > 0 {
		n := min(len(p), stdinChunk)
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
		if err := s.write(FrameStdin, p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// CloseStdin closes the command's stdin.
func (s *Session) CloseStdin() error {
	if s.io != nil {
		if s.io.in != nil {
			s.io.in.Close()
		}
		return nil
	}
	return s.write(FrameStdin, nil)
}

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

// Detach tells the agent nobody reads this exec's output any more: it
// drops the output inside the sandbox, and only the exit frame still comes.
// It reports false when the agent cannot (an older one): its output keeps
// coming, for the caller to drop. Stdin, signals and the exit are as before.
func (s *Session) Detach() bool {
	if s.io != nil {
		// The host stops reading; the agent, told so, drains what the
		// command still writes.
		s.closeIO()
	}
	if !s.Has(CapDetach) {
		return false
	}
	// With stdin window nothing holds the agent's direction up for long;
	// an older agent's may be held by stdin it does not read, so never
	// make the caller wait for it.
	go s.write(FrameDetach, nil)
	return true
}

// Close drops the connection. The command keeps running.
func (s *Session) Close() error {
	s.quitOnce.Do(func() { close(s.quit) })
	if s.io != nil {
		s.closeIO()
	}
	s.smu.Lock()
	s.stopped = true
	s.scond.Broadcast()
	s.smu.Unlock()
	return s.conn.Close()
}

// closeIO lets go of the FIFOs: the host's ends closed and the FIFOs
// removed (the agent drains them for a command that still writes).
func (s *Session) closeIO() { s.ioOnce.Do(s.io.Close) }

// coalesce is how long a FIFO reader lets flowing output gather before it
// reads again: a command writing 4 KiB at a time otherwise makes a frame
// (and a flush to the client) per write.
const coalesce = 2 * time.Millisecond

// readMore reads into buf, waiting for the first bytes, then takes what
// else is there without waiting.
func readMore(f *os.File, buf []byte) (int, error) {
	n, err := f.Read(buf)
	if err != nil || n == len(buf) {
		return n, err
	}
	rc, rerr := f.SyscallConn()
	if rerr != nil {
		return n, nil
	}
	rc.Read(func(fd uintptr) bool {
		for n < len(buf) {
			m, e := unix.Read(int(fd), buf[n:])
			if m <= 0 || e != nil {
				break
			}
			n += m
		}
		return true // never wait here
	})
	return n, nil
}

// startMerge reads the output FIFOs and the connection into merged. The
// exit frame is handed on only after the output that came before it: once
// the agent says the command ended, the FIFOs are read until every writer
// is gone, or for as long as output keeps coming (see tailQuiet).
func (s *Session) startMerge() {
	s.merged = make(chan hostFrame)
	exited := make(chan struct{})
	var wg sync.WaitGroup
	send := func(f hostFrame) bool {
		select {
		case s.merged <- f:
			return true
		case <-s.quit:
			return false
		}
	}
	for i, f := range s.io.out {
		typ := FrameStdout
		if i == 1 {
			typ = FrameStderr
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var tail time.Duration
			buf := make([]byte, 256<<10)
			for n := 0; ; {
				if n > 0 {
					// Output is flowing: let it gather (the FIFO holds
					// 1 MiB) so it goes on in fewer, larger frames. The
					// first bytes after a quiet spell go at once.
					time.Sleep(coalesce)
				}
				t0 := time.Now()
				var err error
				n, err = readMore(f, buf)
				ended := false
				select {
				case <-exited:
					ended = true
					tail += time.Since(t0)
				default:
				}
				if n > 0 {
					s.received.Add(int64(n))
					if !send(hostFrame{typ: typ, p: append([]byte(nil), buf[:n]...)}) {
						return
					}
				}
				if err != nil || tail >= tailMost {
					return // EOF: every writer is gone; or the host let go, or a background child talks on
				}
				if ended {
					f.SetReadDeadline(time.Now().Add(tailQuiet))
				}
			}
		}()
	}
	go func() {
		for {
			typ, p, err := s.recvConn()
			if err == nil && typ == FrameExit {
				close(exited)
				for _, f := range s.io.out {
					f.SetReadDeadline(time.Now().Add(tailQuiet))
				}
				wg.Wait()
			}
			if !send(hostFrame{typ, p, err}) || err != nil || typ == FrameExit {
				return
			}
		}
	}()
}
