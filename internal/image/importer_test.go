package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/useshards/shard/internal/errdefs"
)

func checkImported(t *testing.T, img *Image, wantName string, ti testImages) {
	t.Helper()
	if img.Name != wantName {
		t.Errorf("Name %q, want %q", img.Name, wantName)
	}
	if cn, _ := ti.app.ConfigName(); img.ID != cn.String() {
		t.Errorf("ID %s, want %s", img.ID, cn)
	}
	if len(img.Layers) != 2 || img.Config.WorkingDir != "/work" {
		t.Fatalf("Layers %v Config %+v", img.Layers, img.Config)
	}
	if b, _ := os.ReadFile(filepath.Join(img.Layers[0], "etc/hello")); string(b) != "hi" {
		t.Errorf("etc/hello = %q", b)
	}
	if !isWhiteout(t, filepath.Join(img.Layers[1], "etc/gone")) {
		t.Errorf("etc/gone is not a whiteout")
	}
}

// legacyDockerSave writes the pre-25 `docker save` format by hand:
// plain layer tars, a config, and manifest.json.
func legacyDockerSave(t *testing.T, path string, tags []string, gz bool, ti testImages) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, b []byte) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write(b)
	}
	cfg, _ := ti.app.RawConfigFile()
	add("config.json", cfg)
	var layers []string
	for i, l := range []v1.Layer{ti.base, ti.appTop} {
		rc, _ := l.Uncompressed()
		b, _ := io.ReadAll(rc)
		p := string(rune('a'+i)) + "/layer.tar"
		add(p, b)
		layers = append(layers, p)
	}
	m, _ := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": tags, "Layers": layers}})
	add("manifest.json", m)
	tw.Close()
	data := buf.Bytes()
	if gz {
		var zb bytes.Buffer
		zw := gzip.NewWriter(&zb)
		zw.Write(data)
		zw.Close()
		data = zb.Bytes()
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestImportDockerArchive(t *testing.T) {
	requireRoot(t)
	ctx := own()
	ti := makeTestImages(t)
	tmp := t.TempDir()

	ggcrArchive := filepath.Join(tmp, "ggcr.tar")
	tag, _ := name.NewTag("example.com/imp/docker:1")
	if err := tarball.WriteToFile(ggcrArchive, tag, ti.app); err != nil {
		t.Fatal(err)
	}
	legacy, legacyGz, untagged := filepath.Join(tmp, "legacy.tar"), filepath.Join(tmp, "legacy.tar.gz"), filepath.Join(tmp, "untagged.tar")
	legacyDockerSave(t, legacy, []string{"busybox:latest"}, false, ti)
	legacyDockerSave(t, legacyGz, []string{"busybox:latest"}, true, ti)
	legacyDockerSave(t, untagged, nil, false, ti)

	s := openStore(t, filepath.Join(tmp, "store"))
	tests := []struct {
		file, name, want string
	}{
		// An archive's own names are moved under localhost/ (local.go).
		{ggcrArchive, "", "localhost/imp/docker:1"},
		{legacy, "", "localhost/busybox:latest"},
		{legacyGz, "", "localhost/busybox:latest"},
		{untagged, "localhost/mine:v1", "localhost/mine:v1"},
		{ggcrArchive, "localhost/renamed", "localhost/renamed:latest"},
	}
	digests := map[string]string{}
	for _, tt := range tests {
		imgs, err := s.Import(ctx, tt.file, tt.name)
		if err != nil {
			t.Fatalf("Import(%s, %q): %v", filepath.Base(tt.file), tt.name, err)
		}
		if len(imgs) != 1 {
			t.Fatalf("Import(%s) = %d images", tt.file, len(imgs))
		}
		checkImported(t, imgs[0], tt.want, ti)
		if d, ok := digests[tt.want]; ok && d != imgs[0].Digest {
			t.Errorf("re-import of %s changed its digest: %s -> %s", tt.want, d, imgs[0].Digest)
		}
		digests[tt.want] = imgs[0].Digest
		if got, err := s.Get(ctx, tt.want); err != nil || got.Digest != imgs[0].Digest {
			t.Errorf("Get(%q) after import: %v", tt.want, err)
		}
	}
	if n := len(layerDirs(t, filepath.Join(tmp, "store"))); n != 2 {
		t.Errorf("%d layer dirs after importing one image 5 ways, want 2", n)
	}
	if _, err := s.Import(ctx, untagged, ""); errdefs.KindOf(err) != errdefs.KindInvalid || !strings.Contains(err.Error(), "give a name") {
		t.Errorf("untagged archive without a name: %v", err)
	}
}

func TestImportOCILayout(t *testing.T) {
	requireRoot(t)
	ctx := own()
	ti := makeTestImages(t)
	tmp := t.TempDir()

	named := filepath.Join(tmp, "named")
	p, err := layout.Write(named, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(ti.app, layout.WithAnnotations(map[string]string{annotationRefName: "example.com/imp/oci:2"})); err != nil {
		t.Fatal(err)
	}
	anon := filepath.Join(tmp, "anon")
	if p, err = layout.Write(anon, empty.Index); err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(ti.app, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH})); err != nil {
		t.Fatal(err)
	}
	anonTar := filepath.Join(tmp, "anon.tar")
	tarDir(t, anon, anonTar)

	s := openStore(t, filepath.Join(tmp, "store"))
	tests := []struct {
		path, name, want string
	}{
		{named, "", "localhost/imp/oci:2"},
		{anon, "localhost/local/thing:1", "localhost/local/thing:1"},
		{anonTar, "localhost/from-tar:1", "localhost/from-tar:1"},
	}
	for _, tt := range tests {
		imgs, err := s.Import(ctx, tt.path, tt.name)
		if err != nil {
			t.Fatalf("Import(%s): %v", filepath.Base(tt.path), err)
		}
		if len(imgs) != 1 {
			t.Fatalf("Import(%s) = %d images", tt.path, len(imgs))
		}
		checkImported(t, imgs[0], tt.want, ti)
		if want := mustDigest(t, ti.app); imgs[0].Digest != want {
			t.Errorf("Digest %s, want the manifest's %s", imgs[0].Digest, want)
		}
	}
	if _, err := s.Import(ctx, anon, ""); errdefs.KindOf(err) != errdefs.KindInvalid {
		t.Errorf("unnamed layout without a name: %v", err)
	}
	notArchive := filepath.Join(tmp, "notes.txt")
	os.WriteFile(notArchive, []byte("hello"), 0o644)
	for _, bad := range []string{notArchive, filepath.Join(tmp, "missing"), tmp} {
		if _, err := s.Import(ctx, bad, "localhost/x:1"); errdefs.KindOf(err) != errdefs.KindInvalid {
			t.Errorf("Import(%s): %v, want invalid_argument", bad, err)
		}
	}
}

// tarDir archives a directory, as `tar -C dir -cf out .` would.
func tarDir(t *testing.T, dir, out string) {
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	defer tw.Close()
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr.Name = "./" + rel
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
