package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/useshards/shard/internal/agent/host"
	"github.com/useshards/shard/internal/agent/proto"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/ledger"
	"github.com/useshards/shard/internal/metrics"
	"github.com/useshards/shard/internal/store"
)

// ExecSession is a running exec whose start and end are in the sandbox's
// ledger. One goroutine (pump) reads the agent's frames, records the end
// when it comes, and hands them on, in the service's terms, to Recv. Close
// lets go of the command at once: the agent then drops its output (see
// proto.FrameDetach), and the pump still records its end.
type ExecSession struct {
	PID int // the command's, as seen inside the sandbox

	agent      *host.Session // set before Exec returns
	s          *Service
	sb         *store.Sandbox
	id         string
	start      time.Time
	frames     chan frame    // from the pump; closed when it ends
	detached   chan struct{} // closed by Close
	detachOnce sync.Once
	once       sync.Once     // the exec_finished event
	done       chan struct{} // closed once the end is recorded

	abortOnce sync.Once
	abortEx   *ExecExit          // set (before aborted closes) by abort
	aborted   chan struct{}      // closed by abort
	cancel    context.CancelFunc // ends the dial to the agent
	connMu    sync.Mutex         // orders abort's close with the session's start
	conn      *host.Session      // the agent's session once it started; guarded by connMu
}

// lostGrace is how long a broken connection to the agent waits for the
// host to say why (a stop, a removal, a death) before it is reported lost.
const lostGrace = 3 * time.Second

// execGrace is how long past its timeout the host waits for a sandbox to
// end a command before it ends the stream itself.
const execGrace = 5 * time.Second

// execDialTimeout bounds the connection to the agent: a sandbox gone from
// under its address never answers, and TCP would retry for minutes. A
// sandbox starved of CPU answers within seconds, so this is generous.
const execDialTimeout = 60 * time.Second

type frame struct {
	f   ExecFrame
	err error
}

// Exec starts a command in a running sandbox. Its exec_started event is on
// disk before the command starts; exec_finished follows when it ends.
func (s *Service) Exec(ctx context.Context, idOrName string, req ExecRequest) (*ExecSession, *store.Sandbox, error) {
	sb, err := s.cfg.Store.GetSandbox(ctx, idOrName)
	if err != nil {
		return nil, nil, err
	}
	if sb.State == StateFreezing {
		return nil, nil, errdefs.Conflict(client.CodeSandboxFrozen, "sandbox %s: %s", sb.Name, FrozenMessage)
	}
	if sb.State != StateRunning {
		return nil, nil, errdefs.Conflict(client.CodeSandboxNotRunning, "sandbox %s is %s: exec takes a running sandbox (shard start %s)", sb.Name, sb.State, sb.Name)
	}
	// Checked before exec_started is written: a refused command leaves
	// nothing in the ledger.
	if err := CheckArgv("command", req.Argv); err != nil {
		return nil, nil, err
	}
	if err := CheckEnv(req.Env); err != nil {
		return nil, nil, err
	}
	envNames := make([]string, 0, len(req.Env))
	for _, kv := range req.Env {
		k, _, _ := strings.Cut(kv, "=")
		envNames = append(envNames, k)
	}
	// Granted secrets come first, so a variable the exec sets itself wins;
	// their names and values stay out of the ledger.
	genv, err := s.access.grantEnv(ctx, sb)
	if err != nil {
		return nil, nil, err
	}
	if len(genv) > 0 {
		req.Env = append(genv, req.Env...)
	}
	return s.exec(ctx, sb, req, ledger.ExecStartedData{
		Argv: req.Argv, Cwd: req.Workdir, User: req.User, EnvNames: envNames, TTY: req.TTY, Stdin: req.Stdin, TimeoutMS: timeoutMS(req.Timeout)})
}

func (s *Service) exec(ctx context.Context, sb *store.Sandbox, req ExecRequest, started ledger.ExecStartedData) (*ExecSession, *store.Sandbox, error) {
	if err := s.adm.ledgerRoom(ctx, sb.Project, "run a command in sandbox "+sb.Name); err != nil {
		return nil, nil, err
	}
	started.Exec = randomHex(8)
	if err := s.cfg.Store.AddEvent(ctx, sb, &store.EventSpec{Type: ledger.ExecStarted, Data: started}); err != nil {
		return nil, nil, err
	}
	e := &ExecSession{s: s, sb: sb, id: started.Exec, start: time.Now(), done: make(chan struct{}),
		frames: make(chan frame), detached: make(chan struct{}), aborted: make(chan struct{})}
	dial := execDialTimeout
	if req.Timeout > 0 {
		// The command's timeout holds from the request on, also while the
		// sandbox does not answer at all.
		dial = min(dial, req.Timeout+execGrace)
	}
	dctx, cancel := context.WithTimeout(ctx, dial)
	e.cancel = cancel
	// Known before the dial, so a stop or remove meanwhile ends it too;
	// one that began before this was known is seen in the record.
	s.execs.add(sb.ID, e)
	if cur, err := s.cfg.Store.GetSandbox(ctx, sb.ID); err != nil || leaving(cur.State) {
		e.abort(ExecExit{Code: 137, Signal: 9, Error: "sandbox " + sb.Name + " stopped before the command could start"})
	}
	sess, err := s.agentFor(sb).Exec(dctx, agentRequest(req))
	cancel()
	if err == nil {
		e.connMu.Lock()
		e.conn = sess
		e.connMu.Unlock()
		if e.isAborted() {
			sess.Close()
			err = errors.New(e.abortEx.Error)
		}
	}
	if err != nil && !e.isAborted() {
		// A stop or removal kills the sandbox (breaking this connection)
		// a moment before it ends its execs; it moved the record first.
		if cur, gerr := s.cfg.Store.GetSandbox(context.WithoutCancel(ctx), sb.ID); gerr != nil || leaving(cur.State) {
			select {
			case <-e.aborted:
			case <-time.After(lostGrace):
				e.abort(ExecExit{Code: 137, Signal: 9, Error: "sandbox " + sb.Name + " stopped before the command could start"})
			}
		}
	}
	if err != nil {
		s.execs.remove(sb.ID, e)
		return nil, nil, e.startFailed(ctx, dctx, err, req)
	}
	e.agent, e.PID = sess, sess.PID
	s.cfg.Metrics.ExecStarted(sb.Provider, time.Since(e.start))
	if req.Timeout > 0 {
		// The agent ends a command at its timeout; a sandbox that cannot
		// (paused, wedged, gone) must not hold the stream for ever.
		t := time.AfterFunc(req.Timeout+execGrace, func() {
			e.abort(ExecExit{Code: 137, Signal: 9, TimedOut: true,
				Error: "the command ran past its timeout and sandbox " + sb.Name + " did not end it"})
		})
		go func() {
			select {
			case <-e.done:
			case <-e.s.life.Done():
			}
			t.Stop()
		}()
	}
	if !s.life.goBG(e.pump) {
		sess.Close()
		close(e.frames)
	}
	return e, sb, nil
}

// startFailed records, and turns into the caller's error, why a command
// could not start: the host ended it (a stop or removal), the agent refused
// it, the caller left (ctx), or the sandbox did not answer (within dctx).
func (e *ExecSession) startFailed(ctx, dctx context.Context, err error, req ExecRequest) error {
	sb := e.sb
	if e.isAborted() {
		e.finish(ledger.ExecFinishedData{Error: e.abortEx.Error})
		return errdefs.Conflict(client.CodeSandboxNotRunning, "%s", e.abortEx.Error)
	}
	var es *host.ErrStart
	if errors.As(err, &es) {
		e.finish(ledger.ExecFinishedData{Error: es.Info.Message})
		return startError(es.Info)
	}
	if cerr := ctx.Err(); cerr != nil {
		// The caller left before the sandbox answered: not the sandbox's
		// failure (and the request's is a 499, not a 502).
		e.finish(ledger.ExecFinishedData{Error: "the caller left before the command started"})
		return fmt.Errorf("exec in sandbox %s: %w", sb.Name, cerr)
	}
	e.finish(ledger.ExecFinishedData{Error: "the sandbox did not answer: " + err.Error()})
	if req.Timeout > 0 && errors.Is(dctx.Err(), context.DeadlineExceeded) {
		return errdefs.Upstream(client.CodeSandboxUnreachable, "sandbox %s did not answer within the command's timeout (%s): nothing was run", sb.Name, req.Timeout)
	}
	return errdefs.Upstream(client.CodeSandboxUnreachable, "sandbox %s does not answer: %v", sb.Name, err)
}

// startError is the API error of the agent's refusal to start a command.
// The agent runs in the sandbox: its code is passed on only when it is one
// an agent sends, so a sandbox cannot make up codes.
func startError(info proto.ErrorInfo) error {
	switch code := info.Code; code {
	case client.CodeInternal:
		return errdefs.New(errdefs.KindInternal, code, "%s", info.Message)
	case client.CodeInvalidArgument, client.CodeCommandNotFound:
		return errdefs.New(errdefs.KindInvalid, code, "%s", info.Message)
	}
	return errdefs.New(errdefs.KindInvalid, client.CodeExecFailed, "%s", info.Message)
}

// abort ends the session from the host, whatever the agent does: its
// stream ends with ex (which says why) and the ledger records it.
func (e *ExecSession) abort(ex ExecExit) {
	e.abortOnce.Do(func() {
		e.abortEx = &ex
		close(e.aborted)
		if e.cancel != nil {
			e.cancel()
		}
		e.connMu.Lock()
		if e.conn != nil {
			e.conn.Close() // the pump's Recv returns, and it reports ex
		}
		e.connMu.Unlock()
	})
}

func (e *ExecSession) isAborted() bool {
	select {
	case <-e.aborted:
		return true
	default:
		return false
	}
}

// pump reads frames until the command ends (or the connection does),
// records the end before handing on the exit frame, and then closes the
// connection.
func (e *ExecSession) pump() {
	defer close(e.frames)
	defer e.agent.Close()
	defer e.s.execs.remove(e.sb.ID, e)
	// Output is read into two buffers in turn: a frame handed on is
	// written by the reader before it asks for the next (see Recv), and
	// that next one was read into the other buffer.
	var bufs [2][]byte
	for i := 0; ; i ^= 1 {
		typ, p, err := e.agent.RecvInto(bufs[i])
		if cap(p) > cap(bufs[i]) && (typ == proto.FrameStdout || typ == proto.FrameStderr) {
			bufs[i] = p[:0]
		}
		if err != nil && e.s.life.stopping() && !e.isAborted() {
			// The server is shutting down and closed the connection: the
			// command runs on, and whoever reads is told (their frames end).
			return
		}
		if err != nil && !e.isAborted() {
			// A sandbox killed under a command closes its connection a
			// moment before the stop, removal or death is handled: give
			// that a moment to say why.
			select {
			case <-e.aborted:
			case <-time.After(lostGrace):
			}
		}
		if err != nil && e.isAborted() {
			// Ended by the host: an exit that says why, not a lost stream.
			ex := *e.abortEx
			code := ex.Code
			e.finish(ledger.ExecFinishedData{ExitCode: &code, Signal: ex.Signal, TimedOut: ex.TimedOut, Error: ex.Error})
			select {
			case e.frames <- frame{ExecFrame{Kind: ExecExited, Exit: ex}, nil}:
			case <-e.detached:
			}
			return
		}
		var f ExecFrame
		if err == nil {
			var ok bool
			if f, ok = execFrame(typ, p); !ok {
				// Not one of an exec's: nothing to pass on, and its
				// buffer is read into again (the other may be in use).
				i ^= 1
				continue
			}
		}
		switch {
		case err != nil:
			e.finish(ledger.ExecFinishedData{Error: ledger.LostError})
		case f.Kind == ExecExited:
			ex := f.Exit
			code := ex.Code
			e.finish(ledger.ExecFinishedData{ExitCode: &code, Signal: ex.Signal, TimedOut: ex.TimedOut, OOM: ex.OOM,
				StdinBytes: ex.StdinBytes, StdoutBytes: ex.StdoutBytes, StderrBytes: ex.StderrBytes, OutputCut: ex.OutputCut})
			// Close first, before the frame is handed on: the agent
			// waits for this (see guest.awaitClose).
			e.agent.Close()
		}
		select {
		case e.frames <- frame{f, err}:
		case <-e.detached: // nobody reads any more: drop it
		}
		if err != nil || f.Kind == ExecExited {
			return
		}
	}
}

// Recv returns the next frame: output, and last the exit (its end already
// recorded). Output's Data is the caller's until it calls Recv again: it is
// written over after that.
func (e *ExecSession) Recv() (ExecFrame, error) {
	select {
	case f, ok := <-e.frames:
		if !ok {
			return ExecFrame{}, io.EOF
		}
		return f.f, f.err
	case <-e.detached:
		return ExecFrame{}, errors.New("the exec was let go")
	}
}

// Stdin sends input to the command, only as fast as the sandbox takes it
// (see host.Session.Stdin); an empty p closes its stdin.
func (e *ExecSession) Stdin(p []byte) error { return e.agent.Stdin(p) }

// CloseStdin closes the command's stdin.
func (e *ExecSession) CloseStdin() error { return e.agent.CloseStdin() }

// Resize changes the size of the command's terminal.
func (e *ExecSession) Resize(rows, cols uint16) error { return e.agent.Resize(rows, cols) }

// Signal sends a signal to the command's process group.
func (e *ExecSession) Signal(sig int) error { return e.agent.Signal(sig) }

// Close lets go of the command: it keeps running, and its end is still
// recorded when it comes. The agent is told nobody reads the output, so it
// drops it inside the sandbox and the host does no work for it; an older
// agent's output is dropped here, by the pump.
func (e *ExecSession) Close() error {
	e.detachOnce.Do(func() {
		close(e.detached)
		e.agent.Detach()
	})
	return nil
}

// Wait blocks until the command's end is recorded.
func (e *ExecSession) Wait(ctx context.Context) error {
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *ExecSession) finish(d ledger.ExecFinishedData) {
	e.once.Do(func() {
		d.Exec = e.id
		d.DurationMS = time.Since(e.start).Milliseconds()
		e.s.cfg.Metrics.ExecEnded(e.sb.Provider, exitClass(d), time.Since(e.start))
		// The request may be gone: its end is recorded in the sandbox's
		// project all the same.
		if err := e.s.cfg.Store.AddEvent(inProject(context.Background(), e.sb), e.sb, &store.EventSpec{Type: ledger.ExecFinished, Data: d}); err != nil {
			e.s.cfg.Log.Error("ledger: exec_finished", "sandbox", e.sb.ID, "exec", e.id, "err", err)
		}
		close(e.done)
	})
}

// leaving reports whether a sandbox in state is being (or was) taken down.
func leaving(state string) bool {
	switch state {
	case StateStopping, StateRemoving, StateStopped, StateFailed:
		return true
	}
	return false
}

// execSet is the running execs of every sandbox, so that a stop, a removal
// or a death ends their streams at once: the agent's connection would
// otherwise hang until TCP gives up, minutes later.
type execSet struct {
	mu sync.Mutex
	m  map[string]map[*ExecSession]struct{} // sandbox id → its execs; guarded by mu
}

func (x *execSet) add(id string, e *ExecSession) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.m == nil {
		x.m = map[string]map[*ExecSession]struct{}{}
	}
	if x.m[id] == nil {
		x.m[id] = map[*ExecSession]struct{}{}
	}
	x.m[id][e] = struct{}{}
}

func (x *execSet) remove(id string, e *ExecSession) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.m[id], e)
	if len(x.m[id]) == 0 {
		delete(x.m, id)
	}
}

// closeAll lets go of every running exec at Close: their connections
// close, their commands run on in the sandboxes, and their pumps end
// without recording an end they did not see.
func (x *execSet) closeAll() {
	x.mu.Lock()
	var all []*ExecSession
	for _, m := range x.m {
		for e := range m {
			all = append(all, e)
		}
	}
	x.mu.Unlock()
	for _, e := range all {
		e.connMu.Lock()
		if e.conn != nil {
			e.conn.Close()
		}
		e.connMu.Unlock()
	}
}

// end ends every exec still running in sandbox id: its processes were
// killed (by a stop, a removal, or the sandbox's end), and why is said in
// each stream's exit.
func (x *execSet) end(id, why string) {
	x.mu.Lock()
	var all []*ExecSession
	for e := range x.m[id] {
		all = append(all, e)
	}
	x.mu.Unlock()
	for _, e := range all {
		e.abort(ExecExit{Code: 137, Signal: 9, Error: why})
	}
}

// run runs argv in sb as an exec of its own (in the ledger like any), writes
// its output (stdout and stderr together) to out, and returns its exit code.
func (s *Service) run(ctx context.Context, sb *store.Sandbox, argv []string, out io.Writer) (int, error) {
	return s.runReq(ctx, sb, ExecRequest{Argv: argv}, ledger.ExecStartedData{Argv: argv}, out)
}

func (s *Service) runReq(ctx context.Context, sb *store.Sandbox, req ExecRequest, started ledger.ExecStartedData, out io.Writer) (int, error) {
	sess, _, err := s.exec(ctx, sb, req, started)
	if err != nil {
		return 0, err
	}
	defer sess.Close()
	for {
		f, err := sess.Recv()
		if err != nil {
			return 0, err
		}
		switch f.Kind {
		case ExecStdout, ExecStderr:
			out.Write(f.Data)
		case ExecExited:
			return f.Exit.Code, nil
		}
	}
}

// exitClass is how a command ended, for the metrics.
func exitClass(d ledger.ExecFinishedData) string {
	switch {
	case d.OOM:
		return metrics.ExitOOM
	case d.TimedOut:
		return metrics.ExitTimeout
	case d.Error != "" && d.ExitCode == nil:
		return metrics.ExitError
	case d.Signal != 0:
		return metrics.ExitSignal
	case d.ExitCode != nil && *d.ExitCode == 0:
		return metrics.ExitOK
	case d.ExitCode != nil:
		return metrics.ExitNonzero
	}
	return metrics.ExitError
}
