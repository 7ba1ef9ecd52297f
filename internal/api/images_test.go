package api

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/image"
)

// TestImportUploadTooLarge: an upload over the image store's bound is 413
// too_large naming the bound, whether its Content-Length says so (refused
// before it is read) or it is sent chunked (refused when the bound is
// passed), and the client gets that answer; nothing of it is kept.
func TestImportUploadTooLarge(t *testing.T) {
	dir := t.TempDir()
	st, err := image.Open(image.Options{Dir: dir, MaxImageSize: 1 << 20})
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
			resp, err := http.Post(srv.URL+"/v0/images/import?name=x:1", "application/x-tar", tt.body)
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
