package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func unpackT(t *testing.T, ents ...ent) (string, error) {
	t.Helper()
	d := t.TempDir()
	_, err := unpackLayer(own(), bytes.NewReader(tarOf(t, ents...)), d, nil, "", func(string, ...any) {})
	return d, err
}

func lstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	return st
}

func isWhiteout(t *testing.T, p string) bool {
	t.Helper()
	st := lstat(t, p)
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func TestUnpackWhiteouts(t *testing.T) {
	requireRoot(t)
	root, err := unpackT(t,
		dir("etc/"),
		file("etc/keep", "k"),
		file("etc/.wh.passwd", ""),
		file(".wh.top", ""),
		file("deep/er/.wh.gone", ""), // parents implied
		dir("opq/"),
		file("opq/.wh..wh..opq", ""),
		file("opq/new", "n"),
		file("misc/.wh..wh.plnk", ""), // aufs bookkeeping: dropped
	)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"etc/passwd", "top", "deep/er/gone"} {
		if !isWhiteout(t, filepath.Join(root, p)) {
			t.Errorf("%s: want a 0/0 character device", p)
		}
	}
	for _, p := range []string{"etc/.wh.passwd", ".wh.top", "opq/.wh..wh..opq", "misc/.wh..wh.plnk"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("%s: whiteout marker kept as a file (err=%v)", p, err)
		}
	}
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(filepath.Join(root, "opq"), opaqueXattr, buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Errorf("opq: %s = %q, %v; want y", opaqueXattr, buf[:n], err)
	}
	if _, err := unix.Lgetxattr(filepath.Join(root, "etc"), opaqueXattr, buf); err == nil {
		t.Errorf("etc: unexpectedly opaque")
	}
	if b, _ := os.ReadFile(filepath.Join(root, "opq/new")); string(b) != "n" {
		t.Errorf("opq/new = %q", b)
	}
}

func TestUnpackMetadata(t *testing.T) {
	requireRoot(t)
	root, err := unpackT(t,
		ent{name: "./", typ: tar.TypeDir, mode: 0o755},
		ent{name: "bin/", typ: tar.TypeDir, mode: 0o711, uid: 3, gid: 4},
		ent{name: "bin/su", typ: tar.TypeReg, body: "elf", mode: 0o4755, uid: 0, gid: 0},
		ent{name: "bin/tool", typ: tar.TypeReg, body: "tool", mode: 0o750, uid: 1000, gid: 1001,
			pax: map[string]string{"SCHILY.xattr.user.note": "hi", "SCHILY.xattr.trusted.overlay.redirect": "/etc"}},
		ent{name: "bin/tool2", typ: tar.TypeLink, link: "bin/tool"},
		ent{name: "bin/sh", typ: tar.TypeSymlink, link: "/usr/bin/dash", uid: 7, gid: 8},
		ent{name: "dev/null", typ: tar.TypeChar, major: 1, minor: 3, mode: 0o666},
		ent{name: "run/fifo", typ: tar.TypeFifo, mode: 0o600},
		ent{name: "/abs/file", typ: tar.TypeReg, body: "inside"},
	)
	if err != nil {
		t.Fatal(err)
	}
	p := func(s string) string { return filepath.Join(root, s) }

	tests := []struct {
		path     string
		ifmt     uint32
		perm     uint32
		uid, gid uint32
	}{
		{"bin", unix.S_IFDIR, 0o711, 3, 4},
		{"bin/su", unix.S_IFREG, 0o4755, 0, 0},
		{"bin/tool", unix.S_IFREG, 0o750, 1000, 1001},
		{"bin/sh", unix.S_IFLNK, 0o777, 7, 8},
		{"run/fifo", unix.S_IFIFO, 0o600, 0, 0},
		{"dev", unix.S_IFDIR, 0o755, 0, 0}, // implied parent
		{"abs/file", unix.S_IFREG, 0o644, 0, 0},
	}
	for _, tt := range tests {
		st := lstat(t, p(tt.path))
		if st.Mode&unix.S_IFMT != tt.ifmt || st.Mode&0o7777 != tt.perm || st.Uid != tt.uid || st.Gid != tt.gid {
			t.Errorf("%s: mode %o uid %d gid %d; want type %o perm %o uid %d gid %d",
				tt.path, st.Mode, st.Uid, st.Gid, tt.ifmt, tt.perm, tt.uid, tt.gid)
		}
	}
	if _, err := os.Lstat(p("dev/null")); !os.IsNotExist(err) { // recorded instead: see TestUnpackDevices
		t.Errorf("dev/null: on the host (err=%v)", err)
	}
	if a, b := lstat(t, p("bin/tool")), lstat(t, p("bin/tool2")); a.Ino != b.Ino {
		t.Errorf("hard link: inodes %d and %d differ", a.Ino, b.Ino)
	}
	if target, _ := os.Readlink(p("bin/sh")); target != "/usr/bin/dash" {
		t.Errorf("symlink target %q", target)
	}
	for _, f := range []string{"bin", "bin/tool", "bin/sh"} {
		if fi, err := os.Lstat(p(f)); err != nil || !fi.ModTime().Equal(testTime) {
			t.Errorf("%s: mtime %v, want %v", f, fi.ModTime(), testTime)
		}
	}
	buf := make([]byte, 16)
	if n, err := unix.Lgetxattr(p("bin/tool"), "user.note", buf); err != nil || string(buf[:n]) != "hi" {
		t.Errorf("user.note xattr = %q, %v", buf[:n], err)
	}
	if _, err := unix.Lgetxattr(p("bin/tool"), "trusted.overlay.redirect", buf); err == nil {
		t.Errorf("trusted.overlay.redirect from the image was applied")
	}
}

func TestUnpackRejectsEscapes(t *testing.T) {
	requireRoot(t)
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("safe"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		ents    []ent
		wantErr bool // some escapes are rejected, others end up inside the layer
		unsafe  bool // the error must be errUnsafePath
	}{
		{"dotdot", []ent{file("../evil", "x")}, true, true},
		{"nested dotdot", []ent{file("a/../../evil", "x")}, true, true},
		{"dotdot whiteout", []ent{file("../.wh.victim", "")}, true, true},
		{"hard link out", []ent{{name: "l", typ: tar.TypeLink, link: "../../../../" + victim}}, true, true},
		{"symlink dir then write", []ent{
			{name: "esc", typ: tar.TypeSymlink, link: outside},
			file("esc/victim", "pwned"),
		}, true, false},
		{"relative symlink dir then write", []ent{
			{name: "esc", typ: tar.TypeSymlink, link: "../../../../../../" + outside},
			file("esc/pwned", "pwned"),
		}, true, false},
		{"hard link through symlink", []ent{
			{name: "esc", typ: tar.TypeSymlink, link: outside},
			{name: "l", typ: tar.TypeLink, link: "esc/victim"},
		}, true, false},
		{"symlink dir then whiteout", []ent{
			{name: "esc", typ: tar.TypeSymlink, link: outside},
			file("esc/.wh.victim", ""),
		}, true, false},
		{"file over symlink", []ent{
			{name: "f", typ: tar.TypeSymlink, link: victim},
			file("f", "replaced"),
		}, false, false},
		{"absolute name", []ent{file(victim, "inside")}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root, err := unpackT(t, tt.ents...)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error: %v", err, tt.wantErr)
			}
			if tt.unsafe && !errors.Is(err, errUnsafePath) {
				t.Errorf("err = %v, want errUnsafePath", err)
			}
			if b, err := os.ReadFile(victim); err != nil || string(b) != "safe" {
				t.Errorf("file outside the layer changed: %q, %v", b, err)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 1 {
				t.Errorf("dir outside the layer has %d entries", len(ents))
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(root), "evil")); err == nil {
				t.Errorf("evil written next to the layer")
			}
		})
	}
}

func TestCleanPath(t *testing.T) {
	tests := []struct {
		in, want string
		bad      bool
	}{
		{"a/b", "a/b", false},
		{"./a/b/", "a/b", false},
		{"/etc/passwd", "etc/passwd", false},
		{"./", ".", false},
		{"a/../b", "b", false},
		{"..", "", true},
		{"../x", "", true},
		{"a/../../x", "", true},
		{"/../x", "", true},
		{"a\x00b", "", true},
	}
	for _, tt := range tests {
		got, err := cleanPath(tt.in)
		if (err != nil) != tt.bad || got != tt.want {
			t.Errorf("cleanPath(%q) = %q, %v; want %q, bad=%v", tt.in, got, err, tt.want, tt.bad)
		}
	}
}
