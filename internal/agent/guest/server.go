// Package guest is the agent: the small process shard runs as PID 1 inside
// every sandbox (`shard agent`, the same binary mounted at /.shard). It
// serves the protocol of internal/agent/proto on the sandbox's own network
// stack: it runs commands (exec), reports memory and OOM kills, writes and
// removes granted files, carries out the fork contract, and sets up the
// bounds of a gVisor sandbox at boot.
package guest

import (
	"bufio"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/useshards/shard/internal/agent/proto"
	"github.com/useshards/shard/internal/framing"
	"golang.org/x/sys/unix"

	"github.com/creack/pty"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/envlist"
	"github.com/useshards/shard/internal/revert"
)

// Server is the in-sandbox agent.
type Server struct {
	token   string
	baseEnv []string
	log     *slog.Logger
	reaper  *reaper
	guard   *oomGuard // nil when no memory limit is enforced inside

	pids      int64           // EnvPids: the process bound to enforce inside (0: none)
	pidsTasks string          // EnvPidsTasks
	tmpOnDisk bool            // EnvTmpOnDisk
	identity  *proto.Identity // EnvIdentity: written to ForkFile at boot
	ownHome   bool            // EnvOwnHome: baseEnv's HOME is the sandbox's, not the runtime's
}

// NewServerFromEnv builds the agent from its process environment.
func NewServerFromEnv(log *slog.Logger) (*Server, error) {
	s := &Server{log: log, reaper: newReaper()}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case proto.EnvToken:
			s.token = v
		case proto.EnvMemoryLimit:
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("agent: bad %s %q", proto.EnvMemoryLimit, v)
			}
			s.guard = newOOMGuard(n, log)
		case proto.EnvPids:
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("agent: bad %s %q", proto.EnvPids, v)
			}
			s.pids = n
		case proto.EnvTmpOnDisk:
			s.tmpOnDisk = v == "1"
		case proto.EnvOwnHome:
			s.ownHome = v == "1"
		case proto.EnvPidsTasks:
			s.pidsTasks = v
		case proto.EnvIdentity:
			var id proto.Identity
			if err := json.Unmarshal([]byte(v), &id); err != nil {
				return nil, fmt.Errorf("agent: bad %s: %w", proto.EnvIdentity, err)
			}
			s.identity = &id
		default:
			s.baseEnv = append(s.baseEnv, kv)
		}
	}
	if s.token == "" {
		return nil, errors.New("agent: no token in the environment")
	}
	os.Unsetenv(proto.EnvToken)
	return s, nil
}

// Serve listens on the agent port and serves until ctx ends or a SIGTERM
// arrives, at which point it asks every process to end, syncs and returns.
func (s *Server) Serve(ctx context.Context, addr string) error {
	if os.Getpid() == 1 {
		// Before it listens: once the host reaches it, the bounds hold.
		if err := s.setupBounds(); err != nil {
			return err
		}
		// The sandbox's commands run as root too: without this they read
		// the agent's memory and its first environment (its token) through
		// /proc/1 and may ptrace it, and so forge what it reports. A
		// process that is not dumpable is theirs to trace only with
		// CAP_SYS_PTRACE, which no sandbox has; their own execs are
		// dumpable again (execve resets it).
		if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
			return fmt.Errorf("agent: not dumpable: %w", err)
		}
	}
	if s.identity != nil && os.Getpid() == 1 {
		// A program that watches for forks finds the file from the start.
		if err := writeIdentity(*s.identity); err != nil {
			s.log.Warn("write "+proto.ForkFile, "err", err)
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	if os.Getpid() == 1 {
		s.log.Info("listening", "addr", addr)
		if err := detachStdio(); err != nil {
			return err
		}
	}
	go s.reaper.run()
	if s.guard != nil {
		go s.guard.run(ctx)
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		select {
		case <-term:
		case <-ctx.Done():
		}
		s.shutdown()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			s.log.Warn("accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go s.handle(c)
	}
}

// setupBounds sets up what the host asked for inside a gVisor sandbox (see
// bounds.go), then gives up the capabilities it took for that.
func (s *Server) setupBounds() error {
	if s.tmpOnDisk {
		if err := tmpOnDisk(); err != nil {
			return fmt.Errorf("agent: /tmp on disk: %w", err)
		}
	}
	switch {
	case s.pidsTasks != "":
		sp, err := spawnerFromTasks(s.pidsTasks)
		if err != nil {
			return fmt.Errorf("agent: pids bound: %w", err)
		}
		s.reaper.spawn = sp.start
	case s.pids > 0:
		sp, err := setupPids(s.pids)
		if err != nil {
			return fmt.Errorf("agent: pids bound: %w", err)
		}
		s.reaper.spawn = sp.start
	}
	if err := checkCaps(); err != nil {
		if err := dropSetupCaps(); err != nil {
			return fmt.Errorf("agent: %w", err)
		}
	}
	return nil
}

// shutdown asks every other process in the sandbox to end, gives them a
// moment, then flushes file data to the host.
func (s *Server) shutdown() {
	if os.Getpid() != 1 {
		return // not a sandbox's init (a test): never signal the whole host
	}
	_ = syscall.Kill(-1, syscall.SIGTERM)
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && s.reaper.others() {
		time.Sleep(20 * time.Millisecond)
	}
	syscall.Sync()
}

// closeWait is how long the agent waits, after its last frame, for the
// client to close the connection first.
const closeWait = 5 * time.Second

// awaitClose waits (up to closeWait) for the client to close, reading and
// dropping anything it still sends.
//
// Why: a TCP connection's side that closes first keeps it in TIME_WAIT for a
// minute. Inside a sandbox that endpoint lives in gVisor's netstack and is
// part of every checkpoint: with one connection per exec, hundreds of them
// piled up and tripled the time the source stays frozen for a fork. When the
// host closes first, TIME_WAIT stays on the host.
func awaitClose(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(closeWait))
	io.Copy(io.Discard, c)
}

func (s *Server) handle(c net.Conn) {
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	typ, p, err := framing.Read(c)
	if err != nil || typ != proto.FrameRequest {
		return
	}
	c.SetReadDeadline(time.Time{})
	var req proto.Request
	if err := json.Unmarshal(p, &req); err != nil {
		return
	}
	if req.Op != proto.OpExec {
		// exec waits for the client itself: its reader owns the connection.
		defer awaitClose(c)
	}
	if subtle.ConstantTimeCompare([]byte(req.Token), []byte(s.token)) != 1 {
		s.reply(c, proto.Reply{Error: "bad token"})
		return
	}
	switch req.Op {
	case proto.OpPing:
		s.reply(c, proto.Reply{OK: true, Caps: caps})
	case proto.OpSync:
		syscall.Sync()
		s.reply(c, proto.Reply{OK: true})
	case proto.OpStats:
		r := proto.Reply{OK: true}
		if s.guard != nil {
			r.MemoryUsed, r.MemoryLimit, r.OOMKills = s.guard.stats()
		}
		s.reply(c, r)
	case proto.OpMemCheck:
		r := proto.Reply{OK: true}
		if s.guard != nil {
			r.WatchMS = s.guard.poke().Milliseconds()
		}
		s.reply(c, r)
	case proto.OpExec:
		s.exec(c, &req)
	case proto.OpGrantFile:
		made, err := putGrantFile(req.Path, req.Data, os.FileMode(req.Mode), req.Replace)
		if err != nil {
			s.reply(c, errReply(err))
			return
		}
		s.reply(c, proto.Reply{OK: true, Made: made})
	case proto.OpForked:
		if req.Forked == nil {
			s.reply(c, proto.Reply{Error: "forked: no fork given"})
			return
		}
		s.reply(c, s.forked(req.Forked))
	case proto.OpUngrantFile:
		left, err := removeGrantFile(req.Path, os.FileMode(req.Mode), req.Dirs)
		if err != nil {
			s.reply(c, errReply(err))
			return
		}
		s.reply(c, proto.Reply{OK: true, Left: left})
	default:
		// The words are for hosts from before UnknownOp; a host
		// decides by the field (or, first, by caps).
		s.reply(c, proto.Reply{Error: "unknown op " + req.Op, UnknownOp: true})
	}
}

// caps is what this agent can do beyond the first protocol: every op and
// exec frame it has that an older agent may lack.
var caps = proto.Caps{proto.CapDetach, proto.CapStdinCredit, proto.CapMemCheck, proto.CapGrantFile, proto.CapForked}

func (s *Server) reply(c net.Conn, r proto.Reply) {
	b, _ := json.Marshal(r)
	framing.Write(c, proto.FrameReply, b)
}

// conn serialises frame writes from the output goroutines.
type conn struct {
	mu   sync.Mutex
	c    net.Conn
	dead bool // the client went away, or the exit was sent: nothing more goes out
	// detached: the client said nobody reads the output (FrameDetach); it
	// is drained and dropped here, every other frame still goes. Atomic:
	// the reader sets it while a send may hold mu.
	detached atomic.Bool
}

func (w *conn) send(typ byte, p []byte) {
	output := typ == proto.FrameStdout || typ == proto.FrameStderr
	if output && w.detached.Load() {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dead || output && w.detached.Load() {
		return
	}
	w.c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	if err := framing.Write(w.c, typ, p); err != nil {
		w.dead = true
	}
}

func (w *conn) sendJSON(typ byte, v any) {
	b, _ := json.Marshal(v)
	w.send(typ, b)
}

func (s *Server) exec(c net.Conn, req *proto.Request) {
	out := &conn{c: c}
	p, err := s.start(req)
	if err != nil {
		out.sendJSON(proto.FrameError, err)
		awaitClose(c)
		return
	}
	p.credit = func(n int) { out.sendJSON(proto.FrameCredit, proto.Credit{Bytes: n}) }
	out.sendJSON(proto.FrameStarted, proto.Started{PID: p.pid, Caps: caps, StdinWindow: stdinWindow})

	// Client to agent: stdin, resize, signals. When the client goes away the
	// command keeps running (background work must survive a disconnect).
	// clientGone closes when the client has closed its end (see awaitClose).
	clientGone := make(chan struct{})
	in := bufio.NewReaderSize(c, 256<<10) // a frame and its header in one read
	go func() {
		defer close(clientGone)
		p.readClient(in, out)
	}()

	var ps pumps
	ps.start(p, out)
	ws, timedOut := p.wait(req.TimeoutMS)
	// Output written just before exit is still in the pipes: read it. A
	// background child may hold the pipes open for ever, so wait only a
	// little; the pumps keep draining (and dropping) after we answer, so
	// such a child never blocks or gets SIGPIPE.
	drained := make(chan struct{})
	go func() { ps.wg.Wait(); close(drained) }()
	cut := waitTail(drained, func() bool { return ps.sending.Load() > 0 }, p.outputPending, p.outputHup)
	p.closeTTY(drained)
	ex := proto.Exit{Code: ws.ExitStatus(), TimedOut: timedOut, OutputCut: cut,
		StdinBytes: p.stdinBytes.Load(), StdoutBytes: ps.moved[0].Load(), StderrBytes: ps.moved[1].Load()}
	if ws.Signaled() {
		ex.Signal = int(ws.Signal())
		ex.Code = 128 + ex.Signal
		if s.guard != nil && s.guard.killed(p.pid) {
			ex.OOM = true
		}
	}
	out.mu.Lock()
	dead := out.dead
	out.mu.Unlock()
	if !dead {
		out.sendJSON(proto.FrameExit, ex)
	}
	out.mu.Lock()
	out.dead = true // the exit is the last frame: no credit after it
	out.mu.Unlock()
	p.abandonStdin()
	// Let the client close first (see awaitClose); a client that has not
	// closed by then is cut off by the deadline.
	c.SetReadDeadline(time.Now().Add(closeWait))
	<-clientGone
}

// readClient hands the client's frames to the command until the client
// closes its end (or breaks the framing): then stdin closes and nothing
// more is sent.
func (p *proc) readClient(in io.Reader, out *conn) {
	for {
		var buf []byte
		select {
		case buf = <-p.spare:
		default:
		}
		typ, b, err := framing.ReadInto(in, proto.MaxFrame, buf)
		if err != nil {
			p.queueStdin(nil)
			out.mu.Lock()
			out.dead = true
			out.mu.Unlock()
			return
		}
		switch typ {
		case proto.FrameStdin:
			// Queued, never written here: a command that does not read
			// its stdin must not hold up signals and resizes behind it.
			p.queueStdin(b)
		case proto.FrameResize:
			var r proto.Resize
			if json.Unmarshal(b, &r) == nil {
				p.resize(r)
			}
		case proto.FrameSignal:
			var sg proto.Signal
			if json.Unmarshal(b, &sg) == nil && sg.Signal > 0 {
				_ = syscall.Kill(-p.pid, syscall.Signal(sg.Signal))
			}
		case proto.FrameDetach:
			// The pumps keep reading (a command never blocks on a
			// full pipe nobody reads) and drop it: the host does no
			// work for output nobody wants.
			out.detached.Store(true)
		}
	}
}

// pumps move a command's output to the client, a goroutine per output.
type pumps struct {
	wg      sync.WaitGroup
	sending atomic.Int32    // pumps handing output on (held up by a slow client)
	moved   [2]atomic.Int64 // bytes read from stdout, stderr
}

// start starts a pump for each of p's outputs.
func (ps *pumps) start(p *proc, out *conn) {
	ps.wg.Add(len(p.outputs))
	for i, r := range p.outputs {
		typ := proto.FrameStdout
		if i == 1 {
			typ = proto.FrameStderr
		}
		go ps.pump(p, out, r, typ, &ps.moved[i])
	}
}

func (ps *pumps) pump(p *proc, out *conn, r io.Reader, typ byte, moved *atomic.Int64) {
	defer ps.wg.Done()
	buf := make([]byte, outputChunk)
	size := pipeSizeOf(r)
	var pc pace
	for {
		n, err := r.Read(buf)
		if n > 0 {
			moved.Add(int64(n))
			ps.sending.Add(1)
			out.send(typ, buf[:n])
			ps.sending.Add(-1)
		}
		if err != nil {
			return
		}
		if p.tty == nil && size > 0 {
			// Output is flowing: let it gather in the pipe before
			// the next read (see pace). Output after a quiet spell
			// is read at once: this read was waiting for it.
			if d := pc.afterRead(n, size); d > 0 {
				time.Sleep(d)
			}
		}
	}
}

// wait waits for the command's end, killing its process group (and it) at
// its timeout (0: none).
func (p *proc) wait(timeoutMS int64) (ws syscall.WaitStatus, timedOut bool) {
	var timeout <-chan time.Time
	if timeoutMS > 0 {
		t := time.NewTimer(time.Duration(timeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case ws = <-p.done:
	case <-timeout:
		timedOut = true
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
		ws = <-p.done
	}
	return ws, timedOut
}

// A command's output and stdin pass through plain pipes of 1 MiB (gVisor's
// most), outside Go's poller (no wake-up per write through epoll), which the
// pumps move at a pace (see pace), in frames of up to outputChunk.
const (
	outputChunk = pipeSize
	pipeSize    = 1 << 20
)

// pipeSizeOf is the size of the pipe r reads, or 0 when r is none.
func pipeSizeOf(r any) int {
	f, ok := r.(*os.File)
	if !ok {
		return 0
	}
	n, err := unix.FcntlInt(f.Fd(), unix.F_GETPIPE_SZ, 0)
	if err != nil {
		return 0
	}
	return n
}

// bigPipe is a blocking pipe of pipeSize (or the system's default, where it
// cannot be made that big), close-on-exec.
func bigPipe() (r, w *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, err
	}
	unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, pipeSize)
	return os.NewFile(uintptr(p[0]), "|0"), os.NewFile(uintptr(p[1]), "|1"), nil
}

// tailQuiet bounds the wait, after a command's exit, for the output it
// wrote before: a background child may hold the pipes open for ever.
const tailQuiet = 100 * time.Millisecond

// waitTail waits until drained closes (every writer of the output is gone
// and all of it went out), or until the pumps have spent tailQuiet neither
// handing output on nor leaving any in the pipes; it reports whether it
// stopped before drained (output cut: a background process holds the
// pipes).
//
// Once hup says every writer of the output is gone (the usual case: no
// background process kept it), it waits for drained, however long the pumps
// take: what is left is the command's own output, and a pump that the
// host's scheduler kept from running for 100 ms lost it (the exit came with
// no output, seen under load, once after the read itself). Time a pump is
// held up by a slow client does not count either: output the command wrote
// before its exit is never cut for a client that reads slowly. Nor does
// time output waits in a pipe, up to tailPending; a background child that
// writes on for ever has the pipes never empty, hence the bound.
func waitTail(drained <-chan struct{}, sending, pending, hup func() bool) (cut bool) {
	t := time.NewTicker(tailTick)
	defer t.Stop()
	looks := 0
	for quiet := time.Duration(0); quiet < tailQuiet; {
		select {
		case <-drained:
			return false
		case <-t.C:
			if hup() {
				<-drained
				return false
			}
			looks++
			waiting := time.Duration(looks)*tailTick < tailPending && pending()
			if !sending() && !waiting {
				quiet += tailTick
			}
		}
	}
	return true
}

// tailPending bounds the time waitTail waits for output left in the pipes
// while a background process holds them.
const tailPending = 300 * time.Millisecond

// tailTick is how often waitTail looks at the pumps.
const tailTick = 10 * time.Millisecond

// stdinWindow is the stdin a client may send ahead of the command reading
// it (see FrameCredit): small, so that a command that does not read holds up
// its client rather than filling the sandbox's memory.
const stdinWindow = 256 << 10

// stdinHardCap bounds what is queued even from a client that ignores the
// window: past it the reader waits, as it would on a pipe.
const stdinHardCap = 4 * stdinWindow

// proc is a started command.
type proc struct {
	pid     int
	done    chan syscall.WaitStatus
	outputs []io.Reader // stdout, stderr (only stdout for a TTY)
	stdin   *os.File    // nil when there is none; owned by the stdin writer
	// A stdin pipe's write end is non-blocking, written at a pace:
	stdinFD   int  // its descriptor
	stdinSize int  // its size; 0 for a terminal (written as is)
	stdinPace pace // the stdin writer's
	// stdinBytes is what went into the command's stdin so far.
	stdinBytes atomic.Int64

	spare  chan []byte // stdin buffers written out, for the next frames
	tty    *os.File    // pty master, or nil
	credit func(n int) // tells the client n stdin bytes left the queue

	stdinOnce sync.Once
	stdinMu   sync.Mutex
	stdinCond *sync.Cond // on stdinMu: the queue changed
	stdinQ    [][]byte   // to the stdin writer; a nil entry closes stdin
	queued    int        // bytes in stdinQ
	closing   bool       // the nil entry is queued: later input is dropped
	abandoned bool       // the exec ended: input past the cap is dropped, never waited for
}

// queueStdin hands input to the stdin writer; empty or nil closes stdin.
// It never waits while the client keeps to the window, so signals and
// resizes behind stdin are never held up.
func (p *proc) queueStdin(b []byte) {
	if p.stdin == nil {
		p.giveCredit(len(b)) // nowhere to go: dropped, and credited
		return
	}
	p.startStdin()
	if !p.enqueue(b) {
		// Dropped (stdin is closing, or the exec ended with the queue
		// full), and credited outside the lock: a credit is a write.
		p.giveCredit(len(b))
	}
}

// enqueue queues b for the writer (an empty b closes stdin), waiting while
// stdinHardCap is queued. It reports whether b was taken.
func (p *proc) enqueue(b []byte) bool {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.closing {
		return false
	}
	if len(b) == 0 {
		p.closing = true
		p.stdinQ = append(p.stdinQ, nil)
		p.stdinCond.Broadcast()
		return true
	}
	for p.queued >= stdinHardCap && !p.abandoned {
		p.stdinCond.Wait()
	}
	if p.queued >= stdinHardCap {
		return false // abandoned, and full
	}
	p.stdinQ = append(p.stdinQ, b)
	p.queued += len(b)
	p.stdinCond.Broadcast()
	return true
}

// abandonStdin: the exec ended; a reader waiting on a full queue (a client
// over its window) drops its input instead of waiting for ever.
func (p *proc) abandonStdin() {
	if p.stdin == nil {
		return
	}
	p.startStdin()
	p.stdinMu.Lock()
	p.abandoned = true
	p.stdinCond.Broadcast()
	p.stdinMu.Unlock()
}

// startStdin starts the stdin writer on first use.
func (p *proc) startStdin() {
	p.stdinOnce.Do(func() {
		p.stdinCond = sync.NewCond(&p.stdinMu)
		go p.stdinWriter()
	})
}

func (p *proc) giveCredit(n int) {
	if n > 0 && p.credit != nil {
		p.credit(n)
	}
}

// writeStdin hands b to the command: at a pace into a pipe (see pace), as
// it comes into a terminal.
// It returns how much of b went in.
func (p *proc) writeStdin(b []byte) (int, error) {
	if p.stdinSize == 0 {
		return p.stdin.Write(b)
	}
	return writePaced(p.stdinFD, b, p.stdinSize, &p.stdinPace)
}

func (p *proc) stdinWriter() {
	var last byte = '\n'
	broken := false // the command closed its stdin: the rest is dropped
	for {
		p.stdinMu.Lock()
		for len(p.stdinQ) == 0 {
			p.stdinCond.Wait()
		}
		b := p.stdinQ[0]
		p.stdinQ[0] = nil
		p.stdinQ = p.stdinQ[1:]
		p.stdinMu.Unlock()
		if b == nil {
			if p.tty == nil {
				p.stdin.Close()
			} else if last == '\n' {
				// A TTY has no half-close: ^D at the start of a line is EOF.
				p.stdin.Write([]byte{4})
			} else {
				// After a partial line the first ^D only flushes it.
				p.stdin.Write([]byte{4, 4})
			}
			return
		}
		if !broken {
			n, err := p.writeStdin(b)
			p.stdinBytes.Add(int64(n))
			if err != nil {
				broken = true
			} else {
				last = b[len(b)-1]
			}
		}
		select {
		case p.spare <- b[:0]: // read into again (fresh buffers cost page faults)
		default:
		}
		p.stdinMu.Lock()
		p.queued -= len(b)
		p.stdinCond.Broadcast()
		p.stdinMu.Unlock()
		p.giveCredit(len(b))
	}
}

func (p *proc) resize(r proto.Resize) {
	if p.tty != nil && r.Rows > 0 && r.Cols > 0 {
		pty.Setsize(p.tty, &pty.Winsize{Rows: r.Rows, Cols: r.Cols})
	}
}

// outputPending reports whether an output pipe (or the terminal) holds
// bytes not yet read.
func (p *proc) outputPending() bool {
	for _, r := range p.outputs {
		if f, ok := r.(*os.File); ok {
			if n, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCINQ); err == nil && n > 0 {
				return true
			}
		}
	}
	return false
}

// outputHup reports whether every writer of every output is gone (the
// pipes poll POLLHUP: their last write end closed; unread bytes may remain).
func (p *proc) outputHup() bool {
	fds := make([]unix.PollFd, 0, len(p.outputs))
	for _, r := range p.outputs {
		f, ok := r.(*os.File)
		if !ok {
			return false
		}
		fds = append(fds, unix.PollFd{Fd: int32(f.Fd()), Events: unix.POLLIN})
	}
	if _, err := unix.Poll(fds, 0); err != nil {
		return false
	}
	for _, fd := range fds {
		if fd.Revents&unix.POLLHUP == 0 {
			return false
		}
	}
	return true
}

// closeTTY closes the pty master once output is drained (a pty, unlike a
// pipe, reads EIO after the last holder of the slave exits).
func (p *proc) closeTTY(drained <-chan struct{}) {
	if p.tty == nil {
		return
	}
	go func() {
		<-drained
		p.tty.Close()
	}()
}

func startErr(code, format string, args ...any) *proto.ErrorInfo {
	return &proto.ErrorInfo{Code: code, Message: fmt.Sprintf(format, args...)}
}

// execEnv is a command's environment: the sandbox's, then the request's,
// and HOME the home of the user it runs as unless the request or the
// sandbox's own environment sets it (as podman does; the HOME the runtime
// gave the agent is root's, which is no one else's).
func (s *Server) execEnv(reqEnv []string, home string) []string {
	env := envlist.Merge(s.baseEnv, reqEnv)
	if envlist.Has(reqEnv, "HOME") || (s.ownHome && envlist.Has(s.baseEnv, "HOME")) {
		return env
	}
	return envlist.Merge(env, []string{"HOME=" + home})
}

func (s *Server) start(req *proto.Request) (*proc, *proto.ErrorInfo) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, startErr(client.CodeInvalidArgument, "no command given")
	}
	cred, home, err := lookupUser(req.User)
	if err != nil {
		return nil, startErr(client.CodeInvalidArgument, "%v", err)
	}
	env := s.execEnv(req.Env, home)
	path, err := lookPath(req.Argv[0], envlist.Value(env, "PATH"))
	if err != nil {
		return nil, startErr(client.CodeCommandNotFound, "%v", err)
	}
	dir := req.Dir
	if dir == "" {
		dir = "/"
		if home != "" {
			if st, err := os.Stat(home); err == nil && st.IsDir() && req.User != "" {
				dir = home
			}
		}
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, startErr(client.CodeInvalidArgument, "working directory %s does not exist in the sandbox", dir)
	}

	p := &proc{done: make(chan syscall.WaitStatus, 1), spare: make(chan []byte, 4)}
	attr := &os.ProcAttr{Dir: dir, Env: env, Sys: &syscall.SysProcAttr{Credential: cred}}
	var closeAfter []*os.File
	var serr *proto.ErrorInfo
	if req.TTY {
		closeAfter, serr = p.openTTY(req, attr)
	} else {
		closeAfter, serr = p.openPipes(req, attr)
	}
	if serr != nil {
		return nil, serr
	}
	pid, err := s.reaper.start(path, req.Argv, attr, p.done)
	for _, f := range closeAfter {
		f.Close()
	}
	if err != nil {
		for _, r := range p.outputs {
			r.(*os.File).Close()
		}
		if p.stdin != nil && p.tty == nil {
			p.stdin.Close()
		}
		return nil, startErr(client.CodeExecFailed, "start %s: %v", req.Argv[0], errors.Unwrap(err))
	}
	p.pid = pid
	return p, nil
}

// openTTY gives the command a terminal for its stdio: it returns the slave
// end, for the caller to close once the command has it.
func (p *proc) openTTY(req *proto.Request, attr *os.ProcAttr) ([]*os.File, *proto.ErrorInfo) {
	master, slave, err := pty.Open()
	if err != nil {
		return nil, startErr(client.CodeInternal, "open a tty: %v", err)
	}
	rows, cols := req.Rows, req.Cols
	if rows == 0 || cols == 0 {
		rows, cols = 24, 80 // a terminal of no size breaks programs that ask
	}
	pty.Setsize(master, &pty.Winsize{Rows: rows, Cols: cols})
	attr.Files = []*os.File{slave, slave, slave}
	attr.Sys.Setsid = true
	attr.Sys.Setctty = true
	attr.Sys.Ctty = 0
	if !envlist.Has(attr.Env, "TERM") {
		attr.Env = append(attr.Env, "TERM=xterm")
	}
	p.tty = master
	p.stdin = master
	p.outputs = []io.Reader{master}
	return []*os.File{slave}, nil
}

// newPipe makes the pipes of a command's stdio; a test makes it fail.
var newPipe = bigPipe

// openPipes gives the command pipes for its stdio (its stdin /dev/null
// unless req.Stdin): it returns the command's ends, for the caller to close
// once the command has them. When one fails, those already made are closed.
func (p *proc) openPipes(req *proto.Request, attr *os.ProcAttr) ([]*os.File, *proto.ErrorInfo) {
	r := revert.New()
	defer r.Fail()
	var stdinR, stdinW *os.File
	if req.Stdin {
		rd, w, err := newPipe()
		if err != nil {
			return nil, startErr(client.CodeInternal, "pipe: %v", err)
		}
		r.Add(func() { rd.Close(); w.Close() })
		stdinR, stdinW = rd, w
	} else {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return nil, startErr(client.CodeInternal, "open %s: %v", os.DevNull, err)
		}
		r.Add(func() { f.Close() })
		stdinR = f
	}
	outR, outW, err := newPipe()
	if err != nil {
		return nil, startErr(client.CodeInternal, "pipe: %v", err)
	}
	r.Add(func() { outR.Close(); outW.Close() })
	errR, errW, err := newPipe()
	if err != nil {
		return nil, startErr(client.CodeInternal, "pipe: %v", err)
	}
	r.Success()
	if stdinW != nil {
		p.stdin = stdinW
		p.stdinFD = int(stdinW.Fd())
		if n := pipeSizeOf(stdinR); n > 0 && unix.SetNonblock(p.stdinFD, true) == nil {
			p.stdinSize = n
		}
	}
	attr.Files = []*os.File{stdinR, outW, errW}
	attr.Sys.Setpgid = true
	p.outputs = []io.Reader{outR, errR}
	return []*os.File{stdinR, outW, errW}, nil
}
