package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/useshards/shard/internal/framing"
	"github.com/useshards/shard/internal/sandbox"

	"github.com/useshards/shard/client"
)

// TestExecStreamFailed: an exec stream that ends without the command's exit
// ends with the error errorBody made, in the stream's form: a frame of
// {code, message}, or an NDJSON error event with the message.
func TestExecStreamFailed(t *testing.T) {
	e := Error{Code: client.CodeSandboxUnreachable, Message: "lost the connection to the sandbox: EOF"}
	tests := []struct {
		name  string
		out   func(w *httptest.ResponseRecorder) execWriter
		check func(t *testing.T, body []byte)
	}{
		{"frames", func(w *httptest.ResponseRecorder) execWriter {
			return &frameWriter{w: w, rc: http.NewResponseController(w)}
		}, func(t *testing.T, body []byte) {
			typ, p, err := framing.Read(bytes.NewReader(body))
			var got Error
			if err != nil || typ != client.FrameError || json.Unmarshal(p, &got) != nil || got != e {
				t.Errorf("frame %q %s (%v), want %q %+v", typ, p, err, client.FrameError, e)
			}
		}},
		{"NDJSON", func(w *httptest.ResponseRecorder) execWriter {
			return &ndjsonWriter{enc: json.NewEncoder(w), rc: http.NewResponseController(w)}
		}, func(t *testing.T, body []byte) {
			var ev ExecEvent
			if err := json.Unmarshal(body, &ev); err != nil {
				t.Fatal(err)
			}
			msg, _ := base64.StdEncoding.DecodeString(ev.Data)
			if ev.Type != "error" || string(msg) != e.Message {
				t.Errorf("event %s, want an error event saying %q", body, e.Message)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			if err := tt.out(w).failed(e); err != nil {
				t.Fatal(err)
			}
			tt.check(t, w.Body.Bytes())
		})
	}
}

// The exec stream's frames are client's frame types with the payloads
// openapi.json gives, the same in the framed answer and on the WebSocket;
// the exit's JSON is byte for byte what the agent's was when the WebSocket
// passed it on as it came.
func TestStreamFrame(t *testing.T) {
	tests := []struct {
		name    string
		f       sandbox.ExecFrame
		wantTyp byte
		want    string
		wantOK  bool
	}{
		{"stdout", sandbox.ExecFrame{Kind: sandbox.ExecStdout, Data: []byte("out\x00")}, client.FrameStdout, "out\x00", true},
		{"stderr", sandbox.ExecFrame{Kind: sandbox.ExecStderr, Data: []byte("err")}, client.FrameStderr, "err", true},
		{"exit 0", sandbox.ExecFrame{Kind: sandbox.ExecExited}, client.FrameExit, `{"exit_code":0}`, true},
		{"an exit with every field", sandbox.ExecFrame{Kind: sandbox.ExecExited, Exit: sandbox.ExecExit{Code: 137, Signal: 9,
			TimedOut: true, OOM: true, Error: "why", StdinBytes: 1, StdoutBytes: 2, StderrBytes: 3, OutputCut: true}}, client.FrameExit,
			`{"exit_code":137,"signal":9,"timed_out":true,"oom_killed":true,"error":"why","stdin_bytes":1,"stdout_bytes":2,"stderr_bytes":3,"output_cut":true}`, true},
		{"no kind", sandbox.ExecFrame{Data: []byte("x")}, 0, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			typ, p, ok := streamFrame(tt.f)
			if typ != tt.wantTyp || string(p) != tt.want || ok != tt.wantOK {
				t.Errorf("streamFrame(%+v) = %q %q %v, want %q %q %v", tt.f, typ, p, ok, tt.wantTyp, tt.want, tt.wantOK)
			}
		})
	}
	if typ, p := startedFrame(42); typ != client.FrameStarted || string(p) != `{"pid":42}` {
		t.Errorf("startedFrame(42) = %q %q, want %q {\"pid\":42}", typ, p, client.FrameStarted)
	}
}

// The NDJSON form says the same as the frames, in events.
func TestNDJSONFrame(t *testing.T) {
	code := 3
	tests := []struct {
		name string
		f    sandbox.ExecFrame
		want ExecEvent
	}{
		{"stdout", sandbox.ExecFrame{Kind: sandbox.ExecStdout, Data: []byte("out")}, ExecEvent{Type: "stdout", Data: "b3V0"}},
		{"stderr", sandbox.ExecFrame{Kind: sandbox.ExecStderr, Data: []byte("err")}, ExecEvent{Type: "stderr", Data: "ZXJy"}},
		{"exit", sandbox.ExecFrame{Kind: sandbox.ExecExited, Exit: sandbox.ExecExit{Code: 3, Signal: 1, TimedOut: true, OOM: true,
			Error: "why", StdoutBytes: 9, OutputCut: true}},
			ExecEvent{Type: "exit", ExitCode: &code, Signal: 1, TimedOut: true, OOM: true, Error: "why", OutputCut: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			if err := (&ndjsonWriter{enc: json.NewEncoder(w), rc: http.NewResponseController(w)}).frame(tt.f); err != nil {
				t.Fatal(err)
			}
			want, _ := json.Marshal(tt.want)
			if got := bytes.TrimSpace(w.Body.Bytes()); !bytes.Equal(got, want) {
				t.Errorf("frame(%+v) wrote %s, want %s", tt.f, got, want)
			}
		})
	}
}

// TestRefusedExecWithOpenBody: an exec refused before it starts is answered
// while the client's framed body is still open (stdin from a terminal, or
// the CLI's signal frames, end only after the answer). net/http read such a
// body to its end before answering: the CLI's `shard exec SB nosuchcmd`
// waited for ever.
func TestRefusedExecWithOpenBody(t *testing.T) {
	s, _ := testServer(t)
	h := s.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, admin(r)) }))
	defer srv.Close()
	for _, tt := range []struct {
		name, frame string
		more        int64 // bytes sent after the request frame; the body then ends
		status      int
	}{
		{"refused where it is routed", `{"argv":["nosuchcmd"]}`, -1, 0}, // this Server has no sandboxes: whatever it answers
		{"bad request", `{"argv":[]}`, -1, http.StatusBadRequest},
		// A client still sending reads the answer before the close.
		{"refused while 40MiB more come", `{"argv":["nosuchcmd"]}`, 40 << 20, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pr, pw := io.Pipe()
			defer pw.Close()
			go func() {
				framing.Write(pw, client.FrameRequest, []byte(tt.frame))
				if tt.more < 0 {
					return // and nothing more: the body stays open
				}
				io.Copy(pw, io.LimitReader(zeros{}, tt.more))
				pw.Close()
			}()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v0/sandboxes/nosuch/exec", pr)
			req.Header.Set("Content-Type", StreamMediaType)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatalf("no answer while the body is open: %v", err)
			}
			defer resp.Body.Close()
			var got Error
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode < 400 || tt.status != 0 && resp.StatusCode != tt.status || got.Code == "" {
				t.Fatalf("= %d %+v (%v); want %d with the error JSON", resp.StatusCode, got, err, tt.status)
			}
		})
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }
