package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/useshards/shard/internal/auth"
	"github.com/useshards/shard/internal/hostdisk"
	"github.com/useshards/shard/internal/image"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/testenv"
)

// TestImportUploadTooLarge: an upload over the image store's bound is 413
// too_large naming the bound, whether its Content-Length says so (refused
// before it is read) or it is sent chunked (refused when the bound is
// passed), and the client gets that answer; nothing of it is kept.
func TestImportUploadTooLarge(t *testing.T) {
	dir := t.TempDir()
	st, err := image.Open(image.Options{Dir: dir, MaxImageSize: 1 << 20, Disk: hostdisk.Roomy(dir)})
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Images: st, Log: slog.New(slog.DiscardHandler)}
	h := s.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, admin(r)) }))
	defer srv.Close()

	body := bytes.Repeat([]byte("x"), 4<<20)
	for _, tt := range []struct {
		name string
		body io.Reader
	}{
		{"with Content-Length", bytes.NewReader(body)},
		{"chunked", io.MultiReader(bytes.NewReader(body))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := http.Post(srv.URL+"/v0/images/import?name=localhost/x:1", "application/x-tar", tt.body)
			if err != nil {
				t.Fatalf("the client got no answer: %v", err)
			}
			defer resp.Body.Close()
			var got Error
			json.NewDecoder(resp.Body).Decode(&got)
			if resp.StatusCode != http.StatusRequestEntityTooLarge || got.Code != "too_large" ||
				!strings.Contains(got.Message, "cannot import the upload: it is larger than 1MiB") || !strings.Contains(got.Message, "--max-image-size") {
				t.Errorf("answer %d %+v; want 413 too_large naming the bound", resp.StatusCode, got)
			}
			if ents, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(ents) != 0 {
				t.Errorf("tmp/ keeps %d entries", len(ents))
			}
		})
	}
}

// TestImageAccess: an import under a registry's name is 400 with the rule
// (checked before the upload is spooled); a key of a project (not admin) cannot remove
// a pulled image, which every project shares (403 image_shared), and the
// admin's removal gets past that check.
func TestImageAccess(t *testing.T) {
	testenv.RequireRoot(t, "unpacking an image")
	regSrv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer regSrv.Close()
	host := strings.TrimPrefix(regSrv.URL, "http://")
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(host + "/team/app:1")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := image.Open(image.Options{Dir: dir, Insecure: []string{host}, Disk: hostdisk.Roomy(dir)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pull(context.Background(), ref.String(), nil); err != nil {
		t.Fatal(err)
	}
	s := &Server{Images: st, Log: slog.New(slog.DiscardHandler)}
	h := s.Handler()
	keyOf := func(r *http.Request) *http.Request {
		return r.WithContext(auth.WithPrincipal(r.Context(), &auth.Principal{Name: "ci", Project: "team-a", Scopes: []string{"sandbox:write"}}))
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, keyOf(r)) }))
	defer srv.Close()

	resp, err := http.Post(srv.URL+"/v0/images/import?name="+url.QueryEscape("python:3.12-slim"), "application/x-tar", bytes.NewReader(bytes.Repeat([]byte("x"), 1<<20)))
	if err != nil {
		t.Fatal(err)
	}
	var got Error
	json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(got.Message, "localhost/NAME[:TAG]") || !strings.Contains(got.Message, "localhost/python:3.12-slim") {
		t.Errorf("import as python:3.12-slim: %d %+v, want 400 with the rule", resp.StatusCode, got)
	}

	req, _ := http.NewRequest("DELETE", srv.URL+"/v0/images/"+ref.String(), nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || got.Code != "image_shared" || !strings.Contains(got.Message, "only an admin key") {
		t.Errorf("project key removes a pulled image: %d %+v, want 403 image_shared", resp.StatusCode, got)
	}
	if _, err := st.Get(project.Unscoped(context.Background(), "a test"), ref.String()); err != nil {
		t.Errorf("the pulled image is gone: %v", err)
	}
	if !isAdmin(admin(httptest.NewRequest("GET", "/", nil)).Context()) || isAdmin(keyOf(httptest.NewRequest("GET", "/", nil)).Context()) {
		t.Error("isAdmin: wrong for the admin or a key")
	}
}

// TestPullStreamError: a pull that fails once its stream began ends the
// stream with an error line made as an error answer is (errorBody): a
// registry that cannot be reached is its code and message, a client that
// left is canceled, logged at debug and never as a failure of the server.
func TestPullStreamError(t *testing.T) {
	dir := t.TempDir()
	st, err := image.Open(image.Options{Dir: dir, Disk: hostdisk.Roomy(dir), Insecure: []string{"127.0.0.2:1"}})
	if err != nil {
		t.Fatal(err)
	}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name     string
		ctx      context.Context
		wantCode string
		wantMsg  string
		wantLog  string
	}{
		{"registry down", context.Background(), "registry_unreachable", "connection refused", "level=ERROR msg=\"request failed\""},
		{"client gone", canceled, "canceled", "the request was canceled: its client went away", "level=DEBUG msg=\"request canceled\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logBuf bytes.Buffer
			s := &Server{Images: st, Log: slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
			w := httptest.NewRecorder()
			r := httptest.NewRequestWithContext(tt.ctx, http.MethodPost, "/v0/images/pull", strings.NewReader(`{"image":"127.0.0.2:1/x/y:z"}`))
			s.Handler().ServeHTTP(w, admin(r))
			if w.Code != http.StatusOK {
				t.Fatalf("status %d %s, want 200 and the stream", w.Code, w.Body)
			}
			lines := strings.Split(strings.TrimSpace(w.Body.String()), "\n")
			var last PullEvent
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
				t.Fatal(err)
			}
			if last.Type != "error" || last.Error == nil || last.Error.Code != tt.wantCode || !strings.Contains(last.Error.Message, tt.wantMsg) {
				t.Errorf("last line %s, want an error %s saying %q", lines[len(lines)-1], tt.wantCode, tt.wantMsg)
			}
			if !strings.Contains(logBuf.String(), tt.wantLog) {
				t.Errorf("log %q, want %s", logBuf.String(), tt.wantLog)
			}
			if tt.wantCode == "canceled" && strings.Contains(logBuf.String(), "level=ERROR") {
				t.Errorf("a pull its client left is logged as an error: %q", logBuf.String())
			}
		})
	}
}
