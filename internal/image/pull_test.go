package image

import (
	"archive/tar"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sys/unix"

	"github.com/useshards/shard/internal/errdefs"
)

// testImages are two images sharing a base layer; app's top layer deletes
// a base file with a whiteout and hides a base dir's content with an
// opaque whiteout.
type testImages struct {
	base, appTop, otherTop v1.Layer
	app, other             v1.Image
}

func makeTestImages(t *testing.T) testImages {
	var ti testImages
	ti.base = layerOf(t,
		dir("etc/"), file("etc/hello", "hi"), file("etc/gone", "bye"),
		dir("var/"), dir("var/cache/"), file("var/cache/old", "o"),
		dir("bin/"), ent{name: "bin/sh", typ: tar.TypeReg, body: "#!", mode: 0o755},
	)
	ti.appTop = layerOf(t,
		file("etc/.wh.gone", ""), file("etc/new", "new"),
		dir("var/cache/"), file("var/cache/.wh..wh..opq", ""), file("var/cache/fresh", "f"),
	)
	ti.otherTop = layerOf(t, file("other", "o"))
	ti.app = imageOf(t, runtime.GOARCH, ti.base, ti.appTop)
	ti.other = imageOf(t, runtime.GOARCH, ti.base, ti.otherTop)
	return ti
}

type progressLog struct {
	mu  sync.Mutex
	all []Progress
}

func (p *progressLog) fn(u Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.all = append(p.all, u)
}

func (p *progressLog) statuses() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := map[string]int{}
	for _, u := range p.all {
		if u.Layer != "" {
			m[u.Status]++
		}
	}
	return m
}

func (p *progressLog) last() Progress {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.all[len(p.all)-1]
}

func layerDirs(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "l"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestPullUnpackReuseRemove(t *testing.T) {
	requireRoot(t)
	ctx := own()
	host := testRegistry(t)
	ti := makeTestImages(t)
	appRef, otherRef := host+"/test/app:v1", host+"/test/other:v1"
	push(t, appRef, ti.app)
	push(t, otherRef, ti.other)

	dir := t.TempDir()
	s := openStore(t, dir)
	var pl progressLog
	img, err := s.Pull(ctx, appRef, pl.fn)
	if err != nil {
		t.Fatalf("Pull: %v", err)
	}
	if img.Name != appRef || img.Ref != appRef {
		t.Errorf("Name %q Ref %q, want %q", img.Name, img.Ref, appRef)
	}
	if want := mustDigest(t, ti.app); img.Digest != want {
		t.Errorf("Digest %s, want %s", img.Digest, want)
	}
	if cn, _ := ti.app.ConfigName(); img.ID != cn.String() {
		t.Errorf("ID %s, want %s", img.ID, cn)
	}
	if img.Config.WorkingDir != "/work" || img.Config.User != "1000:1000" || len(img.Config.Env) != 2 ||
		img.Config.Cmd[0] != "/bin/sh" || img.Config.Entrypoint[0] != "/entry" {
		t.Errorf("Config = %+v", img.Config)
	}
	if img.Size < int64(len("hi")+len("bye")+len("new")) || img.Created.IsZero() {
		t.Errorf("Size %d Created %v", img.Size, img.Created)
	}
	if len(img.Layers) != 2 {
		t.Fatalf("Layers = %v", img.Layers)
	}
	short := regexp.MustCompile(`^` + regexp.QuoteMeta(filepath.Join(dir, "l")) + `/[0-9a-f]{16}$`)
	for _, l := range img.Layers {
		if !short.MatchString(l) {
			t.Errorf("layer dir %q is not <Dir>/l/<16 hex>", l)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(img.Layers[0], "etc/hello")); string(b) != "hi" {
		t.Errorf("bottom layer etc/hello = %q", b)
	}
	if !isWhiteout(t, filepath.Join(img.Layers[1], "etc/gone")) {
		t.Errorf("top layer: etc/gone is not a whiteout")
	}
	last := pl.last()
	if last.Status != StatusDone || last.Total == 0 || last.Done != last.Total {
		t.Errorf("last progress %+v", last)
	}
	if st := pl.statuses(); st[StatusComplete] != 2 || st[StatusExists] != 0 {
		t.Errorf("first pull statuses %v", st)
	}
	checkStacked(t, img.Layers)

	// A second pull asks the registry again but reuses both layers.
	inode := lstat(t, img.Layers[0]).Ino
	pl = progressLog{}
	img2, err := s.Pull(ctx, appRef, pl.fn)
	if err != nil {
		t.Fatal(err)
	}
	if st := pl.statuses(); st[StatusExists] != 2 || st[StatusDownloading] != 0 {
		t.Errorf("second pull statuses %v, want 2 %q", st, StatusExists)
	}
	if lstat(t, img2.Layers[0]).Ino != inode || !img2.Created.Equal(img.Created) {
		t.Errorf("second pull replaced the layer or Created")
	}

	// other shares the base layer: only its top layer is new.
	pl = progressLog{}
	if _, err := s.Pull(ctx, otherRef, pl.fn); err != nil {
		t.Fatal(err)
	}
	if st := pl.statuses(); st[StatusExists] != 1 || st[StatusComplete] != 1 {
		t.Errorf("other pull statuses %v", st)
	}
	if n := len(layerDirs(t, dir)); n != 3 {
		t.Errorf("%d layer dirs, want 3", n)
	}

	// Get by name, ID prefix and digest; List.
	for _, q := range []string{appRef, img.ID[7:19], img.Digest, "sha256:" + img.Digest[7:20]} {
		got, err := s.Get(ctx, q)
		if err != nil || got.Ref != appRef {
			t.Errorf("Get(%q) = %v, %v", q, got, err)
		}
	}
	if _, err := s.Get(ctx, host+"/test/app:nope"); errdefs.CodeOf(err) != "image_not_found" {
		t.Errorf("Get unknown: %v", err)
	}
	if list, _ := s.List(ctx); len(list) != 2 {
		t.Errorf("List = %d images, want 2", len(list))
	}

	// A restart sees the same images.
	s = openStore(t, dir)
	got, err := s.Get(ctx, appRef)
	if err != nil || got.Digest != img.Digest || strings.Join(got.Layers, ":") != strings.Join(img.Layers, ":") {
		t.Fatalf("Get after reopen = %+v, %v", got, err)
	}

	// Remove frees only what nothing else uses.
	if err := s.Remove(ctx, appRef, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img.Layers[1]); !os.IsNotExist(err) {
		t.Errorf("app's own layer still on disk")
	}
	if _, err := os.Stat(img.Layers[0]); err != nil {
		t.Errorf("shared base layer removed: %v", err)
	}
	if _, err := s.Get(ctx, appRef); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Errorf("Get removed: %v", err)
	}
	if err := s.Remove(ctx, otherRef, true); err != nil {
		t.Fatal(err)
	}
	if n := len(layerDirs(t, dir)); n != 0 {
		t.Errorf("%d layer dirs left after removing everything", n)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "blobs", "sha256")); len(ents) != 0 {
		t.Errorf("%d blobs left after removing everything", len(ents))
	}
	if err := s.Remove(ctx, otherRef, true); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Errorf("Remove twice: %v", err)
	}
}

// checkStacked mounts the layers as overlayfs lowerdirs, as sandboxes do,
// and checks that the whiteouts take effect.
func checkStacked(t *testing.T, layers []string) {
	t.Helper()
	mnt := t.TempDir()
	lower := make([]string, len(layers))
	for i, l := range layers {
		lower[len(layers)-1-i] = l
	}
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(lower, ":")); err != nil {
		t.Logf("overlayfs unavailable, skipping the stacked check: %v", err)
		return
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	for p, want := range map[string]string{"etc/hello": "hi", "etc/new": "new", "var/cache/fresh": "f", "bin/sh": "#!"} {
		if b, err := os.ReadFile(filepath.Join(mnt, p)); err != nil || string(b) != want {
			t.Errorf("merged %s = %q, %v; want %q", p, b, err, want)
		}
	}
	for _, p := range []string{"etc/gone", "var/cache/old"} {
		if _, err := os.Lstat(filepath.Join(mnt, p)); !os.IsNotExist(err) {
			t.Errorf("merged %s: still visible (err=%v)", p, err)
		}
	}
}

func TestPullErrors(t *testing.T) {
	ctx := own()
	host := testRegistry(t)
	ti := makeTestImages(t)
	push(t, host+"/test/app:v1", ti.app)
	s := openStore(t, t.TempDir(), func(o *Options) { o.Insecure = append(o.Insecure, "127.0.0.2:1") })

	tests := []struct {
		ref  string
		kind errdefs.Kind
		code string
		msg  string
	}{
		{host + "/test/app:nope", errdefs.KindNotFound, "image_not_found", `image "` + host + `/test/app:nope" not found in registry ` + host},
		{host + "/test/nosuch", errdefs.KindNotFound, "image_not_found", "not found in registry"},
		{"127.0.0.1:1/x/y:z", errdefs.KindForbidden, "registry_not_allowed", "from registry 127.0.0.1:1: it is a loopback address; an admin may allow it with shard serve --allowed-registry 127.0.0.1:1"},
		{"127.0.0.2:1/x/y:z", errdefs.KindUpstream, "registry_unreachable", "cannot reach registry 127.0.0.2:1 to pull \"127.0.0.2:1/x/y:z\": connection refused"},
		{"Bad:Ref", errdefs.KindInvalid, "invalid_argument", "invalid image reference"},
		{"", errdefs.KindInvalid, "invalid_argument", "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.ref, func(t *testing.T) {
			_, err := s.Pull(ctx, tt.ref, nil)
			if errdefs.KindOf(err) != tt.kind || errdefs.CodeOf(err) != tt.code || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("err = %v (kind %s, code %s); want %s/%s containing %q", err, errdefs.KindOf(err), errdefs.CodeOf(err), tt.kind, tt.code, tt.msg)
			}
		})
	}
}

func TestPullMultiArchAndMirrors(t *testing.T) {
	requireRoot(t)
	ctx := own()
	host := testRegistry(t)
	ti := makeTestImages(t)
	foreign := imageOf(t, "s390x", ti.otherTop)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: foreign, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "s390x"}}},
		mutate.IndexAddendum{Add: ti.app, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH, Variant: defaultVariant()}}},
	)
	r, _ := name.ParseReference(host + "/library/multi:1")
	if err := remote.WriteIndex(r, idx); err != nil {
		t.Fatal(err)
	}
	// A dead mirror first: the next one serves Docker Hub's library/multi.
	s := openStore(t, t.TempDir(), func(o *Options) { o.Mirrors = []string{"http://127.0.0.1:1", "http://" + host} })
	img, err := s.Pull(ctx, "multi:1", nil)
	if err != nil {
		t.Fatalf("Pull through mirror: %v", err)
	}
	if img.Name != "multi:1" || img.Ref != "docker.io/library/multi:1" {
		t.Errorf("Name %q Ref %q", img.Name, img.Ref)
	}
	if img.Digest != mustDigest(t, idx) {
		t.Errorf("Digest %s, want the index's %s", img.Digest, mustDigest(t, idx))
	}
	if cn, _ := ti.app.ConfigName(); img.ID != cn.String() {
		t.Errorf("picked the wrong platform: ID %s", img.ID)
	}
	for _, q := range []string{"docker.io/library/multi:1", "library/multi:1", "index.docker.io/library/multi:1", "multi:1"} {
		if _, err := s.Get(ctx, q); err != nil {
			t.Errorf("Get(%q): %v", q, err)
		}
	}
}

func TestTagMovesKeepsOldByDigest(t *testing.T) {
	requireRoot(t)
	ctx := own()
	host := testRegistry(t)
	ti := makeTestImages(t)
	ref := host + "/test/app:v1"
	push(t, ref, ti.app)
	s := openStore(t, t.TempDir())
	old, err := s.Pull(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	push(t, ref, ti.other)
	cur, err := s.Pull(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cur.Digest == old.Digest {
		t.Fatal("tag did not move")
	}
	kept, err := s.Get(ctx, host+"/test/app@"+old.Digest)
	if err != nil || kept.Digest != old.Digest {
		t.Fatalf("old image by digest: %+v, %v", kept, err)
	}
	for _, l := range old.Layers {
		if _, err := os.Stat(l); err != nil {
			t.Errorf("old image's layer gone: %v", err)
		}
	}
	if list, _ := s.List(ctx); len(list) != 2 {
		t.Errorf("List has %d refs, want 2", len(list))
	}
}

func TestConcurrentEnsure(t *testing.T) {
	requireRoot(t)
	ctx := own()
	host := testRegistry(t)
	ti := makeTestImages(t)
	push(t, host+"/test/app:v1", ti.app)
	push(t, host+"/test/other:v1", ti.other)
	s := openStore(t, t.TempDir())
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ref := host + "/test/app:v1"
			if i%2 == 1 {
				ref = host + "/test/other:v1"
			}
			if _, err := s.Ensure(ctx, ref, nil); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := len(layerDirs(t, s.dir)); n != 3 {
		t.Errorf("%d layer dirs, want 3", n)
	}
	called := false
	if _, err := s.Ensure(ctx, host+"/test/app:v1", func(Progress) { called = true }); err != nil || called {
		t.Errorf("Ensure of a cached image: err %v, pulled %v", err, called)
	}
}

func TestNames(t *testing.T) {
	s := openStore(t, t.TempDir(), func(o *Options) { o.Insecure = []string{"http://registry.internal:5000/"} })
	d := "sha256:" + strings.Repeat("ab", 32)
	tests := []struct{ in, ref, name string }{
		{"python:3.12-slim", "docker.io/library/python:3.12-slim", "python:3.12-slim"},
		{"python", "docker.io/library/python:latest", "python:latest"},
		{"docker.io/library/python:3", "docker.io/library/python:3", "python:3"},
		{"user/img", "docker.io/user/img:latest", "user/img:latest"},
		{"127.0.0.1:5000/busybox", "127.0.0.1:5000/busybox:latest", "127.0.0.1:5000/busybox:latest"},
		{"ghcr.io/org/app:v2", "ghcr.io/org/app:v2", "ghcr.io/org/app:v2"},
		{"alpine@" + d, "docker.io/library/alpine@" + d, "alpine@" + d},
	}
	for _, tt := range tests {
		r, err := s.parseRef(tt.in)
		if err != nil {
			t.Errorf("parseRef(%q): %v", tt.in, err)
			continue
		}
		if canonical(r) != tt.ref || familiar(r) != tt.name || familiarOf(canonical(r)) != tt.name {
			t.Errorf("%q: ref %q name %q; want %q %q", tt.in, canonical(r), familiar(r), tt.ref, tt.name)
		}
	}
	for ref, scheme := range map[string]string{"registry.internal:5000/a/b": "http", "registry.internal/a/b": "https", "ghcr.io/a/b": "https"} {
		r, err := s.parseRef(ref)
		if err != nil || r.Context().Scheme() != scheme {
			t.Errorf("%s: scheme %s, %v; want %s", ref, r.Context().Scheme(), err, scheme)
		}
	}
	for _, bad := range []string{"", "Upper:case", "a/../b", "a//b", "x@sha256:12"} {
		if _, err := s.parseRef(bad); errdefs.KindOf(err) != errdefs.KindInvalid {
			t.Errorf("parseRef(%q) = %v, want invalid_argument", bad, err)
		}
	}
}

func TestRepeatedLayerStackedOnce(t *testing.T) {
	requireRoot(t)
	ctx := own()
	host := testRegistry(t)
	ti := makeTestImages(t)
	// base, appTop, base: the lower copy of base is redundant.
	push(t, host+"/test/rep:1", imageOf(t, runtime.GOARCH, ti.base, ti.appTop, ti.base))
	s := openStore(t, t.TempDir())
	img, err := s.Pull(ctx, host+"/test/rep:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Layers) != 2 {
		t.Fatalf("Layers = %v, want 2 distinct dirs", img.Layers)
	}
	if _, err := os.Stat(filepath.Join(img.Layers[1], "etc/gone")); err != nil || isWhiteout(t, filepath.Join(img.Layers[1], "etc/gone")) {
		t.Errorf("top layer should be base (etc/gone a file): %v", err)
	}
}

func TestRemoveOneOfTwoTagsPersists(t *testing.T) {
	requireRoot(t)
	ctx := own()
	host := testRegistry(t)
	ti := makeTestImages(t)
	push(t, host+"/test/app:v1", ti.app)
	push(t, host+"/test/app:v2", ti.app)
	dir := t.TempDir()
	s := openStore(t, dir)
	for _, tag := range []string{"v1", "v2"} {
		if _, err := s.Pull(ctx, host+"/test/app:"+tag, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Remove(ctx, host+"/test/app:v1", true); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, dir)
	if _, err := s.Get(ctx, host+"/test/app:v1"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Errorf("removed tag is back after reopen: %v", err)
	}
	img, err := s.Get(ctx, host+"/test/app:v2")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range img.Layers {
		if _, err := os.Stat(l); err != nil {
			t.Errorf("layer of the remaining tag removed: %v", err)
		}
	}
	// Removing by ID removes every reference to the image.
	if _, err := s.Pull(ctx, host+"/test/app:v1", nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, img.ID[7:19], true); err != nil {
		t.Fatal(err)
	}
	if list, _ := s.List(ctx); len(list) != 0 || len(layerDirs(t, dir)) != 0 {
		t.Errorf("after Remove by ID: %d refs, %d layer dirs", len(list), len(layerDirs(t, dir)))
	}
}
