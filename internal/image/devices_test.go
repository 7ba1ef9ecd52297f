package image

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// hostDevices lists the device nodes under root that reach a device: every
// character or block device but overlayfs whiteouts (0/0 character).
func hostDevices(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeDevice == 0 {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil && (st.Mode&unix.S_IFMT == unix.S_IFBLK || st.Rdev != 0) {
			out = append(out, p)
		}
		return nil
	})
	return out
}

func devPaths(ds []Device) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Path)
	}
	return out
}

func TestUnpackDevices(t *testing.T) {
	requireRoot(t)
	chr := func(name string, major, minor int64) ent {
		return ent{name: name, typ: tar.TypeChar, major: major, minor: minor, mode: 0o666}
	}
	tests := []struct {
		name      string
		ents      []ent
		want      []Device // recorded
		absent    []string // nothing on disk
		whiteouts []string
		fifos     []string
	}{
		{"char and block", []ent{
			{name: "dev/sda", typ: tar.TypeBlock, major: 8, minor: 0, mode: 0o660, gid: 6},
			{name: "./dev/kmsg", typ: tar.TypeChar, major: 1, minor: 11, mode: 0o4644, uid: 5, gid: 7},
		}, []Device{
			{Path: "/dev/kmsg", Type: "c", Major: 1, Minor: 11, Mode: 0o644, UID: 5, GID: 7},
			{Path: "/dev/sda", Type: "b", Major: 8, Minor: 0, Mode: 0o660, GID: 6},
		}, []string{"dev/kmsg", "dev/sda"}, nil, nil},
		{"outside /dev", []ent{chr("/opt/app/null", 1, 3)},
			[]Device{{Path: "/opt/app/null", Type: "c", Major: 1, Minor: 3, Mode: 0o666}}, []string{"opt/app/null"}, nil, nil},
		{"replaced by a file", []ent{chr("dev/x", 1, 3), file("dev/x", "f")}, nil, nil, nil, nil},
		{"replaced by a dir", []ent{chr("dev/x", 1, 3), dir("dev/x/")}, nil, nil, nil, nil},
		{"replaced by a symlink", []ent{chr("dev/x", 1, 3), {name: "dev/x", typ: tar.TypeSymlink, link: "null"}}, nil, nil, nil, nil},
		{"replaced by a fifo", []ent{chr("dev/x", 1, 3), {name: "dev/x", typ: tar.TypeFifo}}, nil, nil, nil, []string{"dev/x"}},
		{"a file replaced by a device", []ent{file("dev/x", "f"), chr("dev/x", 1, 3)},
			[]Device{{Path: "/dev/x", Type: "c", Major: 1, Minor: 3, Mode: 0o666}}, []string{"dev/x"}, nil, nil},
		{"deleted by a whiteout", []ent{chr("dev/x", 1, 3), file("dev/.wh.x", "")}, nil, nil, []string{"dev/x"}, nil},
		{"parent replaced by a file", []ent{chr("dev/sub/x", 1, 3), file("dev/sub", "f")}, nil, nil, nil, nil},
		{"parent deleted", []ent{chr("dev/sub/x", 1, 3), file("dev/.wh.sub", "")}, nil, nil, []string{"dev/sub"}, nil},
		{"parent dir listed again", []ent{chr("dev/sub/x", 1, 3), dir("dev/sub/")},
			[]Device{{Path: "/dev/sub/x", Type: "c", Major: 1, Minor: 3, Mode: 0o666}}, []string{"dev/sub/x"}, nil, nil},
		{"hard link to a device", []ent{chr("dev/x", 1, 3), {name: "dev/y", typ: tar.TypeLink, link: "dev/x"}},
			[]Device{{Path: "/dev/x", Type: "c", Major: 1, Minor: 3, Mode: 0o666}, {Path: "/dev/y", Type: "c", Major: 1, Minor: 3, Mode: 0o666}},
			[]string{"dev/x", "dev/y"}, nil, nil},
		{"under a symlinked dir", []ent{dir("real/"), {name: "alias", typ: tar.TypeSymlink, link: "/real"}, chr("alias/x", 1, 3), file("real/x", "f"), chr("alias/y", 1, 5)},
			[]Device{{Path: "/real/y", Type: "c", Major: 1, Minor: 5, Mode: 0o666}}, []string{"real/y"}, nil, nil},
		{"0/0 character device is a whiteout", []ent{chr("etc/gone", 0, 0)}, nil, nil, []string{"etc/gone"}, nil},
		{"fifo", []ent{{name: "run/f", typ: tar.TypeFifo, mode: 0o600}}, nil, nil, nil, []string{"run/f"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			got, err := unpackLayer(own(), bytes.NewReader(tarOf(t, tt.ents...)), root, nil, "", func(string, ...any) {})
			if err != nil {
				t.Fatal(err)
			}
			if devs := hostDevices(t, root); len(devs) > 0 {
				t.Errorf("device nodes on the host: %v", devs)
			}
			if !reflect.DeepEqual(got.devices, tt.want) {
				t.Errorf("recorded %+v\nwant     %+v", got.devices, tt.want)
			}
			for _, p := range tt.absent {
				if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
					t.Errorf("%s: on the host (err=%v)", p, err)
				}
			}
			for _, p := range tt.whiteouts {
				if !isWhiteout(t, filepath.Join(root, p)) {
					t.Errorf("%s: not a whiteout", p)
				}
			}
			for _, p := range tt.fifos {
				if st := lstat(t, filepath.Join(root, p)); st.Mode&unix.S_IFMT != unix.S_IFIFO {
					t.Errorf("%s: mode %o, want a FIFO", p, st.Mode)
				}
			}
		})
	}
}

// TestImageDevices: the devices an image shows are those of its layers that
// no higher layer replaces or deletes, as overlayfs would show them.
func TestImageDevices(t *testing.T) {
	requireRoot(t)
	ctx := own()
	host := testRegistry(t)
	s := openStore(t, t.TempDir())
	chr := func(name string, minor int64) ent {
		return ent{name: name, typ: tar.TypeChar, major: 1, minor: minor, mode: 0o640, uid: 3, gid: 4}
	}
	tests := []struct {
		name   string
		layers [][]ent
		want   map[string]int64 // path: minor
	}{
		{"one layer", [][]ent{{chr("dev/a", 3), {name: "dev/b", typ: tar.TypeBlock, major: 7, minor: 1}}}, map[string]int64{"/dev/a": 3, "/dev/b": 1}},
		{"unrelated layer above", [][]ent{{chr("dev/a", 3)}, {file("etc/x", "x")}}, map[string]int64{"/dev/a": 3}},
		{"deleted above", [][]ent{{chr("dev/a", 3), chr("dev/b", 5)}, {file("dev/.wh.a", "")}}, map[string]int64{"/dev/b": 5}},
		{"opaque dir above", [][]ent{{chr("dev/sub/a", 3), chr("dev/c", 5)}, {dir("dev/sub/"), file("dev/sub/.wh..wh..opq", "")}}, map[string]int64{"/dev/c": 5}},
		{"replaced by a file above", [][]ent{{chr("dev/a", 3)}, {file("dev/a", "f")}}, map[string]int64{}},
		{"parent a symlink above", [][]ent{{chr("dev/sub/a", 3)}, {{name: "dev/sub", typ: tar.TypeSymlink, link: "/tmp"}}}, map[string]int64{}},
		{"device over a device", [][]ent{{chr("dev/a", 3)}, {chr("dev/a", 5)}}, map[string]int64{"/dev/a": 5}},
		{"device under a dir above", [][]ent{{chr("dev/sub/a", 3)}, {dir("dev/sub/"), file("dev/sub/b", "b")}}, map[string]int64{"/dev/sub/a": 3}},
		{"device over a dir", [][]ent{{chr("dev/sub/a", 3), chr("dev/c", 6)}, {chr("dev/sub", 5)}}, map[string]int64{"/dev/sub": 5, "/dev/c": 6}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var layers []v1.Layer
			for _, l := range tt.layers {
				layers = append(layers, layerOf(t, l...))
			}
			ref := host + "/dev/img:" + string(rune('a'+i))
			push(t, ref, imageOf(t, runtime.GOARCH, layers...))
			img, err := s.Pull(ctx, ref, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int64{}
			for _, d := range img.Devices {
				got[d.Path] = d.Minor
				if d.Type == "c" && (*d.FileMode != 0o640 || *d.UID != 3 || *d.GID != 4 || d.Major != 1) {
					t.Errorf("%s: %+v mode %o uid %d gid %d", d.Path, d, *d.FileMode, *d.UID, *d.GID)
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("devices %v, want %v", got, tt.want)
			}
			if d := s.Devices(ref); !reflect.DeepEqual(d, img.Devices) {
				t.Errorf("Store.Devices = %v, want %v", d, img.Devices)
			}
			for _, l := range img.Layers {
				if devs := hostDevices(t, l); len(devs) > 0 {
					t.Errorf("device nodes on the host: %v", devs)
				}
			}
		})
	}
}

// TestOpenUpgradesOldCache: a cache an older version made (0755 dirs, real
// device nodes in its layer dirs, a spooled upload left by a crash) is
// made private, its device nodes are moved into the index, and the
// leftover is gone.
func TestOpenUpgradesOldCache(t *testing.T) {
	requireRoot(t)
	ctx := own()
	host := testRegistry(t)
	dir := t.TempDir()
	ref := host + "/dev/old:1"
	push(t, ref, imageOf(t, runtime.GOARCH, layerOf(t,
		ent{name: "dev/a", typ: tar.TypeChar, major: 1, minor: 3, mode: 0o666},
		ent{name: "etc/.wh.gone", typ: tar.TypeReg},
		file("bin/sh", "x"),
	)))
	s := openStore(t, dir)
	img, err := s.Pull(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	layer := img.Layers[0]

	// Make it look as the old version left it.
	var idx index
	b, _ := os.ReadFile(filepath.Join(dir, indexFile))
	if err := json.Unmarshal(b, &idx); err != nil {
		t.Fatal(err)
	}
	for _, lr := range idx.Layers {
		lr.Format, lr.Devices = 0, nil
	}
	b, _ = json.Marshal(idx)
	os.WriteFile(filepath.Join(dir, indexFile), b, 0o644)
	os.Remove(filepath.Join(layer, "dev/a"))
	if err := unix.Mknod(filepath.Join(layer, "dev/a"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(layer, "dev/a"), 0o666)
	dirs := []string{".", "l", "blobs", "blobs/sha256", "tmp"}
	for _, d := range dirs {
		os.Chmod(filepath.Join(dir, d), 0o755)
	}
	os.WriteFile(filepath.Join(dir, "tmp", "upload-123"), []byte("half an upload"), 0o644)

	s = openStore(t, dir)
	for _, d := range dirs {
		if fi, err := os.Stat(filepath.Join(dir, d)); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, %v; want 0700", d, fi.Mode(), err)
		}
	}
	if devs := hostDevices(t, dir); len(devs) > 0 {
		t.Errorf("device nodes left on the host: %v", devs)
	}
	if _, err := os.Lstat(filepath.Join(layer, "dev/a")); !os.IsNotExist(err) {
		t.Errorf("dev/a: still on the host (err=%v)", err)
	}
	if !isWhiteout(t, filepath.Join(layer, "etc/gone")) {
		t.Errorf("etc/gone is not a whiteout any more")
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(ents) != 0 {
		t.Errorf("tmp/ keeps %d leftovers", len(ents))
	}
	img, err = s.Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Devices) != 1 || img.Devices[0].Path != "/dev/a" || img.Devices[0].Minor != 3 || *img.Devices[0].FileMode != 0o666 {
		t.Errorf("devices after the upgrade: %+v", img.Devices)
	}
	if fi, err := os.Stat(filepath.Join(dir, indexFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("index.json: %v, %v; want 0600", fi.Mode(), err)
	}
}

// TestStoreIsPrivate: every dir of a new cache down to the layer trees,
// and every file that is not in a layer tree, is root's alone.
func TestStoreIsPrivate(t *testing.T) {
	requireRoot(t)
	ctx := own()
	host := testRegistry(t)
	dir := filepath.Join(t.TempDir(), "images")
	s := openStore(t, dir)
	ti := makeTestImages(t)
	push(t, host+"/p/app:1", ti.app)
	img, err := s.Pull(ctx, host+"/p/app:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	layers := map[string]bool{}
	for _, l := range img.Layers {
		layers[l] = true
	}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Error(err)
			return nil
		}
		if layers[p] {
			if fi, _ := os.Stat(filepath.Dir(p)); fi.Mode().Perm() != 0o700 {
				t.Errorf("%s holds layer trees with mode %v", filepath.Dir(p), fi.Mode())
			}
			return filepath.SkipDir // the image's own modes
		}
		fi, _ := d.Info()
		if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: mode %v, reachable by others", strings.TrimPrefix(p, dir), fi.Mode())
		}
		return nil
	})
}
