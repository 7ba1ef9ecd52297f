package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/sys/unix"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/hostdisk"
)

const testLimit = 32 << 20 // MaxImageSize of the stores below

func limited(o *Options) { o.MaxImageSize = testLimit }

// leftovers lists what a store holds of images: layer dirs, blobs, temp
// entries and references.
func leftovers(t *testing.T, s *Store) []string {
	t.Helper()
	var out []string
	for _, d := range []string{"l", "blobs/sha256", "tmp"} {
		ents, _ := os.ReadDir(filepath.Join(s.Dir(), d))
		for _, e := range ents {
			out = append(out, d+"/"+e.Name())
		}
	}
	s.mu.Lock()
	for k := range s.idx.Refs {
		out = append(out, "ref "+k)
	}
	for k := range s.idx.Layers {
		out = append(out, "layer record "+k)
	}
	s.mu.Unlock()
	return out
}

// wantErr checks err's kind, code and text.
func wantErr(t *testing.T, err error, kind errdefs.Kind, code string, texts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want %s/%s", kind, code)
	}
	if errdefs.KindOf(err) != kind || errdefs.CodeOf(err) != code {
		t.Errorf("err = %q (%s/%s); want %s/%s", err, errdefs.KindOf(err), errdefs.CodeOf(err), kind, code)
	}
	for _, s := range texts {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("err = %q; want it to say %q", err, s)
		}
	}
	if p := hostPathIn(err.Error()); p != "" {
		t.Errorf("err = %q names the host path %s", err, p)
	}
}

func allocated(t *testing.T, p string) (size, onDisk int64) {
	t.Helper()
	st := lstat(t, p)
	return st.Size, st.Blocks * 512
}

func TestSparseTarHelper(t *testing.T) {
	tr := tar.NewReader(bytes.NewReader(sparseTar(t, "big", 1<<20, 4096, []byte("data"))))
	hdr, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(tr)
	if err != nil || hdr.Name != "big" || len(b) != 1<<20 || string(b[4096:4100]) != "data" {
		t.Fatalf("%q %d %v", hdr.Name, len(b), err)
	}
}

// TestUnpackWritesHoles: a sparse entry is written with holes, not its
// zeros (as is a run of zero blocks in a plain file), and reads the same.
func TestUnpackWritesHoles(t *testing.T) {
	requireRoot(t)
	d := t.TempDir()
	var layer bytes.Buffer
	// Two entries in one tar: the sparse file, then a plain one of zeros
	// with some data in it.
	sp := sparseTar(t, "sparse", 256<<20, 128<<20, []byte("middle"))
	plain := make([]byte, 8<<20)
	copy(plain[5<<20:], "data")
	pt := tarOf(t, ent{name: "plain", typ: tar.TypeReg, body: string(plain)})
	layer.Write(sp[:len(sp)-1024]) // without its end blocks
	layer.Write(pt)
	got, err := unpackLayer(own(), bytes.NewReader(layer.Bytes()), d, nil, "", func(string, ...any) {})
	if err != nil {
		t.Fatal(err)
	}
	if got.size != 256<<20+8<<20 {
		t.Errorf("content size %d", got.size)
	}
	for _, c := range []struct {
		name       string
		size       int64
		maxOnDisk  int64
		at         int64
		wantAtData string
	}{{"sparse", 256 << 20, 1 << 20, 128 << 20, "middle"}, {"plain", 8 << 20, 1 << 20, 5 << 20, "data"}} {
		p := filepath.Join(d, c.name)
		size, onDisk := allocated(t, p)
		t.Logf("%s: %d bytes, %d on disk", c.name, size, onDisk)
		if size != c.size || onDisk > c.maxOnDisk {
			t.Errorf("%s: %d bytes, %d of them on disk; want %d with at most %d on disk (holes)", c.name, size, onDisk, c.size, c.maxOnDisk)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(c.wantAtData)+2)
		f.ReadAt(buf, c.at-1)
		f.Close()
		if string(buf) != "\x00"+c.wantAtData+"\x00" {
			t.Errorf("%s at %d: %q", c.name, c.at, buf)
		}
	}
}

// TestUnpackStopsWhenCancelled: a sparse bomb with no bound (the tar
// reader makes its terabyte of zeros without reading anything) stops when
// the context ends.
func TestUnpackStopsWhenCancelled(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(own(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := unpackLayer(ctx, bytes.NewReader(sparseTar(t, "bomb", 1<<40, 0, []byte("x"))), t.TempDir(), nil, "", func(string, ...any) {})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want the context's", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("unpacking went on 20s after its context ended")
	}
}

// TestPullBombs: layers that are small in the registry and huge unpacked
// fail the pull with 413 image_too_large naming the image and the bound,
// once the bound is reached (not after), and leave nothing of the image:
// not the layer being unpacked, not the layers unpacked before it.
func TestPullBombs(t *testing.T) {
	requireRoot(t)
	host := testRegistry(t)
	good := layerOf(t, file("etc/ok", "ok"))
	tests := []struct {
		name  string
		layer []byte
		says  string
	}{
		{"sparse file of 1TiB", sparseTar(t, "bomb", 1<<40, 1<<30, []byte("x")), "hold more than 32MiB of files"},
		{"gzip bomb", gzipOf(t, zeroTar(t, "zeros", 64<<20)), "decompress to more than 32MiB"},
		{"zstd bomb", zstdOf(t, zeroTar(t, "zeros", 64<<20)), "decompress to more than 32MiB"},
		{"zstd trailing garbage", zstdOf(t, append(tarOf(t, file("a", "a")), make([]byte, 64<<20)...)), "decompress to more than 32MiB"},
		{"layers over the bound together", gzipOf(t, zeroTar(t, "zeros", 24<<20)), "more than 32MiB"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Logf("layer blob: %d bytes", len(tt.layer))
			ref := host + "/bomb/" + string(rune('a'+i)) + ":1"
			layers := []v1.Layer{good, blobLayer(t, tt.layer)}
			if strings.HasPrefix(tt.name, "layers over") {
				layers = append(layers, blobLayer(t, gzipOf(t, zeroTar(t, "more", 24<<20))))
			}
			push(t, ref, imageOf(t, runtime.GOARCH, layers...))
			s := openStore(t, t.TempDir(), limited)
			start := time.Now()
			_, err := s.Pull(own(), ref, nil)
			t.Logf("after %v: %v", time.Since(start), err)
			wantErr(t, err, errdefs.KindTooLarge, "image_too_large", `image "`+ref+`" is too large`, tt.says, "shard serve --max-image-size", "at layer sha256:")
			if left := leftovers(t, s); len(left) > 0 {
				t.Errorf("the failed pull left %v", left)
			}
		})
	}
}

// TestPullCountsCachedLayers: an image is as large with the layers it
// shares with the cache.
func TestPullCountsCachedLayers(t *testing.T) {
	requireRoot(t)
	host := testRegistry(t)
	base := blobLayer(t, gzipOf(t, zeroTar(t, "base", 20<<20)))
	push(t, host+"/c/base:1", imageOf(t, runtime.GOARCH, base))
	push(t, host+"/c/big:1", imageOf(t, runtime.GOARCH, base, blobLayer(t, gzipOf(t, zeroTar(t, "top", 20<<20)))))
	s := openStore(t, t.TempDir(), limited)
	if _, err := s.Pull(own(), host+"/c/base:1", nil); err != nil {
		t.Fatal(err)
	}
	_, err := s.Pull(own(), host+"/c/big:1", nil)
	wantErr(t, err, errdefs.KindTooLarge, "image_too_large", "decompress to more than 32MiB")
	if n := len(layerDirs(t, s.Dir())); n != 1 {
		t.Errorf("%d layer dirs after the failed pull; want base's only", n)
	}
}

// TestPullKeepsTheDiskReserve: a pull that would leave the data dir's
// filesystem below its reserve fails with 507 insufficient_storage, and
// leaves nothing.
func TestPullKeepsTheDiskReserve(t *testing.T) {
	requireRoot(t)
	host := testRegistry(t)
	push(t, host+"/r/app:1", imageOf(t, runtime.GOARCH, layerOf(t, file("a", "a")), blobLayer(t, gzipOf(t, zeroTar(t, "z", 40<<20)))))
	for _, tt := range []struct {
		name    string
		reserve int64
		fake    func(d hostdisk.Space) hostdisk.Space
		says    string
	}{
		{"bytes", 5 << 30, func(d hostdisk.Space) hostdisk.Space { d.Total, d.Avail = 100<<30, 5<<30+16<<20; return d }, "keeps 5GiB of it free for the rest of the host (shard serve --reserve)"},
		{"small reserve", 1 << 30, func(d hostdisk.Space) hostdisk.Space { d.Total, d.Avail = 10<<30, 1<<30+16<<20; return d }, "keeps 1GiB"},
		{"inodes", 1 << 30, func(d hostdisk.Space) hostdisk.Space { d.Files, d.Ffree = 1000000, 40000; return d }, "not enough free inodes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			var mu sync.Mutex
			var written int64 // what unpacking has taken: the fake disk fills with it
			disk := hostdisk.New(dir, tt.reserve).WithStatfs(func(string) (hostdisk.Space, error) {
				mu.Lock()
				defer mu.Unlock()
				f := tt.fake(hostdisk.Space{Total: 1 << 40, Avail: 1 << 39})
				if tt.name != "inodes" {
					f.Avail -= uint64(min(written, int64(f.Avail)))
				}
				written += 8 << 20
				return f, nil
			})
			s := openStore(t, dir, func(o *Options) { o.MaxImageSize = 1 << 30; o.Disk = disk })
			_, err := s.Pull(own(), host+"/r/app:1", nil)
			wantErr(t, err, errdefs.KindNoSpace, "insufficient_storage", `image "`+host+`/r/app:1"`, tt.says)
			if left := leftovers(t, s); len(left) > 0 {
				t.Errorf("the failed pull left %v", left)
			}
		})
	}
}

// TestPullBadImagesAre4xx: what a registry serves that is not a valid
// image is the image's fault (422 invalid_image or 413 image_too_large),
// named, never a 500.
func TestPullBadImagesAre4xx(t *testing.T) {
	requireRoot(t)
	host := testRegistry(t)
	bigAnnotation := strings.Repeat("a", maxManifestSize)
	cases := []struct {
		name string
		img  func(t *testing.T) v1.Image
		kind errdefs.Kind
		code string
		says []string
	}{
		{"file under a file", func(t *testing.T) v1.Image {
			return imageOf(t, runtime.GOARCH, layerOf(t, file("a", "x"), file("a/b", "y")))
		}, errdefs.KindFailed, "invalid_image", []string{"of image", `is not a valid layer: entry "a/b": not a directory`}},
		{"not a tar", func(t *testing.T) v1.Image {
			return imageOf(t, runtime.GOARCH, blobLayer(t, gzipOf(t, bytes.Repeat([]byte("not a tar "), 100))))
		}, errdefs.KindFailed, "invalid_image", []string{"is not a valid layer"}},
		{"truncated gzip", func(t *testing.T) v1.Image {
			gz := gzipOf(t, tarOf(t, file("a", strings.Repeat("x", 10000))))
			return imageOf(t, runtime.GOARCH, rawLayer{gz[:len(gz)-20]})
		}, errdefs.KindFailed, "invalid_image", []string{"is not a valid layer"}},
		{"path escapes", func(t *testing.T) v1.Image {
			return imageOf(t, runtime.GOARCH, layerOf(t, file("../evil", "x")))
		}, errdefs.KindFailed, "invalid_image", []string{`entry "../evil": path escapes the layer directory`}},
		{"manifest over 4MiB", func(t *testing.T) v1.Image {
			return mutate.Annotations(imageOf(t, runtime.GOARCH, layerOf(t, file("a", "a"))), map[string]string{"x": bigAnnotation}).(v1.Image)
		}, errdefs.KindTooLarge, "image_too_large", []string{"its manifest is larger than 4MiB"}},
		{"config over 16MiB", func(t *testing.T) v1.Image {
			img := imageOf(t, runtime.GOARCH, layerOf(t, file("a", "a")))
			cf, _ := img.ConfigFile()
			cf = cf.DeepCopy()
			cf.Config.Env = append(cf.Config.Env, "BIG="+strings.Repeat("b", maxConfigSize))
			img, err := mutate.ConfigFile(img, cf)
			if err != nil {
				t.Fatal(err)
			}
			return img
		}, errdefs.KindTooLarge, "image_too_large", []string{"its config is larger than 16MiB"}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ref := host + "/bad/" + string(rune('a'+i)) + ":1"
			push(t, ref, c.img(t))
			s := openStore(t, t.TempDir(), limited)
			_, err := s.Pull(own(), ref, nil)
			wantErr(t, err, c.kind, c.code, c.says...)
			if left := leftovers(t, s); len(left) > 0 {
				t.Errorf("the failed pull left %v", left)
			}
		})
	}
}

// TestImportUploadBounds: an upload over the bound is 413 too_large
// naming the bound, and nothing of it is kept; an upload that fills the
// disk to its reserve is 507.
func TestImportUploadBounds(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	s := openStore(t, dir, func(o *Options) { o.MaxImageSize = 1 << 20 })
	_, err := s.ImportStream(own(), io.LimitReader(zeroReader{}, 1<<20+1), "x:1")
	wantErr(t, err, errdefs.KindTooLarge, "too_large", "cannot import the upload: it is larger than 1MiB", "shard serve --max-image-size")
	if left := leftovers(t, s); len(left) > 0 {
		t.Errorf("left %v", left)
	}
	// Exactly at the bound is taken (and found not to be an archive).
	_, err = s.ImportStream(own(), io.LimitReader(zeroReader{}, 1<<20), "x:1")
	wantErr(t, err, errdefs.KindInvalid, "invalid_argument")

	s = openStore(t, t.TempDir(), limited, func(o *Options) {
		o.Disk = hostdisk.New(o.Dir, 5<<30).WithStatfs(func(string) (hostdisk.Space, error) {
			return hostdisk.Space{Total: 100 << 30, Avail: 5<<30 - 1}, nil
		})
	})
	_, err = s.ImportStream(own(), bytes.NewReader(archiveOf(t, "a", "b")), "x:1")
	wantErr(t, err, errdefs.KindNoSpace, "insufficient_storage", "not enough disk space for the upload")
	if left := leftovers(t, s); len(left) > 0 {
		t.Errorf("left %v", left)
	}
}

// TestImportBombs: archives whose content is over the bound (a gzipped
// archive that decompresses past it, a layout holding a sparse bomb, an
// image's layers) or whose JSON documents are over theirs are 413
// image_too_large, and leave nothing.
func TestImportBombs(t *testing.T) {
	requireRoot(t)
	oci := ociSeeds(t)[0]
	dock := dockerSeeds(t)[0]
	pad := func(doc []byte, n int) []byte { // valid JSON, n bytes longer
		return append(append([]byte{}, doc...), bytes.Repeat([]byte(" "), n)...)
	}
	bigConfig := pad(seedConfig(), maxConfigSize)
	cases := []struct {
		name    string
		archive func(t *testing.T) []byte
		says    []string
	}{
		{"gzipped archive decompressing past the bound", func(t *testing.T) []byte {
			var buf bytes.Buffer
			buf.Write(zeroTar(t, "junk", 40<<20)[:512+40<<20])
			buf.Write(ociLayoutTar(t, oci.index, oci.manifest, oci.config, oci.layer))
			return gzipOf(t, buf.Bytes())
		}, []string{"cannot import the upload: it decompresses to more than 32MiB"}},
		{"layout holding a sparse bomb", func(t *testing.T) []byte {
			l := ociLayoutTar(t, oci.index, oci.manifest, oci.config, oci.layer)
			st := sparseTar(t, "junk", 1<<40, 0, []byte("x"))
			return append(st[:len(st)-1024], l...)
		}, []string{"cannot import the upload: it holds more than 32MiB of files"}},
		{"layout image's layer a zstd bomb", func(t *testing.T) []byte {
			return ociLayoutTar(t, oci.index, oci.manifest, oci.config, zstdOf(t, zeroTar(t, "z", 64<<20)))
		}, []string{`image "localhost/fuzz:1" is too large: its layers decompress to more than 32MiB`}},
		{"docker archive's layer a sparse bomb", func(t *testing.T) []byte {
			return dockerArchiveTar(t, dock.manifest, dock.config, sparseTar(t, "bomb", 1<<40, 0, []byte("x")))
		}, []string{`image "localhost/fuzz:1" is too large: its layers hold more than 32MiB of files`}},
		{"layout index.json over 4MiB", func(t *testing.T) []byte {
			return ociLayoutTar(t, pad(oci.index, maxManifestSize), oci.manifest, oci.config, oci.layer)
		}, []string{"its index.json is larger than 4MiB"}},
		{"layout manifest over 4MiB", func(t *testing.T) []byte {
			return ociLayoutTar(t, oci.index, pad(oci.manifest, maxManifestSize), oci.config, oci.layer)
		}, []string{"its manifest is larger than 4MiB"}},
		{"layout config over 16MiB", func(t *testing.T) []byte {
			return ociLayoutTar(t, oci.index, oci.manifest, bigConfig, oci.layer)
		}, []string{"its config is larger than 16MiB"}},
		{"docker manifest.json over 4MiB", func(t *testing.T) []byte {
			return dockerArchiveTar(t, pad(dock.manifest, maxManifestSize), dock.config, dock.layer)
		}, []string{"its manifest.json is larger than 4MiB"}},
		{"docker config over 16MiB", func(t *testing.T) []byte {
			return dockerArchiveTar(t, dock.manifest, bigConfig, dock.layer)
		}, []string{"its config is larger than 16MiB"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := c.archive(t)
			t.Logf("archive: %d bytes", len(a))
			s := openStore(t, t.TempDir(), func(o *Options) { o.MaxImageSize = 64 << 20 })
			if !strings.Contains(c.name, "over 4MiB") && !strings.Contains(c.name, "over 16MiB") {
				s.maxImage = testLimit
			}
			_, err := s.ImportStream(own(), bytes.NewReader(a), "")
			wantErr(t, err, errdefs.KindTooLarge, "image_too_large", c.says...)
			if left := leftovers(t, s); len(left) > 0 {
				t.Errorf("the failed import left %v", left)
			}
		})
	}
}

// TestUnpackHostErrorsAreInternal: a failure of the host's disk while
// unpacking is the server's (500), not the image's.
func TestUnpackHostErrorsAreInternal(t *testing.T) {
	err := (&Store{log: slog.New(slog.DiscardHandler)}).layerErr(own(), layerSource{digest: "sha256:aa"}, &budget{what: `image "x"`}, nil,
		&os.PathError{Op: "write", Path: "/x", Err: unix.EIO})
	if errdefs.KindOf(err) != errdefs.KindInternal {
		t.Errorf("EIO: %v (%s)", err, errdefs.KindOf(err))
	}
	err = (&Store{log: slog.New(slog.DiscardHandler)}).layerErr(own(), layerSource{digest: "sha256:aa"}, &budget{what: `image "x"`}, nil,
		&os.PathError{Op: "write", Path: "/x", Err: unix.ENOSPC})
	wantErr(t, err, errdefs.KindNoSpace, "insufficient_storage", `not enough disk space for image "x"`)
}

// TestPullRepoNamedManifests: the cut-off for manifests is not applied to
// the blobs of a repository with "manifests" in its name.
func TestPullRepoNamedManifests(t *testing.T) {
	requireRoot(t)
	host := testRegistry(t)
	big := make([]byte, 6<<20)
	rand.NewChaCha8([32]byte{1}).Read(big)
	ref := host + "/manifests/manifests:1"
	push(t, ref, imageOf(t, runtime.GOARCH, layerOf(t, file("big", string(big)))))
	s := openStore(t, t.TempDir())
	if _, err := s.Pull(own(), ref, nil); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{"/v2/a/manifests/latest": true, "/v2/manifests/manifests/sha256:ab": true,
		"/v2/a/manifests/blobs/sha256:ab": false, "/v2/manifests/blobs/sha256:ab": false, "/v2/a/blobs/x": false} {
		if isManifestPath(p) != want {
			t.Errorf("isManifestPath(%q) = %v", p, !want)
		}
	}
}
