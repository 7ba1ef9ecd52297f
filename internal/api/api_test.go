package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"

	"github.com/useshards/shard/internal/errdefs"
)

type decodeTarget struct {
	Name  string            `json:"name"`
	Count int               `json:"count"`
	Tags  []string          `json:"tags"`
	Meta  map[string]string `json:"meta"`
	On    bool              `json:"on"`
}

func request(body io.Reader) *http.Request {
	return httptest.NewRequest(http.MethodPost, "/v0/sandboxes", body)
}

func TestDecodeValid(t *testing.T) {
	tests := []struct {
		name string
		body string
		want decodeTarget
	}{
		{"full", `{"name":"a","count":2,"tags":["x","y"],"meta":{"k":"v"},"on":true}`,
			decodeTarget{Name: "a", Count: 2, Tags: []string{"x", "y"}, Meta: map[string]string{"k": "v"}, On: true}},
		{"empty body is {}", "", decodeTarget{}},
		{"blank body is {}", " \n\t\r\n", decodeTarget{}},
		{"empty object", "{}", decodeTarget{}},
		{"surrounding space", "\n  {\"name\": \"b\"}  \n\n", decodeTarget{Name: "b"}},
		{"null field", `{"name":null,"count":1}`, decodeTarget{Count: 1}},
		{"unicode", `{"name":"\u00e9t\u00e9 ✓"}`, decodeTarget{Name: "été ✓"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got decodeTarget
			if err := decode(request(strings.NewReader(tt.body)), &got); err != nil {
				t.Fatalf("decode(%q) error = %v, want nil", tt.body, err)
			}
			if fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", tt.want) {
				t.Errorf("decode(%q) = %#v, want %#v", tt.body, got, tt.want)
			}
		})
	}
}

func TestDecodeInvalid(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		wantMsgs []string // each must appear in the message
	}{
		{"truncated", `{"name":"a"`, []string{"not valid JSON"}},
		{"garbage", `nope`, []string{"not valid JSON", "at byte"}},
		{"trailing comma", `{"name":"a",}`, []string{"not valid JSON"}},
		{"single quotes", `{'name':'a'}`, []string{"not valid JSON"}},
		{"unknown field", `{"name":"a","extra":1}`, []string{`unknown field "extra"`}},
		{"field names are not case-folded into unknown ones", `{"nmae":"a"}`, []string{`unknown field "nmae"`}},
		{"wrong type: string for int", `{"count":"two"}`, []string{`"count"`, "int", "string"}},
		{"wrong type: number for string", `{"name":5}`, []string{`"name"`, "string", "number"}},
		{"wrong type: object for list", `{"tags":{}}`, []string{`"tags"`}},
		{"wrong type: array for the body", `[]`, []string{"must be"}},
		{"wrong type: string for the body", `"x"`, []string{"must be"}},
		{"int overflow", `{"count":1e400}`, []string{`"count"`}},
		{"two values", `{} {}`, []string{"more than one JSON value"}},
		{"two values, second garbage", `{"name":"a"} x`, []string{"more than one JSON value"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got decodeTarget
			err := decode(request(strings.NewReader(tt.body)), &got)
			if err == nil {
				t.Fatalf("decode(%q) = nil error (decoded %+v), want invalid_argument", tt.body, got)
			}
			if code := errdefs.CodeOf(err); code != "invalid_argument" {
				t.Errorf("decode(%q) code = %q, want %q (err %v)", tt.body, code, "invalid_argument", err)
			}
			if kind := errdefs.KindOf(err); kind != errdefs.KindInvalid || statusOf(kind) != http.StatusBadRequest {
				t.Errorf("decode(%q) kind = %q (status %d), want %q (400)", tt.body, kind, statusOf(kind), errdefs.KindInvalid)
			}
			for _, m := range tt.wantMsgs {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("decode(%q) = %q, want it to mention %q", tt.body, err, m)
				}
			}
			if !strings.Contains(err.Error(), "request body") {
				t.Errorf("decode(%q) = %q, want it to say it is about the request body", tt.body, err)
			}
		})
	}
}

// Trailing closing brackets after the value are a second (broken) value,
// not padding: decode must refuse them like any other trailing data.
func TestDecodeTrailingBracket(t *testing.T) {
	for _, body := range []string{`{}}`, `{"name":"a"}]`, `{} ]`} {
		var got decodeTarget
		err := decode(request(strings.NewReader(body)), &got)
		if err == nil {
			t.Fatalf("decode(%q) = nil, want invalid_argument (json.Decoder.More() is false before '}' and ']')", body)
		}
		if errdefs.CodeOf(err) != "invalid_argument" {
			t.Errorf("decode(%q) code = %q, want invalid_argument", body, errdefs.CodeOf(err))
		}
	}
}

func TestDecodeBodySize(t *testing.T) {
	// {"name":"aaa…"} of exactly n bytes.
	body := func(n int) string {
		const frame = `{"name":""}`
		return `{"name":"` + strings.Repeat("a", n-len(frame)) + `"}`
	}
	tests := []struct {
		name     string
		body     string
		wantCode string // "" for success
	}{
		{"exactly MaxBody", body(MaxBody), ""},
		{"MaxBody+1", body(MaxBody + 1), "body_too_large"},
		{"twice MaxBody", body(2 * MaxBody), "body_too_large"},
		{"MaxBody of spaces then JSON", strings.Repeat(" ", MaxBody) + "{}", "body_too_large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got decodeTarget
			err := decode(request(strings.NewReader(tt.body)), &got)
			if tt.wantCode == "" {
				if err != nil {
					t.Fatalf("decode(%d bytes) error = %v, want nil", len(tt.body), err)
				}
				if want := len(tt.body) - len(`{"name":""}`); len(got.Name) != want {
					t.Errorf("decode(%d bytes) name has %d bytes, want %d", len(tt.body), len(got.Name), want)
				}
				return
			}
			if code := errdefs.CodeOf(err); code != tt.wantCode {
				t.Fatalf("decode(%d bytes) = %v (code %q), want code %q", len(tt.body), err, code, tt.wantCode)
			}
			if kind := errdefs.KindOf(err); kind != errdefs.KindTooLarge || statusOf(kind) != http.StatusRequestEntityTooLarge {
				t.Errorf("decode(%d bytes) kind = %q (status %d), want %q (413)", len(tt.body), kind, statusOf(kind), errdefs.KindTooLarge)
			}
			if !strings.Contains(err.Error(), fmt.Sprint(MaxBody)) {
				t.Errorf("decode(%d bytes) = %q, want it to state the limit %d", len(tt.body), err, MaxBody)
			}
		})
	}
}

func TestDecodeReadError(t *testing.T) {
	boom := errors.New("connection reset")
	var got decodeTarget
	err := decode(request(iotest.ErrReader(boom)), &got)
	if errdefs.CodeOf(err) != "invalid_argument" || !strings.Contains(err.Error(), "connection reset") {
		t.Errorf("decode(failing body) = %v (code %q), want invalid_argument mentioning the cause", err, errdefs.CodeOf(err))
	}
}

func TestStatusOf(t *testing.T) {
	tests := []struct {
		kind errdefs.Kind
		want int
	}{
		{errdefs.KindInvalid, http.StatusBadRequest},
		{errdefs.KindNotFound, http.StatusNotFound},
		{errdefs.KindConflict, http.StatusConflict},
		{errdefs.KindUnsupported, http.StatusConflict},
		{errdefs.KindUpstream, http.StatusBadGateway},
		{errdefs.KindUnavailable, http.StatusServiceUnavailable},
		{errdefs.KindTimeout, http.StatusGatewayTimeout},
		{errdefs.KindCanceled, 499},
		{errdefs.KindFailed, http.StatusUnprocessableEntity},
		{errdefs.KindNoSpace, http.StatusInsufficientStorage},
		{errdefs.KindForbidden, http.StatusForbidden},
		{errdefs.KindUnauth, http.StatusUnauthorized},
		{errdefs.KindTooLarge, http.StatusRequestEntityTooLarge},
		{errdefs.KindTooMany, http.StatusTooManyRequests},
		{errdefs.KindInternal, http.StatusInternalServerError},
		{errdefs.Kind(""), http.StatusInternalServerError},
		{errdefs.Kind("no_such_kind"), http.StatusInternalServerError},
	}
	for _, tt := range tests {
		if got := statusOf(tt.kind); got != tt.want {
			t.Errorf("statusOf(%q) = %d, want %d", tt.kind, got, tt.want)
		}
	}
}

// testServer returns a Server whose log is written to the returned buffer.
func testServer(t *testing.T) (*Server, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	return &Server{Log: slog.New(slog.NewTextHandler(&buf, nil))}, &buf
}

func TestWriteError(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantCode   string
		wantMsg    string
		wantLog    string // the level of the log line: 5xx are the server's failures, 4xx the user's and not logged
	}{
		{"invalid", errdefs.Invalid("bad %s", "thing"), 400, "invalid_argument", "bad thing", ""},
		{"not found", errdefs.NotFound("sandbox_not_found", "sandbox %s not found", "x"), 404, "sandbox_not_found", "sandbox x not found", ""},
		{"conflict", errdefs.Conflict("name_taken", "a sandbox named x already exists"), 409, "name_taken", "a sandbox named x already exists", ""},
		{"unsupported", errdefs.Unsupported("no fork here"), 409, "unsupported", "no fork here", ""},
		{"forbidden", errdefs.New(errdefs.KindForbidden, "", "no"), 403, "forbidden", "no", ""},
		{"unauthenticated", errdefs.New(errdefs.KindUnauth, "bad_token", "who are you"), 401, "bad_token", "who are you", ""},
		{"too large", errdefs.New(errdefs.KindTooLarge, "body_too_large", "big"), 413, "body_too_large", "big", ""},
		{"wrapped keeps code, shows context", fmt.Errorf("stop sandbox x: %w", errdefs.Conflict("sandbox_busy", "busy")), 409, "sandbox_busy", "stop sandbox x: busy", ""},
		{"upstream", errdefs.Upstream("registry_unreachable", "registry down"), 502, "registry_unreachable", "registry down", "ERROR"},
		{"unavailable", errdefs.Unavailable("node_unreachable", "node a is down"), 503, "node_unreachable", "node a is down", "ERROR"},
		{"timeout", errdefs.New(errdefs.KindTimeout, "freeze_timeout", "the freeze lasted 10m0s"), 504, "freeze_timeout", "the freeze lasted 10m0s", "ERROR"},
		{"canceled is not the server's failure", fmt.Errorf("list sandboxes: %w", context.Canceled), 499, "canceled", "the request was canceled: its client went away", "DEBUG"},
		{"a deadline is a timeout", fmt.Errorf("list sandboxes: %w", context.DeadlineExceeded), 504, "timeout", "the request ran out of time: the server's log has the cause (request r1)", "ERROR"},
		{"plain error is internal, its text only logged", errors.New("boom"), 500, "internal", "internal error: the server's log has the cause (request r1)", "ERROR"},
		{"wrapped plain error", fmt.Errorf("create: %w", io.ErrUnexpectedEOF), 500, "internal", "internal error: the server's log has the cause (request r1)", "ERROR"},
		{"classified internal", errdefs.Wrap(errdefs.KindInternal, "policy_failed", errors.New("nft refused the rule")), 500, "policy_failed", "internal error: nft refused the rule", "ERROR"},
		{"Wrap", errdefs.Wrap(errdefs.KindNotFound, "image_not_found", errors.New("no image alpine")), 404, "image_not_found", "no image alpine", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logBuf bytes.Buffer
			s := &Server{Log: slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
			w := httptest.NewRecorder()
			w.Header().Set(RequestIDHeader, "r1")
			s.writeError(w, httptest.NewRequest(http.MethodGet, "/v0/x", nil), tt.err)

			if w.Code != tt.wantStatus {
				t.Errorf("writeError(%v) status = %d, want %d", tt.err, w.Code, tt.wantStatus)
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("writeError(%v) Content-Type = %q, want application/json", tt.err, ct)
			}
			// Exactly {"code","message"}, nothing else.
			var raw map[string]any
			if err := json.Unmarshal(w.Body.Bytes(), &raw); err != nil {
				t.Fatalf("writeError(%v) body %q is not JSON: %v", tt.err, w.Body, err)
			}
			if len(raw) != 2 || raw["code"] == nil || raw["message"] == nil {
				t.Errorf("writeError(%v) body = %s, want exactly the keys code and message", tt.err, w.Body)
			}
			var got Error
			dec := json.NewDecoder(bytes.NewReader(w.Body.Bytes()))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&got); err != nil {
				t.Fatalf("writeError(%v) body %q: %v", tt.err, w.Body, err)
			}
			if got.Code != tt.wantCode || got.Message != tt.wantMsg {
				t.Errorf("writeError(%v) = {code %q, message %q}, want {code %q, message %q}", tt.err, got.Code, got.Message, tt.wantCode, tt.wantMsg)
			}
			log := logBuf.String()
			if tt.wantLog == "" && log != "" || tt.wantLog != "" && !strings.Contains(log, "level="+tt.wantLog+" ") {
				t.Errorf("writeError(%v) logged %q, want a line at %q", tt.err, log, tt.wantLog)
			}
			if tt.wantLog != "" && !strings.Contains(log, tt.err.Error()) {
				t.Errorf("writeError(%v) logged %q, want the error's text", tt.err, log)
			}
		})
	}
}

// TestErrorBody: the status and body of an error, in an answer or inside a
// stream: a classified error's message is shown (written for the user),
// an unclassified error's text never is (it may name a host path).
func TestErrorBody(t *testing.T) {
	hostPath := &fs.PathError{Op: "open", Path: "/var/lib/shard/images/blobs/sha256/ab", Err: syscall.EACCES}
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantCode   string
		wantMsg    string
	}{
		{"classified", errdefs.NotFound("image_not_found", "image %q not found locally", "alpine"), 404, "image_not_found", `image "alpine" not found locally`},
		{"an untyped error naming a host path", fmt.Errorf("pull alpine: %w", hostPath), 500, "internal", "internal error: the server's log has the cause (request r1)"},
		{"without a request id", hostPath, 500, "internal", "internal error: the server's log has the cause"},
		{"a bare ENOSPC", &fs.PathError{Op: "write", Path: "/var/lib/shard/x", Err: syscall.ENOSPC}, 507, "insufficient_storage",
			"the server's disk is full: free space (remove sandboxes, snapshots or checkpoints) and try again"},
		{"a classified ENOSPC keeps its message", errdefs.New(errdefs.KindNoSpace, "insufficient_storage", "a pull leaves 1GiB free"), 507, "insufficient_storage", "a pull leaves 1GiB free"},
		{"classified internal", errdefs.New(errdefs.KindInternal, "", "the ledger is closed"), 500, "internal", "internal error: the ledger is closed"},
		{"canceled", fmt.Errorf("read %s: %w", "/var/lib/shard/x", context.Canceled), 499, "canceled", "the request was canceled: its client went away"},
		{"canceled under an internal error", errdefs.Wrap(errdefs.KindInternal, "policy_failed", context.Canceled), 499, "canceled", "the request was canceled: its client went away"},
		{"a deadline", fmt.Errorf("read %s: %w", "/var/lib/shard/x", context.DeadlineExceeded), 504, "timeout", "the request ran out of time: the server's log has the cause (request r1)"},
		{"upstream", errdefs.Upstream("sandbox_unreachable", "lost the connection to the sandbox: EOF"), 502, "sandbox_unreachable", "lost the connection to the sandbox: EOF"},
		{"unavailable", errdefs.Unavailable("no_addresses", "no free address left in 10.88.0.0/16"), 503, "no_addresses", "no free address left in 10.88.0.0/16"},
		{"a peer's answer", errdefs.Upstream("", "node b answered 500 Internal Server Error"), 502, "upstream", "node b answered 500 Internal Server Error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := "r1"
			if tt.name == "without a request id" {
				id = ""
			}
			status, body := errorBody(tt.err, id)
			if status != tt.wantStatus || body.Code != tt.wantCode || body.Message != tt.wantMsg {
				t.Errorf("errorBody(%v) = %d {%q, %q}, want %d {%q, %q}", tt.err, status, body.Code, body.Message, tt.wantStatus, tt.wantCode, tt.wantMsg)
			}
			if strings.Contains(body.Message, "/var/lib/shard") {
				t.Errorf("errorBody(%v) shows a host path: %q", tt.err, body.Message)
			}
		})
	}
}

// An unknown endpoint gets the same error shape from the handler.
func TestHandlerUnknownEndpoint(t *testing.T) {
	s, _ := testServer(t)
	h := s.Handler()
	tests := []struct{ method, path string }{
		{http.MethodGet, "/v0/nope"},
		{http.MethodGet, "/"},
		{http.MethodPost, "/v1/sandboxes"},
	}
	for _, tt := range tests {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(tt.method, tt.path, nil))
		var got Error
		if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
			t.Fatalf("%s %s: body %q is not JSON: %v", tt.method, tt.path, w.Body, err)
		}
		if w.Code != http.StatusNotFound || got.Code != "not_found" || !strings.Contains(got.Message, tt.path) {
			t.Errorf("%s %s = %d %+v, want 404 not_found mentioning the path", tt.method, tt.path, w.Code, got)
		}
	}
}
