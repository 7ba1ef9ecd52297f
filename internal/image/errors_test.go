package image

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/useshards/shard/internal/errdefs"
)

// hostPathIn names the host path an error message shows, if any.
func hostPathIn(msg string, dirs ...string) string {
	for _, d := range dirs {
		if strings.Contains(msg, d) {
			return d
		}
	}
	for _, p := range []string{"/tmp/", "/proc/self/", "/var/lib/"} {
		if strings.Contains(msg, p) {
			return p
		}
	}
	return ""
}

// archiveOf builds a tar of name/content pairs.
func archiveOf(t testing.TB, files ...string) []byte {
	t.Helper()
	var ents []ent
	for i := 0; i < len(files); i += 2 {
		ents = append(ents, file(files[i], files[i+1]))
	}
	return tarOf(t, ents...)
}

// failingReader yields some bytes, then an error.
type failingReader struct{ n int }

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("connection reset by peer")
	}
	n := min(len(p), f.n)
	clear(p[:n])
	f.n -= n
	return n, nil
}

func TestImportStreamErrors(t *testing.T) {
	requireRoot(t)
	ctx := own()
	tests := []struct {
		name  string
		body  func(t *testing.T) io.Reader
		setup func(t *testing.T, dir string)
		kind  errdefs.Kind
		msg   string
	}{
		{"not an archive", func(t *testing.T) io.Reader { return strings.NewReader("hello") }, nil,
			errdefs.KindInvalid, "cannot import the upload: not a readable tar archive"},
		{"OCI layout without index.json", func(t *testing.T) io.Reader {
			return bytes.NewReader(archiveOf(t, "oci-layout", `{"imageLayoutVersion":"1.0.0"}`))
		}, nil, errdefs.KindInvalid, "cannot import the upload: stat index.json: no such file or directory"},
		{"OCI layout escaping", func(t *testing.T) io.Reader {
			return bytes.NewReader(archiveOf(t, "oci-layout", `{"imageLayoutVersion":"1.0.0"}`, "../../evil", "x"))
		}, nil, errdefs.KindInvalid, "entry \"../../evil\": path escapes"},
		{"docker archive without its config", func(t *testing.T) io.Reader {
			return bytes.NewReader(archiveOf(t, "manifest.json", `[{"Config":"c.json","RepoTags":["a:1"],"Layers":[]}]`))
		}, nil, errdefs.KindInvalid, "cannot import the upload"},
		{"upload cut off", func(t *testing.T) io.Reader { return &failingReader{n: 100 << 10} }, nil,
			errdefs.KindInvalid, "cannot import the upload: reading it failed: connection reset by peer"},
		{"no room to spool", func(t *testing.T) io.Reader { return strings.NewReader("hello") },
			func(t *testing.T, dir string) {
				os.RemoveAll(filepath.Join(dir, "tmp"))
				os.WriteFile(filepath.Join(dir, "tmp"), nil, 0o600)
			}, errdefs.KindInternal, "the image store cannot keep the upload: not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir)
			if tt.setup != nil {
				tt.setup(t, dir)
			}
			_, err := s.ImportStream(ctx, tt.body(t), "localhost/x:1")
			t.Logf("err: %v", err)
			if err == nil {
				t.Fatal("import succeeded")
			}
			if errdefs.KindOf(err) != tt.kind || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("err = %q (%s), want %s containing %q", err, errdefs.KindOf(err), tt.kind, tt.msg)
			}
			if p := hostPathIn(err.Error(), dir); p != "" {
				t.Errorf("err = %q names the host path %s", err, p)
			}
			if tt.setup == nil {
				if ents, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(ents) != 0 {
					t.Errorf("tmp/ keeps %d entries", len(ents))
				}
			}
		})
	}
}

// TestImportErrorsHideTheStore: Import(path) may name the path it was
// given, but not the store's own dirs (where it unpacks a layout).
func TestImportErrorsHideTheStore(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	s := openStore(t, filepath.Join(dir, "store"))
	tests := []struct {
		name string
		tar  []byte
	}{
		{"no index.json", archiveOf(t, "oci-layout", `{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json names a missing manifest", archiveOf(t, "oci-layout", `{"imageLayoutVersion":"1.0.0"}`,
			"index.json", `{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:`+strings.Repeat("a", 64)+`","size":3}]}`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := filepath.Join(dir, "in.tar")
			os.WriteFile(f, tt.tar, 0o600)
			_, err := s.Import(own(), f, "localhost/x:1")
			if err == nil {
				t.Fatal("import succeeded")
			}
			if strings.Contains(err.Error(), s.Dir()) {
				t.Errorf("err = %q names the store's dir", err)
			}
		})
	}
}

// TestImportStreamSpoolsInTheStore: the upload is kept under the store's
// tmp/ (not the host's /tmp) while it is imported, and removed after.
func TestImportStreamSpoolsInTheStore(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	s := openStore(t, dir)
	var seen []string
	body := io.MultiReader(strings.NewReader("x"), readerFunc(func(p []byte) (int, error) {
		ents, _ := os.ReadDir(filepath.Join(dir, "tmp"))
		for _, e := range ents {
			seen = append(seen, e.Name())
		}
		return 0, io.EOF
	}))
	s.ImportStream(own(), body, "localhost/x:1")
	if len(seen) != 1 || !strings.HasPrefix(seen[0], "upload-") {
		t.Errorf("tmp/ while reading the upload: %v, want one upload-*", seen)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(ents) != 0 {
		t.Errorf("tmp/ keeps %d entries after the import", len(ents))
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestPullErrorsHideTheStore: a pull that fails on the store's own disk
// work says so without naming the host path (which goes to the log).
func TestPullErrorsHideTheStore(t *testing.T) {
	requireRoot(t)
	ctx := own()
	host := testRegistry(t)
	ti := makeTestImages(t)
	push(t, host+"/e/app:1", ti.app)
	tests := []struct {
		name  string
		block string // replaced by a file
		msg   string
	}{
		{"cannot unpack", "tmp", "the image store cannot make a directory to unpack a layer into: not a directory"},
		{"cannot store blobs", "blobs/sha256", "the image store cannot store a blob: not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openStore(t, dir)
			p := filepath.Join(dir, tt.block)
			os.RemoveAll(p)
			os.WriteFile(p, nil, 0o600)
			_, err := s.Pull(ctx, host+"/e/app:1", nil)
			if err == nil {
				t.Fatal("pull succeeded")
			}
			if errdefs.KindOf(err) != errdefs.KindInternal || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("err = %q (%s), want internal containing %q", err, errdefs.KindOf(err), tt.msg)
			}
			if p := hostPathIn(err.Error(), dir); p != "" {
				t.Errorf("err = %q names the host path %s", err, p)
			}
		})
	}
}

// TestPullBadLayerIsNotUnreachable: a layer the unpacker refuses (here a
// file under a file, ENOTDIR) is not a registry that cannot be reached.
func TestPullBadLayerIsNotUnreachable(t *testing.T) {
	requireRoot(t)
	host := testRegistry(t)
	push(t, host+"/e/bad:1", imageOf(t, runtime.GOARCH, layerOf(t, file("a", "x"), file("a/b", "y"))))
	s := openStore(t, t.TempDir())
	_, err := s.Pull(own(), host+"/e/bad:1", nil)
	if err == nil || errdefs.KindOf(err) == errdefs.KindUpstream || !strings.Contains(err.Error(), `entry "a/b": not a directory`) {
		t.Errorf("err = %v (%s), want the entry's error, not upstream", err, errdefs.KindOf(err))
	}
}
