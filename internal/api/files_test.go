package api

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/files"
	"github.com/useshards/shard/internal/sandbox"
)

// fakeFiles is a FileService that records what the handlers ask and
// answers err, or what it was given.
type fakeFiles struct {
	calls []string // "verb sandbox path"
	write sandbox.WriteOptions
	read  files.GetOptions
	body  string
	limit int
	flag  bool // follow (stat) or recursive (remove)
	err   error
}

func (f *fakeFiles) call(verb, id, path string) { f.calls = append(f.calls, verb+" "+id+" "+path) }

func (f *fakeFiles) ReadFiles(_ context.Context, id, path string, o files.GetOptions) (*sandbox.FileStream, error) {
	f.call("read", id, path)
	f.read = o
	return nil, f.err
}

func (f *fakeFiles) WriteFiles(_ context.Context, id, path string, body io.Reader, o sandbox.WriteOptions) (*sandbox.WriteResult, error) {
	f.call("write", id, path)
	if f.err != nil {
		return nil, f.err
	}
	b, err := io.ReadAll(body)
	if err != nil {
		return nil, err
	}
	f.write, f.body = o, string(b)
	return &sandbox.WriteResult{Path: path, Bytes: int64(len(b)), Files: 1}, nil
}

func (f *fakeFiles) StatFile(_ context.Context, id, path string, follow bool) (*files.Info, error) {
	f.call("stat", id, path)
	f.flag = follow
	return &files.Info{Path: path, Type: files.TypeFile}, f.err
}

func (f *fakeFiles) ListFiles(_ context.Context, id, path string, limit int) ([]files.Info, bool, error) {
	f.call("list", id, path)
	f.limit = limit
	return []files.Info{{Name: "a"}, {Name: "b"}}, true, f.err
}

func (f *fakeFiles) RemoveFile(_ context.Context, id, path string, recursive bool) (*files.Info, error) {
	f.call("remove", id, path)
	f.flag = recursive
	return &files.Info{Path: path}, f.err
}

// The files handlers run against a fake sandbox service, with no runtime,
// store or helper behind them: what each reads of the request (the path,
// a write's mode, owner and tar, a list's limit, the flags) reaches the
// service as it should, what the request gets wrong is refused before it,
// and the service's errors come back with their status and code.
func TestFileHandlers(t *testing.T) {
	writer := &auth.Principal{Name: "ci", Scopes: []string{auth.SandboxWrite}, Project: "default"}
	reader := &auth.Principal{Name: "ro", Scopes: []string{auth.SandboxRead}, Project: "default"}
	do := func(t *testing.T, f *fakeFiles, p *auth.Principal, method, uri, ctype, body string) *httptest.ResponseRecorder {
		t.Helper()
		h := (&Server{Log: slog.New(slog.DiscardHandler), Files: f}).Handler()
		r := httptest.NewRequest(method, uri, strings.NewReader(body))
		if ctype != "" {
			r.Header.Set("Content-Type", ctype)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), p)))
		return w
	}
	wantErr := func(t *testing.T, w *httptest.ResponseRecorder, status int, code string) {
		t.Helper()
		var e struct{ Code, Message string }
		json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != status || e.Code != code {
			t.Fatalf("got %d %s (%s), want %d %s", w.Code, e.Code, e.Message, status, code)
		}
	}

	t.Run("write", func(t *testing.T) {
		f := &fakeFiles{}
		w := do(t, f, writer, http.MethodPut, "/v0/sandboxes/web/files?path=/app/run.sh&mode=750&uid=1000&parents=true&mtime=2026-01-02T15:04:05Z", "", "echo hi\n")
		if w.Code != 200 {
			t.Fatalf("write: %d %s", w.Code, w.Body)
		}
		want := sandbox.WriteOptions{Mode: 0o750, UID: 1000, GID: -1, Size: 8, Parents: true, MTime: time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)}
		if f.write != want || f.body != "echo hi\n" || len(f.calls) != 1 || f.calls[0] != "write web /app/run.sh" {
			t.Fatalf("the service got %v %+v %q, want %+v", f.calls, f.write, f.body, want)
		}
		var res sandbox.WriteResult
		if json.Unmarshal(w.Body.Bytes(), &res) != nil || res.Bytes != 8 {
			t.Fatalf("answer %s", w.Body)
		}
	})
	t.Run("write a tar", func(t *testing.T) {
		f := &fakeFiles{}
		if w := do(t, f, writer, http.MethodPut, "/v0/sandboxes/web/files?path=/app", TarMediaType, "tar"); w.Code != 200 {
			t.Fatalf("tar write: %d %s", w.Code, w.Body)
		}
		if want := (sandbox.WriteOptions{Tar: true, Mode: -1, UID: -1, GID: -1, Size: -1}); f.write != want {
			t.Fatalf("the service got %+v, want %+v", f.write, want)
		}
	})
	t.Run("sparse", func(t *testing.T) {
		f := &fakeFiles{}
		// A file sent as a tar of it: its body is not its length, and the
		// file's attributes are the query's.
		if w := do(t, f, writer, http.MethodPut, "/v0/sandboxes/web/files?path=/app/disk.img&sparse=true&mode=600", "", "tar"); w.Code != 200 {
			t.Fatalf("sparse write: %d %s", w.Code, w.Body)
		}
		if want := (sandbox.WriteOptions{Sparse: true, Mode: 0o600, UID: -1, GID: -1, Size: -1}); f.write != want {
			t.Fatalf("the service got %+v, want %+v", f.write, want)
		}
		if w := do(t, f, writer, http.MethodPut, "/v0/sandboxes/web/files?path=/app&sparse=true", TarMediaType, "tar"); w.Code != 200 {
			t.Fatalf("sparse tar write: %d %s", w.Code, w.Body)
		}
		if want := (sandbox.WriteOptions{Tar: true, Sparse: true, Mode: -1, UID: -1, GID: -1, Size: -1}); f.write != want {
			t.Fatalf("the service got %+v, want %+v", f.write, want)
		}
		f.err = errdefs.NotFound(files.CodeNotFound, "sandbox web: /app: no such file")
		r := httptest.NewRequest(http.MethodGet, "/v0/sandboxes/web/files?path=/app/&sparse=true", nil)
		r.Header.Set("Accept", TarMediaType)
		rw := &auth.Principal{Name: "rw", Scopes: []string{auth.SandboxRead, auth.SandboxWrite}, Project: "default"}
		(&Server{Log: slog.New(slog.DiscardHandler), Files: f}).Handler().ServeHTTP(httptest.NewRecorder(), r.WithContext(auth.WithPrincipal(r.Context(), rw)))
		if want := (files.GetOptions{Tar: true, Sparse: true}); f.read != want {
			t.Fatalf("the service got %+v, want %+v", f.read, want)
		}
	})
	// Refused before the service is asked anything.
	for _, tt := range []struct {
		name, method, uri, ctype string
		p                        *auth.Principal
		status                   int
		code                     string
	}{
		{"no path", http.MethodPut, "/v0/sandboxes/web/files", "", writer, 400, files.CodeInvalid},
		{"mode not octal", http.MethodPut, "/v0/sandboxes/web/files?path=/a&mode=9", "", writer, 400, client.CodeInvalidArgument},
		{"mode of a tar", http.MethodPut, "/v0/sandboxes/web/files?path=/a&mode=644", TarMediaType, writer, 400, client.CodeInvalidArgument},
		{"uid past the range", http.MethodPut, "/v0/sandboxes/web/files?path=/a&uid=-2", "", writer, 400, client.CodeInvalidArgument},
		{"write without sandbox:write", http.MethodPut, "/v0/sandboxes/web/files?path=/a", "", reader, 403, client.CodeMissingScope},
		{"list limit 0", http.MethodGet, "/v0/sandboxes/web/files/list?path=/&limit=0", "", reader, 400, client.CodeInvalidArgument},
		{"sparse without a tar", http.MethodGet, "/v0/sandboxes/web/files?path=/a&sparse=true", "", reader, 400, client.CodeInvalidArgument},
		{"sparse=maybe", http.MethodPut, "/v0/sandboxes/web/files?path=/a&sparse=maybe", "", writer, 400, client.CodeInvalidArgument},
		{"stat follow_link=maybe", http.MethodGet, "/v0/sandboxes/web/files/stat?path=/&follow_link=maybe", "", reader, 400, client.CodeInvalidArgument},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeFiles{}
			wantErr(t, do(t, f, tt.p, tt.method, tt.uri, tt.ctype, "x"), tt.status, tt.code)
			if len(f.calls) != 0 {
				t.Fatalf("the service was asked %v", f.calls)
			}
		})
	}
	t.Run("stat, list, remove", func(t *testing.T) {
		f := &fakeFiles{}
		if w := do(t, f, reader, http.MethodGet, "/v0/sandboxes/web/files/stat?path=/etc/hosts&follow_link=true", "", ""); w.Code != 200 || !f.flag {
			t.Fatalf("stat: %d %s, follow %v", w.Code, w.Body, f.flag)
		}
		w := do(t, f, reader, http.MethodGet, "/v0/sandboxes/web/files/list?path=/etc/../etc/&limit=2", "", "")
		var list FileList
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &list) != nil || list.Path != "/etc" || len(list.Entries) != 2 || !list.Truncated || f.limit != 2 {
			t.Fatalf("list: %d %s (limit %d)", w.Code, w.Body, f.limit)
		}
		if w := do(t, f, writer, http.MethodDelete, "/v0/sandboxes/web/files?path=/tmp/x&recursive=true", "", ""); w.Code != 200 || !f.flag {
			t.Fatalf("remove: %d %s, recursive %v", w.Code, w.Body, f.flag)
		}
		want := []string{"stat web /etc/hosts", "list web /etc/../etc/", "remove web /tmp/x"}
		if strings.Join(f.calls, ",") != strings.Join(want, ",") {
			t.Fatalf("the service was asked %q, want %q", f.calls, want)
		}
	})
	// The service's errors, as the client sees them.
	for _, tt := range []struct {
		name   string
		err    error
		status int
		code   string
	}{
		{"not found", errdefs.NotFound(files.CodeNotFound, "sandbox web: /x: no such file"), 404, files.CodeNotFound},
		{"busy", errdefs.Conflict(client.CodeSandboxBusy, "sandbox web is stopping"), 409, client.CodeSandboxBusy},
		{"body past its bound", &http.MaxBytesError{Limit: 4}, 413, client.CodeTooLarge},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wantErr(t, do(t, &fakeFiles{err: tt.err}, writer, http.MethodPut, "/v0/sandboxes/web/files?path=/x", "", "body"), tt.status, tt.code)
		})
	}
}
