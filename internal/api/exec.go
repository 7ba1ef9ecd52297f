package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/useshards/shard/internal/agent"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/names"
)

// agentRequest checks an exec request (both forms) and makes the agent's.
func agentRequest(req *ExecRequest) (agent.Request, error) {
	ar := agent.Request{Argv: req.Argv, Dir: req.Workdir, User: req.User, TTY: req.TTY, Rows: req.Rows, Cols: req.Cols}
	if err := checkArgv("command", req.Argv); err != nil {
		return ar, err
	}
	env, err := envField(req.Env)
	if err != nil {
		return ar, err
	}
	ar.Env = env
	if ar.TimeoutMS, err = execTimeout(req.Timeout); err != nil {
		return ar, err
	}
	if req.Workdir != "" && !strings.HasPrefix(req.Workdir, "/") {
		return ar, errdefs.Invalid("workdir %q must be an absolute path", req.Workdir)
	}
	if err := names.NoNUL("workdir", req.Workdir); err != nil {
		return ar, err
	}
	return ar, names.NoNUL("user", req.User)
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
	ar, stdin, err := parseExec(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sess, _, err := s.Sandboxes.Exec(r.Context(), r.PathValue("id"), ar)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// If the client leaves (or stalls), the command keeps running and the
	// sandbox drops its output; the ledger still gets its end.
	defer sess.Close()
	if ar.Stdin {
		go func() {
			// Only as fast as the command reads it (see agent.Session.Stdin).
			if sess.Stdin(stdin) == nil {
				sess.CloseStdin()
			}
		}()
	}
	stop := context.AfterFunc(r.Context(), func() { sess.Close() })
	defer stop()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	send := func(ev ExecEvent) error {
		rc.SetWriteDeadline(time.Now().Add(streamStall))
		if err := enc.Encode(ev); err != nil {
			return err
		}
		return rc.Flush()
	}
	if send(ExecEvent{Type: "started", PID: sess.PID}) != nil {
		return
	}
	for {
		typ, p, err := sess.Recv()
		if err != nil {
			if r.Context().Err() == nil {
				send(ExecEvent{Type: "error", Data: base64.StdEncoding.EncodeToString([]byte("lost the connection to the sandbox: " + err.Error()))})
			}
			return
		}
		switch typ {
		case agent.FrameStdout, agent.FrameStderr:
			t := "stdout"
			if typ == agent.FrameStderr {
				t = "stderr"
			}
			if send(ExecEvent{Type: t, Data: base64.StdEncoding.EncodeToString(p)}) != nil {
				return // the client is gone or stalled
			}
		case agent.FrameExit:
			var ex agent.Exit
			json.Unmarshal(p, &ex)
			code := ex.Code
			send(ExecEvent{Type: "exit", ExitCode: &code, Signal: ex.Signal, TimedOut: ex.TimedOut, OOM: ex.OOM, Error: ex.Error})
			return
		}
	}
}

// execWebSocket is the interactive form: GET with ?request=<ExecRequest JSON>
// and a WebSocket upgrade. Every message is binary: one frame-type byte
// (the agent's: 'I' stdin, 'R' resize, 'K' signal from the client; 'S'
// started, 'O' stdout, 'E' stderr, 'X' exit from the server) then the
// payload. An empty 'I' closes stdin.
func (s *Server) execWebSocket(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		s.writeError(w, r, errdefs.Invalid("exec over GET is the WebSocket form: upgrade the connection, or POST the request"))
		return
	}
	raw := r.URL.Query().Get("request")
	if raw == "" {
		s.writeError(w, r, errdefs.Invalid("exec over GET is the WebSocket form: pass ?request=<JSON> and upgrade, or POST the request"))
		return
	}
	var req ExecRequest
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		s.writeError(w, r, errdefs.Invalid("request is not valid JSON: %v", err))
		return
	}
	if dec.More() {
		s.writeError(w, r, errdefs.Invalid("request has more than one JSON value"))
		return
	}
	ar, err := agentRequest(&req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ar.Stdin = req.Interactive || req.TTY
	sess, _, err := s.Sandboxes.Exec(r.Context(), r.PathValue("id"), ar)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer sess.Close()
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return
	}
	defer c.CloseNow()
	// The reader below reads at most maxWSMessage+1 bytes of a message
	// itself, to close with a reason that says what to do; the library's
	// own limit is only a backstop past that.
	c.SetReadLimit(maxWSMessage + 1)
	ctx := r.Context()
	write := func(typ byte, p []byte) error {
		// A client that takes nothing for streamStall is taken as gone
		// (the library closes the connection when wctx ends).
		wctx, cancel := context.WithTimeout(ctx, streamStall)
		defer cancel()
		return c.Write(wctx, websocket.MessageBinary, append([]byte{typ}, p...))
	}
	started, _ := json.Marshal(agent.Started{PID: sess.PID})
	if err := write(agent.FrameStarted, started); err != nil {
		return
	}
	go func() {
		// One message at a time, and the next only once this one went to
		// the agent: stdin moves as fast as the command reads it (the
		// agent holds a small window), and a client that sends faster is
		// held up by TCP, not queued here or in the sandbox.
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
			switch msg[0] {
			case agent.FrameStdin:
				if len(msg) > 1 {
					if sess.Stdin(msg[1:]) != nil {
						return
					}
				} else {
					sess.CloseStdin()
				}
			case agent.FrameResize:
				var rz agent.Resize
				if json.Unmarshal(msg[1:], &rz) == nil {
					sess.Resize(rz.Rows, rz.Cols)
				}
			case agent.FrameSignal:
				var sg agent.Signal
				if json.Unmarshal(msg[1:], &sg) == nil {
					sess.Signal(sg.Signal)
				}
			}
		}
	}()
	for {
		typ, p, err := sess.Recv()
		if err != nil {
			c.Close(websocket.StatusInternalError, "lost the connection to the sandbox")
			return
		}
		if err := write(typ, p); err != nil {
			return // the client is gone or stalled: the deferred Close lets go of the exec
		}
		if typ == agent.FrameExit {
			c.Close(websocket.StatusNormalClosure, "")
			return
		}
	}
}
