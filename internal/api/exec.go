package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"

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
	defer sess.Close() // the command keeps running if the client left
	if ar.Stdin {
		go func() {
			for len(stdin) > 0 {
				n := min(len(stdin), 64<<10)
				if sess.Stdin(stdin[:n]) != nil {
					return
				}
				stdin = stdin[n:]
			}
			sess.CloseStdin()
		}()
	}
	stop := context.AfterFunc(r.Context(), func() { sess.Close() })
	defer stop()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	enc.Encode(ExecEvent{Type: "started", PID: sess.PID})
	rc.Flush()
	for {
		typ, p, err := sess.Recv()
		if err != nil {
			if r.Context().Err() == nil {
				enc.Encode(ExecEvent{Type: "error", Data: base64.StdEncoding.EncodeToString([]byte("lost the connection to the sandbox: " + err.Error()))})
			}
			return
		}
		switch typ {
		case agent.FrameStdout, agent.FrameStderr:
			t := "stdout"
			if typ == agent.FrameStderr {
				t = "stderr"
			}
			enc.Encode(ExecEvent{Type: t, Data: base64.StdEncoding.EncodeToString(p)})
		case agent.FrameExit:
			var ex agent.Exit
			json.Unmarshal(p, &ex)
			code := ex.Code
			enc.Encode(ExecEvent{Type: "exit", ExitCode: &code, Signal: ex.Signal, TimedOut: ex.TimedOut, OOM: ex.OOM, Error: ex.Error})
			rc.Flush()
			return
		}
		rc.Flush()
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
	c.SetReadLimit(agent.MaxFrame)
	ctx := r.Context()
	started, _ := json.Marshal(agent.Started{PID: sess.PID})
	if err := c.Write(ctx, websocket.MessageBinary, append([]byte{agent.FrameStarted}, started...)); err != nil {
		return
	}
	go func() {
		for {
			_, msg, err := c.Read(ctx)
			if err != nil {
				sess.CloseStdin()
				sess.Close()
				return
			}
			if len(msg) == 0 {
				continue
			}
			switch msg[0] {
			case agent.FrameStdin:
				sess.Stdin(msg[1:])
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
		if err := c.Write(ctx, websocket.MessageBinary, append([]byte{typ}, p...)); err != nil {
			return
		}
		if typ == agent.FrameExit {
			c.Close(websocket.StatusNormalClosure, "")
			return
		}
	}
}
