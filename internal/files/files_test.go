package files

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// archive builds a tar from entries.
func archive(t *testing.T, entries ...*tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range entries {
		body := ""
		if h.Typeflag == tar.TypeReg {
			body = strings.Repeat("x", int(h.Size))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, body)
	}
	tw.Close()
	return b.Bytes()
}

func reg(name string, size int64, mode int64) *tar.Header {
	return &tar.Header{Name: name, Typeflag: tar.TypeReg, Size: size, Mode: mode, ModTime: time.Unix(1e9, 0)}
}

func TestUnpackRefusesWhatLeadsOut(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []*tar.Header
		code    string
		made    []string // relative to dest, must exist after
	}{
		{"dotdot", []*tar.Header{reg("../up", 1, 0o644)}, CodeUnsafe, nil},
		{"dotdot inside", []*tar.Header{reg("a/../../up", 1, 0o644)}, CodeUnsafe, nil},
		{"absolute name is made relative", []*tar.Header{reg("/abs", 1, 0o644)}, "", []string{"abs"}},
		{"through an absolute symlink", []*tar.Header{
			{Name: "esc", Typeflag: tar.TypeSymlink, Linkname: "/"},
			reg("esc/owned", 1, 0o644)}, CodeUnsafe, []string{"esc"}},
		{"through a relative symlink out", []*tar.Header{
			{Name: "esc", Typeflag: tar.TypeSymlink, Linkname: "../.."},
			reg("esc/owned", 1, 0o644)}, CodeUnsafe, nil},
		{"hard link out", []*tar.Header{{Name: "hl", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}}, CodeUnsafe, nil},
		{"hard link through a symlink out", []*tar.Header{
			{Name: "esc", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
			{Name: "hl", Typeflag: tar.TypeLink, Linkname: "esc/passwd"}}, CodeUnsafe, nil},
		{"hard link inside", []*tar.Header{reg("a", 2, 0o644), {Name: "b", Typeflag: tar.TypeLink, Linkname: "a"}}, "", []string{"a", "b"}},
		{"symlink that leads out is made, not followed", []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"}}, "", []string{"l"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			top := t.TempDir()
			dest := filepath.Join(top, "a", "b")
			os.MkdirAll(dest, 0o755)
			res := Unpack(bytes.NewReader(archive(t, tc.entries...)), dest, UnpackOptions{})
			if tc.code == "" && !res.OK {
				t.Fatalf("refused: %s: %s", res.Code, res.Message)
			}
			if tc.code != "" && (res.OK || res.Code != tc.code) {
				t.Fatalf("got ok=%v code %q (%s), want %s", res.OK, res.Code, res.Message, tc.code)
			}
			for _, m := range tc.made {
				if _, err := os.Lstat(filepath.Join(dest, m)); err != nil {
					t.Errorf("%s was not made: %v", m, err)
				}
			}
			// Nothing outside dest.
			filepath.Walk(top, func(p string, fi os.FileInfo, err error) error {
				if err == nil && !strings.HasPrefix(p, dest) && p != top && p != filepath.Dir(dest) {
					t.Errorf("%s was made outside the destination", p)
				}
				return nil
			})
		})
	}
}

func TestUnpackSanitises(t *testing.T) {
	dest := t.TempDir()
	res := Unpack(bytes.NewReader(archive(t,
		reg("suid", 1, 0o4755),
		&tar.Header{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666},
		&tar.Header{Name: "fifo", Typeflag: tar.TypeFifo, Mode: 0o644},
		&tar.Header{Name: "sgid-dir/", Typeflag: tar.TypeDir, Mode: 0o2775, ModTime: time.Unix(1e9, 0)},
		reg("sgid-dir/f", 3, 0o640),
	)), dest, UnpackOptions{})
	if !res.OK {
		t.Fatalf("%s: %s", res.Code, res.Message)
	}
	if fi, err := os.Stat(filepath.Join(dest, "suid")); err != nil || fi.Mode()&os.ModeSetuid != 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("suid: %v %v, want 0755 without setuid", fi.Mode(), err)
	}
	for _, gone := range []string{"null", "fifo"} {
		if _, err := os.Lstat(filepath.Join(dest, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s was made (%v)", gone, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(dest, "sgid-dir")); err != nil || fi.Mode()&os.ModeSetgid == 0 || !fi.ModTime().Equal(time.Unix(1e9, 0)) {
		t.Errorf("sgid-dir: %v %v %v, want setgid kept and its time", fi.Mode(), fi.ModTime(), err)
	}
	if len(res.Notes) != 3 || res.Files != 3 {
		t.Errorf("notes %q files %d, want 3 notes (setuid, device, fifo) and 3 files", res.Notes, res.Files)
	}
}

func TestUnpackRename(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "top", "sub"), 0o750)
	os.WriteFile(filepath.Join(src, "top", "sub", "f"), []byte("hi"), 0o600)
	os.Symlink("sub/f", filepath.Join(src, "top", "l"))
	os.Link(filepath.Join(src, "top", "sub", "f"), filepath.Join(src, "top", "hl"))
	var b bytes.Buffer
	if err := WriteTar(context.Background(), &b, filepath.Join(src, "top"), "top", TarOptions{}); err != nil {
		t.Fatal(err)
	}
	dest := t.TempDir()
	rename := func(n string) (string, bool) {
		if n == "top" {
			return "other", true
		}
		rest, ok := strings.CutPrefix(n, "top/")
		return "other/" + rest, ok
	}
	if res := Unpack(bytes.NewReader(b.Bytes()), dest, UnpackOptions{Rename: rename}); !res.OK {
		t.Fatalf("%s: %s", res.Code, res.Message)
	}
	if got, err := os.ReadFile(filepath.Join(dest, "other", "l")); err != nil || string(got) != "hi" {
		t.Errorf("other/l reads %q %v", got, err)
	}
	if fi, err := os.Stat(filepath.Join(dest, "other", "sub")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("other/sub: %v %v, want 0750", fi.Mode(), err)
	}
	a, _ := os.Stat(filepath.Join(dest, "other", "sub", "f"))
	h, _ := os.Stat(filepath.Join(dest, "other", "hl"))
	if a == nil || h == nil || !os.SameFile(a, h) {
		t.Errorf("other/hl is not a hard link of other/sub/f")
	}
}

func TestChunkReader(t *testing.T) {
	var b bytes.Buffer
	w := NewChunkWriter(&b)
	w.Write([]byte("hello "))
	w.Write([]byte("world"))
	whole := append([]byte(nil), b.Bytes()...)
	w.Close()
	got, err := io.ReadAll(NewChunkReader(bytes.NewReader(b.Bytes())))
	if err != nil || string(got) != "hello world" {
		t.Fatalf("read %q %v", got, err)
	}
	// Without its end, or cut inside a chunk: never a clean EOF.
	for _, cut := range [][]byte{whole, whole[:len(whole)-2], whole[:2]} {
		_, err := io.ReadAll(NewChunkReader(bytes.NewReader(cut)))
		var fe *Error
		if !errors.As(err, &fe) || fe.Code != CodeShortBody {
			t.Errorf("%d bytes: err %v, want %s", len(cut), err, CodeShortBody)
		}
	}
}

func TestPutFileIsWholeOrNothing(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	os.WriteFile(p, []byte("old"), 0o640)
	// An upload that breaks off leaves the old file, and no temporary one.
	var b bytes.Buffer
	w := NewChunkWriter(&b)
	w.Write([]byte("new content"))
	res := Put(context.Background(), NewChunkReader(&b), p, PutOptions{Mode: -1, UID: -1, GID: -1, Size: -1})
	if res.OK || res.Code != CodeShortBody {
		t.Fatalf("got %+v, want %s", res, CodeShortBody)
	}
	if got, _ := os.ReadFile(p); string(got) != "old" {
		t.Errorf("the file holds %q, want the old one", got)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d entries left, want 1", len(ents))
	}
	// A whole one replaces it, keeping its mode.
	b.Reset()
	w.Write([]byte("new"))
	w.Close()
	res = Put(context.Background(), NewChunkReader(&b), p, PutOptions{Mode: -1, UID: -1, GID: -1, Size: 3})
	if !res.OK || res.Bytes != 3 {
		t.Fatalf("got %+v", res)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want the replaced file's 0640", fi.Mode())
	}
	// The length is checked.
	res = Put(context.Background(), strings.NewReader("abc"), p, PutOptions{Mode: -1, UID: -1, GID: -1, Size: 4})
	if res.OK || res.Code != CodeShortBody {
		t.Errorf("a short body: %+v", res)
	}
}

// TestUnpackSyncs: with Sync, an unpack that ends, well or not, has
// synced and closed every file it wrote, more files than it syncs at once
// included, and what it wrote reads back whole; a name written twice
// holds the second.
func TestUnpackSyncs(t *testing.T) {
	many := make([]*tar.Header, 0, 3*syncWorkers)
	for i := range cap(many) {
		many = append(many, reg(fmt.Sprintf("d/f%03d", i), int64(i), 0o644))
	}
	cases := []struct {
		name    string
		tar     []byte
		code    string // "": it succeeds
		present map[string]int
	}{
		{"many files", archive(t, many...), "", map[string]int{"d/f000": 0, "d/f095": 95}},
		{"a name twice", archive(t, reg("a", 3, 0o644), reg("a", 5, 0o644)), "", map[string]int{"a": 5}},
		{"an unsafe entry after files", archive(t, reg("a", 3, 0o644), reg("b", 4, 0o644), reg("../x", 1, 0o644)), CodeUnsafe, map[string]int{"a": 3, "b": 4}},
		{"a tar cut after files", archive(t, reg("a", 3, 0o644), reg("b", 4, 0o644))[:1024+100], CodeBadArchive, map[string]int{"a": 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dest := t.TempDir()
			res := Unpack(bytes.NewReader(tc.tar), dest, UnpackOptions{Sync: true})
			if tc.code == "" && !res.OK || tc.code != "" && res.Code != tc.code {
				t.Fatalf("got %+v, want code %q", res, tc.code)
			}
			for name, size := range tc.present {
				if got, err := os.ReadFile(filepath.Join(dest, name)); err != nil || string(got) != strings.Repeat("x", size) {
					t.Errorf("%s holds %q (%v), want %d bytes", name, got, err, size)
				}
			}
		})
	}
}

func TestPathsAndErrors(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	for _, tc := range []struct {
		name string
		res  Result
		code string
		says string // in the message, if set
	}{
		{"relative", Stat("etc/passwd", false), CodeInvalid, ""},
		{"nul", Stat("/a\x00b", false), CodeInvalid, ""},
		{"missing", Stat(filepath.Join(dir, "nope"), false), CodeNotFound, ""},
		{"list a file", List(filepath.Join(dir, "f"), 0), CodeNotDir, ""},
		{"remove root", Remove("/", true), CodeInvalid, ""},
		{"remove a full dir", Remove(filepath.Dir(dir), false), CodeNotEmpty, ""},
		{"put onto a dir", Put(context.Background(), strings.NewReader(""), dir, PutOptions{Mode: -1, UID: -1, GID: -1, Size: -1}), CodeIsDir, ""},
		{"put without its dir", Put(context.Background(), strings.NewReader(""), filepath.Join(dir, "no", "f"), PutOptions{Mode: -1, UID: -1, GID: -1, Size: -1}), CodeNotFound, "shard write --parents"},
		{"tar onto a file", Put(context.Background(), strings.NewReader(""), filepath.Join(dir, "f"), PutOptions{Tar: true}), CodeNotDir, ""},
	} {
		if tc.res.OK || tc.res.Code != tc.code || !strings.Contains(tc.res.Message, tc.says) {
			t.Errorf("%s: got ok=%v %q (%s), want %s saying %q", tc.name, tc.res.OK, tc.res.Code, tc.res.Message, tc.code, tc.says)
		}
	}
	var b bytes.Buffer
	if err := Get(context.Background(), &b, dir, GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if res, err := ReadResult(bufio.NewReader(&b)); err != nil || res.Code != CodeIsDir {
		t.Errorf("get of a directory: %+v %v, want %s", res, err, CodeIsDir)
	}
}

func TestReadResultIsBounded(t *testing.T) {
	long := strings.Repeat("x", MaxResultLine+10)
	if _, err := ReadResult(bufio.NewReader(strings.NewReader(long))); err == nil {
		t.Fatal("an answer past the bound was taken")
	}
	if _, err := ReadResult(bufio.NewReader(strings.NewReader("not json\n"))); err == nil {
		t.Fatal("an answer that is not JSON was taken")
	}
}

// TestUnpackNothingThroughItsOwnSymlink: a copy out to a new directory
// unpacks into its parent, so an archive's "top/s -> .." then "top/s/x"
// would put x beside the destination (os.Root only keeps it in the
// parent). Nothing is made through a symlink the archive made.
func TestUnpackNothingThroughItsOwnSymlink(t *testing.T) {
	into := t.TempDir()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "data/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "data/s", Typeflag: tar.TypeSymlink, Linkname: ".."})
	tw.WriteHeader(&tar.Header{Name: "data/s/pwned", Typeflag: tar.TypeReg, Mode: 0o755, Size: 3})
	tw.Write([]byte("bad"))
	tw.WriteHeader(&tar.Header{Name: "data/h", Typeflag: tar.TypeLink, Linkname: "data/s/victim"})
	tw.Close()
	os.WriteFile(filepath.Join(into, "victim"), []byte("mine"), 0o644)
	rename := func(n string) (string, bool) {
		if n == "data" {
			return "out", true
		}
		if rest, ok := strings.CutPrefix(n, "data/"); ok {
			return "out/" + rest, true
		}
		return "", false
	}
	res := Unpack(&b, into, UnpackOptions{Rename: rename})
	if res.OK || res.Code != CodeUnsafe {
		t.Fatalf("unpacked: %+v", res)
	}
	if _, err := os.Lstat(filepath.Join(into, "pwned")); err == nil {
		t.Fatal("an entry went through the archive's own symlink, out of the destination")
	}
}

// TestPathNamesDir: a path that ends in / or /. names a directory: one
// that leads to a file is refused as not a directory (the kernel's
// ENOTDIR), never taken as the file its clean form names.
func TestPathNamesDir(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	os.WriteFile(f, []byte("x"), 0o644)
	os.Symlink("f", filepath.Join(dir, "lnk"))
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	put := func(p string) Result {
		return Put(context.Background(), strings.NewReader("new"), p, PutOptions{Mode: -1, UID: -1, GID: -1, Size: -1})
	}
	get := func(p string, tar bool) Result {
		var b bytes.Buffer
		if err := Get(context.Background(), &b, p, GetOptions{Tar: tar}); err != nil {
			t.Fatal(err)
		}
		res, _ := ReadResult(bufio.NewReader(&b))
		return res
	}
	for _, tc := range []struct {
		name string
		res  Result
		code string
	}{
		{"stat f/", Stat(f+"/", true), CodeNotDir},
		{"stat f/.", Stat(f+"/.", true), CodeNotDir},
		{"stat lnk/", Stat(dir+"/lnk/", true), CodeNotDir},
		{"get f/", get(f+"/", false), CodeNotDir},
		{"get f/. as a tar", get(f+"/.", true), CodeNotDir},
		{"remove f/", Remove(f+"/", false), CodeNotDir},
		{"put f/", put(f + "/"), CodeNotDir},
		{"put d/", put(dir + "/d/"), CodeIsDir},
		{"put new/", put(dir + "/new/"), CodeNotFound},
		{"stat d/", Stat(dir+"/d/", true), ""},
		{"stat d/.", Stat(dir+"/d/.", true), ""},
		{"get f", get(f, false), ""},
	} {
		if tc.res.Code != tc.code || tc.res.OK != (tc.code == "") {
			t.Errorf("%s: ok=%v %q (%s), want %q", tc.name, tc.res.OK, tc.res.Code, tc.res.Message, tc.code)
		}
	}
	if b, err := os.ReadFile(f); err != nil || string(b) != "x" {
		t.Errorf("f holds %q %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "new")); err == nil {
		t.Error("put new/ wrote a file")
	}
}

func TestNamesDir(t *testing.T) {
	for p, want := range map[string]bool{
		"/t/lnkdir/": true, "/t/lnkdir/.": true, "/t/lnkdir/./": true,
		"/t/lnkdir": false, "/t/lnkdir/..": false, "/": false, "/t/x.": false,
	} {
		if got := NamesDir(p); got != want {
			t.Errorf("NamesDir(%q) = %v, want %v", p, got, want)
		}
	}
}

// A copy's modification time is never after its source's: archive/tar
// rounded a time of …00.7 to …01.0 (a file sent whole), and a sparse
// file's PAX entry kept the nanoseconds; both now keep whole seconds.
func TestTarTimesAreNotLater(t *testing.T) {
	src := filepath.Join(t.TempDir(), "top")
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	os.WriteFile(filepath.Join(src, "dense"), []byte("d"), 0o644)
	holey(t, filepath.Join(src, "holes"), 8<<20, 0)
	mtime := time.Unix(1_700_000_000, 700_000_000)
	names := []string{"dense", "holes", "sub", "."}
	for _, n := range names {
		if err := os.Chtimes(filepath.Join(src, n), mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	var b bytes.Buffer
	if err := WriteTar(context.Background(), &b, src, "top", TarOptions{Sparse: true}); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if res := Unpack(&b, dst, UnpackOptions{}); !res.OK {
		t.Fatalf("unpack: %+v", res)
	}
	for _, n := range names {
		st, err := os.Stat(filepath.Join(dst, "top", n))
		if err != nil {
			t.Fatal(err)
		}
		if got := st.ModTime(); got.After(mtime) || mtime.Sub(got) >= time.Second {
			t.Errorf("%s: mtime %s, source's %s: want not later, within a second", n, got.Format(time.RFC3339Nano), mtime.Format(time.RFC3339Nano))
		}
	}
}
