package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/useshards/shard/client"
	"github.com/useshards/shard/internal/sparse"
)

// TestCopyOutRefusesExtentsBomb: what a sandbox sends is hostile (a runc
// sandbox can rewrite its files helper's memory). An entry of extents of
// one byte each, a block apart, took a block of this disk per byte sent
// (1.5 MB sent wrote 469 MB): shard cp refuses it, keeping nothing of it,
// and still writes a sparse file of whole blocks with its holes.
func TestCopyOutRefusesExtentsBomb(t *testing.T) {
	const n = 2000
	var ext sparse.Extents // a byte a block apart
	for i := range int64(n) {
		ext = append(ext, [2]int64{i * sparse.Block, 1})
	}
	bomb := sparseTar(t, n*sparse.Block, ext.String(), bytes.Repeat([]byte("b"), n))
	good := sparseTar(t, 1<<30, fmt.Sprintf("%d:%d", 1<<29, sparse.Block), bytes.Repeat([]byte("g"), sparse.Block))
	for _, tc := range []struct {
		name    string
		archive []byte
		wantErr string
	}{
		{"bomb", bomb, "not whole blocks"},
		{"good", good, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set(client.FileStatHeader, base64.StdEncoding.EncodeToString([]byte(`{"name":"f","path":"/f","type":"file"}`)))
				w.Header().Set("Content-Type", client.TarMediaType)
				w.Write(tc.archive)
			}))
			defer srv.Close()
			c, err := client.New(client.Options{Remote: srv.URL, APIKey: "shk_x_y"})
			if err != nil {
				t.Fatal(err)
			}
			dst := filepath.Join(t.TempDir(), "out")
			err = copyOut(context.Background(), c, "box", "/f", dst, false)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("copy out: %v, want %q", err, tc.wantErr)
				}
				if _, err := os.Lstat(dst); err == nil {
					t.Fatal("the refused entry was written")
				}
				return
			}
			fi, serr := os.Stat(dst)
			if err != nil || serr != nil || fi.Size() != 1<<30 || fi.Sys().(*syscall.Stat_t).Blocks*512 > 1<<20 {
				t.Fatalf("copy out: %v %v %v", err, serr, fi)
			}
		})
	}
}

// sparseTar is a tar of one sparse file, f, of size bytes, whose extents
// record is ext and data data.
func sparseTar(t *testing.T, size int64, ext string, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	hdr := &tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data)), Format: tar.FormatPAX,
		PAXRecords: map[string]string{sparse.RecordSize: fmt.Sprint(size), sparse.RecordExtents: ext}}
	if err := tw.WriteHeader(hdr); err != nil {
		t.Fatal(err)
	}
	tw.Write(data)
	tw.Close()
	return b.Bytes()
}
