package image

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/useshards/shard/internal/hostdisk"
	"github.com/useshards/shard/internal/project"
	"github.com/useshards/shard/internal/testenv"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

var testTime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// ent is a tar entry for tests; zero fields get sensible defaults.
type ent struct {
	name     string
	typ      byte
	body     string
	link     string
	mode     int64
	uid, gid int
	major    int64
	minor    int64
	pax      map[string]string
}

func file(name, body string) ent { return ent{name: name, typ: tar.TypeReg, body: body} }
func dir(name string) ent        { return ent{name: name, typ: tar.TypeDir} }

// tarOf builds an uncompressed tar from entries.
func tarOf(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
			if e.typ == tar.TypeDir {
				mode = 0o755
			}
		}
		hdr := &tar.Header{
			Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: mode,
			Uid: e.uid, Gid: e.gid, Devmajor: e.major, Devminor: e.minor,
			ModTime: testTime, PAXRecords: e.pax, Format: tar.FormatPAX,
		}
		if e.typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("tar header %s: %v", e.name, err)
		}
		if e.typ == tar.TypeReg {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layerOf makes a gzip-compressed image layer from entries.
func layerOf(t testing.TB, ents ...ent) v1.Layer {
	t.Helper()
	b := tarOf(t, ents...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// imageOf stacks layers into a linux image for this machine's arch.
func imageOf(t testing.TB, arch string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}
	cf.Config.Cmd = []string{"/bin/sh"}
	cf.Config.Entrypoint = []string{"/entry"}
	cf.Config.WorkingDir = "/work"
	cf.Config.User = "1000:1000"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// testRegistry runs an in-process registry and returns its host:port.
func testRegistry(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	testRegistries.Store(host, true)
	return host
}

// testRegistries are the hosts testRegistry started: openStore lists them
// as insecure, as an admin lists a local registry.
var testRegistries sync.Map

func push(t testing.TB, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

func openStore(t testing.TB, dir string, opts ...func(*Options)) *Store {
	t.Helper()
	o := Options{Dir: dir, Disk: hostdisk.Roomy(dir)}
	testRegistries.Range(func(k, _ any) bool {
		o.Insecure = append(o.Insecure, k.(string))
		return true
	})
	for _, f := range opts {
		f(&o)
	}
	s, err := Open(o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func requireRoot(t testing.TB) {
	t.Helper()
	testenv.RequireRoot(t, "mknod, chown, trusted.* xattrs")
}

func mustDigest(t testing.TB, d interface{ Digest() (v1.Hash, error) }) string {
	t.Helper()
	h, err := d.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

// sparseTar is a tar of one sparse file in the PAX format GNU tar writes
// (GNU.sparse 1.0): name is realSize bytes long, all holes but data at
// off. archive/tar reads such files (and yields their holes as zeros) but
// cannot write them, so the blocks are made here.
func sparseTar(t testing.TB, name string, realSize, off int64, data []byte) []byte {
	t.Helper()
	var pax []byte
	for _, kv := range [][2]string{{"GNU.sparse.major", "1"}, {"GNU.sparse.minor", "0"},
		{"GNU.sparse.name", name}, {"GNU.sparse.realsize", strconv.FormatInt(realSize, 10)}} {
		rec := " " + kv[0] + "=" + kv[1] + "\n"
		n := len(rec)
		for n != len(strconv.Itoa(n))+len(rec) {
			n = len(strconv.Itoa(n)) + len(rec)
		}
		pax = append(pax, strconv.Itoa(n)+rec...)
	}
	sparseMap := []byte(fmt.Sprintf("1\n%d\n%d\n", off, len(data)))
	body := append(padBlock(sparseMap), data...)
	var out []byte
	out = append(out, ustarHeader("PaxHeaders.0/"+name, 'x', int64(len(pax)))...)
	out = append(out, padBlock(pax)...)
	out = append(out, ustarHeader("GNUSparseFile.0/"+name, '0', int64(len(body)))...)
	out = append(out, padBlock(body)...)
	return append(out, make([]byte, 1024)...)
}

func padBlock(b []byte) []byte {
	return append(b, make([]byte, (512-len(b)%512)%512)...)
}

func ustarHeader(name string, typ byte, size int64) []byte {
	h := make([]byte, 512)
	copy(h[0:100], name)
	copy(h[100:], "0000644\x00")
	copy(h[108:], "0000000\x00")
	copy(h[116:], "0000000\x00")
	copy(h[124:], fmt.Sprintf("%011o\x00", size))
	copy(h[136:], fmt.Sprintf("%011o\x00", testTime.Unix()))
	h[156] = typ
	copy(h[257:], "ustar\x0000")
	copy(h[148:156], "        ")
	sum := 0
	for _, c := range h {
		sum += int(c)
	}
	copy(h[148:], fmt.Sprintf("%06o\x00 ", sum))
	return h
}

// zeroTar is a tar of one regular file of n zero bytes.
func zeroTar(t testing.TB, name string, n int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: n, ModTime: testTime}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(tw, zeroReader{}, n); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// gzipOf and zstdOf compress b: a few KiB for many MiB of zeros.
func gzipOf(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func zstdOf(t testing.TB, b []byte) []byte {
	t.Helper()
	zw, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedBestCompression))
	if err != nil {
		t.Fatal(err)
	}
	defer zw.Close()
	return zw.EncodeAll(b, nil)
}

// blobLayer is a layer from an already compressed (or plain) blob.
func blobLayer(t testing.TB, blob []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(blob)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// rawLayer is a layer whose blob is taken as it is, even one that does not
// decompress (which tarball.LayerFromOpener refuses), with a made-up diffID.
type rawLayer struct{ blob []byte }

func (l rawLayer) Digest() (v1.Hash, error) {
	h, _, err := v1.SHA256(bytes.NewReader(l.blob))
	return h, err
}
func (l rawLayer) DiffID() (v1.Hash, error) {
	h, _, err := v1.SHA256(strings.NewReader("diff of " + string(l.blob)))
	return h, err
}
func (l rawLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.blob)), nil
}
func (l rawLayer) Uncompressed() (io.ReadCloser, error) {
	return nil, fmt.Errorf("a raw layer is not uncompressed here")
}
func (l rawLayer) Size() (int64, error)                { return int64(len(l.blob)), nil }
func (l rawLayer) MediaType() (types.MediaType, error) { return types.DockerLayer, nil }

// own is the context of a test that uses the store as the server's own
// work does: it sees every project, and makes imports in the default one.
func own() context.Context { return project.Unscoped(context.Background(), "a test") }
