package integration

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/useshards/shard/client"
)

// TestImageBombs: with the server at --max-image-size 32MiB, images whose
// layers are a few KiB in the registry and huge unpacked (a sparse file of
// 1TiB, a gzip bomb, a zstd bomb) fail to pull with 413 image_too_large
// naming the image and the bound, through a pull and through a create,
// and leave nothing of them under the data dir; an upload over the bound
// is 413 too_large (with a Content-Length, chunked, and through the CLI)
// and leaves nothing either; a small image still pulls.
func TestImageBombs(t *testing.T) {
	e := need(t)
	bombs := map[string]string{ // ref -> what the error says
		pushBomb(t, e, "sparse", sparseLayerTar("var/log/lastlog", 1<<40, 1<<30, []byte("x"))): "hold more than 32MiB of files",
		pushBomb(t, e, "gzip", gzipBytes(t, zeroFileTar(t, 256<<20))):                          "decompress to more than 32MiB",
		pushBomb(t, e, "zstd", zstdBytes(t, zeroFileTar(t, 256<<20))):                          "decompress to more than 32MiB",
	}
	small := pushBomb(t, e, "small", tarBytes(t, "etc/small", []byte("small")))

	restartWith(t, "--max-image-size", "32MiB")
	images := filepath.Join(e.dataDir, "images")
	before := storeContent(t, images)

	for ref, says := range bombs {
		t.Run(ref[strings.LastIndex(ref, "/")+1:], func(t *testing.T) {
			_, err := e.c.Pull(ctxT(t), ref, nil)
			wantClientErr(t, err, 0, "image_too_large", `image "`+ref+`" is too large`, says, "32MiB", "shard serve --max-image-size", "at layer sha256:")
			_, err = e.c.Create(ctxT(t), client.CreateRequest{Image: ref, Provider: "runc"})
			wantClientErr(t, err, 413, "image_too_large", `image "`+ref+`" is too large`, says)
			if after := storeContent(t, images); after != before {
				t.Errorf("the image store after the failed pulls:\n%s\nbefore:\n%s", after, before)
			}
			if _, err := e.c.Image(ctxT(t), ref); err == nil {
				t.Errorf("%s is listed after its pull failed", ref)
			}
		})
	}

	// An upload over the bound: refused as soon as the server can tell,
	// and nothing of it kept. The archive is valid, only too large.
	noise := make([]byte, 40<<20) // does not compress: the archive is over 40MiB
	rand.NewChaCha8([32]byte{1}).Read(noise)
	archive := dockerSave(t, noise)
	for _, tt := range []struct {
		name string
		body io.Reader
	}{
		{"with a Content-Length", bytes.NewReader(archive)},
		{"chunked", io.MultiReader(bytes.NewReader(archive))},
	} {
		t.Run("upload "+tt.name, func(t *testing.T) {
			_, err := e.c.ImportImage(ctxT(t), tt.body, "localhost/bombs/upload:1")
			wantClientErr(t, err, 413, "too_large", "cannot import the upload: it is larger than 32MiB", "shard serve --max-image-size")
		})
	}
	file := filepath.Join(t.TempDir(), "big.tar")
	if err := os.WriteFile(file, archive, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := e.cli(t, "", "image", "import", "--name", "localhost/bombs/upload:1", file); code == 0 || !strings.Contains(errOut, "it is larger than 32MiB") {
		t.Errorf("shard image import of 40MiB: exit %d, %q", code, errOut)
	}
	if after := storeContent(t, images); after != before {
		t.Errorf("the image store after the refused uploads:\n%s\nbefore:\n%s", after, before)
	}

	if _, err := e.c.Pull(ctxT(t), small, nil); err != nil {
		t.Errorf("a small image under the bound: %v", err)
	}
}

func wantClientErr(t *testing.T, err error, status int, code string, says ...string) {
	t.Helper()
	ce, ok := err.(*client.Error)
	if !ok {
		t.Fatalf("err = %v (%T), want a %d %s answer", err, err, status, code)
	}
	if ce.Code != code || (status != 0 && ce.Status != status) {
		t.Errorf("answer %d %s %q, want %d %s", ce.Status, ce.Code, ce.Message, status, code)
	}
	for _, s := range says {
		if !strings.Contains(ce.Message, s) {
			t.Errorf("message %q does not say %q", ce.Message, s)
		}
	}
	if strings.Contains(ce.Message, need(t).dataDir) || strings.Contains(ce.Message, "/proc/self") {
		t.Errorf("message %q names a host path", ce.Message)
	}
}

// storeContent lists the image store's layer dirs, blobs and temp entries.
func storeContent(t *testing.T, images string) string {
	t.Helper()
	var out []string
	for _, d := range []string{"l", "blobs/sha256", "tmp"} {
		ents, _ := os.ReadDir(filepath.Join(images, d))
		for _, e := range ents {
			out = append(out, d+"/"+e.Name())
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// pushBomb pushes an image of one layer, the blob given (a plain tar or
// compressed one), to the test registry.
func pushBomb(t *testing.T, e *env, tag string, blob []byte) string {
	t.Helper()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(blob)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	ref := e.registry + "/shard-test/bomb-" + tag + ":1"
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	t.Logf("%s: a layer of %d bytes", ref, len(blob))
	return ref
}

// dockerSave is a docker-save archive of one image whose one layer holds
// a file of content.
func dockerSave(t *testing.T, content []byte) []byte {
	t.Helper()
	return dockerSaveAs(t, "localhost/bombs/upload:1", content)
}

// dockerSaveAs is dockerSave of an image named ref.
func dockerSaveAs(t *testing.T, ref string, content []byte) []byte {
	t.Helper()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tarBytes(t, "data", content))), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tarball.Write(tag, img, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func tarBytes(t *testing.T, name string, content []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content))}); err != nil {
		t.Fatal(err)
	}
	tw.Write(content)
	tw.Close()
	return buf.Bytes()
}

// zeroFileTar is a tar of one file of n zeros (compressed, a bomb).
func zeroFileTar(t *testing.T, n int) []byte { return tarBytes(t, "zeros", make([]byte, n)) }

func gzipBytes(t *testing.T, b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func zstdBytes(t *testing.T, b []byte) []byte {
	zw, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer zw.Close()
	return zw.EncodeAll(b, nil)
}

// sparseLayerTar is a tar of one sparse file in GNU tar's PAX format
// (GNU.sparse 1.0): realSize bytes, all holes but data at off. Go's tar
// package reads these but cannot write them.
func sparseLayerTar(name string, realSize, off int64, data []byte) []byte {
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
	pad := func(b []byte) []byte { return append(b, make([]byte, (512-len(b)%512)%512)...) }
	header := func(name string, typ byte, size int) []byte {
		h := make([]byte, 512)
		copy(h[0:100], name)
		copy(h[100:], "0000644\x00")
		copy(h[108:], "0000000\x00")
		copy(h[116:], "0000000\x00")
		copy(h[124:], fmt.Sprintf("%011o\x00", size))
		copy(h[136:], fmt.Sprintf("%011o\x00", 0))
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
	body := append(pad([]byte(fmt.Sprintf("1\n%d\n%d\n", off, len(data)))), data...)
	var out []byte
	out = append(out, header("PaxHeaders.0/"+filepath.Base(name), 'x', len(pax))...)
	out = append(out, pad(pax)...)
	out = append(out, header("GNUSparseFile.0/"+filepath.Base(name), '0', len(body))...)
	out = append(out, pad(body)...)
	return append(out, make([]byte, 1024)...)
}
