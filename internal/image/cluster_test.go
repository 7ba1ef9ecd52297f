package image

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/useshards/shard/internal/errdefs"
	"github.com/useshards/shard/internal/project"
)

// fakeRegistry is a cluster's record of imports, in memory.
type fakeRegistry struct {
	mu     sync.Mutex
	node   string
	held   map[string]string // project + " " + ref -> digest
	refuse error             // ClaimImport's answer when set
}

func (f *fakeRegistry) ClaimImport(_ context.Context, proj, ref, digest string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse != nil {
		return f.refuse
	}
	f.held[proj+" "+ref] = digest
	return nil
}

func (f *fakeRegistry) ReleaseImport(_ context.Context, proj, ref string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.held, proj+" "+ref)
}

func (f *fakeRegistry) get(key string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held[key]
}

// TestImportCopies: an import is claimed in the cluster's registry, keeps
// its layer blobs, and is exported as an OCI layout that another store
// imports as a copy, checked against the digest: a copy whose blob was
// changed, or that names another digest, is refused and leaves nothing.
// A copy is not claimed, nor released when removed; the import is
// released when removed. A refused claim imports nothing.
func TestImportCopies(t *testing.T) {
	requireRoot(t)
	ti := makeTestImages(t)
	tmp := t.TempDir()
	anon := filepath.Join(tmp, "anon")
	p, err := layout.Write(anon, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(ti.app, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH})); err != nil {
		t.Fatal(err)
	}
	docker := filepath.Join(tmp, "docker.tar")
	legacyDockerSave(t, docker, nil, false, ti)

	reg := &fakeRegistry{node: "a", held: map[string]string{}}
	a := openStore(t, filepath.Join(tmp, "a"))
	a.SetRegistry(reg)
	bars := project.With(context.Background(), "bars")
	other := project.With(context.Background(), "other")

	for _, src := range []struct{ path, ref string }{{anon, "localhost/bars/oci:1"}, {docker, "localhost/bars/docker:1"}} {
		t.Run(filepath.Base(src.path), func(t *testing.T) {
			imgs, err := a.Import(bars, src.path, src.ref)
			if err != nil {
				t.Fatal(err)
			}
			digest := imgs[0].Digest
			if got := reg.get("bars " + src.ref); got != digest {
				t.Fatalf("the registry holds %q for the import, want %s", got, digest)
			}
			var sent bytes.Buffer
			if err := a.Export(bars, src.ref, &sent); err != nil {
				t.Fatalf("Export: %v", err)
			}
			if err := a.Export(other, src.ref, io.Discard); errdefs.CodeOf(err) != "image_not_found" {
				t.Errorf("Export in another project: %v", err)
			}

			// The copy, whole.
			breg := &fakeRegistry{node: "b", held: map[string]string{}}
			bdir := filepath.Join(t.TempDir(), "b")
			b := openStore(t, bdir)
			b.SetRegistry(breg)
			cp, err := b.ImportCopy(bars, bytes.NewReader(sent.Bytes()), src.ref, digest, "a")
			if err != nil {
				t.Fatalf("ImportCopy: %v", err)
			}
			checkImported(t, cp, src.ref, ti)
			if cp.Digest != digest || cp.Origin != "a" || cp.Project != "bars" {
				t.Errorf("copy: %+v", cp)
			}
			if len(breg.held) != 0 {
				t.Errorf("a copy was claimed: %v", breg.held)
			}
			if _, err := b.Get(other, src.ref); errdefs.CodeOf(err) != "image_not_found" {
				t.Errorf("the copy in another project: %v", err)
			}
			if err := b.Export(bars, src.ref, io.Discard); errdefs.CodeOf(err) != "image_not_exportable" {
				t.Errorf("Export of a copy: %v", err)
			}
			breg.held["bars "+src.ref] = "kept" // a copy's removal releases nothing
			if err := b.Remove(bars, src.ref, false); err != nil {
				t.Fatal(err)
			}
			if breg.get("bars "+src.ref) != "kept" {
				t.Errorf("removing a copy released the import")
			}

			// Tampered, or another digest: refused, nothing kept.
			for what, tc := range map[string]struct {
				body   []byte
				digest string
			}{
				"a changed layer blob": {tamper(t, sent.Bytes()), digest},
				"another digest":       {sent.Bytes(), "sha256:" + strings.Repeat("0", 64)},
			} {
				c := openStore(t, filepath.Join(t.TempDir(), "c"))
				_, err := c.ImportCopy(bars, bytes.NewReader(tc.body), src.ref, tc.digest, "a")
				if errdefs.CodeOf(err) != "image_copy_mismatch" || !strings.Contains(err.Error(), "does not match") {
					t.Errorf("%s: %v, want image_copy_mismatch", what, err)
				}
				if all, _ := c.List(own()); len(all) != 0 {
					t.Errorf("%s: the refused copy left %+v", what, all)
				}
				if n := len(layerDirs(t, c.Dir())); n != 0 {
					t.Errorf("%s: the refused copy left %d layer dirs", what, n)
				}
			}

			if err := a.Remove(bars, src.ref, false); err != nil {
				t.Fatal(err)
			}
			if got := reg.get("bars " + src.ref); got != "" {
				t.Errorf("the registry still holds %q after the removal", got)
			}
		})
	}

	// Outside a cluster (no registry) an import keeps no layer blobs, and
	// is not exported.
	single := openStore(t, filepath.Join(tmp, "single"))
	if _, err := single.Import(bars, anon, "localhost/bars/single:1"); err != nil {
		t.Fatal(err)
	}
	if err := single.Export(bars, "localhost/bars/single:1", io.Discard); errdefs.CodeOf(err) != "image_not_exportable" {
		t.Errorf("Export of an import made outside a cluster: %v", err)
	}

	// A claim the registry refuses imports nothing.
	reg.refuse = errdefs.Conflict("name_taken", "an image named localhost/bars/x:1 was imported on node b")
	if _, err := a.Import(bars, anon, "localhost/bars/x:1"); errdefs.CodeOf(err) != "name_taken" {
		t.Fatalf("import refused by the registry: %v", err)
	}
	if _, err := a.Get(bars, "localhost/bars/x:1"); errdefs.CodeOf(err) != "image_not_found" {
		t.Errorf("a refused import is there: %v", err)
	}
	if n := len(layerDirs(t, a.Dir())); n != 0 {
		t.Errorf("a refused import left %d layer dirs", n)
	}
}

// tamper flips a byte of the first layer blob of an exported layout.
func tamper(t *testing.T, sent []byte) []byte {
	t.Helper()
	type entry struct {
		hdr  *tar.Header
		body []byte
	}
	var ents []entry
	byName := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(sent))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		ents = append(ents, entry{hdr, b})
		byName[hdr.Name] = b
	}
	var idx v1.IndexManifest
	if err := json.Unmarshal(byName["index.json"], &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("index.json: %v", err)
	}
	var m v1.Manifest
	if err := json.Unmarshal(byName["blobs/sha256/"+idx.Manifests[0].Digest.Hex], &m); err != nil || len(m.Layers) == 0 {
		t.Fatalf("manifest: %v", err)
	}
	layer := byName["blobs/sha256/"+m.Layers[0].Digest.Hex]
	if len(layer) == 0 {
		t.Fatalf("no blob of layer %s in the layout", m.Layers[0].Digest)
	}
	layer[len(layer)/2] ^= 0xff
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for _, e := range ents {
		tw.WriteHeader(e.hdr)
		tw.Write(e.body)
	}
	tw.Close()
	return out.Bytes()
}

func TestImportName(t *testing.T) {
	for ref, want := range map[string]string{
		"localhost/app":                  "localhost/app:latest",
		"localhost/bars/busybox:1":       "localhost/bars/busybox:1",
		" localhost/x:2 ":                "localhost/x:2",
		"busybox":                        "",
		"127.0.0.1:5000/app:1":           "",
		"localhost:5000/app:1":           "",
		"localhost/app@sha256:" + hex64s: "",
		"Localhost/APP":                  "",
	} {
		got, ok := ImportName(ref)
		if got != want || ok != (want != "") {
			t.Errorf("ImportName(%q) = %q %v, want %q", ref, got, ok, want)
		}
	}
}

var hex64s = strings.Repeat("ab", 32)
