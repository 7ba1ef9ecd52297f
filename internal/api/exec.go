package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/useshards/shard/internal/framing"

	"github.com/coder/websocket"
	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/names"
	"github.com/useshards/shard/internal/sandbox"
)

// execRequest checks an exec request (both forms) and makes the sandbox
// service's of it.
func execRequest(req *ExecRequest) (sandbox.ExecRequest, error) {
	er := sandbox.ExecRequest{Argv: req.Argv, Workdir: req.Workdir, User: req.User, TTY: req.TTY, Rows: req.Rows, Cols: req.Cols}
	if err := checkArgv("command", req.Argv); err != nil {
		return er, err
	}
	env, err := envField(req.Env)
	if err != nil {
		return er, err
	}
	er.Env = env
	ms, err := execTimeout(req.Timeout)
	if err != nil {
		return er, err
	}
	er.Timeout = time.Duration(ms) * time.Millisecond
	if req.Workdir != "" && !strings.HasPrefix(req.Workdir, "/") {
		return er, errdefs.Invalid("workdir %q must be an absolute path", req.Workdir)
	}
	if err := names.NoNUL("workdir", req.Workdir); err != nil {
		return er, err
	}
	return er, names.NoNUL("user", req.User)
}

// startedFrame is the exec stream's first frame, the same in the framed
// answer and on the WebSocket.
func startedFrame(pid int) (typ byte, p []byte) {
	p, _ = json.Marshal(ExecStarted{PID: pid})
	return client.FrameStarted, p
}

// streamFrame is f on the exec stream: its type (client.Frame*) and
// payload, the same in the framed answer and on the WebSocket. ok is false
// for a frame the stream does not carry.
func streamFrame(f sandbox.ExecFrame) (typ byte, p []byte, ok bool) {
	switch f.Kind {
	case sandbox.ExecStdout:
		return client.FrameStdout, f.Data, true
	case sandbox.ExecStderr:
		return client.FrameStderr, f.Data, true
	case sandbox.ExecExited:
		ex := f.Exit
		p, _ = json.Marshal(ExecExit{Code: ex.Code, Signal: ex.Signal, TimedOut: ex.TimedOut, OOM: ex.OOM, Error: ex.Error,
			StdinBytes: ex.StdinBytes, StdoutBytes: ex.StdoutBytes, StderrBytes: ex.StderrBytes, OutputCut: ex.OutputCut})
		return client.FrameExit, p, true
	}
	return 0, nil, false
}

// clientFrame hands one frame from the client (a framed body's, or a
// WebSocket message) to the command: client.FrameStdin (empty: close
// stdin), FrameSignal or FrameResize; other types are ignored. An error is
// stdin's: the command takes no more of it.
func clientFrame(sess *sandbox.ExecSession, typ byte, p []byte) error {
	switch typ {
	case client.FrameStdin:
		if len(p) == 0 {
			sess.CloseStdin()
			return nil
		}
		return sess.Stdin(p)
	case client.FrameSignal:
		var sg ExecSignal
		if json.Unmarshal(p, &sg) == nil {
			sess.Signal(sg.Signal)
		}
	case client.FrameResize:
		var rz ExecResize
		if json.Unmarshal(p, &rz) == nil {
			sess.Resize(rz.Rows, rz.Cols)
		}
	}
	return nil
}

// streamStall is how long an exec stream waits for a client that takes
// none of its output before it takes the client as gone: the exec is let go
// (it runs on, its end still in the ledger) and the stream ends. Shorter
// than the agent's own 30 s, so the agent is told before it gives up.
const streamStall = 20 * time.Second

// maxWSMessage bounds one message from a WebSocket exec client: stdin
// bigger than this comes in more messages.
const maxWSMessage = 1 << 20

func (s *Server) execStream(w http.ResponseWriter, r *http.Request) {
	framed := mediaType(r.Header.Get("Content-Type")) == StreamMediaType
	var er sandbox.ExecRequest
	var stdin []byte
	var err error
	if framed {
		er, err = parseFramedExec(r)
	} else {
		er, stdin, err = parseExec(r)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sess, _, err := s.Sandboxes.Exec(r.Context(), r.PathValue("id"), er)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// If the client leaves (or stalls), the command keeps running and the
	// sandbox drops its output; the ledger still gets its end.
	defer sess.Close()
	rc := http.NewResponseController(w)
	var body *framedBody
	switch {
	case framed:
		// The body is read while the response is written: stdin, signals
		// and resizes come as the command runs.
		rc.EnableFullDuplex()
		body = &framedBody{done: make(chan struct{})}
		go body.pump(r, sess)
		// The body is never read once the handler returned (net/http
		// forbids it): a body still open at the command's end is cut, and
		// its connection closes.
		defer func() {
			select {
			case <-body.done:
			default:
				rc.SetReadDeadline(time.Now())
				<-body.done
			}
		}()
	case er.Stdin:
		go func() {
			// Only as fast as the command reads it (see ExecSession.Stdin).
			if sess.Stdin(stdin) == nil {
				sess.CloseStdin()
			}
		}()
	}
	stop := context.AfterFunc(r.Context(), func() { sess.Close() })
	defer stop()
	defer s.onStopping(func() {
		sess.Close()
		rc.SetWriteDeadline(time.Now().Add(time.Second)) // a write in flight to a client that reads nothing
	})()
	out := startStream(w, rc, framed || acceptsStream(r), framed, s.Stopping)
	if out.started(sess.PID) != nil {
		return
	}
	s.relay(w, r, sess, out, body)
}

// startStream answers 200 with the stream's headers: frames (binary) or
// NDJSON; a framed body's answer closes its connection after it.
func startStream(w http.ResponseWriter, rc *http.ResponseController, frames, framedBody bool, stop <-chan struct{}) execWriter {
	var out execWriter
	if frames {
		out = &frameWriter{w: w, rc: rc, stop: stop}
		w.Header().Set("Content-Type", StreamMediaType)
	} else {
		out = &ndjsonWriter{enc: json.NewEncoder(w), rc: rc, stop: stop}
		w.Header().Set("Content-Type", "application/x-ndjson")
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if framedBody {
		// A full-duplex body may end after the response does, or never:
		// the connection serves no other request. (Kept alive, net/http
		// read the rest of such a body for the next request's sake while
		// a read of its own was pending: a panic in its connection loop,
		// or a plain-text 400 to the next request.)
		w.Header().Set("Connection", "close")
	}
	w.WriteHeader(http.StatusOK)
	return out
}

// relay writes the command's frames to out until its exit, and says why
// when the stream ends without one.
func (s *Server) relay(w http.ResponseWriter, r *http.Request, sess *sandbox.ExecSession, out execWriter, body *framedBody) {
	for {
		f, err := sess.Recv()
		if err != nil {
			switch {
			case s.isStopping():
				out.failed(Error{Code: client.CodeServerStopping, Message: stoppingMessage})
			case body != nil && body.bad.Load() != nil:
				// The client's stdin is not what it meant: the command is
				// let go (it runs on, its end in the ledger).
				_, e := s.failedAnswer(w, r, errdefs.Invalid("the request body: %s; the command was let go (it runs on)", body.bad.Load().Error()))
				out.failed(e)
			case r.Context().Err() == nil:
				_, e := s.failedAnswer(w, r, errdefs.Upstream(client.CodeSandboxUnreachable, "lost the connection to the sandbox: %v", err))
				out.failed(e)
			}
			return
		}
		if out.frame(f) != nil || f.Kind == sandbox.ExecExited {
			return // the exit was the last, or the client is gone or stalled
		}
	}
}

// closeSoon closes c with code and reason, giving the client a second to
// answer the close: one that reads nothing must not hold a shutdown up.
func closeSoon(c *websocket.Conn, code websocket.StatusCode, reason string) {
	done := make(chan struct{})
	go func() {
		c.Close(code, reason)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
		c.CloseNow()
		<-done
	}
}

// parseWebSocketExec reads a WebSocket exec's request: ?request=<JSON>,
// read as strictly as a body.
func parseWebSocketExec(r *http.Request) (sandbox.ExecRequest, error) {
	raw := r.URL.Query().Get("request")
	if raw == "" {
		return sandbox.ExecRequest{}, errdefs.Invalid("exec over GET is the WebSocket form: pass ?request=<JSON> and upgrade, or POST the request")
	}
	var req ExecRequest
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return sandbox.ExecRequest{}, errdefs.Invalid("request is not valid JSON: %v", err)
	}
	if dec.More() {
		return sandbox.ExecRequest{}, errdefs.Invalid("request has more than one JSON value")
	}
	er, err := execRequest(&req)
	if err != nil {
		return sandbox.ExecRequest{}, err
	}
	er.Stdin = req.Interactive || req.TTY
	return er, nil
}

// readWebSocket hands the client's messages (stdin, resizes, signals) to
// the command, one message at a time, and the next only once this one
// went to the agent: stdin moves as fast as the command reads it (the
// agent holds a small window), and a client that sends faster is held up
// by TCP, not queued here or in the sandbox. It lets go of the exec when
// the client ends.
func readWebSocket(ctx context.Context, c *websocket.Conn, sess *sandbox.ExecSession) {
	defer sess.Close()
	defer sess.CloseStdin()
	for {
		_, mr, err := c.Reader(ctx)
		if err != nil {
			return
		}
		msg, err := io.ReadAll(io.LimitReader(mr, maxWSMessage+1))
		if err != nil {
			return
		}
		if len(msg) > maxWSMessage {
			c.Close(websocket.StatusMessageTooBig, fmt.Sprintf("message of more than %d bytes: send stdin in smaller messages", maxWSMessage))
			return
		}
		if len(msg) == 0 {
			continue
		}
		if clientFrame(sess, msg[0], msg[1:]) != nil {
			return
		}
	}
}

// StreamMediaType is the binary exec stream (docs/exec-stream.md): frames
// of a type byte, a 4-byte big-endian length and the payload, both ways.
const StreamMediaType = client.StreamMediaType

// maxClientFrame bounds one frame of a framed request body past its first
// (the request, bounded like a JSON body).
const maxClientFrame = 1 << 20

// parseFramedExec reads a framed body's first frame, the request, and
// checks it as a JSON body is checked. The rest of the body (stdin,
// signals, resizes) is left to pumpFramedBody.
func parseFramedExec(r *http.Request) (sandbox.ExecRequest, error) {
	typ, p, err := framing.ReadMax(r.Body, MaxBody)
	var big *framing.ErrTooBig
	switch {
	case errors.As(err, &big):
		return sandbox.ExecRequest{}, errdefs.New(errdefs.KindTooLarge, client.CodeBodyTooLarge, "the request frame is larger than %d bytes", MaxBody)
	case err != nil:
		return sandbox.ExecRequest{}, errdefs.Invalid("read the request frame: %v", err)
	case typ != client.FrameRequest:
		return sandbox.ExecRequest{}, errdefs.Invalid("a framed exec body starts with a %q frame holding the request, not %q", client.FrameRequest, typ)
	}
	var req ExecRequest
	if err := decodeJSON(p, &req); err != nil {
		return sandbox.ExecRequest{}, err
	}
	if req.Stdin != nil {
		return sandbox.ExecRequest{}, errdefs.Invalid("a framed exec body sends stdin in %q frames, not in the request's \"stdin\"", client.FrameStdin)
	}
	er, err := execRequest(&req)
	if err != nil {
		return er, err
	}
	// The request came: what follows is stdin, which may rightly be
	// quiet for as long as the command runs.
	if b, ok := r.Body.(interface{ lift() }); ok {
		b.lift()
	}
	er.Stdin = true
	return er, nil
}

// framedBody is a framed exec body's stdin, signals and resizes on their
// way to the command.
type framedBody struct {
	done chan struct{}                     // closed when pump returned
	bad  atomic.Pointer[framing.ErrTooBig] // the client broke the framing: the stream ends saying so
}

// pump hands the body's frames to the command one at a time: the next frame
// is read only once the last reached the sandbox, so stdin moves as fast as
// the command reads it.
func (b *framedBody) pump(r *http.Request, sess *sandbox.ExecSession) {
	defer close(b.done)
	defer sess.CloseStdin()
	var buf []byte // each frame is sent on before the next is read
	for {
		typ, p, err := framing.ReadInto(r.Body, maxClientFrame, buf)
		if cap(p) > cap(buf) {
			buf = p[:0]
		}
		if err != nil {
			var big *framing.ErrTooBig
			if errors.As(err, &big) {
				// The client's stdin is not what it meant: the command
				// is let go (it runs on, its end in the ledger).
				b.bad.Store(big)
				sess.Close()
			}
			return // io.EOF: the body's end closes stdin
		}
		if clientFrame(sess, typ, p) != nil {
			return
		}
	}
}

// acceptsStream reports whether the request's Accept names the binary
// stream.
func acceptsStream(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			if mediaType(part) == StreamMediaType {
				return true
			}
		}
	}
	return false
}

// mediaType is a header value's media type, lower case, without parameters.
func mediaType(v string) string {
	v, _, _ = strings.Cut(v, ";")
	return strings.ToLower(strings.TrimSpace(v))
}

// execWriter writes one exec's stream in the form the client asked for.
type execWriter interface {
	started(pid int) error
	frame(f sandbox.ExecFrame) error // output, or the exit
	failed(e Error) error            // the stream's end without the command's: its last event
}

// stoppingMessage ends an exec's stream cut by a shutdown: the agent keeps
// the command, but no server is left to see its end.
const stoppingMessage = "the server is shutting down; the command runs on in the sandbox (its end is not recorded)"

// ndjsonWriter is the simple form: a JSON event a line, bytes in base64.
type ndjsonWriter struct {
	enc  *json.Encoder
	rc   *http.ResponseController
	stop <-chan struct{} // the server's Stopping
}

// writeDeadline is a write's deadline: streamStall, or a second once the
// server is stopping (a client that takes nothing must not hold the
// shutdown up).
func writeDeadline(stop <-chan struct{}) time.Time {
	select {
	case <-stop:
		return time.Now().Add(time.Second)
	default:
		return time.Now().Add(streamStall)
	}
}

func (n *ndjsonWriter) send(ev ExecEvent) error {
	n.rc.SetWriteDeadline(writeDeadline(n.stop))
	if err := n.enc.Encode(ev); err != nil {
		return err
	}
	return n.rc.Flush()
}

func (n *ndjsonWriter) started(pid int) error { return n.send(ExecEvent{Type: "started", PID: pid}) }

func (n *ndjsonWriter) frame(f sandbox.ExecFrame) error {
	switch f.Kind {
	case sandbox.ExecStdout:
		return n.send(ExecEvent{Type: "stdout", Data: base64.StdEncoding.EncodeToString(f.Data)})
	case sandbox.ExecStderr:
		return n.send(ExecEvent{Type: "stderr", Data: base64.StdEncoding.EncodeToString(f.Data)})
	case sandbox.ExecExited:
		ex := f.Exit
		code := ex.Code
		return n.send(ExecEvent{Type: "exit", ExitCode: &code, Signal: ex.Signal, TimedOut: ex.TimedOut, OOM: ex.OOM, Error: ex.Error, OutputCut: ex.OutputCut})
	}
	return nil
}

// failed sends the error event: its message, and its code (what ended the
// stream).
func (n *ndjsonWriter) failed(e Error) error {
	return n.send(ExecEvent{Type: "error", Data: base64.StdEncoding.EncodeToString([]byte(e.Message)), Code: e.Code})
}

// frameWriter is the binary form: the bytes as they are, in frames.
type frameWriter struct {
	w    io.Writer
	rc   *http.ResponseController
	stop <-chan struct{} // the server's Stopping
}

func (f *frameWriter) send(typ byte, p []byte) error {
	f.rc.SetWriteDeadline(writeDeadline(f.stop))
	if err := framing.Write(f.w, typ, p); err != nil {
		return err
	}
	return f.rc.Flush()
}

func (f *frameWriter) sendJSON(typ byte, v any) error {
	b, _ := json.Marshal(v)
	return f.send(typ, b)
}

func (f *frameWriter) started(pid int) error { return f.send(startedFrame(pid)) }

func (f *frameWriter) frame(fr sandbox.ExecFrame) error {
	typ, p, ok := streamFrame(fr)
	if !ok {
		return nil
	}
	return f.send(typ, p)
}

func (f *frameWriter) failed(e Error) error { return f.sendJSON(client.FrameError, e) }

// execWebSocket is the interactive form: GET with ?request=<ExecRequest JSON>
// and a WebSocket upgrade. Every message is binary: one frame-type byte
// (client.Frame*, as in the framed form: 'I' stdin, 'R' resize, 'K' signal
// from the client; 'S' started, 'O' stdout, 'E' stderr, 'X' exit from the
// server) then the payload. An empty 'I' closes stdin.
func (s *Server) execWebSocket(w http.ResponseWriter, r *http.Request) {
	// A hijacked connection is not waited for by http.Server.Shutdown:
	// the daemon waits for it (WaitStreams).
	release, ok := s.streams.Hold()
	if !ok {
		s.writeError(w, r, errdefs.Unavailable(client.CodeServerStopping, "the server is shutting down"))
		return
	}
	defer release()
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		s.writeError(w, r, errdefs.Invalid("exec over GET is the WebSocket form: upgrade the connection, or POST the request"))
		return
	}
	er, err := parseWebSocketExec(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sess, _, err := s.Sandboxes.Exec(r.Context(), r.PathValue("id"), er)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer sess.Close()
	// The exec protocol is picked when offered: a browser that offered its
	// key as a subprotocol must get one of its own back.
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, Subprotocols: []string{client.ExecProtocol}})
	if err != nil {
		return
	}
	defer c.CloseNow()
	// The reader below reads at most maxWSMessage+1 bytes of a message
	// itself, to close with a reason that says what to do; the library's
	// own limit is only a backstop past that.
	c.SetReadLimit(maxWSMessage + 1)
	ctx := r.Context()
	// Writes end with wsctx: a second after the server starts stopping, a
	// write in flight to a client that reads nothing is cut.
	wsctx, cutWrites := context.WithCancel(ctx)
	defer cutWrites()
	write := func(typ byte, p []byte) error {
		// A client that takes nothing for streamStall is taken as gone
		// (the library closes the connection when wctx ends).
		wctx, cancel := context.WithDeadline(wsctx, writeDeadline(s.Stopping))
		defer cancel()
		return c.Write(wctx, websocket.MessageBinary, append([]byte{typ}, p...))
	}
	if err := write(startedFrame(sess.PID)); err != nil {
		return
	}
	go readWebSocket(ctx, c, sess)
	defer s.onStopping(func() {
		sess.Close()
		time.AfterFunc(time.Second, cutWrites)
	})()
	for {
		f, err := sess.Recv()
		if err != nil && s.isStopping() {
			closeSoon(c, websocket.StatusGoingAway, stoppingMessage)
			return
		}
		if err != nil {
			c.Close(websocket.StatusInternalError, "lost the connection to the sandbox")
			return
		}
		if typ, p, ok := streamFrame(f); ok {
			if err := write(typ, p); err != nil {
				return // the client is gone or stalled: the deferred Close lets go of the exec
			}
		}
		if f.Kind == sandbox.ExecExited {
			c.Close(websocket.StatusNormalClosure, "")
			return
		}
	}
}
