package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/coder/websocket"
)

// The WebSocket exec stream's messages are a frame-type byte (the binary
// stream's, see StreamMediaType) and the payload.

// ExecSession is an interactive exec over a WebSocket: stdin, resize and
// signals go in while output comes out.
type ExecSession struct {
	ws *websocket.Conn
}

// ExecInteractive starts a command with a live stdin (and a TTY if req.TTY).
func (c *Client) ExecInteractive(ctx context.Context, idOrName string, req ExecRequest) (*ExecSession, error) {
	req.Interactive = true
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	path := "/v0/sandboxes/" + esc(idOrName) + "/exec"
	if err := checkPath(path); err != nil {
		return nil, err
	}
	u := strings.Replace(c.base, "http", "ws", 1) + path + "?request=" + url.QueryEscape(string(b))
	opts := &websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: http.Header{}}
	c.authorize(opts.HTTPHeader)
	ws, resp, err := websocket.Dial(ctx, u, opts)
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 {
			defer resp.Body.Close()
			return nil, readError(resp)
		}
		return nil, c.connErr(err)
	}
	ws.SetReadLimit(16 << 20)
	return &ExecSession{ws: ws}, nil
}

func (s *ExecSession) send(ctx context.Context, typ byte, p []byte) error {
	return s.ws.Write(ctx, websocket.MessageBinary, append([]byte{typ}, p...))
}

// ExecResize is a resize frame's payload (openapi.json's ExecResize).
type ExecResize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// ExecSignal is a signal frame's payload (openapi.json's ExecSignal).
type ExecSignal struct {
	Signal int `json:"signal"`
}

// Resize changes the TTY's size.
func (s *ExecSession) Resize(ctx context.Context, rows, cols uint16) error {
	b, _ := json.Marshal(ExecResize{Rows: rows, Cols: cols})
	return s.send(ctx, FrameResize, b)
}

// Signal sends a signal to the command's process group.
func (s *ExecSession) Signal(ctx context.Context, sig int) error {
	b, _ := json.Marshal(ExecSignal{Signal: sig})
	return s.send(ctx, FrameSignal, b)
}

// Run copies stdin in (closing the command's stdin at EOF) and output out
// until the command exits.
func (s *ExecSession) Run(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) (*ExecResult, error) {
	defer s.ws.CloseNow()
	if stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := stdin.Read(buf)
				if n > 0 {
					if s.send(ctx, FrameStdin, buf[:n]) != nil {
						return
					}
				}
				if err != nil {
					s.send(ctx, FrameStdin, nil)
					return
				}
			}
		}()
	}
	for {
		_, msg, err := s.ws.Read(ctx)
		if err != nil {
			return nil, errors.New("the exec stream ended before the command did: " + err.Error())
		}
		if len(msg) == 0 {
			continue
		}
		switch msg[0] {
		case FrameStdout:
			if stdout != nil {
				stdout.Write(msg[1:])
			}
		case FrameStderr:
			if stderr != nil {
				stderr.Write(msg[1:])
			}
		case FrameExit:
			var ex ExecExit
			json.Unmarshal(msg[1:], &ex)
			s.ws.Close(websocket.StatusNormalClosure, "")
			return ex.result(), nil
		}
	}
}
