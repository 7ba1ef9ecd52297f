package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/useshards/shard/internal/framing"

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
